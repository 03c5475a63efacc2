#!/usr/bin/env bash
# GPU nodes without GPUs (docs/test-cluster.md, "GPU nodes without GPUs"): one node of the test
# cluster advertises N `nvidia.com/gpu` and is labelled and tainted as a cloud provider's GPU
# nodes are, so that the pipeline's GPU limits, toleration and node selector are scheduled for
# real. The devices are our own device plugin's (hack/cluster/gomod/fake-gpu), a host process per
# GPU node as the kubelet is here: it registers with that node's kubelet through the kubelet's
# plugin watcher (a socket in <the kubelet's --root-dir>/plugins_registry; not over kubelet.sock,
# whose folder, /var/lib/kubelet/device-plugins, is compiled into the kubelet and shared by every
# kubelet of this host) and sets NVIDIA_VISIBLE_DEVICES (and GPUPIPE_FAKE_GPU=1) in a container
# that holds GPUs. No CUDA.
#   image    the plugin from hack/cluster/gomod/fake-gpu (k8s.io/kubelet at the cluster's
#            Kubernetes release), into ${BIN_DIR}/fake-gpu-<hash of its source>/; no image
#   install  on the GPU node: the taint nvidia.com/gpu=present:NoSchedule, the labels
#            nvidia.com/gpu.present=true, nvidia.com/gpu.product=<product>, nvidia.com/gpu.count=N,
#            then the plugin (log: logs/fake-gpu-K.log; restarted when its flags change); waits
#            until the node's allocatable shows N nvidia.com/gpu. A GPU node moved elsewhere
#            (another GPUPIPE_CLUSTER_GPU_NODE) loses its plugin, its sockets, labels and taint
#            first
#   verify   a pod asking one nvidia.com/gpu, with the pipeline's toleration, lands on the GPU
#            node and sees NVIDIA_VISIBLE_DEVICES naming one of the advertised devices
#   images   none
#   flags    print the plugin's command line, one argument a line
# Environment (install records them: later calls, hack/cluster-node.sh's among them, keep them):
#   GPUPIPE_CLUSTER_GPU_NODE=K     the GPU node, one of 2..N (default: the last node). Never node
#                                  1, the host: CoreDNS and the add-ons' volumes are pinned there,
#                                  and the GPU taint would keep their pods off it
#   GPUPIPE_CLUSTER_GPUS=N         devices it advertises (default 2, at most 64)
#   GPUPIPE_CLUSTER_GPU_PRODUCT=P  its nvidia.com/gpu.product label (default gpupipe-fake-gpu)
# cluster-down stops the plugin; hack/cluster-node.sh stop K kills it with the node's other
# processes, and start K starts it again (this script's install).
set -euo pipefail
# shellcheck source=hack/cluster/addons/common.sh
source "$(dirname "$0")/common.sh"
# shellcheck source=hack/cluster/procs.sh
source "${CLUSTER_HACK}/procs.sh"

PIECE="gpu"
GOMOD="${CLUSTER_HACK}/gomod/fake-gpu"
RESOURCE="nvidia.com/gpu"
# What the pipeline's GPU pods tolerate (trainer/launch/jobspec.py GPU_TOLERATION: key
# nvidia.com/gpu, operator Exists, effect NoSchedule), as GKE and AKS taint their GPU nodes.
TAINT="nvidia.com/gpu=present:NoSchedule"
DEFAULT_PRODUCT="gpupipe-fake-gpu"
MAX_GPUS=64
SETTINGS="$(addon_state "$PIECE")/settings"
# The plugin's sockets under a kubelet's --root-dir (fake-gpu's main.go): the one the kubelet's
# plugin watcher finds, and the device-plugin socket it then dials.
REG_SOCKET="plugins_registry/gpupipe-fake-gpu-reg.sock"
DEVICE_SOCKET="plugins/gpupipe-fake-gpu/dp.sock"
# How long install waits for the node's allocatable: a kubelet that started while the plugin was
# down (hack/cluster-node.sh start) tries the plugin's stale socket with a back-off that grows to
# 2 min 2 s, each try up to 10 s; the node's status reports the devices within 10 s more.
ALLOCATABLE_WAIT_S=150
VERIFY_NS=gpupipe-verify-gpu

# The binary's version folder: a hash of the module's source (go.mod, go.sum, its non-test Go
# files), so that any change to the plugin builds it again.
build_version() {
  local files=("${GOMOD}/go.mod" "${GOMOD}/go.sum") f
  for f in "${GOMOD}"/*.go; do [[ "$f" == *_test.go ]] || files+=("$f"); done
  recipe_of "${files[@]}" | cut -c1-12
}
BIN="${BIN_DIR}/fake-gpu-$(build_version)/fake-gpu"

# The module's k8s.io/kubelet must be the cluster's Kubernetes release (1.34.4 -> v0.34.4).
check_versions() {
  grep -Eq "^(require)?[[:space:]]*k8s.io/kubelet v0.${K8S_VERSION#*.}\$" "${GOMOD}/go.mod" ||
    die "${PIECE}: hack/cluster/gomod/fake-gpu/go.mod does not require k8s.io/kubelet v0.${K8S_VERSION#*.} (versions.env's K8S_VERSION ${K8S_VERSION})"
}

# setting KEY: what install recorded (empty when nothing was).
setting() {
  [[ -f "$SETTINGS" ]] || return 0
  sed -n "s/^$1=//p" "$SETTINGS" | head -n 1
}

# settings: GPU_NODE, GPUS and PRODUCT from the environment, else as install recorded them,
# else the defaults; a bad one is one line and exit 1, before anything is touched.
settings() {
  local nodes
  nodes="$(cluster_nodes)"
  if ! [[ "$nodes" =~ ^[1-9][0-9]*$ ]] || ((nodes < 2)); then
    die "${PIECE}: the cluster has one node, the host, where CoreDNS and the add-ons' volumes are pinned: the GPU taint would keep their pods off it (make cluster-up NODES=2 gives it a node for GPUs)"
  fi
  GPU_NODE="${GPUPIPE_CLUSTER_GPU_NODE:-$(setting node)}"
  GPU_NODE="${GPU_NODE:-$nodes}"
  GPUS="${GPUPIPE_CLUSTER_GPUS:-$(setting gpus)}"
  GPUS="${GPUS:-2}"
  PRODUCT="${GPUPIPE_CLUSTER_GPU_PRODUCT:-$(setting product)}"
  PRODUCT="${PRODUCT:-$DEFAULT_PRODUCT}"
  if ! [[ "$GPU_NODE" =~ ^[1-9][0-9]*$ ]] || ((GPU_NODE < 2 || GPU_NODE > nodes)); then
    die "${PIECE}: GPUPIPE_CLUSTER_GPU_NODE=${GPU_NODE}: the GPU node must be one of the cluster's nodes 2..${nodes} (node 1 is the host, where CoreDNS and the add-ons' volumes are pinned)"
  fi
  if ! [[ "$GPUS" =~ ^[1-9][0-9]*$ ]] || ((${#GPUS} > 2 || GPUS > MAX_GPUS)); then
    die "${PIECE}: GPUPIPE_CLUSTER_GPUS=${GPUS}: the number of GPUs must be a whole number from 1 to ${MAX_GPUS}"
  fi
  if ! [[ "$PRODUCT" =~ ^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$ ]]; then
    die "${PIECE}: GPUPIPE_CLUSTER_GPU_PRODUCT=${PRODUCT}: the product must be a label value (letters, digits, '-', '_', '.'; at most 63)"
  fi
}

addon_images() { :; }

addon_image() {
  check_versions
  go_build_wrapper "$PIECE" fake-gpu "$(build_version)" fake-gpu . fake-gpu
}

# kubelet_root K: node K's kubelet's --root-dir (node-up.sh's node_kubelet).
kubelet_root() { printf '%s/kubelet' "$(node_dir "$1")"; }

# flags: the GPU node's plugin command line, one argument a line. In the node's network namespace,
# as its other processes are (it talks to its kubelet over files only: sockets under the
# kubelet's --root-dir).
flags() {
  # shellcheck disable=SC2046  # node_exec's words are separate arguments
  printf '%s\n' $(node_exec "$GPU_NODE") "$BIN" \
    --kubelet-root-dir "$(kubelet_root "$GPU_NODE")" \
    --node "$(node_name "$GPU_NODE")" \
    --count "$GPUS" --resource "$RESOURCE" --product "$PRODUCT"
}

# allocatable NODE: the node's allocatable nvidia.com/gpu (empty when it has none).
allocatable() {
  kubectl_ get node "$1" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null
}
allocatable_is() { [[ "$(allocatable "$1")" == "$2" ]]; }

# unmake_gpu_node K: node K, the GPU node install recorded before, is one no more: its plugin
# stopped, the labels and taint install put there removed.
unmake_gpu_node() {
  local k="$1" name
  name="$(node_name "$k")"
  stop "$(node_proc fake-gpu "$k")"
  # A plugin killed (hack/cluster-node.sh stop) left its sockets, which that kubelet would try on
  # and on; one stopped has removed them.
  rm -f "$(kubelet_root "$k")/${REG_SOCKET}" "$(kubelet_root "$k")/${DEVICE_SOCKET}"
  rmdir "$(dirname "$(kubelet_root "$k")/${DEVICE_SOCKET}")" 2>/dev/null || true
  rm -f "$(addon_state "$PIECE")/$(node_proc flags "$k")"
  kubectl_ get node "$name" >/dev/null 2>&1 || return 0
  kubectl_ label node "$name" nvidia.com/gpu.present- nvidia.com/gpu.product- nvidia.com/gpu.count- >/dev/null ||
    die "${PIECE}: cannot remove the GPU labels of ${name}"
  if kubectl_ get node "$name" -o jsonpath='{.spec.taints[*].key}' | tr ' ' '\n' | grep -qx nvidia.com/gpu; then
    kubectl_ taint node "$name" "${TAINT}-" >/dev/null || die "${PIECE}: cannot remove the GPU taint of ${name}"
  fi
  say "${name} is no GPU node any more (its plugin stopped, its GPU labels and taint removed)"
}

addon_install() {
  settings
  check_versions
  need_cluster "$PIECE"
  [[ -x "$BIN" ]] || die "${PIECE}: ${BIN} is not built (hack/cluster/addons/gpu.sh image)"
  local name proc dir before flags_file args=()
  name="$(node_name "$GPU_NODE")" proc="$(node_proc fake-gpu "$GPU_NODE")" dir="$(addon_state "$PIECE")"
  kubectl_ get node "$name" >/dev/null 2>&1 || die "${PIECE}: node ${name} is not in the cluster (kubectl get nodes)"
  before="$(setting node)"
  if [[ -n "$before" && "$before" != "$GPU_NODE" ]]; then unmake_gpu_node "$before"; fi
  mkdir -p "$dir"
  printf 'node=%s\ngpus=%s\nproduct=%s\n' "$GPU_NODE" "$GPUS" "$PRODUCT" >"$SETTINGS"
  # The taint before the devices: no pod without the toleration is placed there meanwhile.
  kubectl_ taint node "$name" "$TAINT" --overwrite >/dev/null || die "${PIECE}: cannot taint ${name} ${TAINT}"
  kubectl_ label node "$name" --overwrite nvidia.com/gpu.present=true "nvidia.com/gpu.product=${PRODUCT}" \
    "nvidia.com/gpu.count=${GPUS}" >/dev/null || die "${PIECE}: cannot label ${name}"
  flags_file="${dir}/$(node_proc flags "$GPU_NODE")"
  # New flags (another count or product, a new binary) take effect: it starts again below.
  if flags | put "$flags_file"; then stop "$proc"; fi
  mapfile -t args <"$flags_file"
  start "$proc" "${args[@]}"
  must_run "$proc" "$ALLOCATABLE_WAIT_S" allocatable_is "$name" "$GPUS"
  say "${name} has ${GPUS} ${RESOURCE} (${PRODUCT}, no GPU behind them), tainted ${TAINT} (log: ${LOG_DIR}/${proc}.log)"
}

# gpu_pod_overrides POD: a restricted busybox pod asking one GPU, with the pipeline's toleration
# and a GPU node selector, that prints its node and the GPU variables of its environment.
gpu_pod_overrides() {
  # shellcheck disable=SC2016  # ${NODE} is the pod's shell's
  local script='echo "NODE=${NODE}"; env | grep -E "^(NVIDIA_VISIBLE_DEVICES|GPUPIPE_FAKE_GPU)=" | sort'
  printf '{"spec":{%s,"nodeSelector":{"nvidia.com/gpu.present":"true"},"tolerations":[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}],"containers":[{"name":"%s","image":"%s","command":["sh","-c",%s],"env":[{"name":"NODE","valueFrom":{"fieldRef":{"fieldPath":"spec.nodeName"}}}],"resources":{"limits":{"%s":"1","cpu":"100m","memory":"32Mi"}},%s}]}}' \
    "$RESTRICTED_POD" "$1" "$BUSYBOX_IMAGE" "$(printf '%s' "$script" | json_string)" "$RESOURCE" "$RESTRICTED_CONTAINER"
}

addon_verify() {
  settings
  need_cluster "$PIECE"
  local name proc have ids out visible pod=gpupipe-verify-gpu
  name="$(node_name "$GPU_NODE")" proc="$(node_proc fake-gpu "$GPU_NODE")"
  [[ -x "$BIN" ]] || die "${PIECE}: ${BIN} is not built (hack/cluster/addons/gpu.sh image)"
  running "$proc" || die "${PIECE}: the device plugin does not run for ${name} (log: ${LOG_DIR}/${proc}.log)"
  have="$(allocatable "$name")"
  [[ "$have" == "$GPUS" ]] || die "${PIECE}: ${name}'s allocatable ${RESOURCE} is '${have}', not ${GPUS}"
  [[ "$(kubectl_ get node "$name" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.product}')" == "$PRODUCT" ]] ||
    die "${PIECE}: ${name} has no label nvidia.com/gpu.product=${PRODUCT}"
  ids="$("$BIN" --print-ids --node "$name" --count "$GPUS")"
  ensure_namespace "$VERIFY_NS"
  out="$(run_pod "$VERIFY_NS" "$pod" "$BUSYBOX_IMAGE" "$(gpu_pod_overrides "$pod")" 120)" ||
    die "${PIECE}: a pod asking one ${RESOURCE} did not run: ${out}"
  kubectl_ delete namespace "$VERIFY_NS" --wait=false >/dev/null 2>&1 || true
  [[ "$out" == *"NODE=${name}"* ]] || die "${PIECE}: the GPU pod ran elsewhere than ${name}: ${out}"
  [[ "$out" == *"GPUPIPE_FAKE_GPU=1"* ]] || die "${PIECE}: the GPU pod's environment has no GPUPIPE_FAKE_GPU=1: ${out}"
  visible="$(sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p' <<<"$out")"
  grep -qxF -- "$visible" <<<"$ids" ||
    die "${PIECE}: the GPU pod's NVIDIA_VISIBLE_DEVICES is '${visible}', not one of ${name}'s devices ($(tr '\n' ' ' <<<"$ids"))"
  say "a pod asking one ${RESOURCE} ran on ${name} with NVIDIA_VISIBLE_DEVICES=${visible}"
}

case "${1:-}" in
verify) addon_verify ;;
flags)
  settings
  flags
  ;;
*) addon_main "$PIECE" "$@" ;;
esac
