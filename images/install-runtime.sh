#!/bin/sh
# The runtime of both trainer images (their last stage, as root): a C++ compiler for
# torch.compile, and the user the pods run as.
set -eu

# g++ (with gcc) and the Python headers: torch.compile's inductor builds C++ kernels, and
# Triton its CUDA launcher, with the host compiler at run time. Versions follow the base
# image's release (pin the base by digest to pin them).
# Left out, as no compile of inductor's or Triton's (a shared object: -shared -fPIC, linked
# against the shared libc/libstdc++/libgomp) reads them: apt's caches; LTO (lto1, lto-dump);
# the sanitizer runtimes; the static libraries (libc.a, libstdc++.a, ...: -static only) but
# libgcc*.a and *_nonshared.a, which every link needs (libc.so is a linker script naming
# libc_nonshared.a; gcc adds -lgcc), and glibc's empty stubs (libpthread.a, libdl.a, ...: a few
# bytes; -fopenmp links -lpthread); the profilers and tools no compile runs (gprof, gprofng,
# gcov, the gold linker, dwp).
apt-get update
apt-get install -y --no-install-recommends g++ libpython3-dev
apt-get clean
rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/lib/python3*/config-*/*.a \
  /usr/lib/*-linux-gnu/gprofng /usr/lib/*-linux-gnu/libgprofng* /etc/gprofng.rc
find /usr/lib/gcc /usr/lib/*-linux-gnu \
  \( -name lto1 -o -name 'lib[altu]*san*' -o -name 'libhwasan*' \
  -o \( -name 'lib*.a' -size +1k ! -name 'libgcc*.a' ! -name '*_nonshared.a' \) \) -delete
find /usr/bin \( -name '*lto-dump*' -o -name 'gp-*' -o -name '*-gp-*' -o -name '*gprof*' \
  -o -name '*gcov*' -o -name '*gold' -o -name '*dwp' \) -delete

# uid/gid 1000, the pod's runAsUser. A base that already has one (Ubuntu 24.04's `ubuntu`, in
# PyTorch's CUDA images) gives it up first. /gcs /minio /s3 /oci: where the KFP v2 executor
# stages artifacts (a non-root user cannot create them at run time).
old_user="$(awk -F: '$3 == 1000 {print $1}' /etc/passwd)"
if [ -n "$old_user" ]; then userdel "$old_user"; fi
old_group="$(awk -F: '$3 == 1000 {print $1}' /etc/group)"
if [ -n "$old_group" ]; then groupdel "$old_group"; fi
groupadd --gid 1000 gpupipe
useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gpupipe
mkdir -p /gcs /minio /s3 /oci /workspace
chown 1000:1000 /gcs /minio /s3 /oci /workspace
