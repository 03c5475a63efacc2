"""Training as a child process on this machine, and the one pump that reads a child's output.

:class:`Child` starts a command in its own process group (so that stopping it reaches every
rank) with stdout and stderr merged, and reads that output line by line: each line is
redacted, echoed into this step's log, kept in a short tail for a failure's message, checked
for the worker's ``ERROR [step] E_...`` line and handed to an optional callback (the tune
trial runner reads the worker's JSON ``eval`` records there). :class:`LocalLauncher` (the train
step's ``local`` launcher) and the tune step's subprocess trial runner both run on it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from trainer.base.errors import InputError, StepFailure, parse_error_line
from trainer.base.redact import redact
from trainer.launch import TrainingRun
from trainer.launch.jobspec import GPUS_ENV
from trainer.launch.torchrun import torchrun_command

log = logging.getLogger(__name__)


class Child:
    """A command in its own process group, its merged output pumped line by line.

    Args:
        cmd: the command.
        env: its whole environment.
        tail_lines: output lines kept for :meth:`failure`.
        echo: write each (redacted) line to this process's stdout.
        prefix: put before each echoed line (a trial's name).
        on_line: called with each redacted line, in the pumping thread.
        step: the step whose ``ERROR [<step>] E_...`` lines the child prints.
    """

    def __init__(
        self,
        cmd: list[str],
        *,
        env: Mapping[str, str],
        tail_lines: int,
        echo: bool = True,
        prefix: str = "",
        on_line: Callable[[str], None] | None = None,
        step: str = "train",
    ) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.errors: list[InputError | StepFailure] = []
        self._echo = echo
        self._prefix = prefix
        self._on_line = on_line
        self._step = step
        self._reader: threading.Thread | None = None
        self.proc = subprocess.Popen(
            cmd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pump(self) -> None:
        """Read the child's output to its end (the child closed it, usually by exiting)."""
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = redact(raw)
            if self._echo:
                sys.stdout.write(self._prefix + line)
                sys.stdout.flush()
            self.tail.append(line.rstrip("\n"))
            if err := parse_error_line(line, self._step):
                self.errors.append(err)
            if self._on_line is not None:
                self._on_line(line)

    def pump_in_background(self) -> None:
        """:meth:`pump` in a daemon thread; :meth:`join_pump` waits for it."""
        self._reader = threading.Thread(target=self.pump, daemon=True)
        self._reader.start()

    def join_pump(self, timeout_s: float = 5.0) -> None:
        if self._reader is not None:
            self._reader.join(timeout=timeout_s)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the child's whole process group (every rank); gone is fine."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def wait(self, grace_s: float) -> int:
        """The exit code, waiting at most ``grace_s``; then the group is SIGKILLed."""
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.proc.wait()

    def stop(self, grace_s: float) -> int:
        """SIGTERM the group (workers checkpoint), SIGKILL it after ``grace_s``; the exit code."""
        self.signal(signal.SIGTERM)
        return self.wait(grace_s)

    def kill(self) -> None:
        """SIGKILL a child that still runs (its reader gave up), and reap it."""
        if self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.proc.wait()

    def failure(self, what: str, code: int, error: type[Exception] = RuntimeError) -> Exception:
        """The error of a failed run: the child's own error line, else ``error`` naming
        ``what``, the exit code and the last lines (redacted as they were read)."""
        if self.errors:
            return self.errors[0]
        last = "\n".join(self.tail)
        return error(f"{what} failed (exit code {code}); last log lines:\n{last}")


class LocalLauncher:
    """torchrun as a child process: output streamed into this step's log, stopped on SIGTERM.

    The child gets its own process group so that stopping it (deadline, cancellation) stops
    every rank; torchrun forwards SIGTERM to the workers, which checkpoint before exiting.
    """

    def __init__(
        self, *, tail_lines: int = 40, grace_s: float = 60.0, env: dict[str, str] | None = None
    ) -> None:
        self.tail_lines = tail_lines
        self.grace_s = grace_s
        self.env = env

    def launch(self, run: TrainingRun) -> None:
        """Run the job here and return when it succeeded (see :class:`trainer.launch.Launcher`)."""
        if run.nnodes != 1:
            raise InputError(
                "E_CONFIG",
                f"the local launcher runs one node, got nnodes={run.nnodes}",
                "train.nnodes",
            )
        job_name, timeout_s = run.job_name, run.timeout_s
        cmd = torchrun_command(run.config_uri, nproc_per_node=run.procs_per_node, standalone=True)
        env = dict(os.environ if self.env is None else self.env)
        env["GPUPIPE_JOB"] = job_name
        env.setdefault("OMP_NUM_THREADS", "1")
        if run.gpus_per_node > 0 and env.get("KUBERNETES_SERVICE_HOST"):
            # A pipeline step's pod, which KFP gave the GPU limit: the workers check that torch
            # finds them (on a machine of one's own, no GPU means training on the CPU).
            env[GPUS_ENV] = str(run.gpus_per_node)
        log.info("launching %s: %s", job_name, redact(" ".join(cmd)))
        child = Child(cmd, env=env, tail_lines=self.tail_lines)
        child.pump_in_background()
        previous = _forward_sigterm(child)
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while child.proc.poll() is None:
                if deadline is not None and time.monotonic() > deadline:
                    child.stop(self.grace_s)
                    raise TimeoutError(
                        f"training job {job_name} did not finish within "
                        f"{timeout_s} s (train.timeout_s); it was stopped"
                    )
                time.sleep(0.2)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            child.join_pump()
        code = child.proc.returncode
        if code != 0:
            raise child.failure(f"training job {job_name}", code)


def _forward_sigterm(child: Child) -> Any:
    """Pass a SIGTERM of this step (a cancelled run) on to torchrun, which tells the workers."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: FrameType | None) -> None:
        log.warning("SIGTERM: stopping the training job (workers write a checkpoint)")
        child.signal(signal.SIGTERM)

    return signal.signal(signal.SIGTERM, handler)
