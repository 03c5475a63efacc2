"""Structured JSON log lines, an optional progress bar, and the run's metric history."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from typing import Any, Protocol, TextIO

import torch

from trainer.base import storage
from trainer.base.redact import redact

log = logging.getLogger(__name__)


def gpu_memory_gb(device: torch.device) -> float | None:
    """Peak GPU memory allocated on ``device`` so far, in GiB; ``None`` off GPU."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3)


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)  # JSON has no NaN; keep the line parseable
        return round(value, 6)
    if isinstance(value, str):
        return redact(value)  # a URI in a message must not carry its credentials into the log
    return value


class MetricsSink(Protocol):
    """Where logged events also go: the Prometheus endpoint (:mod:`trainer.training.prom`)."""

    @property
    def url(self) -> str | None: ...

    def observe(self, event: str, fields: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class Telemetry:
    """Emits one JSON object per line on stdout (main rank only) and keeps the history.

    Log lines look like ``{"event": "step", "job": ..., "step": 10, "epoch": 0, "loss": ...}``.
    A progress bar goes to stderr only when a person is watching a terminal, so container logs
    stay clean JSON.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        job: str,
        total_steps: int,
        history_uri: str | None = None,
        stream: TextIO | None = None,
        metrics_stdout: bool = False,
        sink: MetricsSink | None = None,
    ) -> None:
        """Args:
        enabled: print and record (the main rank only).
        job: the job id in every line.
        total_steps: length of the progress bar.
        history_uri: JSON-lines file that :meth:`flush` writes.
        stream: where lines go (default stdout).
        metrics_stdout: after each ``eval`` event, also print ``name=value`` lines for
            Katib's StdOut metrics collector.
        """
        self.enabled = enabled
        self.metrics_stdout = metrics_stdout
        self.job = job
        self.history: list[dict[str, Any]] = []
        self.history_uri = history_uri
        self.sink = sink
        self._stream = stream or sys.stdout
        self._bar = None
        if enabled and sys.stderr.isatty() and self._stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, unit="step", dynamic_ncols=True, file=sys.stderr)

    def emit(self, event: str, **fields: Any) -> None:
        """Record and (on the main rank) print one event."""
        if not self.enabled:
            return
        if self.sink is not None:
            self.sink.observe(event, fields)
        record = {"event": event, "job": self.job, "time": round(time.time(), 3)}
        record.update({k: _clean(v) for k, v in fields.items() if v is not None})
        self.history.append(record)
        line = redact(json.dumps(record, sort_keys=False))
        if self._bar is not None:
            self._bar.write(line, file=self._stream)
        else:
            print(line, file=self._stream, flush=True)
        if event == "eval" and self.metrics_stdout:
            for name, value in fields.items():
                # Katib's default filter reads ``name=<number>``: no booleans, NaN or Inf.
                if (
                    isinstance(value, int | float)
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                    and name not in ("step", "epoch")
                ):
                    text = redact(f"{name}={value!r}")  # full precision, e.g. val_loss=0.1234
                    if self._bar is not None:
                        self._bar.write(text, file=self._stream)
                    else:
                        print(text, file=self._stream, flush=True)

    def advance(self, steps_done: int) -> None:
        """Move the progress bar to ``steps_done``."""
        if self._bar is not None:
            self._bar.n = steps_done
            self._bar.refresh()

    def resume(self, step: int) -> None:
        """Keep an earlier attempt's history up to ``step`` (the checkpoint this run resumed).

        Events after that step belong to an abandoned timeline (a killed or rolled-back run)
        and are dropped, so loss curves show what the final weights actually went through.
        """
        if not (self.enabled and self.history_uri and storage.exists(self.history_uri)):
            return
        earlier = []
        for line in storage.read_text(self.history_uri).splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a killed writer
            if record.get("step", 0) <= step and record.get("event") not in ("start", "done"):
                earlier.append(record)
        self.history[:0] = earlier

    def flush(self) -> None:
        """Write the history so far (atomically) as JSON lines, if a history URI is set."""
        if self.enabled and self.history_uri:
            body = "".join(json.dumps(r) + "\n" for r in self.history)
            storage.write_bytes(self.history_uri, body.encode())

    def close(self) -> None:
        """Close the bar and write the history."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self.flush()
        if self.sink is not None:
            self.sink.close()
            self.sink = None
