"""The training job's Prometheus endpoint: ``/metrics`` in the text format, served by
``prometheus_client`` from each node's first process while the job runs.

Rank 0's endpoint carries the training values, set from the events the run already logs
(:class:`~trainer.training.telemetry.Telemetry` hands each one here), so the step loop pays for
nothing it did not already sync: a few gauge writes per log line. Every node's endpoint carries
its GPUs' utilisation and memory per rank, read from NVML when scraped
(:mod:`trainer.training.gpu_stats`); on CPU those metrics are absent, not zero.

Metrics (the suite's design card, and what a dashboard also wants):

- ``training_duration_seconds`` histogram (buckets 600, 3600, 14400, 86400): observed once, when
  the run ends; ``training_elapsed_seconds`` gauge while it runs;
- ``training_loss``, ``learning_rate``, ``training_step``, ``training_epoch``,
  ``training_samples_per_second`` (and ``training_tokens_per_second`` for token data),
  ``training_val_metric{name}`` gauges; ``training_gpu_memory_peak_bytes{rank="0"}`` on CUDA;
- ``training_restarts`` (torchrun's restarts of this node's workers) and
  ``training_resumed_from_step`` gauges;
- ``checkpoint_size_mb`` histogram, one sample per checkpoint written;
- ``gpu_hours`` and, with a price (``metrics.gpu_hour_usd``), ``cost_usd`` counters;
- ``gpu_utilization``, ``gpu_memory_used_bytes``, ``gpu_memory_total_bytes`` gauges, ``rank``
  labelled (CUDA only).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import pyarrow.fs as pafs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from trainer.base import cost, storage
from trainer.base.errors import InputError
from trainer.config import MetricsConfig
from trainer.distributed import dist
from trainer.distributed.dist import DistContext
from trainer.training.gpu_stats import GpuCollector

log = logging.getLogger(__name__)

DURATION_BUCKETS = (600.0, 3600.0, 14400.0, 86400.0)
"""``training_duration_seconds``: ten minutes, an hour, four hours, a day (the design card)."""
CHECKPOINT_MB_BUCKETS = (1.0, 10.0, 100.0, 1_000.0, 10_000.0, 100_000.0)
"""``checkpoint_size_mb``: a tabular MLP's few MB to a large model's 100 GB."""


def tree_size_bytes(uri: str) -> int:
    """Bytes in the files under ``uri`` (a checkpoint folder), on any storage."""
    fs, path = storage.resolve(uri)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)


def bind_address(host: str) -> str:
    """The address to listen on for ``metrics.host``: ``auto`` is ``127.0.0.1`` outside
    Kubernetes and ``0.0.0.0`` in a pod (``KUBERNETES_SERVICE_HOST``, which the kubelet sets in
    every container), where Prometheus scrapes the pod's IP."""
    if host != "auto":
        return host
    return "0.0.0.0" if os.environ.get("KUBERNETES_SERVICE_HOST") else "127.0.0.1"


def _own_address() -> str | None:
    """This machine's (a pod's) address as others reach it, if it has one besides loopback."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if address.startswith("127.") else address


class TrainingMetrics:
    """One node's metrics registry and its HTTP endpoint (see the module's list)."""

    def __init__(
        self, cfg: MetricsConfig, ctx: DistContext, *, tokens_per_sample: int | None = None
    ) -> None:
        """Args:
        cfg: the worker's ``metrics`` section (port, price, GPUs held).
        ctx: this process (training values are set on the main rank only).
        tokens_per_sample: sequence length of token data (adds tokens per second).
        """
        self.cfg, self.ctx = cfg, ctx
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.gpus = cost.gpus_used(cfg.gpus, ctx.device.type, ctx.world_size)
        self._tokens = tokens_per_sample
        self._server: Any = None
        self._started = self._last = time.monotonic()
        self._gpu = GpuCollector.for_node(
            node_rank=ctx.node_rank, local_world_size=ctx.local_world_size
        )
        if self._gpu is not None:
            r.register(self._gpu)
        self.restarts = Gauge(
            "training_restarts", "torchrun restarts of this node's workers", registry=r
        )
        self.restarts.set(dist.restart_count())
        if not ctx.is_main:
            return
        self.step = Gauge("training_step", "Optimizer steps done", registry=r)
        self.epoch = Gauge("training_epoch", "Epochs done (fractional)", registry=r)
        self.loss = Gauge("training_loss", "Mean training loss since the last log line", registry=r)
        self.lr = Gauge("learning_rate", "Learning rate of the last step", registry=r)
        self.samples_per_s = Gauge(
            "training_samples_per_second", "Samples per second, the whole job", registry=r
        )
        self.tokens_per_s = (
            Gauge("training_tokens_per_second", "Tokens per second, the whole job", registry=r)
            if tokens_per_sample
            else None
        )
        self.gpu_peak = (
            Gauge(
                "training_gpu_memory_peak_bytes",
                "Peak GPU memory torch allocated",
                ["rank"],
                registry=r,
            )
            if ctx.device.type == "cuda"
            else None
        )
        self.val = Gauge("training_val_metric", "Last validation metric", ["name"], registry=r)
        self.resumed = Gauge(
            "training_resumed_from_step", "Checkpoint step this run resumed from", registry=r
        )
        self.elapsed = Gauge("training_elapsed_seconds", "Seconds since training began", registry=r)
        self.duration = Histogram(
            "training_duration_seconds",
            "Wall time of finished training runs",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ckpt_mb = Histogram(
            "checkpoint_size_mb",
            "Size of each checkpoint written, MB",
            buckets=CHECKPOINT_MB_BUCKETS,
            registry=r,
        )
        self.gpu_hours = Counter("gpu_hours", "GPU-hours held by the job so far", registry=r)
        self.cost = (
            Counter("cost_usd", "What the job cost so far (GPU-hours x price)", registry=r)
            if cfg.gpu_hour_usd is not None
            else None
        )

    @property
    def url(self) -> str | None:
        """Where the endpoint answers, once started: the address it is bound to; bound to
        every interface (in a pod), the pod's own address, which a scrape uses."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        if host in ("0.0.0.0", "::"):
            host = _own_address() or host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/metrics"

    def start(self) -> TrainingMetrics:
        """Serve the endpoint (a daemon thread).

        Raises:
            InputError: ``metrics.port`` cannot be bound (taken by another process).
        """
        try:
            self._server, _ = start_http_server(
                self.cfg.port, addr=bind_address(self.cfg.host), registry=self.registry
            )
        except OSError as e:
            raise InputError(
                "E_CONFIG", f"cannot serve metrics on port {self.cfg.port}: {e}", "metrics.port"
            ) from e
        return self

    def _tick(self) -> None:
        """Move the time-based values (elapsed, GPU-hours, cost) to now."""
        now = time.monotonic()
        hours = (now - self._last) / 3600.0 * self.gpus
        self._last = now
        self.elapsed.set(now - self._started)
        self.gpu_hours.inc(hours)
        if self.cost is not None and self.cfg.gpu_hour_usd is not None:
            self.cost.inc(hours * self.cfg.gpu_hour_usd)

    def observe(self, event: str, fields: dict[str, Any]) -> None:
        """Take one logged event (main rank only): ``step``, ``eval``, ``checkpoint`` ..."""
        if event == "step":
            self.step.set(fields["step"])
            self.epoch.set(fields["epoch"])
            self.loss.set(fields["loss"])
            self.lr.set(fields["lr"])
            self.samples_per_s.set(fields["samples_per_s"])
            if self.tokens_per_s is not None and self._tokens:
                self.tokens_per_s.set(fields["samples_per_s"] * self._tokens)
            if self.gpu_peak is not None and fields.get("gpu_mem_gb") is not None:
                self.gpu_peak.labels(rank="0").set(fields["gpu_mem_gb"] * 2**30)
            self._tick()
        elif event == "eval":
            for name, value in fields.items():
                if name.startswith("val_") and isinstance(value, int | float):
                    self.val.labels(name=name).set(value)
        elif event == "start":
            self.step.set(fields.get("step") or 0)
            self.resumed.set(fields.get("resumed_from") or 0)
        elif event == "checkpoint" and fields.get("uri"):
            self.ckpt_mb.observe(tree_size_bytes(fields["uri"]) / 1e6)
        elif event == "done":
            self._tick()
            self.duration.observe(time.monotonic() - self._started)

    def close(self) -> None:
        """Stop serving and release NVML."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None
