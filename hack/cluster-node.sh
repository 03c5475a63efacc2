#!/usr/bin/env bash
# A node of the test cluster lost and brought back, for the node-loss tests (issue 63):
#   stop K    power lost: node K's end of its link goes down (nothing it sent or was sent
#             arrives any more: packets to its address and its pods die on the host's end, as
#             at a dead machine's switch port), then its kubelet, containerd, kube-proxy and kube-router,
#             its GPU device plugin (a GPU node's: hack/cluster/addons/gpu.sh), its containers'
#             shims and every process in its pods' cgroups are killed (SIGKILL): nothing is
#             cleaned up, as on a machine whose power went
#   start K   power back: the link up, then its containerd, kubelet, kube-proxy and kube-router
#             started again, and on the GPU node its device plugin (its containers are gone, as
#             after a reboot; the kubelet finds its pods' sandboxes dead and the API server's view
#             of them)
#   cut K     a network partition: its end of the link down, its processes left running
#   heal K    the link up again
# Never the host's end: with it down, the host's route to the node goes, and packets for the
# node's address take the host's default route out of the machine (seen: something there
# answered the API server's TLS on 10.125.2.2:10250).
# Node 1 is the host, where the control plane runs: K is one of nodes 2..N (make cluster-up
# NODES=N). Each verb prints one line; a bad verb or node is one line and exit 2.
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "$0")/cluster/lib.sh"
# shellcheck source=hack/cluster/procs.sh
source "${CLUSTER_HACK}/procs.sh"
# shellcheck source=hack/cluster/host.sh
source "${CLUSTER_HACK}/host.sh"
# shellcheck source=hack/cluster/node-up.sh
source "${CLUSTER_HACK}/node-up.sh"

usage="usage: hack/cluster-node.sh stop|start|cut|heal K (K: a node from 2 to the cluster's count)"
verb="${1:-}" k="${2:-}"
bad() {
  printf 'error: cluster-node: %s\n' "$*" >&2
  exit 2
}
case "$verb" in stop | start | cut | heal) ;; *) bad "unknown verb '${verb}' (${usage})" ;; esac
[[ -f "$KUBECONFIG_ADMIN" ]] || bad "no test cluster here (${STATE}): make cluster-up NODES=2"
nodes="$(cluster_nodes)"
if ! [[ "$k" =~ ^[0-9]+$ ]] || ((k < 2 || k > nodes)); then
  bad "node '${k}' is not one of the cluster's nodes 2..${nodes} (node 1 is the host, where the control plane runs; ${usage})"
fi
link="$(node_link "$k")" name="$(node_name "$k")"

case "$verb" in
cut)
  on_node "$k" ip link set eth0 down
  say "${name}: its link ${link} is down; its processes run on"
  ;;
heal)
  on_node "$k" ip link set eth0 up
  on_node "$k" ip route replace default via "$(node_gateway "$k")"
  say "${name}: its link ${link} is up"
  ;;
stop)
  on_node "$k" ip link set eth0 down
  for p in kubelet containerd kube-proxy kube-router fake-gpu; do
    pid="$(cat "${RUN_DIR}/$(node_proc "$p" "$k").pid" 2>/dev/null || true)"
    [[ -n "$pid" ]] && ours "$pid" && kill -KILL "$pid" 2>/dev/null || true
  done
  pkill -KILL -f "containerd-shim.*-address $(node_sock "$k")( |$)" 2>/dev/null || true
  killed=0
  for cg in /sys/fs/cgroup/*/"$(node_cgroup_root "$k" | sed 's|^/||')"; do
    [[ -d "$cg" ]] || continue
    while read -r pid; do
      kill -KILL "$pid" 2>/dev/null && killed=$((killed + 1))
    done < <(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
  done
  say "${name}: power lost (its link down; kubelet, containerd, kube-proxy, kube-router and ${killed} processes of its pods killed)"
  ;;
start)
  on_node "$k" ip link set eth0 up
  on_node "$k" ip route replace default via "$(node_gateway "$k")"
  node_containerd "$k"
  node_kubelet "$k"
  must_run "$(node_proc kubelet "$k")" 90 node_ready "$name"
  node_proxy "$k"
  if [[ -d "${STATE}/addons/network-policy" ]]; then
    "${CLUSTER_HACK}/addons/network-policy.sh" install >/dev/null
  fi
  # The GPU node (the one gpu.sh's install recorded): its device plugin, and its N devices back in
  # the node's allocatable.
  if [[ "$(sed -n 's/^node=//p' "${STATE}/addons/gpu/settings" 2>/dev/null || true)" == "$k" ]]; then
    GPUPIPE_CLUSTER_GPU_NODE="$k" "${CLUSTER_HACK}/addons/gpu.sh" install >/dev/null
  fi
  say "${name}: power back (containerd, kubelet, kube-proxy and kube-router run; the node is Ready)"
  ;;
esac
