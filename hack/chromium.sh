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
  # With its recommended packages, as before (their fonts draw the screenshots' text).
  if ! "$(dirname "$0")/apt-install.sh" --with-recommends chromium; then
    echo "error: apt-get install chromium failed" >&2
    exit 3
  fi
fi
/usr/bin/chromium --version
