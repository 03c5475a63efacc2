#!/usr/bin/env bash
# Print the Python base image the Dockerfiles should build FROM, making one when needed:
#   1. $PYTHON_IMAGE (default python:3.11.14-slim-bookworm) when it is here or can be pulled;
#   2. otherwise (no registry reachable) $LOCAL_BASE (default local/python:3.11-bookworm), built
#      once with debootstrap: Debian bookworm minbase with python3.11 and venv, from the Debian
#      mirror apt already uses, with this host's extra CA certificates trusted inside (HTTPS from
#      containers may pass a proxy that presents them). Needs root and debootstrap.
# Progress goes to stderr; the only line on stdout is the image reference.
# Environment: PYTHON_IMAGE, LOCAL_BASE, DEBIAN_MIRROR (default: the first http(s) mirror named
#   in apt's sources), DEBIAN_KEYRING (default /usr/share/keyrings/debian-archive-keyring.gpg:
#   the archive's signatures are verified against it; a missing keyring or a bad signature fails),
#   GPUPIPE_PULL_TIMEOUT (seconds, default 60).
set -euo pipefail

public="${PYTHON_IMAGE:-python:3.11.14-slim-bookworm}"
local_base="${LOCAL_BASE:-local/python:3.11-bookworm}"

say() { printf '==> %s\n' "$*" >&2; }

# One maker at a time: CI builds the cluster's add-on images in the background while the trainer's
# images build, and two debootstraps of the same base would race for its tag.
exec 9>"${TMPDIR:-/tmp}/gpupipe-base-image.lock"
flock 9

if docker image inspect "$public" >/dev/null 2>&1; then
  echo "$public"
  exit 0
fi
if timeout "${GPUPIPE_PULL_TIMEOUT:-60}" docker pull -q "$public" >/dev/null 2>&1; then
  say "pulled ${public}"
  echo "$public"
  exit 0
fi
if docker image inspect "$local_base" >/dev/null 2>&1; then
  say "${public} cannot be pulled: using the local base ${local_base}"
  echo "$local_base"
  exit 0
fi

say "${public} cannot be pulled: building ${local_base} with debootstrap"
if [[ "$(id -u)" != 0 ]] || ! command -v debootstrap >/dev/null 2>&1; then
  echo "error: building ${local_base} needs root and debootstrap (hack/docker-up.sh installs it)" >&2
  exit 1
fi
mirror="${DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
  mirror="$(grep -rhoE '(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d 2>/dev/null \
    | grep -oE 'https?://[^ ]+' | head -n 1 || true)"
fi
mirror="${mirror:-http://deb.debian.org/debian}"

# The archive's Release file must carry a valid signature by Debian's archive keys: debootstrap
# checks it against this keyring and refuses a bad one. Without a keyring it would only warn and
# go on, trusting whatever the (plain http) mirror sent; so the keyring must be there, and the
# log must show the check passed.
keyring="${DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}"
if [[ ! -s "$keyring" ]]; then
  echo "error: Debian's archive keyring ${keyring} is missing: apt-get install debian-archive-keyring (or set DEBIAN_KEYRING)" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rootfs="${work}/rootfs"
start=$SECONDS
say "debootstrap bookworm from ${mirror}, signatures checked against ${keyring}"
debootstrap --variant=minbase --force-check-gpg --keyring="$keyring" \
  --include=python3.11,python3-venv,python-is-python3,ca-certificates,netbase \
  bookworm "$rootfs" "$mirror" >"${work}/debootstrap.log" 2>&1 || {
  tail -n 20 "${work}/debootstrap.log" >&2
  exit 1
}
if ! grep -q "Valid Release signature" "${work}/debootstrap.log"; then
  echo "error: debootstrap did not verify the Release signature of ${mirror}; refusing the base" >&2
  tail -n 20 "${work}/debootstrap.log" >&2
  exit 1
fi
# Trust what the host trusts beyond Debian's bundle (a proxy's CA, a company CA).
shopt -s nullglob
extra=(/usr/local/share/ca-certificates/*.crt)
if ((${#extra[@]})); then
  say "trusting ${#extra[@]} extra CA certificate(s) from /usr/local/share/ca-certificates"
  cp "${extra[@]}" "${rootfs}/usr/local/share/ca-certificates/"
  chroot "$rootfs" update-ca-certificates >/dev/null
fi
# Slim, as Debian's own slim images (python:*-slim's base) are: no documentation, manuals or
# message translations (the images run with LANG=C.UTF-8: programs print their built-in English
# messages), and dpkg told to leave them out of what later layers install too (g++ and binutils
# bring ~14 MB of translations). Saves ~45 MB of the local base plus that in each image.
cat >"${rootfs}/etc/dpkg/dpkg.cfg.d/docker" <<'DPKG'
# Files that containers do not need (as in Debian's slim images): dpkg leaves them out.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
DPKG
rm -rf "${rootfs}"/var/lib/apt/lists/* "${rootfs}"/var/cache/apt/*.bin \
  "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/usr/share/doc/* "${rootfs}"/usr/share/man/* \
  "${rootfs}"/usr/share/locale/* "${rootfs}"/usr/share/info/* "${rootfs}"/usr/share/groff/* \
  "${rootfs}"/usr/share/lintian/* "${rootfs}"/usr/share/linda/*
tar --numeric-owner -C "$rootfs" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$local_base" >/dev/null
say "built ${local_base} in $((SECONDS - start)) s ($(docker image inspect --format '{{.Size}}' "$local_base" | awk '{printf "%.0f MB", $1/1e6}'))"
echo "$local_base"
