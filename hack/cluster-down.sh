#!/usr/bin/env bash
# Stop every process hack/cluster-up.sh started and remove the cluster's state: pods first (through
# the kubelet, so the CNI tears their networks down), then the host processes, then what is left of
# containers, mounts, network namespaces, iptables chains, the bridge and the pods' cgroups.
# Built binaries and the node's image store (images only) stay in the cache (GPUPIPE_CLUSTER_CACHE).
# Safe to run twice.
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "$0")/cluster/lib.sh"
# shellcheck source=hack/cluster/procs.sh
source "${CLUSTER_HACK}/procs.sh"

[[ -d "$STATE" ]] || { say "no cluster state at ${STATE}: nothing to do"; exit 0; }
refuse_foreign_state
state_is_ours || { say "${STATE} is empty and not a cluster's: nothing to do"; exit 0; }
[[ "$(id -u)" == 0 ]] || die "not root: the cluster's mounts and network need root to remove"
start_s=$SECONDS

stage "pods"
if running kube-apiserver && running kubelet; then
  # No controller may recreate what is deleted, no scheduler place it.
  stop kube-controller-manager
  stop kube-scheduler
  kubectl_ delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  # The kubelet stops the containers and removes each sandbox (CNI DEL) for pods it no longer has.
  wait_for 60 bash -c "[[ -z \"\$(ctr --address '${CONTAINERD_SOCK}' -n k8s.io tasks ls -q 2>/dev/null)\" ]]" ||
    say "pods still running after 60 s: killing their containers"
fi

stage "processes"
for p in kube-router kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do
  stop "$p"
done
# The image store outlives the cluster, its containers must not: a containerd that died with the
# session is started again to remove them (its config is still in the state folder).
if ! running containerd && [[ -f "${STATE}/containerd/config.toml" && -d "$IMAGE_STORE" ]]; then
  start containerd containerd --config "${STATE}/containerd/config.toml"
  wait_for 30 ctr_ version || say "containerd did not start: its containers stay in ${IMAGE_STORE}"
fi
pod_netns=" "
if running containerd; then
  # The network namespaces of this containerd's pod sandboxes, as its records name them.
  for id in $(ctr_ containers ls -q 2>/dev/null); do
    for ns in $(ctr_ containers info "$id" 2>/dev/null | grep -oE '/run/netns/cni-[0-9a-f-]+' || true); do
      pod_netns+="$(basename "$ns") "
    done
  done
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  sleep 1
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
  for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
fi
stop containerd
# Shims of this containerd (their command line names its socket) outlive it by design.
pkill -KILL -f "containerd-shim.*-address ${CONTAINERD_SOCK}" 2>/dev/null || true
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
while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v s="${STATE}/" -v i="${IMAGE_STORE}/" 'index($2, s) == 1 || index($2, i) == 1 {print $2}' /proc/mounts | sort -r)
# The pods' network namespaces: those containerd's records name, those whose eth0 is a veth on
# the cluster's bridge, or holds an address that the cluster's IPAM handed out. Another tool's
# cni-* namespaces stay.
pod_ips=" "
for f in "${STATE}"/cni/ipam/gpupipe/*; do
  if [[ "$(basename "$f")" =~ ^[0-9.]+$ ]]; then pod_ips+="$(basename "$f") "; fi
done
ours_netns() {
  local ns="$1" peer addr
  [[ "$pod_netns" == *" ${ns} "* ]] && return 0
  peer="$(ip netns exec "$ns" ip -o link show eth0 2>/dev/null | sed -n 's/^[0-9]*: eth0@if\([0-9]*\):.*/\1/p')"
  if [[ -n "$peer" ]] && ip -o link show 2>/dev/null | grep -q "^${peer}: .* master gpupipe0 "; then
    return 0
  fi
  addr="$(ip netns exec "$ns" ip -o -4 addr show eth0 2>/dev/null | awk '{print $4}' | cut -d/ -f1)"
  [[ -n "$addr" && "$pod_ips" == *" ${addr} "* ]]
}
for ns in /run/netns/cni-*; do
  [[ -e "$ns" ]] || continue
  if ours_netns "$(basename "$ns")"; then ip netns delete "$(basename "$ns")" 2>/dev/null || true; fi
done
ip link delete gpupipe0 2>/dev/null || true
# iptables: only the cluster's own rules and chains.
# - The CNI plugins' (bridge masquerade, portmap): every rule carries `name: "gpupipe"` in its
#   comment; their CNI-<hash> chains go once empty. The firewall plugin's rules name a pod's
#   address; its shared CNI-FORWARD and CNI-ADMIN chains go only when nothing else is left in them.
# - Kubernetes': kube-proxy --cleanup removes the proxy's; the kubelet's and proxy's fixed chains
#   and the proxy's per-service chains are removed unless another kubelet runs on this host.
# - kube-router's (the network-policy add-on): its KUBE-ROUTER-INPUT/FORWARD/OUTPUT chains and
#   their jumps, its per-pod KUBE-POD-FW-* and per-policy KUBE-NWPLCY-* chains, then its KUBE-SRC-*
#   and KUBE-DST-* ipsets, when this cluster ran it (its add-on folder is in the state folder) and
#   no other kube-router runs on this host. Not `kube-router --cleanup-config`: that also flushes
#   every IPVS service and removes what its router would have made.
#   Another tool's KUBE-* or CNI-* chains stay.
if [[ -x "${BIN_DIR}/kubernetes-${K8S_VERSION}/kube-proxy" ]] && ! pgrep -x kube-proxy >/dev/null; then
  "${BIN_DIR}/kubernetes-${K8S_VERSION}/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
KUBE_CHAINS=" KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT KUBE-PROXY-CANARY KUBE-MARK-MASQ \
KUBE-MARK-DROP KUBE-POSTROUTING KUBE-FORWARD KUBE-SERVICES KUBE-EXTERNAL-SERVICES KUBE-NODEPORTS \
KUBE-PROXY-FIREWALL "
ran_kube_router=0
[[ -d "${STATE}/addons/network-policy" ]] && ! pgrep -x kube-router >/dev/null && ran_kube_router=1
kube_router_chain() {
  [[ "$1" =~ ^KUBE-(ROUTER-(INPUT|FORWARD|OUTPUT)|POD-FW-[A-Z0-9]+|NWPLCY-[A-Z0-9]+)$ ]]
}
kube_chain_ours() {
  if kube_router_chain "$1"; then ((ran_kube_router)); return; fi
  if pgrep -x kubelet >/dev/null; then return 1; fi
  [[ "$KUBE_CHAINS" == *" $1 "* || "$1" =~ ^KUBE-(SVC|SEP|FW|XLB|EXT|SVL)-[A-Z0-9]{16}$ ]]
}
ipt_cleanup() {
  local ipt="$1" table="$2" rule chain
  # Rules: the CNI plugins' (our network's comment), the firewall plugin's for our pods'
  # addresses, and any rule that jumps to one of our chains.
  while read -r rule; do
    eval "$ipt -t $table $rule" 2>/dev/null || true
  done < <("$ipt" -t "$table" -S 2>/dev/null | awk -v ips="$pod_ips" '
    /^-A / {
      ours = index($0, "name: \\\"gpupipe\\\"") > 0
      if (!ours && $2 == "CNI-FORWARD") for (i = 3; i <= NF; i++) if (($i == "-d" || $i == "-s") && index(ips, " " substr($(i+1), 1, index($(i+1), "/") - 1) " ")) ours = 1
      if (ours) { sub(/^-A /, "-D "); print }
    }')
  for _ in 1 2; do # twice: a chain emptied in the first pass may be removable in the second
    while read -r chain; do
      if [[ "$chain" == KUBE-* ]] && ! kube_chain_ours "$chain"; then continue; fi
      if [[ "$chain" == CNI-FORWARD ]]; then
        # The firewall plugin's, shared by every CNI network: only when nothing but its jump to
        # CNI-ADMIN is left, and CNI-ADMIN (the admins' own rules) only when empty and unused.
        ! "$ipt" -t "$table" -S "$chain" 2>/dev/null | grep '^-A' | grep -qv -- '-j CNI-ADMIN$' || continue
      elif [[ "$chain" == CNI-ADMIN ]]; then
        ! "$ipt" -t "$table" -S CNI-FORWARD >/dev/null 2>&1 || continue
        ! "$ipt" -t "$table" -S "$chain" 2>/dev/null | grep -q '^-A' || continue
      elif [[ "$chain" == CNI-* ]]; then
        # A CNI-<hash> chain is ours when its rules are (now none are left: they were deleted).
        [[ " $ours_cni " == *" ${chain} "* ]] || continue
      fi
      while read -r rule; do
        eval "$ipt -t $table $rule" 2>/dev/null || true
      done < <("$ipt" -t "$table" -S 2>/dev/null | grep -E -- "(^-A ${chain} |-j ${chain}( |$))" | sed 's/^-A /-D /')
      "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
    done < <("$ipt" -t "$table" -S 2>/dev/null | sed -n 's/^-N \(\(KUBE\|CNI\)-[^ ]*\)$/\1/p')
  done
}
for ipt in iptables ip6tables; do
  command -v "$ipt" >/dev/null 2>&1 || continue
  for table in nat filter mangle; do
    # The CNI-<hash> chains our network's rules use (before those rules are deleted).
    ours_cni="$("$ipt" -t "$table" -S 2>/dev/null | grep -F 'name: \"gpupipe\"' | grep -oE 'CNI-[0-9a-f]{24}' | sort -u | tr '\n' ' ' || true)"
    ipt_cleanup "$ipt" "$table"
  done
done
# kube-router's ipsets, once no rule refers to them.
if ((ran_kube_router)) && command -v ipset >/dev/null 2>&1; then
  while read -r set; do
    ipset destroy "$set" 2>/dev/null || true
  done < <(ipset list -n 2>/dev/null | grep -E '^KUBE-(SRC|DST)-[A-Z0-9]+$' || true)
fi
while read -r cg; do
  find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
done < <(pod_cgroups)

stage "state"
rm -rf "$STATE"
# The CRI's folders of the containers and sandboxes just removed (hostname, resolv.conf, shm).
rm -rf "${IMAGE_STORE}/io.containerd.grpc.v1.cri/containers" "${IMAGE_STORE}/io.containerd.grpc.v1.cri/sandboxes"
stage ""
printf '==> cluster removed in %d s\n' "$((SECONDS - start_s))"
