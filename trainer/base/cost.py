"""What a training run costs: the price of a GPU-hour, an estimate before launch, the actual after.

No prices are built in: they change and differ by contract, so the pipeline takes them as
parameters (``gpu_hour_usd``, or ``gpu_prices`` per ``gpu_type``). The arithmetic is the one
every front door uses (the train step, the worker's ``cost_usd`` counter, the run summary):

- hourly cost = GPUs held x price of one GPU-hour;
- estimated hours = samples to process / throughput / 3600, where samples = training rows x
  epochs (or optimizer steps x global batch when ``train.max_steps`` caps the run);
- actual GPU-hours = the job's training wall time x GPUs held; actual cost = GPU-hours x price.

"GPUs held" is what is billed: nodes x GPUs per node, as the job requests them (one per process
on a node without GPUs, so a CPU run is priced per process, the way a CPU demo of a GPU job
would be). Torch-free: the steps, the worker and the CLI all import it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from trainer.base.errors import InputError

ThroughputSource = Literal["measured", "recorded"]


def resolve_price(
    gpu_type: str, gpu_hour_usd: float, gpu_prices: dict[str, Any] | None
) -> float | None:
    """The price of one GPU-hour of ``gpu_type``; ``None`` when no price is given.

    A price in ``gpu_prices`` for ``gpu_type`` wins over ``gpu_hour_usd``; a table of prices
    that lacks ``gpu_type`` (and no ``gpu_hour_usd`` to fall back on) is an error, not a cost
    of zero.

    Raises:
        InputError: ``E_PARAM`` naming ``gpu_hour_usd`` or ``gpu_prices`` for a negative,
            non-numeric or missing price.
    """
    if not isinstance(gpu_hour_usd, int | float) or isinstance(gpu_hour_usd, bool):
        raise InputError("E_PARAM", f"must be a number, got {gpu_hour_usd!r}", "gpu_hour_usd")
    if not math.isfinite(gpu_hour_usd) or gpu_hour_usd < 0:
        raise InputError("E_PARAM", f"must be >= 0, got {gpu_hour_usd!r}", "gpu_hour_usd")
    prices = dict(gpu_prices or {})
    for name, price in prices.items():
        if (
            not isinstance(price, int | float)
            or isinstance(price, bool)
            or not math.isfinite(price)
            or price < 0
        ):
            raise InputError(
                "E_PARAM", f"price of {name!r} must be a number >= 0, got {price!r}", "gpu_prices"
            )
    if gpu_type in prices:
        return float(prices[gpu_type])
    if gpu_hour_usd > 0:
        return float(gpu_hour_usd)
    if prices:
        raise InputError(
            "E_PARAM",
            f"has no price for gpu_type {gpu_type!r} (it has {', '.join(sorted(prices))}); "
            "add one or set gpu_hour_usd",
            "gpu_prices",
        )
    return None


def gpus_held(nnodes: int, gpus_per_node: int) -> int:
    """GPUs a job holds and is billed for: nodes x GPUs per node (none on CPU nodes)."""
    return nnodes * max(gpus_per_node, 0)


def gpus_used(held: int, device_type: str, processes: int) -> int:
    """GPUs a running job really uses: what it holds (``held``; 0: one per process) when its
    processes drive CUDA devices, and none when they train on the CPU, also where the pipeline
    asked for GPUs that were not there (``gpus_per_node`` 1 on a laptop): GPU-hours that were
    never used are never recorded or priced."""
    if device_type != "cuda":
        return 0
    return held or processes


@dataclass(kw_only=True, slots=True)
class CostEstimate:
    """The estimate printed before launch, with what it assumed."""

    gpus: int
    """GPUs held (nodes x GPUs per node)."""
    gpu_hour_usd: float | None
    """Price of one GPU-hour (``None``: no price given; only the duration is estimated)."""
    samples: int
    """Samples the run will process (rows x epochs, or steps x global batch)."""
    samples_per_s: float
    """Throughput of the whole job."""
    throughput_source: ThroughputSource
    """``measured`` (timed before launch) or ``recorded`` (given, e.g. an earlier run's)."""
    assumptions: list[str] = field(default_factory=list)
    """Each assumption, as a person reads it."""

    @property
    def estimated_duration_hours(self) -> float:
        return self.samples / self.samples_per_s / 3600.0

    @property
    def hourly_cost_usd(self) -> float | None:
        return None if self.gpu_hour_usd is None else self.gpus * self.gpu_hour_usd

    @property
    def total_cost_usd(self) -> float | None:
        hourly = self.hourly_cost_usd
        return None if hourly is None else hourly * self.estimated_duration_hours

    def to_dict(self) -> dict[str, Any]:
        """The fields and the three figures (``hourly_cost_usd``, ``estimated_duration_hours``,
        ``total_cost_usd``), as JSON-ready values."""
        out = asdict(self)
        out.update(
            hourly_cost_usd=self.hourly_cost_usd,
            estimated_duration_hours=self.estimated_duration_hours,
            total_cost_usd=self.total_cost_usd,
        )
        return out


def _held(gpus: int, nnodes: int, gpus_per_node: int) -> str:
    """What the job holds, as a person reads it (a CPU job holds no GPU and costs nothing here)."""
    nodes = f"{nnodes} node{'s' if nnodes != 1 else ''}"
    if gpus_per_node < 1:
        one = "process" if nnodes == 1 else "processes"
        return f"no GPU (gpus_per_node 0 or none found): {nnodes} CPU {one}, no GPU-hours"
    return f"{gpus} GPU{'s' if gpus != 1 else ''} held ({nodes} x {gpus_per_node} per node)"


def estimate(
    *,
    rows: int,
    epochs: int,
    max_steps: int | None,
    global_batch_size: int,
    samples_per_s: float,
    throughput_source: ThroughputSource,
    nnodes: int,
    gpus_per_node: int,
    gpu_hour_usd: float | None,
) -> CostEstimate:
    """The cost of a run before it starts (see the module's arithmetic).

    Raises:
        ValueError: a throughput that is not > 0, or no rows.
    """
    if not (samples_per_s > 0 and math.isfinite(samples_per_s)):
        raise ValueError(f"throughput must be > 0 samples/s, got {samples_per_s!r}")
    if rows <= 0:
        raise ValueError(f"rows must be > 0, got {rows!r}")
    steps_per_epoch = math.ceil(rows / global_batch_size)
    samples = rows * epochs
    how = f"{rows} training rows x {epochs} epochs"
    if max_steps is not None and max_steps < steps_per_epoch * epochs:
        samples = max_steps * global_batch_size
        how = f"train.max_steps {max_steps} x global batch {global_batch_size}"
    gpus = gpus_held(nnodes, gpus_per_node)
    assumptions = [
        f"{samples} samples ({how}); early stopping can only shorten the run",
        f"{samples_per_s:.1f} samples/s for the whole job ({throughput_source})",
        _held(gpus, nnodes, gpus_per_node),
        "optimizer steps only: the actual also counts the job's setup, evaluation and "
        "checkpoints (not scheduling or image pulls)",
    ]
    if gpu_hour_usd is None:
        assumptions.append("no GPU-hour price given (gpu_hour_usd, gpu_prices): no cost")
    else:
        assumptions.append(f"${gpu_hour_usd:g} per GPU-hour")
    return CostEstimate(
        gpus=gpus,
        gpu_hour_usd=gpu_hour_usd,
        samples=samples,
        samples_per_s=float(samples_per_s),
        throughput_source=throughput_source,
        assumptions=assumptions,
    )


def actual(duration_s: float, gpus: int, gpu_hour_usd: float | None) -> dict[str, float | None]:
    """What a run cost: ``gpu_hours`` (wall time x GPUs) and ``cost_usd`` (``None`` unpriced)."""
    gpu_hours = duration_s / 3600.0 * gpus
    return {
        "duration_s": duration_s,
        "gpu_hours": gpu_hours,
        "cost_usd": None if gpu_hour_usd is None else gpu_hours * gpu_hour_usd,
    }


def _money(value: float | None) -> str:
    return "no price" if value is None else f"${value:,.4f}"


def _ran_on(act: dict[str, Any]) -> str:
    """``, on 2 GPUs`` or ``, on the CPU``: what the run's processes used (older records: '')."""
    device = act.get("device")
    if device is None:
        return ""
    if device != "cuda":
        return ", on the CPU"
    gpus = act.get("gpus") or 0
    return f", on {gpus} GPU{'s' if gpus != 1 else ''}"


def summary_lines(est: dict[str, Any] | None, act: dict[str, Any] | None) -> list[str]:
    """Lines for a run summary: the estimate beside the actual (either may be missing)."""
    lines = []
    if est is not None:
        hourly = est["hourly_cost_usd"]
        if not est["gpus"]:
            per_hour = "; on the CPU: no GPU-hours"
        else:
            per_hour = "" if hourly is None else f"; {_money(hourly)}/h for {est['gpus']} GPUs"
        lines.append(
            f"estimate {est['estimated_duration_hours'] * 3600:.1f} s, "
            f"{_money(est['total_cost_usd'])} ({est['samples_per_s']:.1f} samples/s, "
            f"{est['throughput_source']}{per_hour})"
        )
    if act is not None:
        lines.append(
            f"actual   {act['duration_s']:.1f} s, {_money(act.get('cost_usd'))} "
            f"({act['gpu_hours']:.6f} GPU-hours{_ran_on(act)})"
        )
    return lines
