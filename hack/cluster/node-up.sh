#!/usr/bin/env bash
# Start a node's processes (sourced by hack/cluster-up.sh and hack/cluster-node.sh, after lib.sh,
# procs.sh and host.sh, never run): node_containerd K (its network for nodes 2..N, its CNI
# configuration, its containerd), node_kubelet K, node_proxy K (hack/cluster/nodes.sh names
# each node's folders, sockets and addresses). Each is idempotent: a process that runs with an
# unchanged configuration is kept.

K8S_BIN="${BIN_DIR}/kubernetes-${K8S_VERSION}"

# node_containerd K: node K's network (nodes 2..N), CNI configuration and containerd.
node_containerd() {
  local k="$1" dir sock proc masq=true runc_root=""
  dir="$(node_dir "$k")" sock="$(node_sock "$k")" proc="$(node_proc containerd "$k")"
  ((k == 1)) || node_network "$k"
  # Several nodes: a pod's own address crosses to the other nodes (their policies judge it).
  (($(cluster_nodes) == 1)) || masq=false
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
