"""What the train step sets up for watching a run: the job's metrics endpoint, and its cost (an
estimate before the job is launched, the actual after it ran).

The estimate needs a throughput. A **recorded** one (``train_config_json``'s
``watch.samples_per_s``, e.g. the ``samples_per_second`` an earlier run of the same model on
the same GPUs reported in its summary or model tags) is used as given. Without one it is
**measured**: a few optimizer steps of the configured model on synthetic batches of the run's
shape, timed here in the step's own process and device, times the job's processes (which
assumes the job scales linearly, and that the step's device is the job's: right for the local
launcher, a guess for a cluster job on other GPUs; recording a throughput is better there).
Either way the estimate says which it used.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from trainer.base import cost, storage
from trainer.base.typedconfig import require
from trainer.config import MetricsConfig, WorkerConfig
from trainer.launch import processes_per_node
from trainer.launch.jobspec import METRICS_PORT

log = logging.getLogger(__name__)

COST_FILE = "cost.json"
"""The estimate and the actual, beside the model (the report and register read it)."""


@dataclass(kw_only=True, slots=True)
class WatchConfig:
    """The endpoint, the price and the estimate's throughput (``train_config_json``'s
    ``watch`` section)."""

    metrics_port: int | None = None
    """The job's Prometheus endpoint: ``None`` serves it on 9464 for cluster launchers (their
    pods declare it and carry the scrape annotations) and not locally; 0: off."""
    gpu_hour_usd: float | None = None
    """Price of one GPU-hour of the run's ``gpu_type`` (the pipeline's ``gpu_hour_usd`` or
    ``gpu_prices``); ``None``: durations only, no cost."""
    samples_per_s: float | None = None
    """A recorded throughput of the whole job; ``None``: measured before launch."""
    probe_steps: int = 10
    """Optimizer steps timed by the measurement (after two warm-up steps)."""

    def __post_init__(self) -> None:
        require(
            self.gpu_hour_usd is None or self.gpu_hour_usd >= 0,
            "watch.gpu_hour_usd",
            "must be >= 0 or null",
            self.gpu_hour_usd,
        )
        require(
            self.samples_per_s is None or self.samples_per_s > 0,
            "watch.samples_per_s",
            "must be > 0 or null",
            self.samples_per_s,
        )
        require(self.probe_steps > 0, "watch.probe_steps", "must be > 0", self.probe_steps)
        require(
            self.metrics_port is None or 0 <= self.metrics_port <= 65535,
            "watch.metrics_port",
            "must be 0 to 65535 or null",
            self.metrics_port,
        )

    def port_for(self, cluster: bool) -> int | None:
        """The job's metrics port, ``None`` when off (see ``metrics_port``)."""
        if self.metrics_port is None:
            return METRICS_PORT if cluster else None
        return self.metrics_port or None


def measure_samples_per_s(worker: WorkerConfig, processes: int, steps: int) -> float:
    """Samples per second of the whole job, from ``steps`` timed steps on this process."""
    import torch

    from trainer.models import ModelSpec, build_model, forward_loss

    d, t = worker.data, worker.train
    micro = max(1, min(t.micro_batch_size or t.global_batch_size // processes, 4096))
    n_features = len(d.features or [])
    classes = None
    if d.task == "classification" and d.schema_uri and storage.exists(d.schema_uri):
        found = storage.read_json(d.schema_uri).get("classes")
        classes = len(found) if isinstance(found, list) else None
    spec = ModelSpec(task=d.task, in_features=max(n_features, 1), num_classes=max(classes or 2, 2))
    torch.manual_seed(0)
    model = build_model(worker.model, spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(micro, spec.in_features or 1)
    y = (
        torch.randint(0, spec.num_classes or 2, (micro,))
        if d.task == "classification"
        else torch.randn(micro)
    )
    took = 0.0
    for i in range(steps + 2):
        began = time.perf_counter()
        loss = forward_loss(model, d.task, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 2:
            took += time.perf_counter() - began
    return micro * steps / max(took, 1e-9) * processes


def estimate_run(
    c: WatchConfig,
    worker: WorkerConfig,
    *,
    rows: int,
    nnodes: int,
    gpus_per_node: int,
    processes: int,
) -> cost.CostEstimate:
    """The estimate for ``worker``'s run (see the module for the throughput's source)."""
    if c.samples_per_s is not None:
        rate, source = c.samples_per_s, "recorded"
    else:
        rate, source = measure_samples_per_s(worker, processes, c.probe_steps), "measured"
    return _estimate(c, worker, rows, nnodes, gpus_per_node, rate, source)


def _estimate(
    c: WatchConfig,
    worker: WorkerConfig,
    rows: int,
    nnodes: int,
    gpus_per_node: int,
    rate: float,
    source: str,
) -> cost.CostEstimate:
    return cost.estimate(
        rows=rows,
        epochs=worker.train.epochs,
        max_steps=worker.train.max_steps,
        global_batch_size=worker.train.global_batch_size,
        samples_per_s=rate,
        throughput_source=source,  # type: ignore[arg-type]
        nnodes=nnodes,
        gpus_per_node=gpus_per_node,
        gpu_hour_usd=c.gpu_hour_usd,
    )


def estimate_before_launch(
    c: WatchConfig,
    worker: WorkerConfig,
    *,
    port: int | None,
    rows: int | None,
    nnodes: int,
    gpus_per_node: int,
    gpus_found: bool = True,
) -> cost.CostEstimate | None:
    """Set ``worker``'s ``metrics`` section (endpoint, price, GPUs held) and estimate the run.

    ``gpus_found`` False: the job's processes will find no GPU (torchrun in this step, on a
    machine without CUDA): they train on the CPU, and no GPU-hour is estimated or billed.

    Returns:
        The estimate, logged with its assumptions; ``None`` (with a warning) when the training
        split's size is unknown or the throughput cannot be measured.
    """
    billed = gpus_per_node if gpus_found else 0
    worker.metrics = MetricsConfig(
        port=port or 0, gpu_hour_usd=c.gpu_hour_usd, gpus=cost.gpus_held(nnodes, billed)
    )
    if not rows:
        return None
    try:
        est = estimate_run(
            c,
            worker,
            rows=rows,
            nnodes=nnodes,
            gpus_per_node=billed,
            processes=processes_per_node(gpus_per_node) * nnodes,
        )
    except (RuntimeError, ValueError) as e:  # a model the probe cannot drive: say so, go on
        log.warning("no cost estimate: the throughput could not be measured (%s)", e)
        return None
    log_estimate(est)
    return est


def log_estimate(est: cost.CostEstimate) -> None:
    """Print the estimate with its assumptions (before launch)."""
    figures = est.to_dict()
    log.info(
        "cost estimate: %.4f h%s (%s)",
        figures["estimated_duration_hours"],
        "" if est.total_cost_usd is None else f", ${est.total_cost_usd:.4f}",
        "; ".join(est.assumptions),
    )


def record(model_uri: str, est: cost.CostEstimate | None) -> dict[str, Any]:
    """Write the estimate and the job's actual (``model.json``'s ``extra.run``) beside the model,
    and return both."""
    meta = storage.read_json(storage.join(model_uri, "model.json"))
    run = (meta.get("extra") or {}).get("run") or {}
    actual = {
        k: run.get(k)
        for k in (
            "training_duration_seconds",
            "device",
            "processes",
            "gpus",
            "gpu_hours",
            "gpu_hour_usd",
            "cost_usd",
        )
    }
    actual["duration_s"] = actual.pop("training_duration_seconds")
    body = {"estimate": est.to_dict() if est is not None else None, "actual": actual or None}
    storage.write_json(storage.join(model_uri, COST_FILE), body)
    return body


def cost_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The estimate and the actual as flat numbers, for KFP metrics and the model's metadata
    (``estimated_*`` beside the actual; unpriced costs left out)."""
    est, act = record.get("estimate") or {}, record.get("actual") or {}
    pairs = {
        "estimated_duration_hours": est.get("estimated_duration_hours"),
        "estimated_cost_usd": est.get("total_cost_usd"),
        "hourly_cost_usd": est.get("hourly_cost_usd"),
        "estimated_samples_per_second": est.get("samples_per_s"),
        "training_duration_seconds": act.get("duration_s"),
        "gpu_hours": act.get("gpu_hours"),
        "cost_usd": act.get("cost_usd"),
    }
    return {k: float(v) for k, v in pairs.items() if isinstance(v, int | float)}
