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
for p in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$p"; done
# The image store outlives the cluster, its containers must not: a containerd that died with the
# session is started again to remove them (its config is still in the state folder).
if ! running containerd && [[ -f "${STATE}/containerd/config.toml" && -d "$IMAGE_STORE" ]]; then
  start containerd containerd --config "${STATE}/containerd/config.toml"
  wait_for 30 ctr_ version || say "containerd did not start: its containers stay in ${IMAGE_STORE}"
fi
if running containerd; then
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  sleep 1
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
  for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
fi
stop containerd
# Shims of this containerd (their command line names its socket) outlive it by design.
pkill -KILL -f "containerd-shim.*-address ${CONTAINERD_SOCK}" 2>/dev/null || true
# Anything still inside the pods' cgroups.
for cg in /sys/fs/cgroup/*/kubepods; do
  [[ -d "$cg" ]] || continue
  while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done < <(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
done

stage "mounts, network, cgroups"
# Deepest first: the kubelet's volumes, containerd's rootfs and sandbox /dev/shm mounts.
while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v s="${STATE}/" -v i="${IMAGE_STORE}/" 'index($2, s) == 1 || index($2, i) == 1 {print $2}' /proc/mounts | sort -r)
for ns in /run/netns/cni-*; do
  [[ -e "$ns" ]] && ip netns delete "$(basename "$ns")" 2>/dev/null || true
done
ip link delete gpupipe0 2>/dev/null || true
if [[ -x "${BIN_DIR}/kubernetes-${K8S_VERSION}/kube-proxy" ]]; then
  "${BIN_DIR}/kubernetes-${K8S_VERSION}/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
# What kube-proxy --cleanup leaves: the kubelet's own chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
# KUBE-IPTABLES-HINT) and the CNI plugins' (bridge masquerade, firewall, portmap) of pods that no
# CNI DEL tore down. Only Kubernetes and CNI name chains KUBE-* and CNI-*.
for ipt in iptables ip6tables; do
  command -v "$ipt" >/dev/null 2>&1 || continue
  for table in nat filter mangle; do
    while read -r rule; do
      eval "$ipt -t $table $rule" 2>/dev/null || true
    done < <("$ipt" -t "$table" -S 2>/dev/null | sed -n 's/^-A \(.*\(KUBE\|CNI\)-.*\)$/-D \1/p')
    while read -r chain; do
      "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
    done < <("$ipt" -t "$table" -S 2>/dev/null | sed -n 's/^-N \(\(KUBE\|CNI\)-[^ ]*\)$/\1/p')
  done
done
for cg in /sys/fs/cgroup/*/kubepods; do
  [[ -d "$cg" ]] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
done

stage "state"
rm -rf "$STATE"
# The CRI's folders of the containers and sandboxes just removed (hostname, resolv.conf, shm).
rm -rf "${IMAGE_STORE}/io.containerd.grpc.v1.cri/containers" "${IMAGE_STORE}/io.containerd.grpc.v1.cri/sandboxes"
stage ""
printf '==> cluster removed in %d s\n' "$((SECONDS - start_s))"
