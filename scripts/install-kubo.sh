#!/usr/bin/env bash
# Build a pinned Kubo from the Go module proxy into a cache folder outside the
# repo, reuse it when present, and print the binary's path as the last line.
#
# Kubo >= 0.40 cannot be `go install`ed (its go.mod has an `exclude` block), so
# it is built as a dependency of a throwaway module.
#
#   KUBO_VERSION   version to build        (default: the pinned one below; v0.43.x
#                  replaces go-libp2p with a fork the module proxy does not serve)
#   GRADSTORE_CACHE cache root             (default: ${XDG_CACHE_HOME:-~/.cache}/gradstore)
set -euo pipefail

KUBO_VERSION="${KUBO_VERSION:-v0.42.0}"
cache_root="${GRADSTORE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gradstore}"
dest="$cache_root/kubo/$KUBO_VERSION"
bin="$dest/ipfs"

if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null 2>&1 || { echo "install-kubo: 'go' is not on PATH" >&2; exit 1; }

mkdir -p "$dest"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "install-kubo: building Kubo $KUBO_VERSION with $(go version | cut -d' ' -f3) (takes minutes on first run)" >&2
(
  cd "$work"
  export GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
  go mod init gradstore-kubo-build >/dev/null 2>&1
  # A dependency's replace/exclude directives are ignored, so copy Kubo's own
  # into the throwaway module: the build then uses exactly Kubo's versions.
  kubo_mod="$(go mod download -json "github.com/ipfs/kubo@$KUBO_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  awk '/^(replace|exclude) \(/{blk=1} blk{print} blk&&/^\)/{blk=0; next} /^(replace|exclude) [^(]/{print}' "$kubo_mod" >> go.mod
  go get "github.com/ipfs/kubo/cmd/ipfs@$KUBO_VERSION" >&2
  go build -trimpath -o "$work/ipfs" github.com/ipfs/kubo/cmd/ipfs >&2
)
mv "$work/ipfs" "$bin.tmp" && mv "$bin.tmp" "$bin"
"$bin" version >&2
echo "$bin"
