#!/usr/bin/env bash
# Delete the kind cluster that hack/kind-up.sh created (and everything in it).
# Environment: GPUPIPE_KIND_CLUSTER (default gpupipe).
set -euo pipefail

cluster="${GPUPIPE_KIND_CLUSTER:-gpupipe}"

if ! command -v kind >/dev/null 2>&1; then
  echo "error: kind is not on PATH" >&2
  exit 1
fi
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  echo "==> deleting kind cluster '${cluster}'"
  kind delete cluster --name "$cluster"
else
  echo "==> no kind cluster '${cluster}': nothing to delete"
fi
