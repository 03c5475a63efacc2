#!/usr/bin/env bash
# The test cluster's nodes (sourced by hack/cluster/lib.sh, never run). Node 1 is the host itself,
# as the single-node cluster always was: its kubelet, containerd, kube-proxy and kube-router run in
# the host's network namespace, on the host's address. Nodes 2..N each live in a network
# namespace of their own, gpupipe-node-K, joined to the host by a veth pair (gpn-K on the host,
# eth0 inside):
#
#   node K's address   10.125.K.2 (NODE_LINK_CIDR), the host's end 10.125.K.1, its default route
#   node K's pods      10.123.K.0/24 on its own bridge gpupipe0 inside its namespace; the host
#                      routes that range to 10.125.K.2, so a pod of one node reaches a pod of
#                      another through the host: a routed hop (node B's namespace, the host,
#                      node A's bridge), as between machines, never one shared bridge
#   node K's processes its own containerd (root ${CACHE}/containerd-node-K, socket, state, runc
#                      root, CNI folders), kubelet (root folder, pod log folder, cgroup root
#                      ${CGROUP_ROOT}/node-K, certificates system:node:<name>), kube-proxy and
#                      kube-router, each started in its namespace with nsenter --net (the mount
#                      namespace stays the host's: the kubelet's volume mounts and containerd's
#                      root filesystems must be the same files for both)
#
# Why namespaces and not per-node bridges on the host: each node gets its own iptables, conntrack
# and routing table, so kube-proxy and the NetworkPolicy controller program a node as they would a
# machine, and a node's loss (its processes killed, its link cut) is what a machine's is. With more
# than one node, node 1's pods get 10.123.1.0/24 and its bridge masquerades nothing (a pod's
# address is what the other node's policies see); with one node, everything is as before.
# Images: each containerd has its own metadata and unpacked layers (two containerds cannot share
# one root), but the image blobs of node K are hard links to node 1's (import_image): a second
# node adds no second copy of any image's blobs, only the unpacked layers of its snapshotter.
# shellcheck disable=SC2034  # variables here are used by the scripts that source this file

NODE_LINK_PREFIX="${NODE_LINK_CIDR%.*.*}"
NODES_FILE="${STATE}/node-count"
MAX_NODES=9

# cluster_nodes: how many nodes the cluster has: what cluster-up recorded in the state folder,
# else GPUPIPE_CLUSTER_NODES, else GPUPIPE_CLUSTER_NODES_DEFAULT (make test-cluster and .ci/run:
# 3, a spare for the node-loss test), else 2.
cluster_nodes() {
  local n
  n="$(cat "$NODES_FILE" 2>/dev/null || true)"
  [[ -n "$n" ]] || n="${GPUPIPE_CLUSTER_NODES:-${GPUPIPE_CLUSTER_NODES_DEFAULT:-2}}"
  printf '%s' "$n"
}

# node_name K: node 1 keeps the single node's name; the others are <name>-K.
node_name() {
  if (($1 == 1)); then printf '%s' "$NODE_NAME"; else printf '%s-%s' "$NODE_NAME" "$1"; fi
}
node_netns() { printf 'gpupipe-node-%s' "$1"; }
node_link() { printf 'gpn-%s' "$1"; }
node_addr() {
  if (($1 == 1)); then node_ip; else printf '%s.%s.2' "$NODE_LINK_PREFIX" "$1"; fi
}
node_gateway() { printf '%s.%s.1' "$NODE_LINK_PREFIX" "$1"; }
# node_pod_cidr K: the cluster's whole pod range for a single node (as before), else a /24 each.
node_pod_cidr() {
  if (($1 == 1)) && (($(cluster_nodes) == 1)); then
    printf '%s' "$POD_CIDR"
  else
    printf '%s.%s.0/24' "${POD_CIDR%.*.*}" "$1"
  fi
}
# node_dir K: node K's folder in the state folder (node 1's is the state folder itself).
node_dir() {
  if (($1 == 1)); then printf '%s' "$STATE"; else printf '%s/nodes/%s' "$STATE" "$1"; fi
}
# node_proc NAME K: the name of node K's process NAME (its pid file and log).
node_proc() {
  if (($2 == 1)); then printf '%s' "$1"; else printf '%s-%s' "$1" "$2"; fi
}
node_sock() {
  if (($1 == 1)); then printf '%s' "$CONTAINERD_SOCK"; else printf '%s/containerd-%s.sock' "$RUN_DIR" "$1"; fi
}
node_store() {
  if (($1 == 1)); then printf '%s' "$IMAGE_STORE"; else printf '%s/containerd-node-%s' "$CACHE" "$1"; fi
}
node_cgroup_root() {
  if (($1 == 1)); then printf '%s' "$CGROUP_ROOT"; else printf '%s/node-%s' "$CGROUP_ROOT" "$1"; fi
}

# on_node K COMMAND...: COMMAND in node K's network namespace (node 1: here).
on_node() {
  local k="$1"
  shift
  if ((k == 1)); then "$@"; else nsenter --net="${NETNS_DIR:-/run/netns}/$(node_netns "$k")" "$@"; fi
}

# ctr_on K ARGS...: ctr against node K's containerd.
ctr_on() {
  local k="$1"
  shift
  ctr --address "$(node_sock "$k")" --namespace k8s.io "$@"
}

# node_network K: node K's namespace, its veth to the host with both ends' addresses, its default
# route, the host's route to its pods, and its sysctls. Idempotent.
node_network() {
  local k="$1" ns link gw addr
  ns="$(node_netns "$k")" link="$(node_link "$k")" gw="$(node_gateway "$k")" addr="$(node_addr "$k")"
  [[ -e "${NETNS_DIR}/${ns}" ]] || ip netns add "$ns"
  ip link show "$link" >/dev/null 2>&1 || ip link add "$link" type veth peer name eth0 netns "$ns"
  ip addr replace "${gw}/24" dev "$link"
  ip link set "$link" up
  on_node "$k" ip link set lo up
  on_node "$k" ip addr replace "${addr}/24" dev eth0
  on_node "$k" ip link set eth0 up
  on_node "$k" ip route replace default via "$gw"
  ip route replace "$(node_pod_cidr "$k")" via "$addr" dev "$link"
  on_node "$k" sysctl -qw net.ipv4.ip_forward=1
  on_node "$k" sysctl -qw net.bridge.bridge-nf-call-iptables=1 ||
    cannot "net.bridge.bridge-nf-call-iptables cannot be set in node ${k}'s network namespace: Services would not reach its pods"
}

# NODE_FORWARD_COMMENT: the comment of the host's FORWARD rules that let the nodes' traffic
# through (Docker's FORWARD policy is DROP). It carries the CNI network's name, so that
# cluster-down's remove_our_iptables takes them with the CNI plugins' rules.
NODE_FORWARD_COMMENT='name: "gpupipe" nodes'

# host_forward_nodes: the host forwards to and from the nodes' links (appended: kube-router's
# policy chain, first in FORWARD, still judges each packet for a pod of node 1 before them).
host_forward_nodes() {
  local dir
  for dir in -i -o; do
    iptables -w -C FORWARD "$dir" 'gpn-+' -m comment --comment "$NODE_FORWARD_COMMENT" -j ACCEPT 2>/dev/null ||
      iptables -w -A FORWARD "$dir" 'gpn-+' -m comment --comment "$NODE_FORWARD_COMMENT" -j ACCEPT
  done
}

# link_blobs K: node 1's image blobs hard-linked into node K's content store (those it lacks), so
# that an import there finds each blob present and writes no second copy.
link_blobs() {
  local k="$1" from to
  from="${IMAGE_STORE}/io.containerd.content.v1.content/blobs/sha256"
  to="$(node_store "$k")/io.containerd.content.v1.content/blobs/sha256"
  [[ -d "$from" ]] || return 0
  mkdir -p "$to"
  cp -a -l -n "${from}/." "${to}/" 2>/dev/null || true
}

# node_exec K: the words that start a command in node K's network namespace (none for node 1), for
# `start NAME $(node_exec K) COMMAND...` (a process of its own: setsid runs no shell function).
node_exec() {
  ((${1} == 1)) || printf 'nsenter --net=%s/%s' "${NETNS_DIR:-/run/netns}" "$(node_netns "$1")"
}
