"""A small pipeline under the real kfp.local, read as ``gpupipe run --local`` reads one: the
terminal gets two lines per step (three steps here: six lines, or one for a cached step), the
steps' output and kfp.local's warnings only the log. Fails when kfp.local changes the lines it
marks a task's start and end with. (No ``from __future__ import annotations``: KFP reads the
components' annotations as types.)"""

import io
import re
from pathlib import Path

import pytest
from kfp import dsl, local

from pipelines.local_progress import Progress, captured
from pipelines.local_report import StepLog

pytestmark = pytest.mark.integration

NOT_PYTHON = "ghcr.io/gpupipe/trainer-cpu:0.1.0"
"""Our steps' image: kfp.local warns that a non-Python image may not run here."""


@dsl.component(base_image=NOT_PYTHON, install_kfp_package=False)
def add_one(x: int) -> int:
    print(f"the step's own output: {x}")
    return x + 1


@dsl.component(base_image=NOT_PYTHON, install_kfp_package=False)
def refuse(x: int) -> int:
    print(f"ERROR [refuse] E_PARAM: x must be even, got {x} (x)")
    raise SystemExit(2)


@dsl.pipeline(name="small")
def small(x: int = 1, fail: bool = False) -> None:
    first = add_one(x=x).set_cpu_limit("1")  # "settings have no effect" locally
    first.set_caching_options(True)
    second = add_one(x=first.output).set_caching_options(False)
    with dsl.If(fail == True, name="refused"):  # noqa: E712
        refuse(x=second.output).set_caching_options(False)


def run(tmp_path: Path, **arguments: object) -> tuple[str, str, StepLog, Exception | None]:
    log, terminal = io.StringIO(), io.StringIO()
    step_log = StepLog(Progress(log, terminal))
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "runs"),
        cache_root=str(tmp_path / "cache"),
        enable_caching=True,
        raise_on_error=True,
    )
    error = None
    with captured(step_log):
        try:
            small(**arguments)
        except RuntimeError as e:
            error = e
        finally:
            step_log.close_line()
    return log.getvalue(), terminal.getvalue(), step_log, error


STEP_LINE = re.compile(
    r"^  (?P<task>\S+) +(?P<state>RUNNING|SUCCEEDED|FAILED|CACHED)(?P<s> +\d+\.\d s)?$"
)


def states(terminal: str) -> list[tuple[str, str]]:
    out = []
    for line in terminal.splitlines():
        m = STEP_LINE.match(line)
        assert m is not None, f"not a step line: {line!r}"
        assert bool(m.group("s")) == (m.group("state") in ("SUCCEEDED", "FAILED")), line
        out.append((m.group("task"), m.group("state")))
    return out


def test_a_line_per_step_start_and_end_and_the_rest_in_the_log(tmp_path: Path) -> None:
    log, terminal, _, error = run(tmp_path, x=1)
    assert error is None, log[-3000:]
    assert states(terminal) == [
        ("add-one", "RUNNING"), ("add-one", "SUCCEEDED"),
        ("add-one-2", "RUNNING"), ("add-one-2", "SUCCEEDED"),
    ]  # fmt: skip
    for expected in ("the step's own output: 1", "the step's own output: 2",
                     "have no effect", "non-Python base image"):  # fmt: skip
        assert expected in log, log[-3000:]

    # Again: the cached step is one line; the failed one ends FAILED and its error line is kept.
    log, terminal, step_log, error = run(tmp_path, x=1, fail=True)
    assert isinstance(error, RuntimeError)
    assert states(terminal) == [
        ("add-one", "CACHED"),
        ("add-one-2", "RUNNING"), ("add-one-2", "SUCCEEDED"),
        ("refuse", "RUNNING"), ("refuse", "FAILED"),
    ]  # fmt: skip
    assert step_log.error_lines == [("refuse", "ERROR [refuse] E_PARAM: x must be even, got 3 (x)")]
