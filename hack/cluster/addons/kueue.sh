#!/usr/bin/env bash
# Kueue (kueue.x-k8s.io) in the test cluster, built here: gang admission for the training jobs
# (issue 64). A job labelled with a LocalQueue's name (`gang_queue`) is created suspended by
# Kueue's webhook and started only when the whole of it fits the ClusterQueue's quota, so two
# jobs never each hold half their pods and wait for ever.
#   image    the manager from its Go module (cmd/kueue), FROM scratch
#   install  upstream's default overlay from the same module download (CRDs, RBAC, the manager
#            with its internal certificate management and its webhooks, in `kueue-system`) with
#            the local image, less CPU asked, the integrations this cluster runs (Job, JobSet,
#            PyTorchJob, TrainJob), and no visibility APIService (this API server has no
#            aggregation layer: an APIService that never answers breaks namespace deletion);
#            then the user path's queues (manifests/kueue) with the cluster's own quota; waits
#            until the webhook suspends a queued Job
#   verify   a queued busybox Job is admitted and completes; one asking more than the quota
#            stays suspended with Kueue's reason; both deleted after
#   images   the tags it needs
# The version is KUEUE_VERSION (versions.env).
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"

PIECE="kueue"
V="${KUEUE_VERSION}"
MODULE="sigs.k8s.io/kueue"
IMAGE="gpupipe.local/kueue:v${V}"
# The name upstream's config/components/manager gives the image.
UPSTREAM_IMAGE="us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue"
NS=kueue-system
QUEUE_NS=kubeflow

addon_images() { echo "$IMAGE"; }

addon_image() {
  need_docker "$PIECE"
  local df="${ADDONS_HACK}/images/kueue/Dockerfile" recipe
  recipe="$(RECIPE_EXTRA="$V" recipe_of "$df")"
  image_is_built "$IMAGE" "$recipe" && return 0
  go_build_in_module "$PIECE" kueue "$V" "${MODULE}@v${V}" ./cmd/kueue manager
  build_context "$PIECE" "$IMAGE" "$recipe" "$(image_context "${BIN_DIR}/kueue-${V}/manager" "$df")"
}

# The manager's configuration: upstream's, with the integrations of this cluster's controllers
# (an integration whose CRD is missing would keep the manager waiting for it).
manager_config() {
  cat <<YAML
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: :8081
metrics:
  bindAddress: :8443
webhook:
  port: 9443
leaderElection:
  leaderElect: true
  resourceName: c1f6bfd2.kueue.x-k8s.io
clientConnection:
  qps: 50
  burst: 100
integrations:
  frameworks:
    - "batch/job"
    - "jobset.x-k8s.io/jobset"
    - "kubeflow.org/pytorchjob"
    - "trainer.kubeflow.org/trainjob"
YAML
}

# without_webhooks KIND PREFIX: a patch deleting the pod, Deployment and StatefulSet webhooks
# (PREFIXpod.kb.io, ...) from Kueue's KINDWebhookConfiguration.
without_webhooks() {
  local lower w
  lower="$(tr '[:upper:]' '[:lower:]' <<<"$1")"
  printf '  - patch: |-\n      apiVersion: admissionregistration.k8s.io/v1\n'
  printf '      kind: %sWebhookConfiguration\n      metadata:\n' "$1"
  printf '        name: kueue-%s-webhook-configuration\n      webhooks:\n' "$lower"
  # shellcheck disable=SC2016 # $patch is kustomize's key, not a shell variable
  for w in pod deployment statefulset; do printf '        - {name: %s%s.kb.io, $patch: delete}\n' "$2" "$w"; done
}

write_overlay() {
  local dir="$1"
  upstream_copy "$PIECE" "$dir" "${MODULE}@v${V}" config
  manager_config >"${dir}/controller_manager_config.yaml"
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/kueue.sh: Kueue v${V}, upstream's default overlay (from the Go
# module download in ./upstream) with the local image and this cluster's integrations.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - upstream/default
images:
$(image_map "$UPSTREAM_IMAGE" "$IMAGE")
configMapGenerator:
  - name: kueue-manager-config
    namespace: ${NS}
    behavior: replace
    files:
      - controller_manager_config.yaml
generatorOptions:
  disableNameSuffixHash: true
patches:
  # No aggregation layer on this API server: the visibility API would never become Available.
  - patch: |-
      \$patch: delete
      apiVersion: apiregistration.k8s.io/v1
      kind: APIService
      metadata:
        name: v1beta1.visibility.kueue.x-k8s.io
  - patch: |-
      \$patch: delete
      apiVersion: apiregistration.k8s.io/v1
      kind: APIService
      metadata:
        name: v1beta2.visibility.kueue.x-k8s.io
  # The webhooks of the pod, Deployment and StatefulSet integrations (off here) would still be
  # called, failing closed, for every pod, Deployment and StatefulSet of every namespace: each
  # creation would wait on Kueue's pod, and none could be made while it restarts.
$(without_webhooks Mutating m)
$(without_webhooks Validating v)
  # Upstream asks 500m CPU and 512Mi; the whole node has 2 cores. Upstream pulls Always: the
  # local image is on the nodes only (imported), never in a registry.
  - target: {group: apps, version: v1, kind: Deployment, name: kueue-controller-manager}
    patch: |-
      - op: replace
        path: /spec/template/spec/containers/0/resources/requests
        value: {cpu: 50m, memory: 128Mi}
      - op: replace
        path: /spec/template/spec/containers/0/imagePullPolicy
        value: IfNotPresent
YAML
}

# A busybox Job of PARALLELISM pods asking CPU each, in the queue (the LocalQueue's namespace).
queued_job() {
  local name="$1" cpu="${2:-100m}" parallelism="${3:-1}"
  cat <<YAML
apiVersion: batch/v1
kind: Job
metadata:
  name: ${name}
  namespace: ${QUEUE_NS}
  labels: {app.kubernetes.io/part-of: gpupipe, kueue.x-k8s.io/queue-name: gpupipe}
spec:
  parallelism: ${parallelism}
  completions: ${parallelism}
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      ${RESTRICTED_POD_YAML}
      containers:
        - name: main
          image: ${BUSYBOX_IMAGE}
          command: [sh, -c, "echo admitted"]
          ${RESTRICTED_CONTAINER_YAML}
          resources: {requests: {cpu: "${cpu}", memory: 16Mi}, limits: {cpu: "${cpu}", memory: 16Mi}}
YAML
}
RESTRICTED_POD_YAML='securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}'
RESTRICTED_CONTAINER_YAML='securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}'

# The webhook answers: a dry-run queued Job comes back suspended (Kueue's mutating webhook).
webhook_judges() {
  local out
  out="$(queued_job gpupipe-webhook-probe | kubectl_ create --dry-run=server -o json -f - 2>/dev/null)" || return 1
  grep -q '"suspend": true' <<<"$out"
}

# The queues of manifests/kueue, their quota the cluster's: the nodes' allocatable CPU, memory
# and GPUs, summed (the nodes a job's pods can land on: the quota admits no job they cannot hold).
apply_queues() {
  local cpu mem gpu dir
  read -r cpu mem gpu < <(kubectl_ get nodes -o json | python3 -c '
import json, re, sys
from decimal import Decimal
units = {"": 1, "m": Decimal("0.001"), "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
         "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
def q(s):
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", s)
    return Decimal(m.group(1)) * units[m.group(2)]
cpu = mem = gpu = Decimal(0)
for n in json.load(sys.stdin)["items"]:
    a = n["status"].get("allocatable", {})
    cpu += q(a.get("cpu", "0")); mem += q(a.get("memory", "0")); gpu += q(a.get("nvidia.com/gpu", "0"))
print(f"{int(cpu * 1000)}m {int(mem // 1024**2)}Mi {int(gpu)}")
')
  dir="$(addon_state "$PIECE")/queues"
  mkdir -p "$dir"
  user_files "${REPO_ROOT}/manifests/kueue" "$dir" >/dev/null
  cat >"${dir}/kustomization.yaml" <<YAML
# Written by hack/cluster/addons/kueue.sh: manifests/kueue with this cluster's quota.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - queues.yaml
patches:
  - target: {group: kueue.x-k8s.io, kind: ClusterQueue, name: gpupipe}
    patch: |-
      - op: replace
        path: /spec/resourceGroups/0/flavors/0/resources
        value:
          - {name: cpu, nominalQuota: "${cpu}"}
          - {name: memory, nominalQuota: "${mem}"}
          - {name: nvidia.com/gpu, nominalQuota: "${gpu}"}
YAML
  ensure_namespace "$QUEUE_NS"
  apply_k "$PIECE" "$dir"
  printf 'cpu=%s\nmemory=%s\ngpu=%s\n' "$cpu" "$mem" "$gpu" >"$(addon_state "$PIECE")/quota"
  say "ClusterQueue gpupipe: quota cpu ${cpu}, memory ${mem}, nvidia.com/gpu ${gpu}; LocalQueue ${QUEUE_NS}/gpupipe"
}

addon_install() {
  need_cluster "$PIECE"
  apply_overlay "$PIECE"
  crds_established "$PIECE" workloads.kueue.x-k8s.io clusterqueues.kueue.x-k8s.io localqueues.kueue.x-k8s.io
  rollout "$PIECE" "$NS" kueue-controller-manager 180
  webhooks_judge "$PIECE" Job "$NS" kueue-controller-manager
  apply_queues
  say "the Kueue webhook suspends a queued Job until Kueue admits it"
}

addon_verify() {
  need_cluster "$PIECE"
  local ok=gpupipe-verify-kueue big=gpupipe-verify-kueue-big cpu
  cpu="$(sed -n 's/^cpu=//p' "$(addon_state "$PIECE")/quota")"
  check_object "$PIECE" "$QUEUE_NS" job "$ok" Complete 180 queued_job ||
    die "${PIECE}: queued Job ${QUEUE_NS}/${ok} was not admitted and completed within 180 s"
  say "Job ${QUEUE_NS}/${ok}: admitted by the queue and completed"
  # Two pods of more than half the quota each: never admitted, whole; it stays suspended.
  kubectl_ -n "$QUEUE_NS" delete job "$big" --ignore-not-found --wait >/dev/null
  queued_job "$big" "$((${cpu%m} / 2 + 1))m" 2 | kubectl_ create -f - >/dev/null
  wait_for 60 big_job_inadmissible || die "${PIECE}: Job ${QUEUE_NS}/${big} (over the quota) was not held with Kueue's reason within 60 s"
  [[ "$(kubectl_ -n "$QUEUE_NS" get job "$big" -o jsonpath='{.spec.suspend}')" == true ]] ||
    die "${PIECE}: Job ${QUEUE_NS}/${big} is over the quota but not suspended"
  say "Job ${QUEUE_NS}/${big} (over the quota): held suspended, Kueue says why"
  kubectl_ -n "$QUEUE_NS" delete job "$ok" "$big" --wait >/dev/null
}

# The over-quota Job's Workload says it cannot be admitted (QuotaReserved false, with a reason).
big_job_inadmissible() {
  kubectl_ -n "$QUEUE_NS" get workloads -o json | python3 -c '
import json, sys
for w in json.load(sys.stdin)["items"]:
    owners = [o["name"] for o in w["metadata"].get("ownerReferences", [])]
    if "gpupipe-verify-kueue-big" not in owners:
        continue
    for c in w.get("status", {}).get("conditions", []):
        if c["type"] == "QuotaReserved" and c["status"] == "False" and c.get("message"):
            print(c["message"]); sys.exit(0)
sys.exit(1)'
}

case "${1:-}" in
verify) addon_verify ;;
*) addon_main "$PIECE" "$@" ;;
esac
