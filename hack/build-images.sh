#!/usr/bin/env bash
# Build the gpupipe images from images/trainer/Dockerfile and tag them with the package version
# from pyproject.toml:
#   <registry>/trainer-cpu:<version>   FLAVOUR=cpu, over a Python base
#   <registry>/trainer-cuda:<version>  FLAVOUR=cuda, over PyTorch's CUDA runtime image
# Usage: hack/build-images.sh [--print] [--push|--push-only] [cpu|cuda|all]   (default: all)
#   --print  only print the image references, build nothing
#   --push   after building, push each image to its registry and record the digest the registry
#            answered in the digest map GPUPIPE_IMAGE_DIGESTS (default build/image-digests.json;
#            other images' entries are kept): `GPUPIPE_IMAGE_DIGESTS=<map> gpupipe compile` then
#            compiles every image by that digest (components/images.py)
#   --push-only  push and record as --push, images built before (tested, say), building nothing
# Works with the public registries (the Dockerfile's defaults) and without any:
#   - PYTHON_IMAGE unset: hack/base-image.sh picks python:3.11.14-slim-bookworm, or builds a
#     local Debian bookworm base with debootstrap when that cannot be pulled;
#   - TORCH_INDEX_URL unset and PyTorch's CPU index unreachable: the torch==<pin>+cpu wheel from
#     pip's local wheel folder (pip config find-links, PIP_FIND_LINKS) is served on 127.0.0.1
#     for the CPU build (which then uses --network host);
#   - TORCH_IMAGE unset and pytorch/pytorch:2.13.0-cuda${CUDA_VERSION}-cudnn9-runtime cannot be
#     pulled: the CUDA image is built over the Python base with PyPI's torch (the CUDA 13.0
#     build, ~3.5 GB of wheels) as a stand-in.
# Environment: GPUPIPE_IMAGE_REGISTRY (default ghcr.io/gpupipe, as in components/images.py),
#   DOCKER (default docker), PYTHON_IMAGE, TORCH_INDEX_URL, CUDA_VERSION (default 12.6),
#   TORCH_IMAGE, GPUPIPE_WHEEL_PORT (default 38741), GPUPIPE_WHEEL_WAIT (default 900), CUDA_TORCH_INDEX_URL (default https://pypi.org/simple, for the stand-in),
#   DOCKER_BUILD_ARGS (extra arguments for `docker build`, e.g.
#   "--no-cache"; pin a base by digest with PYTHON_IMAGE or TORCH_IMAGE, which may carry one).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

registry="${GPUPIPE_IMAGE_REGISTRY:-ghcr.io/gpupipe}"
docker_cmd="${DOCKER:-docker}"
print_only=false
push=false
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --print) print_only=true ;;
    --push) push=true ;;
    --push-only) push=only ;;
    *)
      echo "usage: $0 [--print] [--push|--push-only] [cpu|cuda|all]" >&2
      exit 2
      ;;
  esac
  shift
done
which="${1:-all}"
digests_file="${GPUPIPE_IMAGE_DIGESTS:-build/image-digests.json}"

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
    echo "usage: $0 [--print] [--push|--push-only] [cpu|cuda|all]" >&2
    exit 2
    ;;
esac

if [[ "$print_only" == true ]]; then
  for flavour in "${flavours[@]}"; do
    echo "${registry}/trainer-${flavour}:${version}"
  done
  exit 0
fi

step() { printf '==> %s\n' "$*"; }

if [[ "$push" == only ]]; then
  for flavour in "${flavours[@]}"; do
    image="${registry}/trainer-${flavour}:${version}"
    "$docker_cmd" image inspect "$image" >/dev/null 2>&1 || {
      echo "error: ${image} is not built: build it first (hack/build-images.sh ${flavour}), or use --push" >&2
      exit 1
    }
  done
fi

extra_args=()
if [[ -n "${DOCKER_BUILD_ARGS:-}" ]]; then
  read -r -a extra_args <<<"$DOCKER_BUILD_ARGS"
fi
torch_version="$(sed -n 's/^torch==\(.*\)$/\1/p' constraints.txt)"
python_image=""
[[ "$push" == only ]] || python_image="${PYTHON_IMAGE:-$(DOCKER="$docker_cmd" hack/base-image.sh)}"
server_pid=""
served_dir=""
trap '[[ -z "$server_pid" ]] || kill "$server_pid" 2>/dev/null; [[ -z "$served_dir" ]] || rm -rf "$served_dir"' EXIT

# The local wheel folders pip is configured with (pip config, PIP_FIND_LINKS), and the project
# machines' ../shared/wheels beside the checkout (GPUPIPE_WHEELS; the Makefile passes it on too).
local_torch_wheel() {
  local dirs dir wheel
  dirs="$(python3 -m pip config list 2>/dev/null | sed -n "s/^.*find-links='\(.*\)'$/\1/p") ${PIP_FIND_LINKS:-}"
  dirs+=" ${GPUPIPE_WHEELS:-$(pwd)/../shared/wheels}"
  for dir in $dirs; do
    dir="${dir#file://}"
    for wheel in "$dir"/torch-"${torch_version}"+cpu-*.whl; do
      [[ -f "$wheel" ]] && echo "$wheel" && return 0
    done
  done
  return 1
}

# The sha256 the wheel must have (images/wheels.sha256, "<sha256>  <file name>" lines): a wheel
# found in a local folder is installed into the image only if it is the very file pinned there.
check_wheel() {
  local wheel="$1" name want got
  name="$(basename "$wheel")"
  want="$(awk -v n="$name" '$2 == n {print $1}' images/wheels.sha256)"
  if [[ -z "$want" ]]; then
    echo "error: ${name} has no pinned sha256 in images/wheels.sha256: add '<sha256>  ${name}' after checking the file" >&2
    exit 1
  fi
  got="$(sha256sum "$wheel" | cut -d' ' -f1)"
  if [[ "$got" != "$want" ]]; then
    echo "error: ${wheel} has sha256 ${got}, not the ${want} pinned in images/wheels.sha256" >&2
    exit 1
  fi
  wheel_sha256="$got"
}

# Serve one wheel as a PEP 503 "simple" index on 127.0.0.1; sets served_index to its URL.
# The index names the wheel with its sha256 (pip refuses a download that does not match), and
# the server is checked to be ours: still running, and answering with a token only it knows
# (another process already on the port would otherwise serve the image its own torch).
# Another build of gpupipe's images may hold the port (`make images` beside `make cluster-up`, or
# the container tests beside a cluster test's cluster-up): its index offers the same pinned wheel
# with the same sha256, so the build waits for it to end (GPUPIPE_WHEEL_WAIT seconds, default
# 900) instead of failing; anything else on the port is refused at once.
served_index=""
wheel_sha256=""
serve_wheel() {
  local wheel="$1" dir port name token answer owner orphan waited=0 starts=0 limit="${GPUPIPE_WHEEL_WAIT:-900}"
  check_wheel "$wheel"
  name="$(basename "$wheel")"
  dir="$(mktemp -d)"
  served_dir="$dir"
  mkdir -p "${dir}/simple/torch"
  cp "$wheel" "${dir}/simple/torch/${name}"
  printf '<!DOCTYPE html>\n<html><body><a href="%s#sha256=%s">%s</a></body></html>\n' \
    "$name" "$wheel_sha256" "$name" >"${dir}/simple/torch/index.html"
  token="$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  printf '%s' "$token" >"${dir}/server-token"
  # A fixed port: the index URL is a build argument, and a new one would void the layer cache.
  port="${GPUPIPE_WHEEL_PORT:-38741}"
  # Each second: another build's server on the port is waited out; else ours starts (a bind
  # lost to a race between the look and the bind is tried again, 5 times at most).
  while :; do
    if (: <"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
      answer="$(curl -sf --max-time 5 "http://127.0.0.1:${port}/simple/torch/" 2>/dev/null || true)"
      if [[ "$answer" != *"href=\"${name}#sha256=${wheel_sha256}\""* ]]; then
        echo "error: the wheel server on 127.0.0.1:${port} is not ours, nor another gpupipe build's (port taken by another process? set GPUPIPE_WHEEL_PORT)" >&2
        exit 1
      fi
      # A server whose build was killed (SIGKILL runs no trap) is left behind: end it, and serve.
      owner="" orphan=""
      read -r owner orphan < <(curl -sf --max-time 5 "http://127.0.0.1:${port}/owner" 2>/dev/null) || true
      if [[ -n "${orphan:-}" ]] && ! kill -0 "${owner:-0}" 2>/dev/null &&
        tr '\0' ' ' <"/proc/${orphan}/cmdline" 2>/dev/null | grep -q 'http.server --bind 127.0.0.1'; then
        printf '==> the wheel server on 127.0.0.1:%s outlived its build (pid %s): stopping it\n' "$port" "$owner"
        kill "$orphan" 2>/dev/null || true
        sleep 1
        continue
      fi
      if ((waited >= limit)); then
        echo "error: another gpupipe image build held 127.0.0.1:${port} for ${limit} s (GPUPIPE_WHEEL_WAIT)" >&2
        exit 1
      fi
      ((waited > 0)) || printf '==> another gpupipe image build serves the wheel on 127.0.0.1:%s: waiting for it to end\n' "$port"
    else
      python3 -m http.server --bind 127.0.0.1 --directory "$dir" "$port" >/dev/null 2>&1 &
      server_pid=$!
      answer=""
      for _ in $(seq 50); do
        answer="$(curl -sf "http://127.0.0.1:${port}/server-token" 2>/dev/null || true)"
        [[ "$answer" == "$token" ]] && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
      done
      if [[ "$answer" == "$token" ]] && kill -0 "$server_pid" 2>/dev/null; then
        printf '%s %s\n' "$$" "$server_pid" >"${dir}/owner"
        break
      fi
      kill "$server_pid" 2>/dev/null || true
      server_pid=""
      starts=$((starts + 1))
      if ((starts >= 5 || waited >= limit)); then
        echo "error: the wheel server on 127.0.0.1:${port} is not ours (port taken by another process? set GPUPIPE_WHEEL_PORT)" >&2
        exit 1
      fi
    fi
    sleep 1
    waited=$((waited + 1))
  done
  served_index="http://127.0.0.1:${port}/simple"
}

# The build arguments of each flavour, into flavour_args (no subshell: the server must outlive it).
cpu_args() {
  local index="${TORCH_INDEX_URL:-}" wheel
  if [[ -z "$index" ]]; then
    index="https://download.pytorch.org/whl/cpu"
    if ! curl -sfI --max-time 10 "${index}/torch/" >/dev/null 2>&1 && wheel="$(local_torch_wheel)"; then
      serve_wheel "$wheel"
      index="$served_index"
      step "PyTorch's CPU index is unreachable: serving ${wheel} at ${index}"
    fi
  fi
  flavour_args=(--build-arg "BASE_IMAGE=${python_image}" --build-arg "TORCH_INDEX_URL=${index}")
  [[ "$index" != http://127.0.0.1:* ]] || flavour_args+=(--network host)
}

cuda_args() {
  local cuda="${CUDA_VERSION:-12.6}" base="${TORCH_IMAGE:-}"
  flavour_args=(--build-arg FLAVOUR=cuda --build-arg "TORCH_BUILD=CUDA ${cuda}")
  if [[ -z "$base" ]]; then
    base="pytorch/pytorch:${torch_version}-cuda${cuda}-cudnn9-runtime"
    if ! "$docker_cmd" image inspect "$base" >/dev/null 2>&1 \
      && ! timeout "${GPUPIPE_PULL_TIMEOUT:-60}" "$docker_cmd" pull -q "$base" >/dev/null 2>&1; then
      step "${base} cannot be pulled: stand-in over ${python_image} with torch from ${CUDA_TORCH_INDEX_URL:-https://pypi.org/simple} (CUDA 13.0 build)"
      flavour_args=(--build-arg FLAVOUR=cuda --build-arg "BASE_IMAGE=${python_image}"
        --build-arg "TORCH_INDEX_URL=${CUDA_TORCH_INDEX_URL:-https://pypi.org/simple}"
        --build-arg "TORCH_BUILD=CUDA 13.0 (stand-in: PyPI torch)")
      return 0
    fi
  fi
  flavour_args+=(--build-arg "BASE_IMAGE=${base}")
}

for flavour in "${flavours[@]}"; do
  [[ "$push" != only ]] || break
  image="${registry}/trainer-${flavour}:${version}"
  "${flavour}_args"
  step "building ${image} from images/trainer/Dockerfile (FLAVOUR=${flavour})"
  start=$SECONDS
  "$docker_cmd" build \
    --file images/trainer/Dockerfile \
    --build-arg "VERSION=${version}" \
    --tag "$image" \
    "${flavour_args[@]}" \
    ${extra_args[@]+"${extra_args[@]}"} \
    .
  size="$("$docker_cmd" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.2f GB", $1/1e9}')"
  step "built ${image} in $((SECONDS - start)) s (${size})"
done

# The digest map: each pushed tag and the digest its registry answered (the push's own
# "digest: sha256:..." line), merged into the map's other entries, written whole or not at all.
record_digest() {
  local image="$1" digest="$2"
  python3 - "$digests_file" "$image" "${image%:*}@${digest}" <<'PY'
import json, os, sys

path, tag, ref = sys.argv[1:]
try:
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
except FileNotFoundError:
    table = {}
if not isinstance(table, dict):
    sys.exit(f"error: {path} is not a digest map (a JSON object): move it away or set GPUPIPE_IMAGE_DIGESTS")
table[tag] = ref
os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(table, f, indent=2, sort_keys=True)
    f.write("\n")
os.replace(path + ".tmp", path)
PY
}

if [[ "$push" != false ]]; then
  for flavour in "${flavours[@]}"; do
    image="${registry}/trainer-${flavour}:${version}"
    step "pushing ${image}"
    start=$SECONDS
    if ! out="$("$docker_cmd" push "$image" 2>&1)"; then
      printf '%s\n' "$out" | tail -n 5 >&2
      echo "error: docker push ${image} failed (above): is ${registry%%/*} a registry this engine can reach and log in to?" >&2
      exit 1
    fi
    digest="$(printf '%s\n' "$out" | sed -n 's/^.*digest: \(sha256:[0-9a-f]\{64\}\) .*$/\1/p' | tail -n 1)"
    if [[ -z "$digest" ]]; then
      echo "error: docker push ${image} printed no digest: ${out##*$'\n'}" >&2
      exit 1
    fi
    record_digest "$image" "$digest"
    step "pushed ${image%:*}@${digest} in $((SECONDS - start)) s (recorded in ${digests_file})"
  done
fi
