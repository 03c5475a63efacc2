#!/usr/bin/env bash
# Stop every process hack/cluster-up.sh started and remove the cluster's state: pods first (through
# the kubelet, so the CNI tears their networks down), then the host processes, then what is left of
# containers, mounts, network namespaces, iptables chains, the bridge and the pods' cgroups: only
# what came after cluster-up's record of the host and is the cluster's by its names, bridge and
# comments (hack/cluster/host.sh). IPVS services are never touched (none is the cluster's).
# Built binaries and the node's image store (images only) stay in the cache (GPUPIPE_CLUSTER_CACHE).
# Safe to run twice.
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "$0")/cluster/lib.sh"
# shellcheck source=hack/cluster/procs.sh
source "${CLUSTER_HACK}/procs.sh"
# shellcheck source=hack/cluster/host.sh
source "${CLUSTER_HACK}/host.sh"

[[ -d "$STATE" ]] || { say "no cluster state at ${STATE}: nothing to do"; exit 0; }
refuse_foreign_state
state_is_ours || { say "${STATE} is empty and not a cluster's: nothing to do"; exit 0; }
[[ "$(id -u)" == 0 ]] || die "not root: the cluster's mounts and network need root to remove"
start_s=$SECONDS
# Every node cluster-up made (hack/cluster/nodes.sh): the count it recorded, and any node's
# network namespace left beside it.
nodes="$(cluster_nodes)"
[[ "$nodes" =~ ^[0-9]+$ ]] && ((nodes >= 1)) || nodes=1
for ns in "${NETNS_DIR}"/gpupipe-node-*; do
  k="${ns##*-}"
  [[ -e "$ns" && "$k" =~ ^[0-9]+$ ]] && ((k > nodes)) && nodes="$k"
done

stage "pods"
if running kube-apiserver && running kubelet; then
  # No controller may recreate what is deleted, no scheduler place it.
  stop kube-controller-manager
  stop kube-scheduler
  kubectl_ delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  # The kubelets stop the containers and remove each sandbox (CNI DEL) for pods they no longer have.
  no_tasks() {
    local k
    for ((k = 1; k <= nodes; k++)); do
      [[ -z "$(ctr_on "$k" tasks ls -q 2>/dev/null)" ]] || return 1
    done
  }
  wait_for 60 no_tasks || say "pods still running after 60 s: killing their containers"
fi

stage "processes"
for ((k = 1; k <= nodes; k++)); do
  # fake-gpu: the GPU add-on's device plugin (hack/cluster/addons/gpu.sh), on its GPU node.
  for p in fake-gpu kube-router kube-proxy kubelet; do stop "$(node_proc "$p" "$k")"; done
done
for p in kube-scheduler kube-controller-manager kube-apiserver etcd; do
  stop "$p"
done
pod_netns=" "
for ((k = 1; k <= nodes; k++)); do
  proc="$(node_proc containerd "$k")" config="$(node_dir "$k")/containerd/config.toml" store="$(node_store "$k")"
  # The image store outlives the cluster, its containers must not: a containerd that died with
  # the session is started again to remove them (its config is still in the state folder), in
  # its node's network namespace while that is there.
  if ! running "$proc" && [[ -f "$config" && -d "$store" ]] &&
    { ((k == 1)) || [[ -e "${NETNS_DIR}/$(node_netns "$k")" ]]; }; then
    # shellcheck disable=SC2046  # node_exec's words are separate arguments
    start "$proc" $(node_exec "$k") containerd --config "$config"
    wait_for 30 ctr_on "$k" version || say "node ${k}'s containerd did not start: its containers stay in ${store}"
  fi
  if running "$proc"; then
    # The network namespaces of this containerd's pod sandboxes, as its records name them.
    for id in $(ctr_on "$k" containers ls -q 2>/dev/null); do
      for ns in $(ctr_on "$k" containers info "$id" 2>/dev/null | grep -oE '/run/netns/cni-[0-9a-f-]+' || true); do
        pod_netns+="$(basename "$ns") "
      done
    done
    for id in $(ctr_on "$k" tasks ls -q 2>/dev/null); do ctr_on "$k" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 1
    for id in $(ctr_on "$k" tasks ls -q 2>/dev/null); do ctr_on "$k" tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_on "$k" containers ls -q 2>/dev/null); do ctr_on "$k" containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  stop "$proc"
  # Shims of this containerd (their command line names its socket) outlive it by design.
  pkill -KILL -f "containerd-shim.*-address $(node_sock "$k")( |$)" 2>/dev/null || true
done
# Anything still inside the pods' cgroups: under the cluster's own cgroup root, never another
# kubelet's /kubepods.
pod_cgroups() {
  local cg
  for cg in /sys/fs/cgroup/*/"${CGROUP_ROOT#/}"; do if [[ -d "$cg" ]]; then echo "$cg"; fi; done
}
while read -r cg; do
  while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done < <(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
done < <(pod_cgroups)

stage "mounts, network, cgroups"
# Deepest first: the kubelet's volumes, containerd's rootfs and sandbox /dev/shm mounts.
while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v s="${STATE}/" -v i="${IMAGE_STORE}/" -v n="${CACHE}/containerd-node-" \
  'index($2, s) == 1 || index($2, i) == 1 || index($2, n) == 1 {print $2}' /proc/mounts | sort -r)
# The pods' network namespaces: those containerd's records name, and those whose eth0 is a veth
# on the cluster's bridge or holds an address the cluster's IPAM handed out (inside its pod range).
# Never one that was there before cluster-up (its record), whatever its address: a podman or CNI
# namespace of another tool stays. Each goes with every mount of it (remove_netns).
POD_IPS=" "
for f in "${STATE}"/cni/ipam/gpupipe/* "${STATE}"/nodes/*/cni/ipam/gpupipe/*; do
  a="$(basename "$f")"
  if [[ "$a" =~ ^[0-9]+(\.[0-9]+){3}$ ]] && cidrs_overlap "$a" "$POD_CIDR"; then POD_IPS+="${a} "; fi
done
ours_netns() {
  local ns="$1" peer addr
  recorded netns "$ns" && return 1
  [[ "$pod_netns" == *" ${ns} "* ]] && return 0
  [[ "$ns" == cni-* ]] || return 1
  peer="$(ip netns exec "$ns" ip -o link show eth0 2>/dev/null | sed -n 's/^[0-9]*: eth0@if\([0-9]*\):.*/\1/p')"
  if [[ -n "$peer" ]] && ip -o link show 2>/dev/null | grep -q "^${peer}: .* master gpupipe0 "; then
    return 0
  fi
  addr="$(ip netns exec "$ns" ip -o -4 addr show eth0 2>/dev/null | awk '{print $4}' | cut -d/ -f1)"
  [[ -n "$addr" && "$POD_IPS" == *" ${addr} "* ]]
}
ours=()
for ns in "${NETNS_DIR}"/*; do
  [[ -e "$ns" ]] || continue
  if ours_netns "$(basename "$ns")"; then ours+=("$(basename "$ns")"); fi
done
((${#ours[@]} == 0)) || remove_netns "${ours[@]}"
left=()
for ns in "${ours[@]}"; do [[ ! -e "${NETNS_DIR}/${ns}" ]] || left+=("$ns"); done
((${#left[@]} == 0)) ||
  say "${#left[@]} of the pods' network namespaces could not be removed (still mounted: grep ${NETNS_DIR} /proc/self/mountinfo): ${left[*]}"
# Nodes 2..N: their network namespaces (their bridges, iptables and the veth to the host go with
# them) and the host's end of each link.
node_ns=()
for ((k = 2; k <= nodes; k++)); do
  ns="$(node_netns "$k")"
  [[ -e "${NETNS_DIR}/${ns}" ]] && ! recorded netns "$ns" && node_ns+=("$ns")
done
((${#node_ns[@]} == 0)) || remove_netns "${node_ns[@]}"
for ((k = 2; k <= nodes; k++)); do ip link delete "$(node_link "$k")" 2>/dev/null || true; done
release_netns_dir
ip link delete gpupipe0 2>/dev/null || true
# iptables: only the cluster's own rules and chains (hack/cluster/host.sh, remove_our_iptables),
# each made after cluster-up's record of the host:
# - The CNI plugins' (bridge masquerade, portmap): every rule carries `name: "gpupipe"` in its
#   comment; their CNI-<hash> chains go with them. The firewall plugin's CNI-FORWARD rules name a
#   pod's address: those of an address the cluster's IPAM handed out; its shared CNI-FORWARD and
#   CNI-ADMIN chains go only when nothing else is left in them.
# - Kubernetes': the kubelet's and kube-proxy's fixed and per-service chains, unless another
#   Kubernetes runs here now (the same names). Not `kube-proxy --cleanup`: it also flushes every
#   IPVS service on the host.
# - kube-router's (the network-policy add-on): its KUBE-ROUTER-INPUT/FORWARD/OUTPUT chains and
#   their jumps, its per-pod KUBE-POD-FW-* and per-policy KUBE-NWPLCY-* chains, then its KUBE-SRC-*
#   and KUBE-DST-* ipsets, when this cluster ran it (its add-on folder is in the state folder) and
#   no other kube-router runs on this host. Not `kube-router --cleanup-config`: that also flushes
#   every IPVS service and removes what its router would have made.
# Another tool's chains, ipsets and IPVS services stay.
RAN_KUBE_ROUTER=0
if [[ -d "${STATE}/addons/network-policy" ]] && ! neighbour_kubernetes_process | grep -q '^kube-router '; then
  RAN_KUBE_ROUTER=1
fi
remove_our_iptables
# kube-router's ipsets, once no rule refers to them.
if ((RAN_KUBE_ROUTER)) && command -v ipset >/dev/null 2>&1; then
  while read -r set; do
    recorded ipsets "$set" || ipset destroy "$set" 2>/dev/null || true
  done < <(ipset list -n 2>/dev/null | grep -E '^KUBE-(SRC|DST)-[A-Z0-9]+$' || true)
fi
while read -r cg; do
  find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
done < <(pod_cgroups)

stage "state"
rm -rf "$STATE"
# The CRI's folders of the containers and sandboxes just removed (hostname, resolv.conf, shm).
for ((k = 1; k <= nodes; k++)); do
  store="$(node_store "$k")"
  rm -rf "${store}/io.containerd.grpc.v1.cri/containers" "${store}/io.containerd.grpc.v1.cri/sandboxes"
done
stage ""
printf '==> cluster removed in %d s\n' "$((SECONDS - start_s))"
