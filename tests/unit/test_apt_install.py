"""hack/apt-install.sh, the one way our scripts install a Debian package, against a fake apt-get.

A cold CI run (2026-11-28) failed its whole cluster half on "E: Could not get lock
/var/lib/apt/lists/lock": the network-policy add-on's `apt-get update` ran while chromium.sh's
apt-get held the lock, and `apt-get update` does not wait (apt 2.6's DPkg::Lock::Timeout covers
only dpkg's lock: tried). The helper retries a refused lock until its deadline, fails at once on
anything else, and lets one of our installers run at a time.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCKED = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 77 (apt-get)"


def fake_apt(tmp_path: Path, body: str) -> Path:
    """An ``apt-get`` first on PATH that appends its arguments to calls.log, then runs ``body``
    (``$n``: how many times it has been called, this call included)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    script = bin_dir / "apt-get"
    script.write_text(f'#!/bin/bash\necho "$*" >> {log}\nn=$(wc -l < {log})\n' + body)
    script.chmod(0o755)
    return log


def apt_env(tmp_path: Path) -> dict[str, str]:
    """The fake apt-get first on PATH, the installers' lock file under tmp_path."""
    return {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "GPUPIPE_APT_LOCK": str(tmp_path / "apt.lock"),
    }


def install(tmp_path: Path, *args: str, wait_s: int = 30) -> subprocess.CompletedProcess[str]:
    env = apt_env(tmp_path) | {"APT_LOCK_WAIT": str(wait_s), "APT_LOCK_RETRY_S": "0.1"}
    return subprocess.run(
        [str(ROOT / "hack" / "apt-install.sh"), *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def what(call: str) -> str:
    """``update``, or the package an install call names."""
    words = call.split()
    return "update" if "update" in words else words[-1]


def test_a_held_lock_is_waited_out_then_the_package_installs(tmp_path: Path) -> None:
    log = fake_apt(tmp_path, f'[[ $n -gt 2 ]] || {{ echo "{LOCKED}" >&2; exit 100; }}\n')
    out = install(tmp_path, "ipset")
    assert out.returncode == 0, out.stderr
    assert [what(c) for c in calls(log)] == ["update"] * 3 + ["ipset"]  # refused twice
    assert calls(log)[-1].endswith("install -y -qq --no-install-recommends ipset")


def test_another_failure_ends_it_at_once_with_apts_own_line(tmp_path: Path) -> None:
    log = fake_apt(
        tmp_path,
        '[[ "$*" != *install* ]] || { echo "E: Unable to locate package nope" >&2; exit 100; }\n',
    )
    out = install(tmp_path, "nope")
    assert out.returncode == 1
    assert out.stderr.strip() == "E: Unable to locate package nope"
    assert [what(c) for c in calls(log)] == ["update", "nope"]  # no retry


def test_a_lock_held_past_the_deadline_fails_saying_so(tmp_path: Path) -> None:
    fake_apt(tmp_path, f'echo "{LOCKED}" >&2; exit 100\n')
    began = time.monotonic()
    out = install(tmp_path, "ipset", wait_s=1)
    assert out.returncode == 1
    assert LOCKED in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "error: apt's lock was still held after 1 s"
    assert time.monotonic() - began < 20


def test_our_installers_take_turns(tmp_path: Path) -> None:
    log = fake_apt(tmp_path, 'echo "begin $$" >> "$(dirname "$0")/../turns"; sleep 0.3\n'
                   'echo "end $$" >> "$(dirname "$0")/../turns"\n')  # fmt: skip
    env = apt_env(tmp_path)
    script = str(ROOT / "hack" / "apt-install.sh")
    procs = [subprocess.Popen([script, pkg], env=env) for pkg in ("a", "b", "c")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    turns = (tmp_path / "turns").read_text().split("\n")[:-1]
    assert len(turns) == 12 and len(calls(log)) == 6
    # Each installer's update and install run back to back: no begin between a begin and its end,
    # and each pair of apt-get calls (update, install) comes from one installer.
    for i in range(0, 12, 2):
        assert turns[i].startswith("begin") and turns[i + 1].startswith("end"), turns
    packages = [what(c) for c in calls(log)]
    assert [packages[i] for i in range(0, 6, 2)] == ["update"] * 3
    assert sorted(packages[i] for i in range(1, 6, 2)) == ["a", "b", "c"]


def test_recommends_only_when_asked_and_no_package_is_a_usage_error(tmp_path: Path) -> None:
    log = fake_apt(tmp_path, "")
    assert install(tmp_path, "--with-recommends", "chromium").returncode == 0
    assert calls(log)[-1].endswith("install -y -qq --install-recommends chromium")
    out = install(tmp_path)
    assert out.returncode == 64 and "usage: hack/apt-install.sh" in out.stderr
