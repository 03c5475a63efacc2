#!/bin/sh
# The deps stage's venv and its torch: the one place the two flavours of images/trainer/Dockerfile
# differ in what they install.
#   cpu   a plain venv, then torch==<constraints.txt's pin>+cpu alone, --no-deps, from the index
#         (default PyTorch's CPU index): it satisfies constraints.txt's torch==2.13.0 and leaves
#         out the ~3 GB of CUDA libraries PyPI's Linux wheel pulls in; its dependencies come
#         with the requirements (install-deps.sh, requirements.lock).
#   cuda  a venv over the base's site-packages: PyTorch's CUDA image, and its torch; or, with an
#         index, torch and its nvidia-* wheels from there (PyPI's Linux torch is the CUDA 13.0
#         build) over a plain Python base.
# `--check` checks the venv's torch (after install-deps.sh, which brings the CPU torch's
# dependencies, and its trim): constraints.txt's version; for cuda, a CUDA build with NCCL,
# checked at once too (the base or the index brought its dependencies).
# Usage: sh install-torch.sh FLAVOUR VENV [INDEX_URL]   (run where constraints.txt and the
#        torch-*.lock files are)
#        sh install-torch.sh FLAVOUR VENV --check
set -eu
flavour="$1"
venv="$2"
index="${3:-}"

pin="$(sed -n 's/^torch==//p' constraints.txt)"
if [ -z "$pin" ]; then
  echo "error: constraints.txt pins no torch (a 'torch==<version>' line)" >&2
  exit 2
fi

check() {
  case "$flavour" in
    cpu) want="" ;;
    cuda) want="cuda" ;;
  esac
  "$venv/bin/python" - "$pin" "$want" <<'PY'
import sys

import torch

pin, want = sys.argv[1], sys.argv[2]
found = torch.__version__.split("+")[0]
if found != pin:
    sys.exit(f"error: the venv's torch is {torch.__version__}, not constraints.txt's torch=={pin}")
if want == "cuda" and not (torch.version.cuda and torch.distributed.is_nccl_available()):
    sys.exit(f"error: the venv's torch {torch.__version__} is not a CUDA build with NCCL (FLAVOUR=cuda)")
print(f"torch {torch.__version__}" + (f", CUDA {torch.version.cuda}, NCCL" if want else ""))
PY
}

case "$flavour" in
  cpu | cuda) ;;
  *)
    echo "error: FLAVOUR is '$flavour': cpu or cuda (images/trainer/Dockerfile's build argument)" >&2
    exit 2
    ;;
esac

if [ "$index" = "--check" ]; then
  check
  exit 0
fi

# Each file pip fetches is checked against its lock's sha256 (hack/lock-images.sh made both from
# constraints.txt's pin): torch-cpu.lock, the CPU wheel (images/wheels.sha256's);
# torch-cuda.lock, PyPI's Linux torch with every CUDA wheel it needs.
if [ "$flavour" = cpu ]; then
  python -m venv "$venv"
  index="${index:-https://download.pytorch.org/whl/cpu}"
  "$venv/bin/python" -m pip install --no-cache-dir --require-hashes --no-deps \
    --index-url "$index" -r torch-cpu.lock
else
  python -m venv --system-site-packages "$venv"
  if [ -n "$index" ]; then
    "$venv/bin/python" -m pip install --no-cache-dir --require-hashes --no-deps \
      --index-url "$index" -r torch-cuda.lock
  fi
  check
fi
