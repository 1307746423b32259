#!/bin/sh
# Kubo settings gradstore relies on; run by the ipfs/kubo image on every start
# (after `ipfs init`, before the daemon), so each step is idempotent.
#
#   unixfs-v1-2025   CIDv1, raw leaves, 1 MiB chunks, 1024 links per node:
#                    the CIDs gradstore computes offline (docs/design/documents.md, "CIDs")
#   Pubsub.Enabled   announcements and results travel over pubsub (docs/design/messages.md)
#
# Routing is left at Kubo's default so the node can find peers elsewhere.
set -eu

ipfs config profile apply unixfs-v1-2025 >/dev/null
ipfs config --json Pubsub.Enabled true
echo "gradstore: unixfs-v1-2025 profile and Pubsub.Enabled=true are set"
