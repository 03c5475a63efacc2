#!/usr/bin/env bash
# Kubeflow Trainer v2 (TrainJob trainer.kubeflow.org/v1alpha1) in the test cluster, built here:
#   image    the controller manager from its Go module (cmd/trainer-controller-manager), FROM scratch
#   install  upstream's manager overlay from the same module download (CRDs, RBAC, the manager
#            with its certificate management, its webhooks, in `kubeflow-system`) without its
#            third-party JobSet (a release URL: hack/cluster/addons/jobset.sh installs the same
#            version from source, first), under a kustomize overlay in the state folder that names
#            the local image; then, once its webhooks judge, the `torch-distributed`
#            ClusterTrainingRuntime of the same release with its image resolved to the trainer's
#            CPU image (see write_runtime), and the user path's RBAC.
#   verify   a 2-node TrainJob of busybox containers on that runtime: node 0 hears from node 1 at
#            PET_MASTER_ADDR:PET_MASTER_PORT, as torch's rendezvous would; deleted after
#   images   the tags it needs
# The version is TRAINER_VERSION (versions.env); the user path (manifests/trainer) must pin the
# same tag, or this refuses to run. Needs JobSet (jobset.sh) installed first.
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"

PIECE="trainer"
V="${TRAINER_VERSION}"
MODULE="github.com/kubeflow/trainer/v2"
IMAGE="gpupipe.local/trainer-controller-manager:v${V}"
UPSTREAM_IMAGE="ghcr.io/kubeflow/trainer/trainer-controller-manager"
# The image torch-distributed names upstream (a CUDA build of torch).
RUNTIME_IMAGE="pytorch/pytorch"
RUNTIME=torch-distributed
# gpupipe's runtime (hack/cluster/addons/trainer/): torch-distributed with the PyTorchJob path's
# failure semantics (see its header); its image name before kustomize resolves it.
GPUPIPE_RUNTIME=gpupipe-torch-distributed
GPUPIPE_RUNTIME_IMAGE=ghcr.io/gpupipe/trainer-cuda
NS=kubeflow-system

check_user_path() {
  local k
  for k in manager runtimes; do
    grep -q "?ref=${TRAINER_COMMIT}\$" "${REPO_ROOT}/manifests/trainer/${k}/kustomization.yaml" ||
      die "${PIECE}: manifests/trainer/${k}/kustomization.yaml does not pin v${V}'s commit ${TRAINER_COMMIT} (versions.env): make them agree"
  done
}

addon_images() { echo "$IMAGE"; }

addon_image() {
  check_user_path
  need_docker "$PIECE"
  local df="${ADDONS_HACK}/images/trainer/Dockerfile" recipe
  recipe="$(RECIPE_EXTRA="$V" recipe_of "$df")"
  image_is_built "$IMAGE" "$recipe" && return 0
  go_install "$PIECE" trainer "$V" "${MODULE}/cmd/trainer-controller-manager@v${V}" manager
  build_context "$PIECE" "$IMAGE" "$recipe" "$(image_context "${BIN_DIR}/trainer-${V}/manager" "$df")"
}

# The trainer's CPU image: the name the cluster holds it under (hack/cluster-up.sh imports it).
cpu_image() { "${REPO_ROOT}/hack/build-images.sh" --print cpu; }

# The overlay in the state folder: upstream's manifests (a copy: the module cache is read-only and
# kustomize wants the files under its root), the manager overlay's JobSet line taken out, our image.
without_jobset() {
  sed -i '\|- \.\./\.\./third-party/jobset|d' "$1/overlays/manager/kustomization.yaml"
  ! grep -q third-party "$1/overlays/manager/kustomization.yaml" ||
    die "${PIECE}: could not take JobSet out of upstream's overlays/manager (its kustomization changed?)"
}

write_overlay() {
  local dir="$1"
  upstream_copy "$PIECE" "$dir" "${MODULE}@v${V}" manifests without_jobset
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/trainer.sh: Kubeflow Trainer v${V}, upstream's manager overlay
# (from the Go module download in ./upstream, without its third-party JobSet, which
# hack/cluster/addons/jobset.sh installs from source) with the locally built image.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - upstream/overlays/manager
images:
$(image_map "$UPSTREAM_IMAGE" "$IMAGE")
YAML
  write_runtime "${dir}/runtime" "${dir}/upstream"
}

# torch-distributed as upstream ships it (base/runtimes/torch_distributed.yaml, with the label its
# runtimes overlay adds) and gpupipe's runtime, the image of both rewritten by kustomize to the
# trainer's CPU image (the cluster holds it under that name: nothing is re-tagged): the image
# a TrainJob runs when it names none. gpupipe's launcher always sets spec.trainer.image, so the
# runtime's image only matters to other TrainJobs; on a GPU cluster users apply upstream's runtimes
# unchanged (manifests/trainer/runtimes) and the launcher's TrainJob names the CUDA image.
write_runtime() {
  local dir="$1" upstream="$2" image
  image="$(cpu_image)"
  mkdir -p "$dir"
  cp "${upstream}/base/runtimes/torch_distributed.yaml" "${ADDONS_HACK}/trainer/${GPUPIPE_RUNTIME}.yaml" "${dir}/"
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/trainer.sh: Kubeflow Trainer v${V}'s torch-distributed
# ClusterTrainingRuntime and gpupipe's own (hack/cluster/addons/trainer/), their image resolved to
# the trainer's CPU image in this cluster.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - torch_distributed.yaml
  - ${GPUPIPE_RUNTIME}.yaml
images:
  - name: ${RUNTIME_IMAGE}
    newName: ${image%:*}
    newTag: "${image##*:}"
  - name: ${GPUPIPE_RUNTIME_IMAGE}
    newName: ${image%:*}
    newTag: "${image##*:}"
patches:
  # As upstream's runtimes overlay labels its own runtimes ("validated ahead of time").
  - target: {kind: ClusterTrainingRuntime, name: ${RUNTIME}}
    patch: |-
      - op: add
        path: /metadata/labels/trainer.kubeflow.org~1webhook-validation
        value: disabled
YAML
}

# A 2-node TrainJob of busybox containers on torch-distributed, NAME; ENV (a YAML flow list) is
# its trainer's env.
trainjob() {
  local name="$1" env="${2:-[]}"
  cat <<YAML
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: ${name}
  namespace: ${NS}
  labels: {app.kubernetes.io/part-of: gpupipe}
spec:
  runtimeRef: {name: ${RUNTIME}, apiGroup: trainer.kubeflow.org, kind: ClusterTrainingRuntime}
  trainer:
    image: ${BUSYBOX_IMAGE}
    numNodes: 2
    env: ${env}
    command:
      - sh
      - -c
      - |
        if [ "\$PET_NODE_RANK" = 0 ]; then
          echo node 0 of \$PET_NNODES; timeout 120 nc -l -p \$PET_MASTER_PORT
        else
          for i in \$(seq 60); do
            echo node \$PET_NODE_RANK at \$PET_MASTER_ADDR:\$PET_MASTER_PORT | nc -w 2 \$PET_MASTER_ADDR \$PET_MASTER_PORT && exit 0
            sleep 2
          done; exit 1
        fi
YAML
}

# The TrainJob webhooks answer: the defaulter stamps the time of a runtime patch, and the validator
# refuses an env name the torch plugin reserves. Both fail closed: an answer means they were asked.
webhook_judges() {
  local out refusal
  out="$(trainjob gpupipe-webhook-probe | sed 's|^  trainer:|  runtimePatches: [{manager: gpupipe.dev/probe}]\n  trainer:|' |
    kubectl_ create --dry-run=server -o json -f - 2>/dev/null)" || return 1
  grep -q '"time": "' <<<"$out" || return 1
  refusal="$(trainjob gpupipe-webhook-probe '[{name: PET_NNODES, value: "3"}]' | kubectl_ create --dry-run=server -f - 2>&1)" && return 1
  grep -q 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied' <<<"$refusal"
}

addon_install() {
  check_user_path
  need_cluster "$PIECE"
  kubectl_ get crd jobsets.jobset.x-k8s.io >/dev/null 2>&1 ||
    cannot "${PIECE}: JobSet is not installed (hack/cluster/addons/jobset.sh install comes first)"
  apply_overlay "$PIECE"
  local dir
  dir="$(addon_state "$PIECE")"
  crds_established "$PIECE" {trainjobs,trainingruntimes,clustertrainingruntimes}.trainer.kubeflow.org
  rollout "$PIECE" "$NS" kubeflow-trainer-controller-manager 180
  # A ClusterTrainingRuntime's failurePolicy is immutable: a runtime changed there is replaced
  # (deleted, then applied; a runtime still in use by a TrainJob is not deleted, and the apply
  # then fails naming it).
  if ! kubectl_ apply --server-side --force-conflicts --field-manager gpupipe-addons -k "${dir}/runtime" >/dev/null 2>&1; then
    say "a runtime changed in an immutable field: replacing the runtimes"
    kubectl_ delete -k "${dir}/runtime" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    wait_for 30 bash -c "! '${BIN_DIR}/kubernetes-${K8S_VERSION}/kubectl' --kubeconfig '${KUBECONFIG_ADMIN}' get clustertrainingruntime ${GPUPIPE_RUNTIME} >/dev/null 2>&1" || true
    apply_k "$PIECE" "${dir}/runtime"
  fi
  webhooks_judge "$PIECE" TrainJob "$NS" kubeflow-trainer-controller-manager
  say "the TrainJob webhooks stamp a runtime patch and refuse a reserved env name"
  runner_account "$PIECE"
}

addon_verify() {
  need_cluster "$PIECE"
  local job=gpupipe-verify-trainjob
  check_object "$PIECE" "$NS" trainjob "$job" Complete 180 trainjob "jobset.sigs.k8s.io/jobset-name=${job}" ||
    die "${PIECE}: TrainJob ${NS}/${job} did not complete within 180 s"
  say "TrainJob ${NS}/${job} completed; node 0 heard from node 1:"
  kubectl_ -n "$NS" logs -l "jobset.sigs.k8s.io/jobset-name=${job},batch.kubernetes.io/job-completion-index=0" | sed 's/^/      /'
  kubectl_ -n "$NS" delete trainjob "$job" --wait >/dev/null
}

case "${1:-}" in
verify) addon_verify ;;
*) addon_main "$PIECE" "$@" ;;
esac
