#!/usr/bin/env bash
# Build a pinned IPFS Cluster (ipfs-cluster-service and ipfs-cluster-ctl) from the Go
# module proxy into the same cache folder as Kubo, reuse it when present, and print the
# folder holding both binaries as the last line.
#
# The proxy does not serve the module's version list, so `go install ...@version` fails:
# both commands are built as dependencies of a throwaway module, as Kubo is.
#
#   CLUSTER_VERSION  version to build  (default: the pinned one below; runs with Kubo v0.42.0)
#   GRADSTORE_CACHE  cache root        (default: ${XDG_CACHE_HOME:-~/.cache}/gradstore)
set -euo pipefail

CLUSTER_VERSION="${CLUSTER_VERSION:-v1.1.6}"
cache_root="${GRADSTORE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gradstore}"
dest="$cache_root/ipfs-cluster/$CLUSTER_VERSION"

if [ -x "$dest/ipfs-cluster-service" ] && [ -x "$dest/ipfs-cluster-ctl" ] \
  && "$dest/ipfs-cluster-service" --version >/dev/null 2>&1; then
  echo "$dest"
  exit 0
fi

command -v go >/dev/null 2>&1 || { echo "install-cluster: 'go' is not on PATH" >&2; exit 1; }

mkdir -p "$dest"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "install-cluster: building IPFS Cluster $CLUSTER_VERSION with $(go version | cut -d' ' -f3) (takes minutes on first run)" >&2
(
  cd "$work"
  export GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
  go mod init gradstore-cluster-build >/dev/null 2>&1
  mod="github.com/ipfs-cluster/ipfs-cluster"
  # A dependency's replace/exclude directives are ignored: copy the cluster's own.
  cluster_mod="$(go mod download -json "$mod@$CLUSTER_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  awk '/^(replace|exclude) \(/{blk=1} blk{print} blk&&/^\)/{blk=0; next} /^(replace|exclude) [^(]/{print}' "$cluster_mod" >> go.mod
  go get "$mod/cmd/ipfs-cluster-service@$CLUSTER_VERSION" "$mod/cmd/ipfs-cluster-ctl@$CLUSTER_VERSION" >&2
  go build -trimpath -o "$work/ipfs-cluster-service" "$mod/cmd/ipfs-cluster-service" >&2
  go build -trimpath -o "$work/ipfs-cluster-ctl" "$mod/cmd/ipfs-cluster-ctl" >&2
)
for b in ipfs-cluster-service ipfs-cluster-ctl; do
  mv "$work/$b" "$dest/$b.tmp" && mv "$dest/$b.tmp" "$dest/$b"
done
"$dest/ipfs-cluster-service" --version >&2
echo "$dest"
