"""How a tune trial's training runs: a ``trainer.worker`` subprocess, or ``train()`` in process.

Both report each evaluation to the study through ``on_eval`` as it happens and stop the run when
it says so (a pruned trial): the subprocess gets SIGTERM, checkpoints and exits 143, exactly as
a preempted worker does; the in-process run stops like an early stop. Failures come back as
:class:`TrialFailed` (counted against ``maxFailedTrialCount``), a cancelled tune step as
:class:`TrialInterrupted` (re-run when the step is retried).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.base.typedconfig import to_json
from trainer.config import WorkerConfig
from trainer.launch.local import Child
from trainer.launch.torchrun import torchrun_command

log = logging.getLogger(__name__)


class TrialFailed(RuntimeError):
    """A trial's training failed; it counts against ``maxFailedTrialCount``."""


class TrialInterrupted(RuntimeError):
    """The tune step itself was stopped (SIGTERM) while the trial ran; it is re-run on resume."""


# --------------------------------------------------------------------------------------------
# Trial runners
# --------------------------------------------------------------------------------------------


@dataclass
class TrialOutcome:
    """What a finished (or pruned) training run reported."""

    metrics: dict[str, float]
    """Final metrics (those of the last or best evaluation, as the trainer exports them)."""
    epochs: float
    """Epochs trained (the trial's cost)."""
    stopped: bool
    """Stopped because ``on_eval`` asked (pruned)."""


OnEval = Callable[[int, dict[str, float]], bool]
"""Called with (optimizer step, metrics) after each evaluation; True stops the run."""


class TrialRunner(Protocol):
    """Runs one trial's training to its end, or until ``on_eval`` returns True."""

    @property
    def capacity(self) -> int:
        """How many trials this runner can run at once on this machine."""
        ...

    def run(
        self,
        cfg: WorkerConfig,
        *,
        name: str,
        work_uri: str,
        nproc_per_node: int,
        on_eval: OnEval,
    ) -> TrialOutcome:
        """Train with ``cfg``; ``work_uri`` is the trial's own folder (config, logs).

        Raises:
            TrialFailed: the training failed (its message says why).
            TrialInterrupted: the runner was told to stop everything (:meth:`interrupt`).
            InputError: the trial's config was rejected.
        """
        ...

    def interrupt(self) -> None:
        """Stop every running trial (the tune step is being cancelled)."""
        ...


class InProcessTrialRunner:
    """Calls ``trainer.training.loop.train`` in this process, one trial at a time (tests).

    Single process only (``nproc_per_node`` 1). With ``quiet`` the trainer's JSON log lines
    are swallowed (stdout is redirected while a trial runs, which is why trials take turns).
    """

    def __init__(self, *, quiet: bool = True, device: str | None = None) -> None:
        self.quiet = quiet
        self.device = device
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @property
    def capacity(self) -> int:
        return 1

    def interrupt(self) -> None:
        self._stop.set()

    def run(
        self,
        cfg: WorkerConfig,
        *,
        name: str,
        work_uri: str,
        nproc_per_node: int,
        on_eval: OnEval,
    ) -> TrialOutcome:
        import torch

        from trainer.distributed.dist import DistContext
        from trainer.training.loop import train
        from trainer.training.stop import StopSignal

        if nproc_per_node != 1:
            raise InputError(
                "E_CONFIG",
                f"the in-process trial runner runs one process, got nproc_per_node="
                f"{nproc_per_node} (from tune.train.gpus_per_node)",
                "tune.train.gpus_per_node",
            )
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        ctx = DistContext(
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            node_rank=0,
            device=torch.device(device),
            backend=None,
            run_id=name,
        )
        stopped = False

        def report(step: int, metrics: dict[str, float]) -> bool:
            nonlocal stopped
            if self._stop.is_set():
                raise TrialInterrupted(f"trial {name} interrupted: the tune step is stopping")
            stopped = bool(on_eval(step, metrics))
            return stopped

        sink = io.StringIO() if self.quiet else None
        with self._lock, contextlib.redirect_stdout(sink) if sink else contextlib.nullcontext():
            try:
                result = train(cfg, ctx, StopSignal(), on_eval=report)
            except (TrialInterrupted, InputError):
                raise
            except (RuntimeError, ValueError) as e:
                raise TrialFailed(f"trial {name} failed: {e}") from e
        return TrialOutcome(metrics=dict(result.metrics), epochs=result.epochs, stopped=stopped)


class SubprocessTrialRunner:
    """Runs ``python -m trainer.worker --config <uri>`` (torchrun when ``nproc_per_node`` > 1).

    The output is read by :class:`trainer.launch.local.Child` (redacted, echoed with the trial's
    name, tail and error line kept), as the local train launcher reads its job's. The worker's
    JSON ``eval`` lines are read live and handed to ``on_eval``; when it asks to stop, the
    trial's process group gets SIGTERM, and the worker checkpoints and exits 143.
    Trials run side by side up to :attr:`capacity`: one per ``nproc_per_node`` GPUs (each
    trial sees only its own, through ``CUDA_VISIBLE_DEVICES``), or per ``nproc_per_node`` CPU
    cores without GPUs.
    """

    def __init__(
        self,
        *,
        nproc_per_node: int = 1,
        grace_s: float = 60.0,
        tail_lines: int = 30,
        echo: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.nproc_per_node = nproc_per_node
        self.grace_s = grace_s
        self.tail_lines = tail_lines
        self.echo = echo
        self.env = env
        self._gpus = _visible_gpus()
        per = max(1, nproc_per_node)
        if self._gpus:
            slots = [self._gpus[i * per : (i + 1) * per] for i in range(len(self._gpus) // per)]
            self._slots: queue.Queue[list[str] | None] = queue.Queue()
            for s in slots or [self._gpus]:
                self._slots.put(s)
            self._capacity = max(1, len(slots))
        else:
            self._slots = queue.Queue()
            self._capacity = max(1, (os.cpu_count() or 1) // per)
            for _ in range(self._capacity):
                self._slots.put(None)
        self._children: set[Child] = set()
        self._lock = threading.Lock()
        self._interrupted = threading.Event()

    @property
    def capacity(self) -> int:
        return self._capacity

    def interrupt(self) -> None:
        self._interrupted.set()
        with self._lock:
            children = list(self._children)
        for child in children:
            child.signal(signal.SIGTERM)

    def command(self, config_uri: str, nproc_per_node: int) -> list[str]:
        """The trial's command: the worker itself, or torchrun around it."""
        if nproc_per_node == 1:
            return [sys.executable, "-m", "trainer.worker", "--config", config_uri]
        return torchrun_command(config_uri, nproc_per_node=nproc_per_node, standalone=True)

    def run(
        self,
        cfg: WorkerConfig,
        *,
        name: str,
        work_uri: str,
        nproc_per_node: int,
        on_eval: OnEval,
    ) -> TrialOutcome:
        config_uri = storage.join(work_uri, "worker-config.json")
        storage.write_text(config_uri, to_json(cfg))
        env = dict(os.environ if self.env is None else self.env)
        env["GPUPIPE_JOB"] = name
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        slot = self._slots.get()
        try:
            if slot is not None:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(slot)
            return self._run(cfg, name, self.command(config_uri, nproc_per_node), env, on_eval)
        finally:
            self._slots.put(slot)

    def _run(
        self,
        cfg: WorkerConfig,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        on_eval: OnEval,
    ) -> TrialOutcome:
        if self._interrupted.is_set():
            raise TrialInterrupted(f"trial {name} not started: the tune step is stopping")
        log.info("trial %s: %s", name, " ".join(cmd))
        last_eval: dict[str, float] = {}
        epochs = 0.0
        stopped = False

        def on_line(line: str) -> None:
            nonlocal epochs, last_eval, stopped
            record = _json_record(line)
            if record is None or record.get("event") != "eval" or stopped:
                return
            epochs = float(record.get("epoch", epochs))
            last_eval = {
                k: float(v) for k, v in record.items() if k.startswith("val_") and is_number(v)
            }
            if on_eval(int(record.get("step", 0)), dict(last_eval)):
                stopped = True
                child.signal(signal.SIGTERM)

        child = Child(
            cmd,
            env=env,
            tail_lines=self.tail_lines,
            echo=self.echo,
            prefix=f"[{name}] ",
            on_line=on_line,
        )
        with self._lock:
            self._children.add(child)
        try:
            child.pump()
            code = child.wait(self.grace_s)
        finally:
            child.kill()  # on_eval raised: do not leave the trial running
            with self._lock:
                self._children.discard(child)
        if self._interrupted.is_set() and not stopped:
            raise TrialInterrupted(f"trial {name} interrupted: the tune step is stopping")
        if stopped:  # any exit after our SIGTERM (143, or torchrun's 1) is a pruned trial
            return TrialOutcome(metrics=last_eval, epochs=epochs, stopped=True)
        if code != 0:
            raise child.failure(f"trial {name}", code, TrialFailed)
        metrics_uri = storage.join(cfg.output.model_uri, "metrics.json")
        metrics = dict(last_eval)
        if storage.exists(metrics_uri):
            metrics.update({k: float(v) for k, v in storage.read_json(metrics_uri).items()})
        return TrialOutcome(metrics=metrics, epochs=epochs, stopped=False)


def _visible_gpus() -> list[str]:
    """GPU ids this process may hand to trials (respecting CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except (ImportError, RuntimeError):
        return []


def _json_record(line: str) -> dict[str, Any] | None:
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
