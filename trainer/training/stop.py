"""Stopping on SIGTERM: remember the signal, stop at the next step boundary, say so after the save.

The loop checks :class:`StopSignal` once per step (agreed by every rank in the step's control
collective), writes a checkpoint and raises :class:`Preempted`; the worker turns that into exit
code 143, which the operator's ``ExitCode`` restart policy retries.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)


class Preempted(Exception):
    """Raised after a SIGTERM once the checkpoint is safely written."""

    def __init__(self, step: int, checkpoint: str | None) -> None:
        super().__init__(f"stopped by SIGTERM after step {step}; checkpoint: {checkpoint}")
        self.step = step
        self.checkpoint = checkpoint


class StopSignal:
    """Remembers a SIGTERM so the loop can stop at the next step boundary."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._previous: Any = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        log.warning("SIGTERM received: finishing the current step, then checkpointing")
        self.requested.set()

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
