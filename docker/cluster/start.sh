#!/bin/sh
# Start the IPFS Cluster peer of docker/compose.yml: refuse to start without the shared
# secret (an empty CLUSTER_SECRET runs a cluster any peer can join), then run the image's
# own entrypoint (it inits a CRDT config on the first start) with `daemon`, bootstrapping
# to GRADSTORE_CLUSTER_BOOTSTRAP (/ip4/HOST/tcp/9096/p2p/ID,...) when it is set.
set -eu

if [ -z "${CLUSTER_SECRET:-}" ]; then
  echo "gradstore cluster: set GRADSTORE_CLUSTER_SECRET to the cluster's shared secret" \
    "(64 hex digits, the same on every peer: python3 -c 'import secrets; print(secrets.token_hex(32))')" >&2
  exit 1
fi
if [ -n "${GRADSTORE_CLUSTER_BOOTSTRAP:-}" ]; then
  exec /usr/local/bin/entrypoint.sh daemon --bootstrap "$GRADSTORE_CLUSTER_BOOTSTRAP"
fi
exec /usr/local/bin/entrypoint.sh daemon
