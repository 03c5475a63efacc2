#!/usr/bin/env bash
# Shared settings and helpers of the test cluster scripts (sourced, never run).
# Paths (override by environment):
#   GPUPIPE_CLUSTER_DIR    state of the running cluster: certs, etcd, containerd, kubelet, logs
#                          (default /var/lib/gpupipe-cluster; removed by `make cluster-down`)
#   GPUPIPE_CLUSTER_CACHE  built binaries (keyed by version) and the node's image store; kept
#                          across cluster-down so a second cluster-up builds and imports nothing
#                          (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpupipe-cluster)
# shellcheck disable=SC2034  # variables here are used by the scripts that source this file

CLUSTER_HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${CLUSTER_HACK}/../.." && pwd)"
# shellcheck source=hack/cluster/versions.env
source "${CLUSTER_HACK}/versions.env"

STATE="${GPUPIPE_CLUSTER_DIR:-/var/lib/gpupipe-cluster}"
CACHE="${GPUPIPE_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpupipe-cluster}"
RUN_DIR="${STATE}/run"           # pid files and sockets
LOG_DIR="${STATE}/logs"
PKI="${STATE}/pki"
KUBECONFIG_ADMIN="${STATE}/kubeconfig"
CONTAINERD_SOCK="${RUN_DIR}/containerd.sock"
BIN_DIR="${CACHE}/bin"           # <name>-<version>/<binary>
# containerd's root: the node's images and their unpacked layers. It outlives the cluster (the
# 1.4 GB trainer image takes over a minute to import); cluster-down removes every container from
# it, so only images are left.
IMAGE_STORE="${CACHE}/containerd"
CGROUP_ROOT=/gpupipe-test-cluster   # the kubelet's cgroupRoot: the pods' cgroups, nobody else's
MARKER="${STATE}/.gpupipe-test-cluster"  # cluster-up's own: cluster-down removes no folder without it

# Time each stage: `stage NAME` starts one and closes the one before with its duration.
_stage_name=""
_stage_start=0
stage() {
  local now=$SECONDS
  if [[ -n "${_stage_name}" ]]; then
    printf '==> %-28s %4d s\n' "${_stage_name}" "$((now - _stage_start))"
  fi
  _stage_name="${1:-}"
  _stage_start=$now
  [[ -n "${_stage_name}" ]] && printf -- '--> %s\n' "${_stage_name}"
  return 0
}

say() { printf '    %s\n' "$*"; }

# One line naming the piece and why, then exit 3. The line is kept in UNAVAILABLE_FILE too: the
# cluster tests skip with it (tests/cluster/kube.py); a cluster-up that gets through removes it.
# It lives in the cache folder (root's own, 0700), not under a fixed name in /tmp, where any local
# user could plant one and make the cluster tests skip.
UNAVAILABLE_FILE="${CACHE}/cluster.unavailable"
cannot() {
  printf 'error: cluster: %s\n' "$*" >&2
  if [[ ! -e "$CACHE" ]] || cache_is_ours; then
    (umask 077 && mkdir -p "$CACHE" && printf '%s\n' "$*" >"$UNAVAILABLE_FILE") 2>/dev/null || true
  fi
  exit 3
}

# The cgroup layout under DIR (default /sys/fs/cgroup): v1 (a hierarchy per controller: cpu,
# memory, pids ...), v2 (the unified hierarchy: cgroup.controllers at the top) or none. The
# cluster's scripts handle v1 only (the kubelet's cgroup root, cpuset's copy, the teardown's
# walk over every hierarchy): cluster-up refuses v2 in its preflight, in one line.
cgroup_layout() {
  local dir="${1:-/sys/fs/cgroup}" c
  if [[ -f "${dir}/cgroup.controllers" ]]; then
    echo v2
    return 0
  fi
  for c in cpu memory pids; do
    [[ -d "${dir}/${c}" ]] || {
      echo none
      return 0
    }
  done
  echo v1
}

die() {
  printf 'error: cluster: %s\n' "$*" >&2
  exit 1
}

# The node's address: the source address of the default route (pods reach the API server there).
node_ip() {
  ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n 1
}

# The go command for our builds of the cluster's pieces: the compiler with GOGC 400 (its heap may
# grow to five times what it keeps before it collects; Go's default is 100). Measured on this
# 2-core machine with an empty build cache: JobSet's manager 111 s against 127 s; Kubernetes'
# core/validation package and its dependencies 77 s of compile time against 84 s, the largest
# compile (k8s.io/api/core/v1) 591 MB against 481 MB. Cold, these builds run beside the tests
# and are the critical path. GPUPIPE_GO_BUILD_GOGC overrides it; only the builds see it (not
# kubectl, not the cluster's servers).
go_() { GOGC="${GPUPIPE_GO_BUILD_GOGC:-400}" go "$@"; }

kubectl_() { "${BIN_DIR}/kubernetes-${K8S_VERSION}/kubectl" --kubeconfig "${KUBECONFIG_ADMIN}" "$@"; }

ctr_() { ctr --address "${CONTAINERD_SOCK}" --namespace k8s.io "$@"; }

# Import a Docker image into every node's containerd, pinned (image GC never removes it). Skipped
# on a node whose image store already holds that image id under that name (the marker lives in the
# store, so it goes when the store goes). Nodes 2..N get node 1's blobs as hard links first
# (hack/cluster/nodes.sh): their import writes no second copy of them.
import_image() {
  local k
  for ((k = 1; k <= $(cluster_nodes); k++)); do import_image_on "$k" "$1"; done
}

import_image_on() {
  local k="$1" tag="$2" id marker store
  store="$(node_store "$k")"
  id="$(docker image inspect --format '{{.Id}}' "$tag")" || die "image ${tag} was not built"
  marker="${store}/gpupipe-imported/$(printf '%s' "$tag" | tr '/:' '__')"
  if [[ -f "$marker" && "$(cat "$marker")" == "$id" ]] && ctr_on "$k" images ls -q "name==${tag}" | grep -q .; then
    return 0
  fi
  mkdir -p "${store}/gpupipe-imported"
  ((k == 1)) || link_blobs "$k"
  docker save "$tag" | ctr_on "$k" images import - >/dev/null ||
    die "importing ${tag} into node ${k}'s containerd failed"
  # containerd 1.6's import has no --label: pin it afterwards.
  ctr_on "$k" images label "$tag" io.cri-containerd.pinned=pinned >/dev/null ||
    die "pinning ${tag} in node ${k}'s containerd failed"
  printf '%s' "$id" >"$marker"
}

# put FILE: write stdin to FILE only when that changes it (written beside, then renamed), so a
# rerun leaves a running process's config alone: kube-proxy exits as soon as its file changes,
# and sees a half-written one if it is rewritten in place. Status 0 when FILE changed, else 1.
put() {
  local f="$1"
  cat >"${f}.new"
  if cmp -s "${f}.new" "$f"; then
    rm -f "${f}.new"
    return 1
  fi
  mv -f "${f}.new" "$f"
}

# Wait until a command succeeds, at most $1 seconds; the rest is the command.
wait_for() {
  local limit="$1" start=$SECONDS
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - start < limit)) || return 1
    sleep 1
  done
}

# The node's own images (hack/cluster/node-images.sh), imported into containerd under these names.
PAUSE_IMAGE="gpupipe.local/pause:3.10"
BUSYBOX_IMAGE="gpupipe.local/busybox:1.35.0"
COREDNS_IMAGE="gpupipe.local/coredns:${COREDNS_VERSION}"
NODE_NAME="${GPUPIPE_NODE_NAME:-gpupipe-node}"

# state_is_ours: the state folder carries cluster-up's marker, or is of the layout cluster-up made
# before the marker existed (its kubeconfig, pki/ and run/).
state_is_ours() {
  [[ -f "$MARKER" ]] || [[ -f "${STATE}/kubeconfig" && -d "${STATE}/pki" && -d "${STATE}/run" ]]
}

# refuse_foreign_state: one line and exit 2 when the state folder holds anything but is not ours
# (a mistyped GPUPIPE_CLUSTER_DIR): nothing in it is touched.
refuse_foreign_state() {
  refuse_foreign_cache
  [[ -d "$STATE" && -n "$(ls -A "$STATE" 2>/dev/null)" ]] || return 0
  state_is_ours && return 0
  printf 'error: cluster: %s is not a test cluster'"'"'s folder (no %s in it): refusing to touch it; set GPUPIPE_CLUSTER_DIR to the folder cluster-up made\n' \
    "$STATE" "$(basename "$MARKER")" >&2
  exit 2
}

# The cache is guarded like the state folder: cluster-down unmounts what lies under its image
# store and removes containers there, so GPUPIPE_CLUSTER_CACHE=/var/lib would have reached the
# system containerd's. A cache is ours with its marker, or (made before the marker) with the
# cluster's own binaries or import records in it.
CACHE_MARKER="${CACHE}/.gpupipe-cluster-cache"
cache_is_ours() {
  [[ -f "$CACHE_MARKER" || -d "${BIN_DIR}/kubernetes-${K8S_VERSION}" || -d "${IMAGE_STORE}/gpupipe-imported" ]]
}

refuse_foreign_cache() {
  [[ -d "$CACHE" && -n "$(ls -A "$CACHE" 2>/dev/null)" ]] || return 0
  cache_is_ours && return 0
  printf 'error: cluster: %s is not a test cluster'"'"'s cache (no %s in it): refusing to touch it; set GPUPIPE_CLUSTER_CACHE to a folder of its own\n' \
    "$CACHE" "$(basename "$CACHE_MARKER")" >&2
  exit 2
}

# claim_cache: the cache folder made (owner-only) and marked as the cluster's.
claim_cache() {
  refuse_foreign_cache
  (umask 077 && mkdir -p "$CACHE")
  chmod 0700 "$CACHE"
  [[ -f "$CACHE_MARKER" ]] ||
    printf 'made by gpupipe hack/cluster-up.sh: built binaries and the node image store\n' >"$CACHE_MARKER"
}

# shellcheck source=hack/cluster/nodes.sh
source "${CLUSTER_HACK}/nodes.sh"
