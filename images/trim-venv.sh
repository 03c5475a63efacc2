#!/bin/sh
# Trim a venv for the image: drop what no step reads at run time (tests and test binaries,
# Cython sources, the Arrow C++ SDK, Arrow Flight) and the static symbol tables of torch's and
# Arrow's own libraries (strip --strip-unneeded keeps the dynamic symbols that loading needs;
# libraries that auditwheel patched, such as numpy.libs' OpenBLAS, break when stripped). Kept:
# torch/include (torch.compile compiles C++ against it), torch_shm_manager (DataLoader workers'
# shared memory) and every .pyc (without them each process spends seconds compiling imports).
# Usage: sh trim-venv.sh /opt/venv
set -eu
venv="$1"
site="$(find "$venv/lib" -maxdepth 2 -type d -name site-packages | head -n 1)"
before="$(du -sm "$venv" | cut -f1)"
find "$site" -depth -type d -name tests -prune -exec rm -rf {} +
find "$site" -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' \) -delete
rm -rf "$site/pyarrow/include" "$site/pyarrow/src" "$site/torch/test"
rm -f "$site"/pyarrow/libarrow_flight.so* "$site"/pyarrow/_flight.*.so
find "$site/torch/bin" -type f ! -name torch_shm_manager -delete
find "$site/torch/lib" -type f \( -name '*test*.so' -o -name 'lib*backend*.so' -o -name 'libaoti_custom_ops.so' \) -delete
if command -v strip >/dev/null 2>&1; then
  find "$site/torch/lib" "$site/pyarrow" -maxdepth 1 -type f \( -name '*.so' -o -name '*.so.*' \) \
    -exec strip --strip-unneeded {} +
else
  echo "strip not found: shared libraries keep their symbol tables" >&2
fi
echo "trimmed $venv: ${before} MB -> $(du -sm "$venv" | cut -f1) MB"
