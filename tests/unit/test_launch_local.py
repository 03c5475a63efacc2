"""The one child-process pump (``trainer.launch.local.Child``) that the local train launcher and
the tune subprocess trial runner share: real child processes, real signals."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time

import pytest

from trainer.base.errors import InputError
from trainer.launch.local import Child

SECRET = "supersecret"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def alive(pid: int) -> bool:
    """Running (a zombie that no init reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_pump_redacts_echoes_keeps_a_tail_and_finds_the_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[str] = []
    child = Child(
        python(
            f"""
            import sys
            for i in range(5):
                print(f"line {{i}}")
            print("reading s3://AKIA:{SECRET}@bucket/x", file=sys.stderr)
            print("ERROR [train] E_DATA: no rows (s3://AKIA:{SECRET}@bucket/x)", file=sys.stderr)
            sys.exit(2)
            """
        ),
        env=os.environ,
        tail_lines=3,
        prefix="[t-1] ",
        on_line=seen.append,
    )
    child.pump()
    code = child.wait(grace_s=10)

    out = capsys.readouterr().out
    assert code == 2
    assert out.splitlines()[0] == "[t-1] line 0"
    assert "[t-1] reading s3://***:***@bucket/x" in out
    assert SECRET not in out and not any(SECRET in line for line in seen)
    assert len(seen) == 7 and seen[0] == "line 0\n"
    assert list(child.tail) == [
        "line 4",
        "reading s3://***:***@bucket/x",
        "ERROR [train] E_DATA: no rows (s3://***:***@bucket/x)",
    ]
    error = child.failure("trial t-1", code)
    assert isinstance(error, InputError) and error.code == "E_DATA"


def test_failure_without_an_error_line_names_the_run_and_its_last_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    child = Child(
        python("print('a'); print('b'); print('c'); raise SystemExit(7)"),
        env=os.environ,
        tail_lines=2,
        echo=False,
    )
    child.pump_in_background()
    code = child.wait(grace_s=10)
    child.join_pump()

    error = child.failure("training job j", code, TimeoutError)
    assert isinstance(error, TimeoutError)
    assert str(error) == "training job j failed (exit code 7); last log lines:\nb\nc"
    assert capsys.readouterr().out == ""  # echo=False


def test_stop_terminates_the_whole_group_then_kills_after_the_grace_period() -> None:
    # A parent that ignores SIGTERM, with a grandchild that would outlive it.
    child = Child(
        python(
            """
            import signal, subprocess, sys, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            print(p.pid, flush=True)
            time.sleep(60)
            """
        ),
        env=os.environ,
        tail_lines=5,
        echo=False,
    )
    assert child.proc.stdout is not None
    grandchild = int(child.proc.stdout.readline())

    started = time.monotonic()
    code = child.stop(grace_s=0.5)

    assert code == -signal.SIGKILL  # SIGTERM ignored: killed once the grace period ran out
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the grandchild got SIGTERM with its group
        if not alive(grandchild):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {grandchild} outlived its group's stop")
