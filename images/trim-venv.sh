#!/bin/sh
# Trim a venv for the image: drop what no step reads at run time, and shrink what stays.
# Usage: sh trim-venv.sh VENV [PIP_ASIDE]
#   PIP_ASIDE (optional): move pip out of the venv into this folder (for the build stage that
#   installs the package: PYTHONPATH=PIP_ASIDE python -m pip ...); the image gets no pip.
# Kept, because steps need them: torch/include's CPU headers (torch.compile's inductor compiles
# C++ against them), torch_shm_manager (DataLoader workers' shared memory), setuptools
# (torch.utils.cpp_extension imports it, and inductor's cpp_builder imports that) and every
# .pyc (without them each process spends seconds compiling its imports: 12 s -> 39 s measured
# for the steps, since a read-only root cannot cache them). Never stripped: the libraries in
# *.libs and anything else auditwheel patched (it sets their RPATH; numpy.libs' OpenBLAS broke
# when stripped). Each cut below says why it is safe; `sh -x` shows what it does.
set -eu
venv="$1"
pip_aside="${2:-}"
site="$(find "$venv/lib" -maxdepth 2 -type d -name site-packages | head -n 1)"
before="$(du -sm "$venv" | cut -f1)"

# Tests, test binaries, Cython sources, the Arrow C++ SDK and Arrow Flight (no step imports
# pyarrow.flight; libarrow_python_flight is loaded only by the _flight module removed here).
find "$site" -depth -type d -name tests -prune -exec rm -rf {} +
find "$site" -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' \) -delete
rm -rf "$site/pyarrow/include" "$site/pyarrow/src" "$site/torch/test"
rm -f "$site"/pyarrow/libarrow_flight.so* "$site"/pyarrow/_flight.*.so \
  "$site"/pyarrow/libarrow_python_flight.so* "$site"/pyarrow/_pyarrow_cpp_tests.*.so
find "$site/torch/bin" -type f ! -name torch_shm_manager -delete
find "$site/torch/lib" -type f \( -name '*test*.so' -o -name 'lib*backend*.so' -o -name 'libaoti_custom_ops.so' \) -delete

# torch/include: the headers of other accelerators' backends. inductor's CPU kernels include
# cpp_prefix.h, whose closure (g++ -M) is c10/{core,macros,util}, ATen/{core,cpu,native},
# torch/headeronly and torch/csrc/{inductor,stable}; a backend's headers are included only when
# compiling for that backend (USE_CUDA/USE_ROCM/...). HIP, MIOpen, MPS/Metal (macOS), XPU and
# MTIA never apply to a Linux CUDA or CPU build of torch; CUDA/cuDNN headers go only where torch
# has no CUDA library (the CPU build). tests/containers' torch.compile smoke test proves it.
backends='-name hip -o -name miopen -o -name mps -o -name metal -o -name xpu -o -name mtia'
if [ ! -e "$site/torch/lib/libtorch_cuda.so" ]; then
  backends="$backends -o -name cuda -o -name cudnn"
fi
# shellcheck disable=SC2086 # $backends is a list of find predicates
find "$site/torch/include" -depth -type d \( $backends \) -prune -exec rm -rf {} +

# pip: no step installs anything at run time (components use install_kfp_package=False and no
# packages_to_install; the pod's root, hence the venv, is read-only; a venv ignores --user).
if [ -n "$pip_aside" ]; then
  mkdir -p "$pip_aside"
  mv "$site"/pip "$site"/pip-*.dist-info "$pip_aside"/
  rm -f "$venv"/bin/pip "$venv"/bin/pip3 "$venv"/bin/pip3.*
fi

if command -v strip >/dev/null 2>&1 && command -v readelf >/dev/null 2>&1; then
  # torch's and Arrow's own libraries: their RPATH ($ORIGIN) comes from their build, not
  # auditwheel, and they load stripped (strip --strip-unneeded keeps the dynamic symbols).
  find "$site/torch/lib" "$site/pyarrow" -maxdepth 1 -type f \( -name '*.so' -o -name '*.so.*' \) \
    -exec strip --strip-unneeded {} +
  # Every other shared object that still has a static symbol table and no RPATH/RUNPATH:
  # auditwheel sets an RPATH on every file it patches (and renames what it copies into *.libs),
  # so these are the files as their linker wrote them (scipy, sqlalchemy, fontTools,
  # kiwisolver, yaml, cryptography, ...: ~40 MB of symbols; in the CUDA image Triton's
  # libtriton 461 -> 180 MB and libproton 23 -> 2 MB). Loading needs only .dynsym. Not the
  # NVIDIA libraries (nvidia/: NCCL's holds 40 MB of symbols), whose device code only a GPU
  # could prove intact after a strip.
  find "$site" -type f \( -name '*.so' -o -name '*.so.*' \) ! -path '*.libs/*' \
    ! -path "$site/nvidia/*" | while read -r lib; do
    if readelf -S "$lib" 2>/dev/null | grep -q '\.symtab' \
      && ! readelf -d "$lib" 2>/dev/null | grep -Eq '\((RPATH|RUNPATH)\)'; then
      strip --strip-unneeded "$lib"
    fi
  done
else
  echo "strip/readelf not found: shared libraries keep their symbol tables" >&2
fi

# Identical shared libraries become relative symlinks to one copy: wheels cannot hold symlinks,
# so pyarrow ships libarrow_python.so three times (.so, .so.2600, .so.2600.1.0) and numpy.libs
# and scipy.libs the same libgfortran and libquadmath. The loader follows symlinks, and the
# copies' names (the sonames asked for) stay.
find "$site" -type f \( -name '*.so' -o -name '*.so.*' \) -size +64k -exec md5sum {} + \
  | sort | awk '$1 == sum { print keep " " $2; next } { sum = $1; keep = $2 }' \
  | while read -r keep dup; do
    ln -sfr "$keep" "$dup"
  done

echo "trimmed $venv: ${before} MB -> $(du -sm "$venv" | cut -f1) MB"
