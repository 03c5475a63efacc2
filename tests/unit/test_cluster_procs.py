"""The test cluster's host processes (hack/cluster/procs.sh): start, running, must_run.

A CI run once ended with "kube-router exited at start" and nothing else: an empty log, no exit
status. `must_run` now says what became of the process (its exit status or signal, or what runs
under its pid) and when its log is empty; `start` returns once the child runs the command, so
that `running` never reads a child that has not yet exec'd (its command line still this shell's)
as another's process, nor stops at setsid, whose command line names the command too (the same
failure came back in a make test-cluster run: "kube-router exited at start, pid N runs:
kube-router ...": must_run had read its command line mid-exec). Real processes, a throwaway
state folder: no cluster or root needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash(tmp_path: Path, script: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """Run SCRIPT after sourcing lib.sh and procs.sh with state and cache under tmp_path."""
    env = {
        **os.environ,
        "GPUPIPE_CLUSTER_DIR": str(tmp_path / "state"),
        "GPUPIPE_CLUSTER_CACHE": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path),
    }
    prelude = (
        "set -euo pipefail\n"
        f"source {ROOT}/hack/cluster/lib.sh\n"
        f"source {ROOT}/hack/cluster/procs.sh\n"
    )
    return subprocess.run(
        ["bash", "-c", prelude + script], env=env, capture_output=True, text=True, timeout=timeout
    )


# A tool that, once ready, stays the same process (its command line the tool's, as a server's):
# `exec sleep 30` there made it another program, which `running` rightly does not take for the
# tool, and must_run failed whenever its ready check came just before the touch and its next
# look just after the exec (twice in a loaded cold .ci/run).
_STAY = "while :; do sleep 1; done\n"


def _tool(tmp_path: Path, name: str, body: str) -> Path:
    """A program in the cluster's binary folder (what `ours` takes for the cluster's own)."""
    path = tmp_path / "cache" / "bin" / f"{name}-1" / name
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_a_started_process_runs_at_once_and_stops(tmp_path: Path) -> None:
    sleeper = tmp_path / "cache" / "bin" / "sleeper-1" / "sleeper"
    sleeper.parent.mkdir(parents=True)
    shutil.copy(shutil.which("sleep") or "/bin/sleep", sleeper)
    out = _bash(
        tmp_path,
        f"""
        for i in $(seq 1 40); do
          start s$i {sleeper} 30
          running s$i || {{ echo "s$i not running right after start"; exit 1; }}
          first="$(argv0 "$(cat "$RUN_DIR/s$i.pid")")"
          [[ "$first" == {sleeper} ]] || {{ echo "s$i runs '$first', not the command"; exit 1; }}
        done
        for i in $(seq 1 40); do stop s$i; running s$i && exit 1; done
        echo ok
        """,
        # A loaded machine (a cold .ci/run builds Kubernetes beside make test) delays each exec.
        timeout=600,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_a_start_that_never_reaches_the_command_fails_in_one_line_after_its_wait(
    tmp_path: Path,
) -> None:
    # A setsid that never execs the command: start waits START_WAIT_S by the clock, then says so.
    out = _bash(
        tmp_path,
        """
        setsid() { sleep 30; }
        START_WAIT_S=1
        if start stuck /bin/true; then echo "start returned 0"; fi
        kill "$(cat "$RUN_DIR/stuck.pid")"
        echo done
        """,
    )
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stdout + out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "error: cluster: stuck (pid " in out.stderr, out.stderr
    assert "did not start /bin/true within 1 s" in out.stderr, out.stderr


def test_a_process_that_exits_is_named_with_its_exit_status_and_log(tmp_path: Path) -> None:
    tool = _tool(tmp_path, "broken", "echo 'bad flag --nope' >&2\nexit 7\n")
    out = _bash(tmp_path, f"start broken {tool}\nmust_run broken 10 false\n")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert "bad flag --nope" in lines
    assert lines[-1] == (
        f"error: cluster: broken exited at start, exit status 7 "
        f"(log: {tmp_path}/state/logs/broken.log)"
    )


def test_a_killed_process_with_an_empty_log_is_said_so(tmp_path: Path) -> None:
    tool = _tool(tmp_path, "victim", "kill -KILL $$\n")
    out = _bash(tmp_path, f"start victim {tool}\nmust_run victim 10 false\n")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[-2] == f"    ({tmp_path}/state/logs/victim.log is empty)"
    assert lines[-1].startswith("error: cluster: victim exited at start, killed by signal 9 (KILL)")


def test_a_process_that_gets_ready_passes(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    tool = _tool(tmp_path, "slow", f"sleep 1\ntouch {ready}\n{_STAY}")
    script = f"start slow {tool}\nmust_run slow 20 test -e {ready}\nstop slow\necho ok"
    out = _bash(tmp_path, script)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_one_read_of_not_running_is_not_believed(tmp_path: Path) -> None:
    """`running` reads NAME as not running once (as a command line read in the middle of an exec
    reads): must_run looks again before it calls the process ended, and waits it out."""
    ready = tmp_path / "ready"
    tool = _tool(tmp_path, "flicker", f"sleep 1\ntouch {ready}\n{_STAY}")
    script = f"""
    start flicker {tool}
    eval "real_$(declare -f running)"
    reads=0
    running() {{ reads=$((reads + 1)); ((reads != 1)) || return 1; real_running "$@"; }}
    must_run flicker 20 test -e {ready}
    stop flicker
    echo "ok after $reads reads"
    """
    out = _bash(tmp_path, script)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("ok after "), out.stdout
