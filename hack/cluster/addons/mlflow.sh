#!/usr/bin/env bash
# The MLflow tracking server and model registry of manifests/mlflow in the test cluster:
#   image    gpupipe.local/mlflow:v${MLFLOW_VERSION}: PyPI's mlflow[auth] (the version the user path's
#            ghcr.io/mlflow/mlflow tag names) in a venv over the local Debian Python base
#            (hack/base-image.sh), running the same `mlflow server`
#   install  manifests/mlflow itself (as users apply it) under a kustomize overlay in the state
#            folder that only swaps the image; its PVC gets a hostPath PersistentVolume made here
#            (the cluster has no StorageClass or provisioner), and the Secrets of its two accounts
#            (mlflow-admin, the admin's; mlflow-auth, the pipeline's) are generated here (no fixed
#            password); waits for the pod to be Ready
#   verify   from a pod: an unauthenticated request is refused (401); with the pipeline's account
#            the server answers /health and a search, and refuses the admin's Default experiment
#   images   the tag it needs
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"

PIECE="mlflow"
V="${MLFLOW_VERSION}"
IMAGE="gpupipe.local/mlflow:v${V}"
UPSTREAM_IMAGE="ghcr.io/mlflow/mlflow"
NS=kubeflow

# boto3 as the project pins it (constraints.txt): the client side speaks to the same store.
boto3_version() {
  sed -n 's/^boto3==//p' "${REPO_ROOT}/constraints.txt"
}

# The user path names the same MLflow release: a drift between the two is a bug.
check_user_path() {
  grep -q "image: ${UPSTREAM_IMAGE}:v${V}-full\$" "${REPO_ROOT}/manifests/mlflow/deployment.yaml" ||
    die "${PIECE}: manifests/mlflow/deployment.yaml does not name ${UPSTREAM_IMAGE}:v${V}-full (MLFLOW_VERSION): make them agree"
}

addon_images() { echo "$IMAGE"; }

addon_image() {
  check_user_path
  need_docker "$PIECE"
  local df="${ADDONS_HACK}/images/mlflow/Dockerfile" base base_id boto3 recipe
  base="$("${REPO_ROOT}/hack/base-image.sh")" || cannot "${PIECE}: no Python base image (hack/base-image.sh failed)"
  base_id="$(docker image inspect --format '{{.Id}}' "$base")"
  boto3="$(boto3_version)"
  [[ -n "$boto3" ]] || die "${PIECE}: constraints.txt pins no boto3"
  grep -qx "mlflow==${V}" "${ADDONS_HACK}/images/mlflow/constraints.txt" ||
    die "${PIECE}: images/mlflow/constraints.txt does not pin mlflow==${V} (MLFLOW_VERSION)"
  recipe="$(RECIPE_EXTRA="$V $boto3 $base_id" recipe_of "$df" "${ADDONS_HACK}/images/mlflow/constraints.txt" \
    "${ADDONS_HACK}/images/mlflow/requirements.lock")"
  image_is_built "$IMAGE" "$recipe" && return 0
  # pip inside the build reaches PyPI through the host's network (the base trusts the host's CAs).
  docker_build "$PIECE" "$IMAGE" "$recipe" "${ADDONS_HACK}/images/mlflow" --network host \
    --build-arg "BASE=${base}" --build-arg "MLFLOW_VERSION=${V}" --build-arg "BOTO3_VERSION=${boto3}"
}

write_overlay() {
  local dir="$1" base
  mkdir -p "$dir"
  # kustomize takes a base outside the overlay's folder, but only by a relative path.
  base="$(realpath --relative-to "$dir" "${REPO_ROOT}/manifests/mlflow")"
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/mlflow.sh: the user path's manifests/mlflow with the local image.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ${base}
images:
$(image_map "$UPSTREAM_IMAGE" "$IMAGE")
YAML
}

# The Secret manifests/mlflow asks its user to make (its admin account, which the pipeline's
# evaluate and register steps also read): made here once, with values generated on this machine
# (no password is written down anywhere), passed to kubectl on stdin, never as an argument.
# ensure_auth_secret SECRET KIND: the Secret of MLflow's admin (mlflow-admin) or the pipeline's
# account (mlflow-auth), generated once.
ensure_auth_secret() {
  local secret="$1" kind="$2"
  kubectl_ -n "$NS" get secret "$secret" >/dev/null 2>&1 && return 0
  "${REPO_ROOT}/hack/mlflow-account.sh" "$kind" |
    kubectl_ -n "$NS" create secret generic "$secret" --from-env-file=/dev/stdin >/dev/null ||
    die "${PIECE}: cannot create Secret ${NS}/${secret}"
  say "made Secret ${NS}/${secret} (MLflow's ${kind} account, generated)"
}

addon_install() {
  check_user_path
  need_cluster "$PIECE"
  import_image "$IMAGE"
  ensure_namespace "$NS"
  ensure_auth_secret mlflow-admin admin
  ensure_auth_secret mlflow-auth pipeline
  hostpath_pv "$PIECE" "$NS" mlflow 10Gi 1000:1000
  local dir
  dir="$(addon_state "$PIECE")"
  write_overlay "$dir"
  apply_k "$PIECE" "$dir"
  rollout "$PIECE" "$NS" mlflow 300
}

# From a pod labelled as KFP labels a run's pods (the only ones manifests/mlflow's NetworkPolicy
# admits), with the Secret's account: an unauthenticated request is refused with 401, and with
# the account /health and the REST API answer.
addon_verify() {
  need_cluster "$PIECE"
  local pod=gpupipe-verify-mlflow out overrides env
  env='"env":[{"name":"USER_NAME","valueFrom":{"secretKeyRef":{"name":"mlflow-auth","key":"username"}}},{"name":"USER_PASSWORD","valueFrom":{"secretKeyRef":{"name":"mlflow-auth","key":"password"}}}]'
  overrides="$(printf '{"metadata":{"labels":{"pipelines.kubeflow.org/v2_component":"true"}},"spec":{%s,"containers":[{"name":"%s","image":"%s","command":["sh","-c",%s],%s,%s}]}}' \
    "$RESTRICTED_POD" "$pod" "$BUSYBOX_IMAGE" "$(json_string <<'SH'
api="http://mlflow.kubeflow:5000/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"
# MLflow's NetworkPolicy admits this pod once kube-router has synced its address, a moment after it
# starts (the network-policy add-on): wait for an answer of any status first, at most 20 s.
for i in $(seq 20); do
  case "$(wget -q -O /dev/null http://mlflow.kubeflow:5000/health 2>&1)" in "" | *HTTP/*) break ;; esac
  sleep 1
done
if refused="$(wget -qO- "$api" 2>&1)"; then echo "an unauthenticated request was answered: $refused"; exit 1; fi
case "$refused" in *401*) echo "unauthenticated: refused (401)" ;; *) echo "unauthenticated: $refused"; exit 1 ;; esac
auth="Authorization: Basic $(printf '%s:%s' "$USER_NAME" "$USER_PASSWORD" | base64 -w0)"
wget -qO- --header "$auth" http://mlflow.kubeflow:5000/health && echo
# The pipeline's account searches what it may read, and reaches nothing it did not make (the
# server's own Default experiment: 403).
wget -qO- --header "$auth" "http://mlflow.kubeflow:5000/api/2.0/mlflow/registered-models/search" &&
  echo " searched as the pipeline's account"
if other="$(wget -qO- --header "$auth" "$api" 2>&1)"; then echo "the pipeline's account read the Default experiment: $other"; exit 1; fi
case "$other" in *403*) echo "the Default experiment: refused to the pipeline's account (403)" ;; *) echo "the Default experiment: $other"; exit 1 ;; esac
SH
)" "$env" "$RESTRICTED_CONTAINER")"
  out="$(run_pod "$NS" "$pod" "$BUSYBOX_IMAGE" "$overrides" 180)" ||
    die "${PIECE}: the check of http://mlflow.kubeflow:5000 from a pod failed: ${out}"
  if ! grep -q 'searched as the pipeline' <<<"$out" || ! grep -q 'refused to the pipeline.s account (403)' <<<"$out"; then
    die "${PIECE}: unexpected answers from the MLflow REST API: ${out}"
  fi
  say "from a pod: MLflow refused an unauthenticated request (401); with Secret ${NS}/mlflow-auth's account (the pipeline's) /health is OK, a search answers, and the admin's Default experiment is refused (403)"
}

case "${1:-}" in
verify) addon_verify ;;
*) addon_main "$PIECE" "$@" ;;
esac
