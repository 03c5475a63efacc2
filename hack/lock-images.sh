#!/usr/bin/env bash
# The hashed lock files every image installs from with `pip install --require-hashes --no-deps`
# (issue 60, item 12): each package at its pinned version with the sha256 of every file PyPI
# has for it, so a re-uploaded or swapped file fails the build instead of entering the image.
# The versions come from the pins that were already the images' (constraints.txt; the add-on
# images' constraints files), resolved once more by pip-compile (pip-tools, in a scratch venv)
# to be complete: an install without dependencies must find every one in its lock.
#
#   images/requirements.lock     the trainer images' .[pipelines] (images/requirements.py), less
#                                torch; the packages torch itself needs are in it
#   images/torch-cpu.lock        torch==<pin>+cpu, the local wheel (GPUPIPE_WHEELS, checked
#                                against images/wheels.sha256)
#   images/torch-cuda.lock       PyPI's Linux torch==<pin> and its CUDA wheels (FLAVOUR=cuda with
#                                TORCH_INDEX_URL: the stand-in)
#   hack/cluster/addons/images/mlflow/requirements.lock        mlflow[auth], boto3
#   hack/cluster/addons/images/kfp/requirements-mlmd.lock      ml-metadata
#   hack/cluster/addons/images/katib/requirements-<svc>.lock   Katib's Python services (upstream's
#                                requirements.txt from its Go module download)
#
# Run from anywhere: make lock. Needs python3 and PyPI (pip's index); Katib's module is fetched
# with `go mod download` when it is not in Go's module cache. tests/unit/test_supply_chain.py
# fails when a lock no longer matches its pins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=hack/cluster/versions.env
source hack/cluster/versions.env
PIP_TOOLS_VERSION=7.6.2
WHEELS="${GPUPIPE_WHEELS:-$(cd "$ROOT/.." && pwd)/shared/wheels}"
ADDON_IMAGES=hack/cluster/addons/images
# pip's own find-links (a machine's local wheel folder) would hash its local copies, not PyPI's.
unset PIP_FIND_LINKS PIP_NO_INDEX

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo ">> pip-tools ${PIP_TOOLS_VERSION} in a scratch venv"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "pip-tools==${PIP_TOOLS_VERSION}"

# lock OUT WHAT INPUT [pip-compile options]: INPUT resolved to OUT, every file's hash of each pin.
lock() {
  local out="$1" what="$2" in="$3"
  shift 3
  echo ">> ${out}"
  rm -f "$work/out.lock" # pip-compile keeps the pins of an output file it finds
  "$work/venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --no-header \
    --no-annotate --strip-extras --no-emit-index-url --no-emit-find-links \
    --cache-dir "$work/cache" --output-file "$work/out.lock" "$@" "$in"
  {
    echo "# ${what}: written by hack/lock-images.sh (make lock), do not edit."
    cat "$work/out.lock"
  } >"$out"
}

# --- the trainer images --------------------------------------------------------------------------
torch_pin="$(sed -n 's/^torch==//p' constraints.txt)"
wheel="torch-${torch_pin}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
[[ -f "${WHEELS}/${wheel}" ]] || { echo "error: ${WHEELS}/${wheel} is missing (GPUPIPE_WHEELS)" >&2; exit 2; }
(cd "$WHEELS" && grep -F "  ${wheel}" "${ROOT}/images/wheels.sha256" | sha256sum --check --quiet) ||
  { echo "error: ${WHEELS}/${wheel} is not the wheel images/wheels.sha256 pins" >&2; exit 2; }
{
  echo "-c ${ROOT}/constraints.txt"
  python3 images/requirements.py pyproject.toml pipelines | grep -v '^torch\b'
  echo "torch==${torch_pin}+cpu"
  echo "setuptools"
} >"$work/trainer.in"
lock "$work/trainer.lock" "TRAINER" "$work/trainer.in" --find-links "$WHEELS"
# torch apart: each flavour brings its own (install-torch.sh); the rest is both flavours'.
python3 - "$work/trainer.lock" images/requirements.lock images/torch-cpu.lock <<'PY'
import re
import sys

text = open(sys.argv[1]).read()
header, _, body = text.partition("\n")
entries = re.split(r"\n(?=\S)", body.strip())
torch = [e for e in entries if e.startswith("torch==")]
assert len(torch) == 1, torch
with open(sys.argv[2], "w") as f:
    f.write(header.replace("TRAINER", "The trainer images' .[pipelines], less torch") + "\n")
    f.write("\n".join(e for e in entries if not e.startswith("torch==")) + "\n")
with open(sys.argv[3], "w") as f:
    f.write(header.replace("TRAINER", "The CPU image's torch (the local wheel)") + "\n")
    f.write(torch[0] + "\n")
PY

echo "torch==${torch_pin}" >"$work/torch-cuda.in"
echo "-c ${ROOT}/constraints.txt" >>"$work/torch-cuda.in"
lock images/torch-cuda.lock "PyPI's Linux torch and its CUDA wheels" "$work/torch-cuda.in"

# --- the test cluster's add-on images ----------------------------------------------------------
boto3="$(sed -n 's/^boto3==//p' "${ADDON_IMAGES}/mlflow/constraints.txt")"
printf -- '-c %s\nmlflow[auth]==%s\nboto3==%s\n' "${ROOT}/${ADDON_IMAGES}/mlflow/constraints.txt" \
  "$MLFLOW_VERSION" "$boto3" >"$work/mlflow.in"
lock "${ADDON_IMAGES}/mlflow/requirements.lock" "mlflow[auth] and boto3" "$work/mlflow.in"

printf -- '-c %s\nml-metadata\n' "${ROOT}/${ADDON_IMAGES}/kfp/requirements-mlmd.txt" >"$work/mlmd.in"
lock "${ADDON_IMAGES}/kfp/requirements-mlmd.lock" "ml-metadata" "$work/mlmd.in"

katib="$(cd /tmp && go mod download -json "github.com/kubeflow/katib@v${KATIB_VERSION}" |
  sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
[[ -d "$katib" ]] || { echo "error: go mod download of Katib v${KATIB_VERSION} failed" >&2; exit 2; }
while read -r name svc; do
  {
    echo "-c ${ROOT}/${ADDON_IMAGES}/katib/constraints-${name}.txt"
    cat "${katib}/${svc}/requirements.txt"
  } >"$work/${name}.in"
  lock "${ADDON_IMAGES}/katib/requirements-${name}.lock" "Katib's ${name}" "$work/${name}.in"
done < <(sed -n '/^PY_SERVICES=(/,/^)/{s/^  "\(.*\)"$/\1/p}' hack/cluster/addons/katib.sh)

echo ">> done: commit the .lock files beside their pins"
