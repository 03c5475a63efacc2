#!/bin/sh
# The deps stage of both trainer images, after torch is in the venv: the requirements of
# .[pipelines] from their hashed lock (requirements.lock, made by hack/lock-images.sh from
# constraints.txt), then the venv trimmed by trim-venv.sh with binutils (strip) installed for it.
# Run from the stage's WORKDIR, which holds requirements.lock and trim-venv.sh.
# Usage: sh install-deps.sh VENV PIP_ASIDE   (trim-venv.sh's arguments)
set -eu
venv="$1"
pip_aside="$2"

# Every package at its locked version, each file checked against the lock's sha256 (a file that
# was swapped on the index fails the build), the lock complete (no dependency is looked up):
# setuptools too, with which the package stage builds the package without a download.
pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock

# binutils for the trim's strip: in the deps stage only (the image copies just the venv).
apt-get update
apt-get install -y --no-install-recommends binutils
apt-get clean
rm -rf /var/lib/apt/lists/*

# pip leaves the venv for PIP_ASIDE: only the package stage runs it (the image gets no pip).
sh trim-venv.sh "$venv" "$pip_aside"
