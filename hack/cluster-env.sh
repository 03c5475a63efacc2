#!/usr/bin/env bash
# The shell settings that make the README's KFP commands work on the test cluster that is up now
# (hack/cluster-up.sh), printed as `export` lines for `eval "$(hack/cluster-env.sh)"`:
#
#   KUBECONFIG               the cluster's admin kubeconfig
#   PATH                     its kubectl, and this checkout's venv (gpupipe) first
#   MINIO_ENDPOINT, MINIO_ACCESS_KEY, MINIO_SECRET_KEY
#                            the object store (KFP's SeaweedFS) through its Service address,
#                            which this host reaches, with the keys of its generated Secret:
#                            `gpupipe demo-data --out minio://...` writes there
#   GPUPIPE_STEP_RESOURCES   steps that fit its one 2-core node: each asks a twentieth of a CPU
#                            and 128Mi (the compiled requests, a node's worth for preprocess and
#                            tune, stay Pending here with "Insufficient cpu"); limits as compiled
#
# Nothing is written; the keys go to stdout (for eval), never to a file. Exit 3 with one line
# when no cluster is up.
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "$0")/cluster/lib.sh"

KUBECTL_DIR="${BIN_DIR}/kubernetes-${K8S_VERSION}"
if [[ ! -f "$KUBECONFIG_ADMIN" ]] || ! kubectl_ get --raw /readyz >/dev/null 2>&1; then
  echo "error: cluster-env: no test cluster answers here (${KUBECONFIG_ADMIN}): make cluster-up" >&2
  exit 3
fi
store_ip="$(kubectl_ -n kubeflow get service seaweedfs -o jsonpath='{.spec.clusterIP}' 2>/dev/null)" || {
  echo "error: cluster-env: the cluster has no object store (Service kubeflow/seaweedfs): GPUPIPE_CLUSTER_ADDONS lacks object-store" >&2
  exit 3
}
key() { kubectl_ -n kubeflow get secret mlpipeline-minio-artifact -o "jsonpath={.data.$1}" | base64 -d; }
steps="fingerprint preprocess train train-launcher tune evaluate register notify"
resources="$(for s in $steps; do printf '"%s":{"cpu_request":"50m","memory_request":"128Mi"},' "$s"; done)"

printf 'export KUBECONFIG=%q\n' "$KUBECONFIG_ADMIN"
# shellcheck disable=SC2016  # $PATH is for the eval, not this shell
printf 'export PATH=%q:%q:"$PATH"\n' "${REPO_ROOT}/.venv/bin" "$KUBECTL_DIR"
printf 'export MINIO_ENDPOINT=%q\n' "${store_ip}:9000"
printf 'export MINIO_ACCESS_KEY=%q\n' "$(key accesskey)"
printf 'export MINIO_SECRET_KEY=%q\n' "$(key secretkey)"
printf "export GPUPIPE_STEP_RESOURCES='%s'\n" "{${resources%,}}"
