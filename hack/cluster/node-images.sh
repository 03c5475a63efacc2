#!/usr/bin/env bash
# Build the images the node itself needs, locally (no registry answers here):
#   pause    the pod sandbox (a static C program, FROM scratch)
#   busybox  Debian's busybox-static with its applet links (init containers: nslookup, sh, wget),
#            dash as /bin/sh, and an nslookup that works through a pod's search domains
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
  trap 'rm -rf "$ctx"' RETURN

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
      [[ "$applet" == busybox || "$applet" == nslookup ]] || ln -s busybox "${ctx}/busybox/bin/${applet}"
    done
    # The Training Operator's init container runs `nslookup <job>-master-0` until it succeeds.
    # busybox >= 1.28 asks every search domain and exits 1 when any of them has no such name,
    # which in a pod is always the case: the init container would wait forever. This nslookup
    # succeeds when the name resolves under any search domain (as the alpine:3.10 image the
    # operator defaults to does).
    cat >"${ctx}/busybox/bin/nslookup" <<'SH'
#!/bin/sh
# nslookup NAME [SERVER]: busybox's, over the pod's search domains one at a time.
name="$1"
shift
case "$name" in
*.) exec /bin/busybox nslookup "$name" "$@" ;;
esac
for domain in $(sed -n 's/^search //p' /etc/resolv.conf) ""; do
  fqdn="${name}${domain:+.$domain}."
  if /bin/busybox nslookup "$fqdn" "$@" >/dev/null 2>&1; then
    exec /bin/busybox nslookup "$fqdn" "$@"
  fi
done
echo "nslookup: ${name} does not resolve under any search domain" >&2
exit 1
SH
    chmod 755 "${ctx}/busybox/bin/nslookup"
    # busybox's own sh runs its applets before searching PATH, so `sh -c 'nslookup ...'` would
    # never reach the script above: /bin/sh is Debian's dash (and the C library it needs).
    rm -f "${ctx}/busybox/bin/sh"
    cp /bin/dash "${ctx}/busybox/bin/sh"
    mkdir -p "${ctx}/busybox/lib/x86_64-linux-gnu" "${ctx}/busybox/lib64"
    cp -L /lib/x86_64-linux-gnu/libc.so.6 "${ctx}/busybox/lib/x86_64-linux-gnu/"
    cp -L /lib64/ld-linux-x86-64.so.2 "${ctx}/busybox/lib64/"
    printf 'FROM scratch\nCOPY . /\nENV PATH=/bin\nCMD ["sh"]\n' >"${ctx}/busybox/Dockerfile"
    build_scratch "${BUSYBOX_IMAGE}" "${ctx}/busybox"
  fi

  if ! docker image inspect "${COREDNS_IMAGE}" >/dev/null 2>&1; then
    mkdir -p "${ctx}/coredns"
    cp "${BIN_DIR}/coredns-${COREDNS_VERSION}/coredns" "${ctx}/coredns/coredns"
    printf 'FROM scratch\nCOPY coredns /coredns\nENTRYPOINT ["/coredns"]\n' >"${ctx}/coredns/Dockerfile"
    build_scratch "${COREDNS_IMAGE}" "${ctx}/coredns"
  fi
}

case "${1:-build}" in
build) build ;;
tags) tags ;;
*) die "usage: node-images.sh [build|tags]" ;;
esac
