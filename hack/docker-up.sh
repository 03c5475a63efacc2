#!/usr/bin/env bash
# Make a Docker engine answer on this machine, for `make images` and `make test-containers`.
#   1. `docker info` answers already: nothing to do.
#   2. Otherwise, as root: install Debian's docker.io (and debootstrap, for hack/base-image.sh)
#      when dockerd is missing (apt-get update first), then start dockerd as a plain background
#      process (no systemd needed; its log goes to $DOCKERD_LOG) and wait until it answers.
# Not root and no engine: exit 3 with the reason (the container tests skip on that).
# Environment: DOCKERD_LOG (default /var/log/gpupipe-dockerd.log), DOCKERD_WAIT (default 60 s).
set -euo pipefail

log_file="${DOCKERD_LOG:-/var/log/gpupipe-dockerd.log}"
wait_s="${DOCKERD_WAIT:-60}"

step() { printf '==> %s\n' "$*"; }

if docker info >/dev/null 2>&1; then
  step "a Docker engine answers: $(docker info --format '{{.ServerVersion}} ({{.Driver}})')"
  exit 0
fi

if [[ "$(id -u)" != 0 ]]; then
  echo "error: no Docker engine answers and this is not root: start dockerd (or join the docker group)" >&2
  exit 3
fi

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ((${#missing[@]})); then
  step "installing ${missing[*]} (apt-get)"
  start=$SECONDS
  "$(dirname "$0")/apt-install.sh" "${missing[@]}"
  step "installed in $((SECONDS - start)) s"
fi
# docker.io brings its own client (/usr/bin/docker); a newer one earlier on PATH wins, fine.
command -v docker >/dev/null 2>&1 || {
  echo "error: no docker client on PATH after installing docker.io" >&2
  exit 1
}

if ! pgrep -x dockerd >/dev/null 2>&1; then
  step "starting dockerd in the background (log: ${log_file})"
  nohup dockerd >>"$log_file" 2>&1 &
fi
start=$SECONDS
until docker info >/dev/null 2>&1; do
  if ((SECONDS - start > wait_s)); then
    echo "error: dockerd did not answer within ${wait_s} s; the last lines of ${log_file}:" >&2
    tail -n 20 "$log_file" >&2 || true
    exit 1
  fi
  sleep 1
done
step "Docker engine $(docker info --format '{{.ServerVersion}} ({{.Driver}})') answers after $((SECONDS - start)) s"
