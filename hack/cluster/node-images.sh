#!/usr/bin/env bash
# Build the images the node itself needs, locally (no registry answers here):
#   pause    the pod sandbox (a static C program, FROM scratch)
#   busybox  Debian's busybox-static with its applet links (init containers: nslookup, sh, wget)
#   coredns  the cluster DNS, from hack/cluster/build.sh's binary (FROM scratch)
# Usage: hack/cluster/node-images.sh [build|tags]
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

tags() {
  echo "${PAUSE_IMAGE}"
  echo "${BUSYBOX_IMAGE}"
  echo "${COREDNS_IMAGE}"
}

# build_scratch TAG CONTEXT: docker build of CONTEXT (its Dockerfile FROM scratch), unless TAG exists.
build_scratch() {
  local tag="$1" ctx="$2"
  docker image inspect "$tag" >/dev/null 2>&1 && return 0
  say "docker build ${tag}"
  # The legacy builder (no buildx here) warns on every build: show its output only on failure.
  docker build -q -t "$tag" "$ctx" >"${ctx}/build.log" 2>&1 || {
    cat "${ctx}/build.log" >&2
    die "docker build of ${tag} failed"
  }
}

build() {
  docker info >/dev/null 2>&1 ||
    cannot "no Docker engine answers (hack/docker-up.sh starts one): the node's images are built with it"
  local ctx
  ctx="$(mktemp -d)"

  if ! docker image inspect "${PAUSE_IMAGE}" >/dev/null 2>&1; then
    mkdir -p "${ctx}/pause"
    gcc -Os -static -o "${ctx}/pause/pause" "${CLUSTER_HACK}/pause/pause.c" ||
      cannot "gcc could not build the static pause binary (glibc's static libraries: apt-get install libc6-dev)"
    printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"${ctx}/pause/Dockerfile"
    build_scratch "${PAUSE_IMAGE}" "${ctx}/pause"
  fi

  if ! docker image inspect "${BUSYBOX_IMAGE}" >/dev/null 2>&1; then
    [[ -x /bin/busybox ]] || cannot "Debian's busybox-static is not installed (apt-get install busybox-static)"
    mkdir -p "${ctx}/busybox/bin"
    cp /bin/busybox "${ctx}/busybox/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
      [[ "$applet" == busybox ]] || ln -s busybox "${ctx}/busybox/bin/${applet}"
    done
    printf 'FROM scratch\nCOPY bin /bin\nENV PATH=/bin\nCMD ["sh"]\n' >"${ctx}/busybox/Dockerfile"
    build_scratch "${BUSYBOX_IMAGE}" "${ctx}/busybox"
  fi

  if ! docker image inspect "${COREDNS_IMAGE}" >/dev/null 2>&1; then
    mkdir -p "${ctx}/coredns"
    cp "${BIN_DIR}/coredns-${COREDNS_VERSION}/coredns" "${ctx}/coredns/coredns"
    printf 'FROM scratch\nCOPY coredns /coredns\nENTRYPOINT ["/coredns"]\n' >"${ctx}/coredns/Dockerfile"
    build_scratch "${COREDNS_IMAGE}" "${ctx}/coredns"
  fi
  rm -rf "$ctx"
}

case "${1:-build}" in
build) build ;;
tags) tags ;;
*) die "usage: node-images.sh [build|tags]" ;;
esac
