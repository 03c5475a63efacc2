"""GPU throughput of the trainer's GPT: tokens/s and MFU at ~124M, ~560M and ~1B parameters.

For each model, in one run on one device:

- **trainer**: the real ``trainer.run.Run`` built from a ``WorkerConfig`` over a Parquet token
  file, exactly as ``train()`` builds it (bf16 autocast, ``torch.compile``, fused AdamW, TF32, SDPA
  flash attention on CUDA), fed by ``train()``'s data path (``BatchStream`` through the
  ``Prefetcher``: pinned memory, non-blocking copies on a side stream) and driven through
  ``step_with_oom_fallback`` plus the bookkeeping of ``train()``'s loop (the on-device loss window,
  synced every ``log_every_steps``), like ``benchmarks/trainer_overhead.py``.
- **resident**: the same run fed one batch that already sits on the device, in blocks interleaved
  with the trainer's blocks: their ratio is the cost of the data path (goal <= 1.02).
- **raw**: a nanoGPT-style loop on the same model (same init, same batches, same micro-batch,
  same compile, autocast and fused AdamW), with nanoGPT's ``pin_memory().to(non_blocking=True)``
  batch copy: the trainer's step time over this one should stay <= 1.02.
- **eager** (when compiling): the trainer without ``torch.compile``: the compile speedup. The
  compile time is the first step's time less a steady step, reported separately.

MFU = tokens/s x FLOPs per token / peak, with FLOPs per token ``6N + 12*L*H*Q*T`` (PaLM appendix
B; ``N`` without the position embedding, the tied output head included), against both the
datasheet peak (H100/H200 SXM: 989 TFLOP/s dense bf16) and a bf16 8192^3 matmul measured in the
same run with CUDA events. Peak memory is the trainer's ``max_memory_allocated``.

Models (vocab 50304, sequence 1024, tied embeddings, no biases; N as counted for 6N):

- gpt-124m: 12 layers x 768, 12 heads (Q=64), N = 123.6M, batch 64 x 1024 tokens (GPT-2 small);
- gpt-560m: 24 layers x 1280, 10 heads (Q=128), N = 536.3M, batch 32 x 1024 (nanochat d20's
  width and head size, with GPT-2's vocabulary);
- gpt-1b: 24 layers x 2048, 16 heads (Q=128), N = 1.311B, batch 32 x 1024 (llm-foundry's "1b").

The batches are sized (by estimate, not yet measured) to fit an H200 (141 GB) without activation
checkpointing; should one not fit, the trainer's OOM fallback halves the micro-batch (the table
shows the one used) and the raw loop uses the same. ``--act-ckpt`` turns activation
checkpointing on.

Without CUDA (or with ``--tiny``) it runs a tiny GPT (2 x 64, 2 heads, sequence 64, vocab 256) in
fp32, without compile unless ``--compile``, against a measured fp32 matmul as the "peak", so CI
tests the logic; the output has the same structure. The MFU ratio of the largest model against
the measured matmul is the last line. On an H200, from the repository root:

    PYTHONPATH=. python benchmarks/gpu_throughput.py
"""

from __future__ import annotations

import argparse
import gc
import io
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer import dist
from trainer.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    OutputConfig,
    TrainConfig,
    WorkerConfig,
)
from trainer.data import BatchStream, DataPosition
from trainer.dist import DistContext
from trainer.models import build_model, compute_loss, count_params, flops_per_token
from trainer.run import LossWindow, Run, seed_everything, training_batches
from trainer.stop import StopSignal
from trainer.telemetry import Telemetry

SEED = 0
DATASHEET_BF16_FLOPS = 989e12  # H100/H200 SXM, dense bf16 (no sparsity)
GPU_MATMUL_N = 8192
CPU_MATMUL_N = 512
MFU_GOAL = "goal >= 0.45 at 0.5-1B on H200"
RATIO_GOAL = "goal <= 1.02"


@dataclass(frozen=True)
class Case:
    """One model row: the GPT's shape and its batch."""

    name: str
    model: ModelConfig
    seq_len: int
    batch: int
    """Sequences per optimizer step (one process)."""

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq_len


def _gpt(n_layer: int, d_model: int, n_head: int, vocab: int = 50304) -> ModelConfig:
    return ModelConfig(
        name="gpt", vocab_size=vocab, n_layer=n_layer, n_head=n_head, d_model=d_model
    )


GPU_CASES = {
    "124m": Case("gpt-124m", _gpt(12, 768, 12), seq_len=1024, batch=64),
    "560m": Case("gpt-560m", _gpt(24, 1280, 10), seq_len=1024, batch=32),
    "1b": Case("gpt-1b", _gpt(24, 2048, 16), seq_len=1024, batch=32),
}
TINY_CASE = Case("gpt-tiny", _gpt(2, 64, 2, vocab=256), seq_len=64, batch=8)


@dataclass
class Row:
    """What one model measured."""

    case: Case
    n_params: int
    flops_per_token: float
    micro_batch: int
    step_s: float
    tokens_per_s: float
    mfu_datasheet: float | None
    mfu_matmul: float
    raw_ratio: float
    data_ratio: float
    compile_s: float | None
    compile_speedup: float | None
    peak_gb: float | None


# ------------------------------------------------------------------------------------ set-up


def write_tokens(case: Case, path: Path) -> None:
    """Random token ids for a few global batches (the stream reshuffles each epoch)."""
    rng = np.random.default_rng(SEED)
    n = 4 * case.batch * case.seq_len + 1
    pq.write_table(pa.table({"tokens": rng.integers(0, case.model.vocab_size, n)}), path)


def make_config(case: Case, data: Path, out: Path, *, compile: bool) -> WorkerConfig:
    """The trainer's config: its defaults (auto precision, TF32, fused AdamW on CUDA, prefetch)."""
    return WorkerConfig(
        data=DataConfig(train_uri=str(data), kind="tokens", target="tokens", seq_len=case.seq_len),
        output=OutputConfig(model_uri=str(out)),
        model=case.model,
        optim=OptimConfig(lr=3e-4, warmup_steps=0, schedule="constant", grad_clip=1.0),
        train=TrainConfig(
            epochs=1_000_000,
            max_steps=1_000_000,
            global_batch_size=case.batch,
            seed=SEED,
            compile=compile,
            log_every_steps=10,
        ),
    )


def build_run(cfg: WorkerConfig, ctx: DistContext) -> Run:
    """``Run`` as ``train()`` builds it, its telemetry sent to a sink."""
    run = Run(cfg, ctx, StopSignal())
    run.telemetry = Telemetry(
        enabled=ctx.is_main, job=ctx.run_id, total_steps=run.total_steps, stream=io.StringIO()
    )
    return run


Batches = Iterator[tuple[Any, torch.Tensor, torch.Tensor]]


def trainer_step(run: Run, batches: Batches) -> Callable[[], None]:
    """One iteration of ``train()``'s loop (``Run.loop_step``) on ``batches``."""
    window = LossWindow(run.ctx)

    def step() -> None:
        position, x, y = next(batches)
        if run.loop_step(position, x, y, window).diverged:
            raise RuntimeError(f"non-finite loss by step {run.state.step}: the benchmark diverged")

    return step


def raw_step(cfg: WorkerConfig, ctx: DistContext, like: Run, *, micro: int) -> Callable[[], None]:
    """A nanoGPT-style loop: same init, batches, micro-batch, compile, autocast and optimizer.

    ``like`` lends its dataset, model spec and precision (not its model or optimizer).
    """
    o = cfg.optim
    seed_everything(cfg.train.seed)  # as Run does: the same initial weights
    model = build_model(cfg.model, like.spec).to(ctx.device)
    fwd = torch.compile(model) if cfg.train.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": o.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        fused=ctx.device.type == "cuda",
    )
    dtype = like.precision.autocast_dtype
    cuda = ctx.device.type == "cuda"
    stream = BatchStream(
        like.train_ds,
        global_batch_size=cfg.train.global_batch_size,
        rank=0,
        world_size=1,
        seed=SEED,
    )
    it = iter(stream)
    counter = itertools.count(1)

    def step() -> None:
        _, x, y = next(it)
        if cuda:  # nanoGPT's get_batch
            x = x.pin_memory().to(ctx.device, non_blocking=True)
            y = y.pin_memory().to(ctx.device, non_blocking=True)
        n = x.shape[0]
        for mx, my in zip(x.split(micro), y.split(micro), strict=True):
            with torch.autocast(ctx.device.type, dtype=dtype, enabled=dtype is not None):
                logits = fwd(mx)
            loss = compute_loss("lm", logits, my) * (mx.shape[0] / n)
            loss.backward()
        if o.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if next(counter) % cfg.train.log_every_steps == 0:
            loss.item()  # nanoGPT's logging sync

    return step


# ------------------------------------------------------------------------------------ timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Seconds per step over ``steps`` steps, synchronising only before and after the block."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / steps


def first_step(step: Callable[[], None], device: torch.device) -> float:
    """Seconds for one step, compile included when it is the first."""
    return timed(step, 1, device)


def matmul_peak(device: torch.device, *, n: int, rounds: int = 3, iters: int = 20) -> float:
    """Best measured FLOP/s of an ``n^3`` matmul: bf16 with CUDA events on GPU, fp32 on CPU."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator(device=device).manual_seed(SEED)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=out)
    best = 0.0
    for _ in range(rounds):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                torch.mm(a, b, out=out)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                torch.mm(a, b, out=out)
            seconds = time.perf_counter() - t0
        best = max(best, 2.0 * n**3 * iters / seconds)
    return best


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------- measuring


def measure(
    case: Case,
    ctx: DistContext,
    *,
    compile: bool,
    steps: int,
    repeats: int,
    warmup: int,
    peak_flops: float,
    datasheet_flops: float | None,
) -> Row:
    """All contenders for one model, one after another on the same device."""
    device = ctx.device
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "tokens.parquet"
        write_tokens(case, data)
        cfg = make_config(case, data, Path(tmp) / "model", compile=compile)

        # trainer, real data path vs a resident batch, in interleaved blocks
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        run = build_run(cfg, ctx)
        n_params = count_params(run.raw_model, exclude_embeddings=True)
        fpt = flops_per_token(case.model, run.spec, n_params)
        _, x0, y0 = next(iter(run.stream))
        resident_batch = (DataPosition(), x0.to(device), y0.to(device))
        batches = training_batches(run)  # what train() iterates: the prefetcher by default
        try:
            real = trainer_step(run, batches)
            resident = trainer_step(run, itertools.repeat(resident_batch))
            first = first_step(real, device)
            for _ in range(warmup):
                timed(real, steps, device)
                timed(resident, steps, device)
            real_s: list[float] = []
            ratios: list[float] = []
            for r in range(repeats):
                # alternate which goes first so neither always follows the other
                if r % 2 == 0:
                    a, b = timed(real, steps, device), timed(resident, steps, device)
                else:
                    b, a = timed(resident, steps, device), timed(real, steps, device)
                real_s.append(a)
                ratios.append(a / b)
        finally:
            batches.close()
        step_s = statistics.median(real_s)
        micro = run.state.micro_batch_size
        peak_gb = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
        # Free the trainer's model and optimizer before the next contender builds its own.
        for attr in ("raw_model", "fwd_model", "ddp", "optimizer", "scheduler"):
            setattr(run, attr, None)
        del real, resident, batches, resident_batch
        _free(device)

        # the hand-written loop
        raw = raw_step(cfg, ctx, run, micro=micro)
        del run
        _free(device)
        first_step(raw, device)
        for _ in range(warmup):
            timed(raw, steps, device)
        raw_s = statistics.median(timed(raw, steps, device) for _ in range(repeats))
        del raw
        _free(device)

        # eager, for the compile speedup
        compile_s = speedup = None
        if compile:
            compile_s = max(0.0, first - step_s)
            eager_run = build_run(replace(cfg, train=replace(cfg.train, compile=False)), ctx)
            eager_run.state.micro_batch_size = micro
            eager_batches = training_batches(eager_run)
            try:
                eager = trainer_step(eager_run, eager_batches)
                for _ in range(warmup):
                    timed(eager, steps, device)
                eager_s = statistics.median(timed(eager, steps, device) for _ in range(repeats))
            finally:
                eager_batches.close()
            speedup = eager_s / step_s
            del eager_run, eager, eager_batches
            _free(device)

    tokens_per_s = case.tokens_per_step / step_s
    return Row(
        case=case,
        n_params=n_params,
        flops_per_token=fpt,
        micro_batch=micro,
        step_s=step_s,
        tokens_per_s=tokens_per_s,
        mfu_datasheet=tokens_per_s * fpt / datasheet_flops if datasheet_flops else None,
        mfu_matmul=tokens_per_s * fpt / peak_flops,
        raw_ratio=step_s / raw_s,
        data_ratio=statistics.median(ratios),
        compile_s=compile_s,
        compile_speedup=speedup,
        peak_gb=peak_gb,
    )


# ------------------------------------------------------------------------------------ output

COLUMNS = (
    ("model", "{:10s}"),
    ("N", "{:>8s}"),
    ("FLOP/tok", "{:>10s}"),
    ("tok/step", "{:>8s}"),
    ("micro", "{:>5s}"),
    ("step ms", "{:>9s}"),
    ("tok/s", "{:>10s}"),
    ("TFLOP/s", "{:>8s}"),
    ("MFU sheet", "{:>9s}"),
    ("MFU mm", "{:>7s}"),
    ("raw", "{:>6s}"),
    ("data", "{:>6s}"),
    ("compile s", "{:>9s}"),
    ("speedup", "{:>7s}"),
    ("peak GB", "{:>7s}"),
)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_row(cells: list[str]) -> str:
    return " ".join(f.format(c) for (_, f), c in zip(COLUMNS, cells, strict=True))


def row_cells(row: Row) -> list[str]:
    return [
        row.case.name,
        f"{row.n_params / 1e6:.1f}M",
        f"{row.flops_per_token:.4e}",
        str(row.case.tokens_per_step),
        str(row.micro_batch),
        f"{row.step_s * 1e3:.2f}",
        f"{row.tokens_per_s:.0f}",
        f"{row.tokens_per_s * row.flops_per_token / 1e12:.4g}",
        _fmt(row.mfu_datasheet, ".3f"),
        f"{row.mfu_matmul:.3f}",
        f"{row.raw_ratio:.3f}",
        f"{row.data_ratio:.3f}",
        _fmt(row.compile_s, ".1f"),
        _fmt(row.compile_speedup, ".2f"),
        _fmt(row.peak_gb, ".1f"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Measures each model, prints the table, and the MFU ratio of the largest model last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default=",".join(GPU_CASES), help=f"of {','.join(GPU_CASES)} (on CUDA)"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="the tiny CPU config (implied off CUDA)"
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile the model (default: on with CUDA, off on the CPU)",
    )
    parser.add_argument("--act-ckpt", action="store_true", help="activation checkpointing on")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="timed blocks per contender")
    parser.add_argument("--warmup", type=int, default=1, help="untimed blocks per contender")
    parser.add_argument(
        "--datasheet-tflops",
        type=float,
        default=DATASHEET_BF16_FLOPS / 1e12,
        help="datasheet dense bf16 peak of the GPU (default: H100/H200 SXM)",
    )
    args = parser.parse_args(argv)
    if min(args.steps, args.repeats) < 1 or args.warmup < 0:
        parser.error("--steps and --repeats must be >= 1, --warmup >= 0")

    ctx = dist.init()
    if ctx.is_distributed:
        parser.error("run it as one process (not under torchrun)")
    device = ctx.device
    cuda = device.type == "cuda"
    tiny = args.tiny or not cuda
    if tiny:
        cases = [TINY_CASE]
    else:
        names = [n.strip() for n in args.models.split(",") if n.strip()]
        unknown = [n for n in names if n not in GPU_CASES]
        if unknown or not names:
            parser.error(f"--models must name some of {', '.join(GPU_CASES)}, got {args.models!r}")
        cases = [GPU_CASES[n] for n in names]
    if args.act_ckpt:
        cases = [replace(c, model=replace(c.model, activation_checkpointing=True)) for c in cases]
    compile = args.compile if args.compile is not None else cuda
    torch.set_grad_enabled(True)

    peak_n = CPU_MATMUL_N if not cuda else GPU_MATMUL_N
    peak = matmul_peak(device, n=peak_n)
    datasheet = args.datasheet_tflops * 1e12 if cuda else None
    name = torch.cuda.get_device_name(device) if cuda else f"cpu, {torch.get_num_threads()} threads"
    precision = "bf16" if cuda else "fp32"
    print(
        f"device {device} ({name}), torch {torch.__version__}, {precision}, "
        f"compile {'on' if compile else 'off'}, activation checkpointing "
        f"{'on' if args.act_ckpt else 'off'}; {args.repeats} blocks of {args.steps} steps "
        f"(+{args.warmup} warmup)"
    )
    sheet = f"{args.datasheet_tflops:.0f} TFLOP/s datasheet" if cuda else "no datasheet peak"
    print(
        f"peak: {peak / 1e12:.4g} TFLOP/s measured ({peak_n}^3 {precision} matmul), {sheet}",
        flush=True,
    )
    print(format_row([c for c, _ in COLUMNS]))
    rows: list[Row] = []
    for case in cases:
        row = measure(
            case,
            ctx,
            compile=compile,
            steps=args.steps,
            repeats=args.repeats,
            warmup=args.warmup,
            peak_flops=peak,
            datasheet_flops=datasheet,
        )
        rows.append(row)
        print(format_row(row_cells(row)), flush=True)
    dist.close(ctx)
    print(
        "N = parameters without the position embedding; FLOP/tok = 6N + 12*L*H*Q*T; micro = "
        "micro-batch used; MFU sheet/mm = vs the datasheet peak / the measured matmul; raw = "
        "step time over a nanoGPT-style loop's; data = real data path over a resident batch "
        "(median of interleaved block pairs); compile s = first step less a steady one; "
        "speedup = eager step time over compiled; peak GB = trainer's max allocated"
    )
    largest = max(rows, key=lambda r: r.n_params)
    where = "cpu tiny config" if not cuda else ("tiny config" if tiny else largest.case.name)
    if largest.mfu_datasheet is not None:
        print(f"mfu vs datasheet ({where}): {largest.mfu_datasheet:.3f}")
    print(f"raw-loop ratio ({where}): {largest.raw_ratio:.3f} ({RATIO_GOAL})")
    print(f"data-path ratio ({where}): {largest.data_ratio:.3f} ({RATIO_GOAL})")
    suffix = f" ({where})" if tiny else ""
    print(f"gpu_throughput mfu_ratio: {largest.mfu_matmul:.3f} ({MFU_GOAL}){suffix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
