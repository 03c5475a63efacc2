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
#   GPUPIPE_CLUSTER_ADDONS (default "network-policy training-operator jobset trainer object-store
#   mlflow katib kfp kfp-ui": NetworkPolicy enforced, both operators, PyTorchJob and TrainJob,
#   Katib, KFP's backend and its UI; "" for none; trainer needs jobset before it, the store comes
#   before what uses it, and kfp before kfp-ui; network-policy first, so that every pod starts
#   under the policies: docs/test-cluster.md).
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "$0")/cluster/lib.sh"
# shellcheck source=hack/cluster/procs.sh
source "${CLUSTER_HACK}/procs.sh"
# shellcheck source=hack/cluster/host.sh
source "${CLUSTER_HACK}/host.sh"

build_only=0
case "${1:-}" in
"") ;;
--build-only) build_only=1 ;;
*) die "unknown argument '${1}' (usage: hack/cluster-up.sh [--build-only])" ;;
esac
addons="${GPUPIPE_CLUSTER_ADDONS-network-policy training-operator jobset trainer object-store mlflow katib kfp kfp-ui}"
total_start=$SECONDS
MIN_FREE_GIB="${GPUPIPE_MIN_FREE_GIB:-12}"
K8S_BIN="${BIN_DIR}/kubernetes-${K8S_VERSION}"

stage "preflight"
refuse_foreign_state
# How many nodes (hack/cluster/nodes.sh): GPUPIPE_CLUSTER_NODES (make cluster-up NODES=N), else what
# the running cluster recorded, else 1.
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
# too. Refuse, saying so, rather than fail the cluster tests one upload at a time.
disk="$STATE"
while [[ ! -d "$disk" ]]; do disk="$(dirname "$disk")"; done
free_gib="$(df --output=avail -BG "$disk" | tail -n 1 | tr -dc '0-9')"
((free_gib >= MIN_FREE_GIB)) ||
  cannot "only ${free_gib} GiB free under ${STATE}: the test cluster needs ${MIN_FREE_GIB} GiB (GPUPIPE_MIN_FREE_GIB; its object store stops taking writes when the disk runs short)"
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
  --profiling=false --event-ttl 2h
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
  --leader-elect=false --bind-address 127.0.0.1 --profiling=false
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
# node_containerd K: node K's network (nodes 2..N), CNI configuration and containerd.
node_containerd() {
  local k="$1" dir sock proc masq=true runc_root=""
  dir="$(node_dir "$k")" sock="$(node_sock "$k")" proc="$(node_proc containerd "$k")"
  ((k == 1)) || node_network "$k"
  # Several nodes: a pod's own address crosses to the other nodes (their policies judge it).
  ((nodes == 1)) || masq=false
  mkdir -p "${dir}/cni/net.d" "${dir}/containerd"
  put "${dir}/cni/net.d/10-gpupipe.conflist" <<CNI || true
{
  "cniVersion": "1.0.0",
  "name": "gpupipe",
  "plugins": [
    {"type": "bridge", "bridge": "gpupipe0", "isGateway": true, "ipMasq": ${masq}, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$(node_pod_cidr "$k")"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "${dir}/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall"}
  ]
}
CNI
  # Nodes 2..N: runc's state of their own (node 1 keeps containerd's default, as before).
  ((k == 1)) || runc_root="
      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]
        Root = \"${RUN_DIR}/runc-${k}\""
  if put "${dir}/containerd/config.toml" <<TOML; then
version = 2
root = "$(node_store "$k")"
state = "${RUN_DIR}/$(node_proc containerd "$k")"
oom_score = 0
[grpc]
  address = "${sock}"
[ttrpc]
  address = "${sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  # This VM lacks CAP_SYS_RESOURCE: a score below containerd's own cannot be set, so clamp it.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"${runc_root}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "${dir}/cni/net.d"
TOML
    stop "$proc" # a changed config takes effect: it starts again below
  fi
  # shellcheck disable=SC2046  # node_exec's words are separate arguments
  start "$proc" $(node_exec "$k") containerd --config "${dir}/containerd/config.toml"
  must_run "$proc" 30 ctr_on "$k" version
}
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
# node_kubelet K: node K's kubelet. The pods' cgroups live under a root of the cluster's own
# (CGROUP_ROOT/kubepods in every v1 hierarchy; node K's under CGROUP_ROOT/node-K), so that
# cluster-down removes only those, never another kubelet's /kubepods. The kubelet wants the root
# to exist; cpuset needs its cpus and mems before a task can join.
node_kubelet() {
  local k="$1" dir cg_root hierarchy f parent proc pki_node pki_kubelet logs_line=""
  dir="$(node_dir "$k")" cg_root="$(node_cgroup_root "$k")" proc="$(node_proc kubelet "$k")"
  pki_node=node pki_kubelet=kubelet
  if ((k > 1)); then
    pki_node="node-${k}" pki_kubelet="kubelet-${k}"
    # Its own pods' log folder: a kubelet removes the folders there of pods it does not know.
    logs_line="podLogsDir: ${dir}/pod-logs"
    mkdir -p "${dir}/pod-logs"
  fi
  mkdir -p "${dir}/kubelet"
  for hierarchy in /sys/fs/cgroup/*/; do
    [[ "$hierarchy" == */unified/ ]] && continue
    mkdir -p "${hierarchy}${cg_root#/}" 2>/dev/null || true
  done
  parent=/sys/fs/cgroup/cpuset
  for part in ${cg_root//\// }; do
    parent+="/${part}"
    for f in cpuset.cpus cpuset.mems; do
      [[ -d "$parent" && -z "$(cat "${parent}/${f}" 2>/dev/null)" ]] && cat "$(dirname "$parent")/${f}" >"${parent}/${f}"
    done
  done
  if put "${dir}/kubelet/config.yaml" <<YAML; then
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${PKI}/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: ${PKI}/${pki_kubelet}.crt
tlsPrivateKeyFile: ${PKI}/${pki_kubelet}.key
# The node's address only (the API server reaches the kubelet there), not every interface.
address: $(node_addr "$k")
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
containerRuntimeEndpoint: unix://$(node_sock "$k")
cgroupDriver: cgroupfs
cgroupRoot: ${cg_root}
failCgroupV1: false
failSwapOn: false
clusterDNS: [${CLUSTER_DNS}]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
# A busy test disk must neither evict pods nor delete the imported (unpullable) images.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
# A pod's mounted Secrets are refreshed on its sync (default every minute): the operators' webhook
# certificates, which they write into a Secret after start, are served within 10 s instead.
syncFrequency: 10s
${logs_line}
YAML
    stop "$proc" # a changed config takes effect: it starts again below
  fi
  # --oom-score-adj: the kubelet would lower its own score to -999, which this VM refuses.
  # shellcheck disable=SC2046  # node_exec's words are separate arguments
  start "$proc" $(node_exec "$k") "${K8S_BIN}/kubelet" --config "${dir}/kubelet/config.yaml" \
    --kubeconfig "${PKI}/${pki_node}.kubeconfig" --root-dir "${dir}/kubelet" \
    --hostname-override "$(node_name "$k")" --node-ip "$(node_addr "$k")" --oom-score-adj 0
}
node_ready() { kubectl_ get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
for ((k = 1; k <= nodes; k++)); do node_kubelet "$k"; done
for ((k = 1; k <= nodes; k++)); do must_run "$(node_proc kubelet "$k")" 90 node_ready "$(node_name "$k")"; done

stage "kube-proxy"
# node_proxy K: node K's kube-proxy, in its network namespace (its iptables are the node's).
node_proxy() {
  local k="$1" dir proc
  dir="$(node_dir "$k")/kube-proxy" proc="$(node_proc kube-proxy "$k")"
  mkdir -p "$dir"
  if put "${dir}/config.yaml" <<YAML; then
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: ${PKI}/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: ${POD_CIDR}
hostnameOverride: $(node_name "$k")
bindAddress: $(node_addr "$k")
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
oomScoreAdj: 0
# Zero: keep the host's conntrack settings (this VM may refuse to change them).
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
    stop "$proc" # a changed config takes effect: it starts again below
  fi
  # shellcheck disable=SC2046  # node_exec's words are separate arguments
  start "$proc" $(node_exec "$k") "${K8S_BIN}/kube-proxy" --config "${dir}/config.yaml"
  must_run "$proc" 30 on_node "$k" curl -sf http://127.0.0.1:10256/healthz
}
for ((k = 1; k <= nodes; k++)); do node_proxy "$k"; done

stage "coredns"
sed -e "s|@IMAGE@|${COREDNS_IMAGE}|g" -e "s|@CLUSTER_DNS@|${CLUSTER_DNS}|g" \
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
