"""Benchmark: step time of trainer.training against a hand-written PyTorch loop on the same work.

Both contenders train the same model (built by ``build_model`` after the same seed, from the same
starting weights), on the same batches (two ``BatchStream`` iterators over one dataset, same
seed), with the same AdamW (decay on matrices only, same fused flag), the same ``LambdaLR``
warmup-and-cosine schedule, the same gradient clipping and the same precision policy, in one
process (``dist.init()`` without torchrun: world size 1, the CPU unless a GPU is visible).

- **ours** is the real ``trainer.training.run.Run``, built from a ``WorkerConfig`` over a Parquet
  file exactly as ``train()`` builds it, driven through ``step_with_oom_fallback(x, y)``
  (micro-batch split, control agreement, backward, clip, optimizer and scheduler step), plus the
  per-step bookkeeping of ``train()``'s loop: the on-device loss window (``nan_to_num``, the
  non-finite counts, the grad-norm check), the progress-bar advance, the log/eval/checkpoint
  decisions, and every ``log_every_steps`` the one sync and a JSON log line (written to a throwaway
  stream). ``train()`` itself is not timed because it cannot be paused to interleave blocks with the
  other contender and its history holds only windowed, rounded losses, so the step-for-step loss
  check would be impossible; the bookkeeping here mirrors its loop body line for line.
- **raw** is a nanoGPT-style loop: ``loss = F.cross_entropy(model(x), y)`` (or, as nanoGPT,
  ``model(x, targets=y)`` for a model that computes its own loss: the GPT's chunked head);
  ``loss.backward(); clip; opt.step(); sched.step(); opt.zero_grad(set_to_none=True)``, with
  ``loss.item()`` every ``log_every_steps`` as nanoGPT logs.

Blocks of ``--steps`` steps alternate between the two (after warmup blocks that are not
measured) for ``--repeats`` rounds; every step is timed (the device is synchronised after each
step on CUDA). Each pair of adjacent blocks gives one ratio of block-median step times; the
headline is the median of those paired ratios, because on a shared machine the load drifts
between blocks far more than the trainer's overhead (the pooled ratio of all-step medians is
printed too). The losses of the two runs must agree
step for step; otherwise the benchmark exits with status 1. Run from the repo root:

    .venv/bin/python benchmarks/trainer_overhead.py [--steps 5] [--repeats 30] [--rows ...]
"""

from __future__ import annotations

import argparse
import io
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.config import (
    DataConfig,
    MetricsConfig,
    ModelConfig,
    OptimConfig,
    OutputConfig,
    TrainConfig,
    WorkerConfig,
)
from trainer.data.datasets import BatchStream
from trainer.distributed import dist
from trainer.distributed.dist import DistContext
from trainer.models import build_model, computes_loss
from trainer.training.loop import LossWindow, loop_step
from trainer.training.optim import lr_multiplier
from trainer.training.run import Run
from trainer.training.stop import StopSignal
from trainer.training.telemetry import Telemetry

SEED = 0
# Losses are compared with this tolerance; on one CPU process they are in fact bitwise equal.
RTOL, ATOL = 1e-6, 1e-7


PLAIN_MLP: dict[str, object] = {"embedding": "none", "ensemble": 1}
"""The MLP rows time the loop around a plain MLP (the model of the figures below): the raw loop
computes ``F.cross_entropy(model(x), y)``, which an ensemble's per-member loss is not."""


@dataclass(frozen=True)
class Case:
    """One benchmark row: a model, its data and its batch."""

    name: str
    model: ModelConfig
    kind: str  # "tabular" or "tokens"
    batch: int
    features: int = 64
    seq_len: int = 64


CASES = {
    "mlp": Case(
        "mlp 64->512x4->10, batch 512",
        ModelConfig(name="mlp", hidden_dim=512, num_layers=4, **PLAIN_MLP),
        "tabular",
        batch=512,
    ),
    "mlp-small": Case(
        "mlp 64->256x2->10, batch 256",
        ModelConfig(name="mlp", hidden_dim=256, num_layers=2, **PLAIN_MLP),
        "tabular",
        batch=256,
    ),
    "gpt": Case(
        "gpt 2x128 (4 heads), 16x64 tokens",
        ModelConfig(name="gpt", vocab_size=512, n_layer=2, n_head=4, d_model=128),
        "tokens",
        batch=16,
    ),
}


def write_data(case: Case, path: Path, rows: int) -> None:
    """Writes the Parquet the trainer reads: features + label, or a flat token column."""
    rng = np.random.default_rng(SEED)
    cols: dict[str, np.ndarray]
    if case.kind == "tabular":
        x = rng.standard_normal((rows, case.features), dtype=np.float32)
        cols = {f"f{j}": x[:, j] for j in range(case.features)}
        cols["label"] = rng.integers(0, 10, rows)
    else:
        cols = {"tokens": rng.integers(0, case.model.vocab_size, rows * case.seq_len + 1)}
    pq.write_table(pa.table(cols), path)


def make_config(
    case: Case, data: Path, out: Path, total_steps: int, metrics_port: int = 0
) -> WorkerConfig:
    """A config whose schedule spans the whole benchmark (warmup, then cosine decay); with
    ``metrics_port`` the run serves its Prometheus endpoint there, priced (``cost_usd`` too)."""
    return WorkerConfig(
        metrics=MetricsConfig(
            port=metrics_port, host="127.0.0.1", gpu_hour_usd=1.0 if metrics_port else None
        ),
        data=DataConfig(
            train_uri=str(data),
            kind=case.kind,  # type: ignore[arg-type]
            target="label" if case.kind == "tabular" else "tokens",
            seq_len=case.seq_len,
        ),
        output=OutputConfig(model_uri=str(out)),
        model=case.model,
        optim=OptimConfig(lr=1e-3, warmup_steps=10, grad_clip=1.0),
        train=TrainConfig(
            epochs=10_000, max_steps=total_steps, global_batch_size=case.batch, seed=SEED
        ),
    )


def ours(cfg: WorkerConfig, ctx: DistContext) -> tuple[Callable[[], torch.Tensor], Run]:
    """The trainer's step: ``loop_step``, the body of ``train()``'s loop."""
    run = Run(cfg, ctx, StopSignal())
    # Same events as train() would emit, but into a sink so the table stays readable.
    run.telemetry = Telemetry(
        enabled=ctx.is_main,
        job=ctx.run_id,
        total_steps=run.total_steps,
        stream=io.StringIO(),
        sink=run.telemetry.sink,  # the metrics endpoint, when on: fed as train() feeds it
    )
    window = LossWindow(ctx)
    it = iter(run.stream)

    def step() -> torch.Tensor:
        position, x, y = next(it)
        outcome = loop_step(run, position, x, y, window)
        if outcome.diverged:
            raise RuntimeError(f"non-finite loss by step {run.state.step}: the benchmark diverged")
        return outcome.loss

    return step, run


def raw(cfg: WorkerConfig, ctx: DistContext, run: Run) -> Callable[[], torch.Tensor]:
    """A hand-written loop over the same dataset, model init, optimizer and schedule."""
    o, t = cfg.optim, cfg.train
    torch.manual_seed(t.seed)
    model = build_model(cfg.model, run.spec).to(ctx.device)
    # The run's starting weights (the MLP starts from its linear fit, model.linear), taken
    # before either contender steps.
    model.load_state_dict(run.raw_model.state_dict())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = o.fused if o.fused is not None else ctx.device.type == "cuda"
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": o.weight_decay},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        fused=fused,
    )
    total = run.total_steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_multiplier(
            s, total=total, warmup=o.warmup_steps, schedule=o.schedule, min_ratio=o.min_lr_ratio
        ),
    )
    dtype = run.precision.autocast_dtype
    if run.precision.make_scaler() is not None:
        raise ValueError("the hand-written loop has no gradient scaler: use fp32 or bf16")
    stream = BatchStream(
        run.train_ds, global_batch_size=t.global_batch_size, rank=0, world_size=1, seed=t.seed
    )
    it: Iterator[tuple[object, torch.Tensor, torch.Tensor]] = iter(stream)
    counter = {"step": 0}

    def step() -> torch.Tensor:
        _, x, y = next(it)
        x, y = x.to(ctx.device), y.to(ctx.device)
        with torch.autocast(ctx.device.type, dtype=dtype, enabled=dtype is not None):
            if computes_loss(model):  # nanoGPT's `logits, loss = model(X, Y)`
                loss = model(x, targets=y)
            else:
                loss = F.cross_entropy(model(x).float().flatten(0, -2), y.flatten())
        loss.backward()
        if o.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        counter["step"] += 1
        if counter["step"] % t.log_every_steps == 0:
            loss.item()  # nanoGPT's logging sync
        return loss

    return step


class Scraper:
    """Scrapes a metrics endpoint every ``every_s`` seconds on a thread, as Prometheus would."""

    def __init__(self, url: str, every_s: float) -> None:
        self.url, self.every_s, self.scrapes = url, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            with urllib.request.urlopen(self.url, timeout=5) as r:
                r.read()
            self.scrapes += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.scrapes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(
    case: Case,
    ctx: DistContext,
    *,
    rows: int,
    steps: int,
    repeats: int,
    warmup: int,
    scrape_every_s: float | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[torch.Tensor]], list[float]]:
    """Interleaved blocks of both loops; returns per-step times and losses of each. With
    ``scrape_every_s`` ours serves its metrics endpoint, scraped that often throughout."""
    blocks = warmup + repeats
    port = _free_port() if scrape_every_s else 0
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "train.parquet"
        write_data(case, data, rows)
        cfg = make_config(case, data, Path(tmp) / "model", blocks * steps, metrics_port=port)
        ours_step, run = ours(cfg, ctx)
        raw_step = raw(cfg, ctx, run)
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics", scrape_every_s) if port else None
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    contenders = {"ours": ours_step, "raw": raw_step}
    times: dict[str, list[float]] = {k: [] for k in contenders}
    losses: dict[str, list[torch.Tensor]] = {k: [] for k in contenders}
    block_ratios: list[float] = []
    for b in range(blocks):
        block_median: dict[str, float] = {}
        # Alternate which contender goes first so neither always follows the other.
        order = list(contenders) if b % 2 == 0 else list(reversed(contenders))
        for name in order:
            fn, ts = contenders[name], []
            for _ in range(steps):
                t0 = time.perf_counter()
                loss = fn()
                sync()
                ts.append(time.perf_counter() - t0)
                if b >= warmup:
                    losses[name].append(loss.detach())
            if b >= warmup:
                times[name].extend(ts)
                block_median[name] = statistics.median(ts)
        if b >= warmup:
            block_ratios.append(block_median["ours"] / block_median["raw"])
    if scraper is not None:
        print(f"  {case.name}: metrics endpoint on, scraped {scraper.stop()} times")
    run.telemetry.close()  # stops the endpoint
    return times, losses, block_ratios


def main(argv: list[str] | None = None) -> int:
    """Runs each case, prints a table, and the headline ratio as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="mlp,mlp-small,gpt", help=f"of {','.join(CASES)}")
    parser.add_argument("--steps", type=int, default=5, help="steps per block")
    parser.add_argument("--repeats", type=int, default=30, help="measured blocks per contender")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured blocks per contender")
    parser.add_argument("--rows", type=int, default=32768, help="training rows (sequences)")
    parser.add_argument(
        "--metrics",
        type=float,
        metavar="SECONDS",
        help="ours serves its Prometheus endpoint (priced), scraped every SECONDS",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        parser.error(f"--cases must name some of {', '.join(CASES)}, got {args.cases!r}")

    ctx = dist.init()
    torch.set_grad_enabled(True)
    print(
        f"device {ctx.device}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"{args.repeats} interleaved blocks of {args.steps} steps each (+{args.warmup} warmup)"
    )
    print(
        f"{'case':36s} {'ours ms':>9s} {'raw ms':>9s} {'pooled':>7s} {'ratio':>7s} {'max |dL|':>9s}"
    )
    headline: float | None = None
    failed = False
    for name in names:
        case = CASES[name]
        times, losses, block_ratios = measure(
            case,
            ctx,
            rows=args.rows,
            steps=args.steps,
            repeats=args.repeats,
            warmup=args.warmup,
            scrape_every_s=args.metrics,
        )
        ours_ms = statistics.median(times["ours"]) * 1e3
        raw_ms = statistics.median(times["raw"]) * 1e3
        ratio = statistics.median(block_ratios)
        a, b = torch.stack(losses["ours"]).float(), torch.stack(losses["raw"]).float()
        diff = (a - b).abs().max().item()
        equal = torch.allclose(a, b, rtol=RTOL, atol=ATOL)
        failed |= not equal
        print(
            f"{case.name:36s} {ours_ms:9.3f} {raw_ms:9.3f} {ours_ms / raw_ms:7.3f} "
            f"{ratio:7.3f} {diff:9.2e}" + ("" if equal else "  LOSSES DIFFER")
        )
        if headline is None:
            headline = ratio
    print(
        "ms = median step time over all measured steps; pooled = their ratio; ratio = median "
        "over block pairs of ours/raw block-median step times (adjacent in time, so load drift "
        "cancels); max |dL| = largest loss difference over the measured steps"
    )
    dist.close(ctx)
    if failed:
        print(f"losses differ beyond rtol={RTOL}, atol={ATOL}: the loops do not do the same work")
        return 1
    assert headline is not None
    print(f"trainer_overhead ratio: {headline:.3f} (goal <= 1.03)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
