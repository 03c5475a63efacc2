#!/bin/sh
# The deps stage of both trainer images, after torch is in the venv: the requirements of
# .[pipelines] (requirements.txt, written by requirements.py), then the venv trimmed by
# trim-venv.sh with binutils (strip) installed for it. Run from the stage's WORKDIR, which holds
# constraints.txt, requirements.txt and trim-venv.sh.
# Usage: sh install-deps.sh VENV PIP_ASIDE   (trim-venv.sh's arguments)
set -eu
venv="$1"
pip_aside="$2"

# Every version comes from constraints.txt, setuptools's too: the package stage builds the
# package with it, without a download.
pip install --no-cache-dir -c constraints.txt -r requirements.txt setuptools

# binutils for the trim's strip: in the deps stage only (the image copies just the venv).
apt-get update
apt-get install -y --no-install-recommends binutils
apt-get clean
rm -rf /var/lib/apt/lists/*

# pip leaves the venv for PIP_ASIDE: only the package stage runs it (the image gets no pip).
sh trim-venv.sh "$venv" "$pip_aside"
