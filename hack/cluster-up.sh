#!/usr/bin/env bash
# A single-node Kubernetes cluster as host processes, the way Kubernetes' own
# hack/local-up-cluster.sh runs one: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# containerd (a separate instance from Docker's) with CNI, kubelet, kube-proxy, and CoreDNS in the
# cluster; then the add-ons (hack/cluster/addons/*.sh). Everything is built here from upstream
# (hack/cluster/build.sh) and cached by version, so a second run builds nothing.
# Idempotent: pieces already running are kept. Prints each stage with its time; the last line is
# `export KUBECONFIG=<file>`. A piece that cannot run here ends it with one line and exit 3.
# --build-only: build the binaries and the add-on images, start nothing (.ci/run runs it in the
# background while the other tests run, so that a machine with nothing cached builds in parallel).
# Environment: GPUPIPE_CLUSTER_DIR, GPUPIPE_CLUSTER_CACHE (hack/cluster/lib.sh),
#   GPUPIPE_CLUSTER_ADDONS (default "network-policy training-operator jobset trainer kueue
#   object-store mlflow katib kfp kfp-ui": NetworkPolicy enforced, both operators, PyTorchJob
#   and TrainJob, Kueue's queues, Katib, KFP's backend and its UI; "gpu" adds a GPU node's device
#   plugin; "" for none; trainer needs jobset before it, kueue both operators, the store comes
#   before what uses it, and kfp before kfp-ui; network-policy first, so that every pod starts
#   under the policies: docs/test-cluster.md).
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "$0")/cluster/lib.sh"
# shellcheck source=hack/cluster/procs.sh
source "${CLUSTER_HACK}/procs.sh"
# shellcheck source=hack/cluster/host.sh
source "${CLUSTER_HACK}/host.sh"
# shellcheck source=hack/cluster/node-up.sh
source "${CLUSTER_HACK}/node-up.sh"

build_only=0
case "${1:-}" in
"") ;;
--build-only) build_only=1 ;;
*) die "unknown argument '${1}' (usage: hack/cluster-up.sh [--build-only])" ;;
esac
addons="${GPUPIPE_CLUSTER_ADDONS-network-policy training-operator jobset trainer kueue object-store mlflow katib kfp kfp-ui}"
total_start=$SECONDS
MIN_FREE_GIB="${GPUPIPE_MIN_FREE_GIB:-12}"

stage "preflight"
refuse_foreign_state
# How many nodes (hack/cluster/nodes.sh): GPUPIPE_CLUSTER_NODES (make cluster-up NODES=N), else what
# the running cluster recorded, else GPUPIPE_CLUSTER_NODES_DEFAULT, else 2.
nodes="${GPUPIPE_CLUSTER_NODES:-$(cluster_nodes)}"
if ! [[ "$nodes" =~ ^[0-9]+$ ]] || ((nodes < 1 || nodes > MAX_NODES)); then
  die "GPUPIPE_CLUSTER_NODES=${nodes}: the number of nodes must be a whole number from 1 to ${MAX_NODES}"
fi
if [[ -f "$NODES_FILE" && "$(cat "$NODES_FILE")" != "$nodes" ]] && running kube-apiserver; then
  die "the cluster runs with $(cat "$NODES_FILE") node(s), not ${nodes}: make cluster-down first to change NODES (node 1's pod range depends on the count)"
fi
export GPUPIPE_CLUSTER_NODES="$nodes"
((nodes == 1)) || command -v nsenter >/dev/null 2>&1 || cannot "nsenter (util-linux) is not installed: nodes 2..${nodes} run in network namespaces of their own"
cgroup_fs="${GPUPIPE_CGROUP_FS:-/sys/fs/cgroup}"
case "$(cgroup_layout "$cgroup_fs")" in
  v1) ;;
  v2) cannot "cgroup v2 (the unified hierarchy at ${cgroup_fs}): the test cluster's scripts handle cgroup v1 only (the pods' cgroup root and its teardown); use a machine with cgroup v1" ;;
  *) cannot "no cpu, memory and pids cgroup controllers mounted under ${cgroup_fs}: kubelet cannot run pods" ;;
esac
# The object store (SeaweedFS) sizes its volume count by the free space of this filesystem and
# stops taking writes when it runs short ("No writable volumes and no free volumes left", seen
# with 8 GB free while other builds wrote beside it); the node's images and pods' logs live here
# too. Refuse, saying so, rather than fail the cluster tests one upload at a time. Not over a
# cluster that runs: its object store sized its volumes when it started, and its own images, logs
# and volumes are what fills the disk since (a second cluster-up over a cluster that ran the
# tests met 11 GiB free in CI and refused).
disk="$STATE"
while [[ ! -d "$disk" ]]; do disk="$(dirname "$disk")"; done
free_gib="$(df --output=avail -BG "$disk" | tail -n 1 | tr -dc '0-9')"
if ((free_gib < MIN_FREE_GIB)); then
  running kube-apiserver ||
    cannot "only ${free_gib} GiB free under ${STATE}: the test cluster needs ${MIN_FREE_GIB} GiB (GPUPIPE_MIN_FREE_GIB; its object store stops taking writes when the disk runs short)"
  say "only ${free_gib} GiB free under ${STATE}, the cluster already runs: going on (the ${MIN_FREE_GIB} GiB are checked when it starts)"
fi
[[ "$(id -u)" == 0 ]] || cannot "not root: kubelet and containerd need root (mounts, cgroups, network namespaces)"
command -v go >/dev/null 2>&1 || cannot "Go is not installed: the cluster is built from Go modules"
missing=()
for pair in containerd:containerd runc:runc iptables:iptables conntrack:conntrack busybox:busybox-static \
  openssl:openssl ipset:ipset ipvsadm:ipvsadm; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
[[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
if ((${#missing[@]})); then
  say "apt-get install ${missing[*]}"
  "$(dirname "$0")/apt-install.sh" "${missing[@]}" ||
    cannot "could not install ${missing[*]} with apt-get"
fi
# Not beside another Kubernetes in this network namespace, nor on a range a route here has
# (hack/cluster/host.sh): one line, and nothing made yet.
refuse_neighbour_network
"$(dirname "$0")/docker-up.sh" >/dev/null || cannot "no Docker engine: the node's images are built with it"
node_ip="$(node_ip)"
[[ -n "$node_ip" ]] || cannot "this machine has no IPv4 default route: pods need the node's address"
fresh=1
if running kubelet || running kube-proxy || ip link show gpupipe0 >/dev/null 2>&1; then fresh=0; fi
mkdir -p "$STATE" "$RUN_DIR" "$LOG_DIR"
# Owner-only: the cluster's keys, kubeconfig, databases and volumes are root's alone.
chmod 0700 "$STATE"
printf '%s\n' "$nodes" >"$NODES_FILE"
# What this network namespace had before the cluster, so that cluster-down removes only what came
# after. Once, before anything of the cluster's is made (not over a cluster that runs).
if ((fresh)); then
  record_host
elif [[ ! -d "$HOST_RECORD" ]]; then
  say "no record of the host before this cluster (${HOST_RECORD}): cluster-down goes by names, bridge and comments alone"
fi
claim_cache
[[ -f "$MARKER" ]] || printf 'made by gpupipe hack/cluster-up.sh; make cluster-down removes this folder\n' >"$MARKER"

stage "build binaries"
"${CLUSTER_HACK}/build.sh"

stage "build images"
"${CLUSTER_HACK}/node-images.sh" build
for a in $addons; do "${CLUSTER_HACK}/addons/${a}.sh" image; done
if ((build_only)); then
  stage ""
  say "built the binaries and the add-on images in $((SECONDS - total_start)) s (--build-only: no cluster started)"
  exit 0
fi
# The trainer's CPU image (seconds when nothing changed). The node has no GPU: the CUDA image's
# name points at the CPU image inside the node, so the compiled pipeline (whose train step names
# the CUDA image) runs unchanged, as on kind (hack/kind-up.sh).
[[ "${GPUPIPE_SKIP_IMAGE_BUILD:-0}" == 1 ]] || "$(dirname "$0")/build-images.sh" cpu >"${LOG_DIR}/build-images.log" 2>&1 ||
  die "building the trainer's CPU image failed (log: ${LOG_DIR}/build-images.log)"
cpu_image="$("$(dirname "$0")/build-images.sh" --print cpu)"
cuda_image="$("$(dirname "$0")/build-images.sh" --print cuda)"

stage "certificates"
"${CLUSTER_HACK}/pki.sh" "${NODE_NAME}" "$node_ip"

stage "etcd"
start etcd "${BIN_DIR}/etcd-${ETCD_VERSION}/etcd" --name "${NODE_NAME}" --data-dir "${STATE}/etcd" \
  --listen-client-urls https://127.0.0.1:2379 --advertise-client-urls https://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster "${NODE_NAME}=http://127.0.0.1:2380" \
  --listen-metrics-urls http://127.0.0.1:2381 \
  --cert-file "${PKI}/etcd.crt" --key-file "${PKI}/etcd.key" \
  --client-cert-auth --trusted-ca-file "${PKI}/ca.crt" --quota-backend-bytes 2147483648
must_run etcd 30 curl -sf http://127.0.0.1:2381/health

# Several nodes: a lost node's pods are evicted within a minute, not the upstream five
# (tolerations of not-ready and unreachable 30 s instead of 300 s, the node declared lost after
# 20 s without a heartbeat instead of 50 s), so that the node-loss tests see the Training
# Operator and JobSet restart a job in test time. One node keeps upstream's defaults: there,
# a NotReady node (a busy machine's late heartbeat) must not evict anything.
apiserver_extra=() controller_extra=()
if ((nodes > 1)); then
  apiserver_extra=(--default-not-ready-toleration-seconds 30 --default-unreachable-toleration-seconds 30)
  controller_extra=(--node-monitor-grace-period 20s)
fi

stage "kube-apiserver"
start kube-apiserver "${K8S_BIN}/kube-apiserver" \
  --advertise-address "$node_ip" --bind-address "$node_ip" --secure-port 6443 \
  --etcd-servers https://127.0.0.1:2379 --etcd-cafile "${PKI}/ca.crt" \
  --etcd-certfile "${PKI}/apiserver-etcd-client.crt" --etcd-keyfile "${PKI}/apiserver-etcd-client.key" \
  --tls-cert-file "${PKI}/apiserver.crt" --tls-private-key-file "${PKI}/apiserver.key" \
  --client-ca-file "${PKI}/ca.crt" \
  --kubelet-client-certificate "${PKI}/apiserver-kubelet-client.crt" \
  --kubelet-client-key "${PKI}/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "${PKI}/ca.crt" --kubelet-preferred-address-types InternalIP \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "${PKI}/sa.pub" --service-account-signing-key-file "${PKI}/sa.key" \
  --service-cluster-ip-range "${SERVICE_CIDR}" \
  --authorization-mode Node,RBAC --anonymous-auth=false \
  --enable-admission-plugins NodeRestriction \
  --allow-privileged=true --enable-aggregator-routing=true \
  --profiling=false --event-ttl 2h "${apiserver_extra[@]}"
must_run kube-apiserver 90 kubectl_ get --raw /readyz

stage "controller-manager, scheduler"
start kube-controller-manager "${K8S_BIN}/kube-controller-manager" \
  --kubeconfig "${PKI}/controller-manager.kubeconfig" \
  --authentication-kubeconfig "${PKI}/controller-manager.kubeconfig" \
  --authorization-kubeconfig "${PKI}/controller-manager.kubeconfig" \
  --use-service-account-credentials --root-ca-file "${PKI}/ca.crt" \
  --service-account-private-key-file "${PKI}/sa.key" \
  --cluster-signing-cert-file "${PKI}/ca.crt" --cluster-signing-key-file "${PKI}/ca.key" \
  --service-cluster-ip-range "${SERVICE_CIDR}" --cluster-cidr "${POD_CIDR}" \
  --leader-elect=false --bind-address 127.0.0.1 --profiling=false "${controller_extra[@]}"
start kube-scheduler "${K8S_BIN}/kube-scheduler" --kubeconfig "${PKI}/scheduler.kubeconfig" \
  --authentication-kubeconfig "${PKI}/scheduler.kubeconfig" \
  --authorization-kubeconfig "${PKI}/scheduler.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1 --profiling=false
must_run kube-controller-manager 60 curl -skf https://127.0.0.1:10257/healthz
must_run kube-scheduler 60 curl -skf https://127.0.0.1:10259/healthz

stage "containerd"
sysctl -qw net.ipv4.ip_forward=1
[[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] || modprobe br_netfilter 2>/dev/null || true
sysctl -qw net.bridge.bridge-nf-call-iptables=1 ||
  cannot "net.bridge.bridge-nf-call-iptables cannot be set: Services would not reach pods on the node's bridge"
# Before the first pod's network namespace is mounted there (hack/cluster/host.sh).
shared_netns_dir
((nodes == 1)) || host_forward_nodes
for ((k = 1; k <= nodes; k++)); do node_containerd "$k"; done

stage "import images"
for tag in $("${CLUSTER_HACK}/node-images.sh" tags); do import_image "$tag"; done
for a in $addons; do
  for tag in $("${CLUSTER_HACK}/addons/${a}.sh" images); do import_image "$tag"; done
done
import_image "$cpu_image"
for ((k = 1; k <= nodes; k++)); do
  ctr_on "$k" images tag --force "$cpu_image" "$cuda_image" >/dev/null
  ctr_on "$k" images label "$cuda_image" io.cri-containerd.pinned=pinned >/dev/null
done

stage "kubelet"
for ((k = 1; k <= nodes; k++)); do node_kubelet "$k"; done
for ((k = 1; k <= nodes; k++)); do must_run "$(node_proc kubelet "$k")" 90 node_ready "$(node_name "$k")"; done

stage "kube-proxy"
for ((k = 1; k <= nodes; k++)); do node_proxy "$k"; done

stage "coredns"
sed -e "s|@IMAGE@|${COREDNS_IMAGE}|g" -e "s|@CLUSTER_DNS@|${CLUSTER_DNS}|g" -e "s|@NODE@|${NODE_NAME}|g" \
  "${CLUSTER_HACK}/coredns.yaml" | kubectl_ apply -f - >/dev/null
kubectl_ -n kube-system rollout status deployment/coredns --timeout 120s >/dev/null ||
  die "CoreDNS did not become ready (kubectl -n kube-system describe pod -l k8s-app=kube-dns)"

for a in $addons; do
  stage "add-on ${a}"
  "${CLUSTER_HACK}/addons/${a}.sh" install
done

stage ""
rm -f "$UNAVAILABLE_FILE"
printf '==> cluster ready in %d s (state: %s)\n' "$((SECONDS - total_start))" "$STATE"
echo "export KUBECONFIG=${KUBECONFIG_ADMIN}"
if [[ " $addons " == *" kfp "* ]]; then
  # README.md's block for this cluster, as written there (a cluster test runs the same lines).
  echo "The pipeline on this cluster (README.md, \"On the test cluster\"):"
  sed -n '/^<!-- test-cluster-demo/,/^```$/p' "${REPO_ROOT}/README.md" | sed -e '1,2d' -e '$d' -e 's/^/  /'
fi
