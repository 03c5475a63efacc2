#!/usr/bin/env bash
# hack/apt-install.sh [--with-recommends] PACKAGE...: apt-get update, then install the named Debian
# packages (without their recommended ones unless asked): the one way gpupipe's scripts install a
# package (docker-up.sh, cluster-up.sh, chromium.sh, the network-policy add-on).
#
# On a fresh machine .ci/run's stages install at the same time (chromium.sh beside the
# network-policy add-on's ipset, CI of 2026-11-28), and apt takes its locks without waiting:
# `apt-get update` fails at once on /var/lib/apt/lists/lock (apt 2.6's DPkg::Lock::Timeout covers
# only dpkg's lock). So our own installers take turns (flock on $GPUPIPE_APT_LOCK), and an apt-get
# started by anything else is waited out: a command refused a lock is retried every
# APT_LOCK_RETRY_S seconds (default 5) until APT_LOCK_WAIT seconds (default 600) have passed; any
# other failure ends it at once (tests/unit/test_apt_install.py, with a fake apt-get).
# Exit 0 installed (or already there), 1 with apt's own error lines, 64 no package named.
set -euo pipefail
recommends=--no-install-recommends
[[ "${1:-}" != --with-recommends ]] || {
  recommends=--install-recommends
  shift
}
(($#)) || {
  echo "usage: hack/apt-install.sh [--with-recommends] PACKAGE..." >&2
  exit 64
}
wait_s="${APT_LOCK_WAIT:-600}"
retry_s="${APT_LOCK_RETRY_S:-5}"
export DEBIAN_FRONTEND=noninteractive

exec 9>"${GPUPIPE_APT_LOCK:-/var/lock/gpupipe-apt.lock}"
flock -w "$wait_s" 9 || {
  echo "error: another gpupipe install held ${GPUPIPE_APT_LOCK:-/var/lock/gpupipe-apt.lock} for ${wait_s} s" >&2
  exit 1
}

deadline=$((SECONDS + wait_s))
# Run apt-get with its arguments; while it is refused one of apt's locks, again after retry_s.
apt_get() {
  local err
  until err="$(apt-get -o DPkg::Lock::Timeout=60 "$@" 2>&1 >/dev/null)"; do
    if [[ "$err" == *"Could not get lock"* ]] && ((SECONDS < deadline)); then
      sleep "$retry_s"
      continue
    fi
    printf '%s\n' "$err" >&2
    [[ "$err" != *"Could not get lock"* ]] || echo "error: apt's lock was still held after ${wait_s} s" >&2
    return 1
  done
}
apt_get update -qq
apt_get install -y -qq "$recommends" "$@"
