"""What ``gpupipe run --local`` prints while it runs: a line per step as it starts and as it
ends, while everything else (each step's own output, kfp.local's lines, library warnings and
log records) goes to the run's log file, ``<root>/runs/<run id>/run.log``. ``-v`` prints the log
to the terminal as well.

kfp.local says when a task starts and ends only in its log lines
(``HH:MM:SS.mmm - INFO - Executing task 'train'``, ``... Task 'train' finished with status
SUCCESS``, ``... Task preprocess cache hit``); those are read here, after the credentials in
them were masked (:class:`pipelines.local_report.StepLog`). The seconds are this process's own
clock between the two lines.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from trainer.base.errors import printable

LOG_NAME = "run.log"
"""The log file in a run's folder (``<root>/runs/<run id>/``)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KFP_LINE = re.compile(r"^\d{2}:\d{2}:\d{2}\.\d{3} - [A-Z]+ - (?P<message>.*)$")
_STARTED = re.compile(r"^Executing task '(?P<task>[^']+)'\s*$")
_ENDED = re.compile(r"^Task '(?P<task>[^']+)' finished with status (?P<status>[A-Z]+)\b")
_CACHED = re.compile(r"^Task (?P<task>\S+) cache hit\b")
STATES = {"SUCCESS": "SUCCEEDED", "FAILURE": "FAILED"}
"""kfp.local's task statuses in the words KFP's API and our summary use."""
_KFP_FORMAT = "%(asctime)s - %(levelname)s - %(message)s"
"""kfp.local's own log format (``kfp.local.logging_utils``): log records of this process are
written to the log the same way, so one reader finds a task's lines in both."""


def step_line(task: str, state: str, seconds: float | None = None) -> str:
    """``  train          SUCCEEDED    12.3 s``: a step's start or end, as the terminal shows it."""
    text = f"  {printable(task):<14} {printable(state):<9}"
    if seconds is not None:
        text += f" {seconds:7.1f} s"
    return text.rstrip()


class Progress(io.TextIOBase):
    """Takes the run's output (its credentials masked), writes all of it to ``log``, and prints
    to ``terminal`` a line for each step that starts or ends, or everything with ``verbose``.

    Args:
        log: the run's log file, open for writing.
        terminal: where the person watching reads (stdout, or stderr under ``--json``).
        verbose: print every line of the log, not only the steps' lines.
        clock: seconds from an arbitrary start (tests pass their own).
    """

    def __init__(
        self,
        log: TextIO,
        terminal: TextIO,
        *,
        verbose: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._log = log
        self._terminal = terminal
        self._verbose = verbose
        self._clock = clock
        self._partial = ""
        self._started: dict[str, float] = {}
        self.log_full = False
        """The run's log's filesystem filled up: nothing more is written to it."""
        self.steps: list[tuple[str, str]] = []
        """``(task, state)`` of every step line, in order (``RUNNING`` when it starts)."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._to_log(_ANSI.sub("", line) + "\n")
            if self._verbose:
                self._terminal.write(line + "\n")
            else:
                self._read(_ANSI.sub("", line))
        return len(text)

    def _to_log(self, text: str) -> None:
        """Write to the run's log, until its filesystem is full: then the log stops (once, with
        a note on the terminal) and the run goes on, so that the step that met the full disk
        ends with its own line (E_DISK_FULL) instead of this process with ENOSPC's traceback
        (kfp.local prints every line of a step's output through here)."""
        if self.log_full:
            return
        try:
            self._log.write(text)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self.log_full = True
            name = getattr(self._log, "name", "the run's log")
            self._terminal.write(f"  (the run's log {name} stops here: {e.strerror})\n")

    def flush(self) -> None:
        if not self.log_full:
            try:
                self._log.flush()
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                self.log_full = True
        self._terminal.flush()

    def _read(self, line: str) -> None:
        kfp = _KFP_LINE.match(line.strip())
        if kfp is None:
            return
        message = kfp.group("message")
        if m := _STARTED.match(message):
            self._started[m.group("task")] = self._clock()
            self._say(m.group("task"), "RUNNING")
        elif m := _ENDED.match(message):
            task = m.group("task")
            started = self._started.pop(task, None)
            seconds = self._clock() - started if started is not None else None
            self._say(task, STATES.get(m.group("status"), m.group("status")), seconds)
        elif m := _CACHED.match(message):
            self._say(m.group("task"), "CACHED")

    def _say(self, task: str, state: str, seconds: float | None = None) -> None:
        self.steps.append((task, state))
        self._terminal.write(step_line(task, state, seconds) + "\n")
        self._terminal.flush()


@contextlib.contextmanager
def captured(sink: TextIO) -> Iterator[None]:
    """Send what this process itself says while a run goes on to ``sink``: stdout and stderr,
    warnings (kfp.local's "settings have no effect" and "non-Python base image" for every step),
    and log records at INFO and above (kfp.local's cache hits, MLflow creating its tables).

    kfp.local swaps the root logger's handlers for one of its own around each task, on the
    ``sys.stdout`` of that moment (this ``sink``), and puts these back after.
    """

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        sink.write(warnings.formatwarning(message, category, filename, lineno, line))

    root = logging.getLogger()
    handler = logging.StreamHandler(sink)
    handler.setFormatter(_millisecond_formatter())
    saved_handlers, saved_level = root.handlers[:], root.level
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(sink),
        contextlib.redirect_stderr(sink),
    ):
        warnings.showwarning = show
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        try:
            yield
        finally:
            root.handlers[:] = saved_handlers
            root.setLevel(saved_level)


def _millisecond_formatter() -> logging.Formatter:
    from kfp.local.logging_utils import MillisecondFormatter

    return MillisecondFormatter(fmt=_KFP_FORMAT, datefmt="%H:%M:%S.%f")


def open_log(run_folder: Path) -> TextIO:
    """The run's log file, ``<run folder>/run.log``, line-buffered (a person may ``tail -f`` it)."""
    return open(run_folder / LOG_NAME, "w", encoding="utf-8", buffering=1)
