#!/usr/bin/env bash
# Debian's chromium for the browser tests (tests/cluster/test_kfp_ui.py drives KFP's UI in it with
# Playwright, which cannot download a browser of its own here): apt-get installs it when
# /usr/bin/chromium is missing (root). Prints the browser's version. Exit 3 when it cannot be
# installed: the browser tests then skip, saying so.
set -euo pipefail
if [[ ! -x /usr/bin/chromium ]]; then
  if [[ "$(id -u)" != 0 ]]; then
    echo "error: chromium is missing, and installing it needs root (apt-get install chromium)" >&2
    exit 3
  fi
  echo "==> apt-get install chromium" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Another apt-get (cluster-up's, docker-up's) may hold the lock for a while.
  if ! { apt-get -o DPkg::Lock::Timeout=300 update -qq &&
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq chromium >/dev/null; }; then
    echo "error: apt-get install chromium failed" >&2
    exit 3
  fi
fi
/usr/bin/chromium --version
