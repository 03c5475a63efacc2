#!/usr/bin/env bash
# Build the gpupipe images and tag them with the package version from pyproject.toml:
#   <registry>/trainer-cpu:<version>   images/trainer-cpu/Dockerfile
#   <registry>/trainer-cuda:<version>  images/trainer-cuda/Dockerfile
# Usage: hack/build-images.sh [--print] [cpu|cuda|all]   (default: all)
#   --print  only print the image references, build nothing
# Environment: GPUPIPE_IMAGE_REGISTRY (default ghcr.io/gpupipe, as in components/images.py),
#   DOCKER (default docker), DOCKER_BUILD_ARGS (extra arguments for `docker build`, e.g.
#   "--build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...").
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

registry="${GPUPIPE_IMAGE_REGISTRY:-ghcr.io/gpupipe}"
docker_cmd="${DOCKER:-docker}"
print_only=false
if [[ "${1:-}" == "--print" ]]; then
  print_only=true
  shift
fi
which="${1:-all}"

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)"
if [[ -z "$version" ]]; then
  echo "error: no 'version = \"...\"' line in pyproject.toml" >&2
  exit 1
fi

case "$which" in
  cpu) flavours=(cpu) ;;
  cuda) flavours=(cuda) ;;
  all) flavours=(cpu cuda) ;;
  *)
    echo "usage: $0 [--print] [cpu|cuda|all]" >&2
    exit 2
    ;;
esac

extra_args=()
if [[ -n "${DOCKER_BUILD_ARGS:-}" ]]; then
  read -r -a extra_args <<<"$DOCKER_BUILD_ARGS"
fi

for flavour in "${flavours[@]}"; do
  image="${registry}/trainer-${flavour}:${version}"
  if [[ "$print_only" == true ]]; then
    echo "$image"
    continue
  fi
  echo ">> building ${image} from images/trainer-${flavour}/Dockerfile"
  "$docker_cmd" build \
    --file "images/trainer-${flavour}/Dockerfile" \
    --build-arg "VERSION=${version}" \
    --tag "$image" \
    ${extra_args[@]+"${extra_args[@]}"} \
    .
  echo ">> built ${image}"
done
