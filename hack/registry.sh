#!/usr/bin/env bash
# A container registry for the image-digest test (tests/containers/test_digests.py) on a machine
# with none to push to: CNCF Distribution's `registry` (the reference implementation of the OCI
# distribution spec, what Docker Hub's own `registry` image runs), built from the Go module proxy
# once into the build cache and kept there.
# Usage: hack/registry.sh   prints the binary's path (building it first when it is not cached)
# Environment: GPUPIPE_REGISTRY_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpupipe-registry).
set -euo pipefail

VERSION=v3.1.2
MODULE=github.com/distribution/distribution/v3
cache="${GPUPIPE_REGISTRY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpupipe-registry}"
bin="${cache}/registry-${VERSION}/registry"
if [[ -x "$bin" ]]; then
  printf '%s\n' "$bin"
  exit 0
fi
command -v go >/dev/null || {
  echo "error: building the registry needs Go (https://go.dev/dl/), and none is on PATH" >&2
  exit 3
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
if ! CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath "${MODULE}/cmd/registry@${VERSION}" >"${tmp}/log" 2>&1; then
  tail -n 15 "${tmp}/log" >&2
  echo "error: building ${MODULE}/cmd/registry@${VERSION} failed (is the Go module proxy reachable? go env GOPROXY)" >&2
  exit 3
fi
mkdir -p "${bin%/*}"
mv "${tmp}/registry" "$bin"
echo "==> built the registry ${VERSION} in $((SECONDS - start)) s" >&2
printf '%s\n' "$bin"
