"""What ``gpupipe run --local`` prints while it runs: a line per step as it starts and ends; the
rest (the steps' output, kfp.local's lines, library warnings and log records) only in the log."""

from __future__ import annotations

import io
import logging
import sys
import warnings

import pytest

from pipelines.local_progress import Progress, captured, step_line
from pipelines.local_report import StepLog

# kfp.local 2.17's own lines, as it prints them (colours included) around a task's output.
KFP_RUN = """\
18:47:38.266 - INFO - Running pipeline: \x1b[95m'gpupipe-training'\x1b[0m
--------------------------------------------------------------------------------
18:47:38.271 - INFO - Executing task \x1b[96m'fingerprint'\x1b[0m
18:47:38.272 - INFO - Streamed logs:

    [KFP Executor 2026-12-03 18:47:38,380 INFO]: Looking for component `fingerprint`
    Executing task 'train'
    Task 'fingerprint' finished with status FAILURE
18:47:38.703 - INFO - Task \x1b[96m'fingerprint'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m
18:47:38.704 - INFO - Task preprocess cache hit (key=7f00fec9637c); skipping execution.
18:47:39.425 - INFO - Executing task \x1b[96m'train'\x1b[0m
    loss 0.41
18:47:55.921 - INFO - Task \x1b[96m'train'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m
"""


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def feed(text: str, *, verbose: bool = False) -> tuple[str, str, Progress]:
    log, terminal = io.StringIO(), io.StringIO()
    progress = Progress(log, terminal, verbose=verbose, clock=Clock())
    for piece in (text[:50], text[50:51], text[51:]):  # lines arrive in any pieces
        progress.write(piece)
    return log.getvalue(), terminal.getvalue(), progress


def test_the_terminal_gets_a_line_per_step_as_it_starts_and_ends() -> None:
    log, terminal, progress = feed(KFP_RUN)
    assert terminal.splitlines() == [
        "  fingerprint    RUNNING",
        "  fingerprint    SUCCEEDED     0.5 s",
        "  preprocess     CACHED",
        "  train          RUNNING",
        "  train          FAILED        0.5 s",
    ]
    assert progress.steps[-1] == ("train", "FAILED")
    # the log has every line, without the colours; a step's own output that happens to read
    # like kfp.local's line (indented, as kfp.local streams it) made no step line
    assert (
        log.splitlines()
        == KFP_RUN.replace("\x1b[95m", "")
        .replace("\x1b[96m", "")
        .replace("\x1b[92m", "")
        .replace("\x1b[91m", "")
        .replace("\x1b[0m", "")
        .splitlines()
    )


def test_verbose_prints_the_whole_log_as_it_comes() -> None:
    log, terminal, _ = feed(KFP_RUN, verbose=True)
    assert terminal == KFP_RUN
    assert "\x1b[" not in log and len(log.splitlines()) == len(KFP_RUN.splitlines())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("train", "RUNNING"), "  train          RUNNING"),
        (("evaluate", "SUCCEEDED", 12.34), "  evaluate       SUCCEEDED    12.3 s"),
        (("a-very-long-step-name", "FAILED", 0.0), "  a-very-long-step-name FAILED        0.0 s"),
        (("x\x1b[2Jy", "CACHED"), "  x\\x1b[2Jy      CACHED"),
    ],
    ids=["start", "end", "long-name", "control-characters"],
)
def test_step_line(args: tuple, expected: str) -> None:
    assert step_line(*args) == expected


def test_warnings_log_records_and_both_streams_go_to_the_log_only() -> None:
    """kfp.local's warnings (one pair per step) and MLflow's table creation used to reach the
    terminal; inside ``captured`` they are lines of the log, with the credentials masked."""
    log, terminal = io.StringIO(), io.StringIO()
    step_log = StepLog(Progress(log, terminal))
    before = (sys.stdout, sys.stderr, logging.getLogger().handlers[:], warnings.showwarning)
    with captured(step_log):
        warnings.warn("Task 'train': settings ['cpu_limit'] have no effect", UserWarning, 1)
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables")
        logging.getLogger("kfp.local").info("Task tune cache hit (key=3007dc5d2c21); skipping.")
        print("to stdout http://user:hunter2@mlflow:5000")
        print("to stderr", file=sys.stderr)
    step_log.close_line()
    assert (sys.stdout, sys.stderr, logging.getLogger().handlers, warnings.showwarning) == before
    text = log.getvalue()
    for expected in ("UserWarning: Task 'train'", "Creating initial MLflow", "to stdout",
                     "to stderr"):  # fmt: skip
        assert expected in text, text
    assert "hunter2" not in text
    # the cache hit came through the log record: the one line the terminal got
    assert terminal.getvalue() == "  tune           CACHED\n"


class _FullDisk(io.StringIO):
    """A log file whose filesystem fills up after ``room`` characters."""

    name = "/small/runs/r1/run.log"

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, text: str) -> int:
        import errno

        if self.tell() + len(text) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)


def test_a_full_disk_stops_the_log_not_the_run() -> None:
    """The run's log on a filesystem that fills up (CI, 2026-12-07: kfp.local printing a step's
    line to it raised ENOSPC in gpupipe itself, a traceback instead of the step's E_DISK_FULL):
    the log stops, once, saying so on the terminal, and the step lines go on."""
    log, terminal = _FullDisk(room=40), io.StringIO()
    progress = Progress(log, terminal)
    progress.write("a line that fits\n")
    progress.write("a line that does not fit in what is left\n")
    progress.write("another\n")
    progress.flush()
    assert progress.log_full
    assert log.getvalue() == "a line that fits\n"
    note = "  (the run's log /small/runs/r1/run.log stops here: No space left on device)\n"
    assert terminal.getvalue().count(note) == 1
