"""GPU throughput of the trainer's GPT: tokens/s and MFU at ~124M, ~560M and ~1B parameters.

For each model, in one run on one device:

- **trainer**: the real ``trainer.training.run.Run`` built from a ``WorkerConfig`` over a Parquet
  token file, exactly as ``train()`` builds it (bf16 autocast, ``torch.compile``, fused AdamW, TF32,
  SDPA flash attention on CUDA), fed by ``train()``'s data path (``BatchStream`` through the
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
- **old loss**: the trainer with ``model.loss_chunk = 0``: the head's full ``[B, T, V]`` logits
  and their fp32 copy, as before the chunked linear + cross-entropy (``trainer/models/lm_loss.py``).
- **hf** (when ``transformers`` is importable; not a project dependency): Hugging Face's
  ``GPT2LMHeadModel`` of the same shape, SDPA attention, same autocast, compile, fused AdamW,
  clipping, batches and micro-batch (halved only if it runs out of memory: the table shows it).
- **curve**: the trainer with the new and the old loss, ``--curve-steps`` steps each from one
  seed on a learnable token stream: the max |loss difference| over the curve and between the
  means of its last 10%.

MFU = tokens/s x FLOPs per token / peak, with FLOPs per token ``6N + 12*L*H*Q*T`` (PaLM appendix
B; ``N`` without the position embedding, the tied output head included), against both the
datasheet peak (H100/H200 SXM: 989 TFLOP/s dense bf16) and a bf16 8192^3 matmul measured in the
same run with CUDA events. Peak memory is the trainer's ``max_memory_allocated``.

Models (vocab 50304, sequence 1024, tied embeddings, no biases; N as counted for 6N):

- gpt-124m: 12 layers x 768, 12 heads (Q=64), N = 123.6M, batch 64 x 1024 tokens (GPT-2 small);
- gpt-560m: 24 layers x 1280, 10 heads (Q=128), N = 536.3M, batch 32 x 1024 (nanochat d20's
  width and head size, with GPT-2's vocabulary);
- gpt-1b: 24 layers x 2048, 16 heads (Q=128), N = 1.311B, batch 32 x 1024 (llm-foundry's "1b").

Without activation checkpointing, on an H100 80GB with the old loss, gpt-1b needed the OOM
fallback to micro-batch 16; the trainer starts from ``--micro`` (default: the whole batch) and
halves the micro-batch on OOM (the table shows the one used), the raw loop uses the same, and so
does HF unless it runs out of memory. ``--act-ckpt`` turns activation checkpointing on.

Each model's ratios against Hugging Face (ours/HF tok/s, goal >= 1.10; ours/HF peak memory, goal
<= 1.00) follow the table; the worst tok/s ratio is the last line when HF ran, else the MFU ratio.

Without CUDA (or with ``--tiny``) it runs a tiny GPT (2 x 64, 2 heads, sequence 64, vocab 256) in
fp32, without compile unless ``--compile``, against a measured fp32 matmul as the "peak", so CI
tests the logic; the output has the same structure. The MFU ratio of the largest model against
the measured matmul is the last line. On an H100/H200, from the repository root, one model
per call (a command there may run 10 minutes; benchmarks/README.md lists the calls):

    PYTHONPATH=. python benchmarks/gpu_throughput.py --models 124m
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
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib import gpu_contenders as hf
from benchmarks.lib.gpu_report import (
    COLUMNS,
    CONTENDERS,
    Case,
    Row,
    Settings,
    Side,
    format_row,
    print_summary,
    row_cells,
)
from trainer.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    OutputConfig,
    TrainConfig,
    WorkerConfig,
)
from trainer.data.datasets import BatchStream, DataPosition
from trainer.distributed import dist
from trainer.distributed.dist import DistContext
from trainer.models import build_model, count_params, flops_per_token, forward_loss
from trainer.training.loop import LossWindow, loop_step
from trainer.training.rng import seed_everything
from trainer.training.run import Run, training_batches
from trainer.training.stop import StopSignal
from trainer.training.telemetry import Telemetry

SEED = 0
DATASHEET_BF16_FLOPS = 989e12  # H100/H200 SXM, dense bf16 (no sparsity)
GPU_MATMUL_N = 8192
CPU_MATMUL_N = 512


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


# ------------------------------------------------------------------------------------ set-up


def write_tokens(case: Case, path: Path) -> None:
    """Random token ids for a few global batches (the stream reshuffles each epoch)."""
    rng = np.random.default_rng(SEED)
    n = 4 * case.batch * case.seq_len + 1
    pq.write_table(pa.table({"tokens": rng.integers(0, case.model.vocab_size, n)}), path)


def make_config(
    case: Case, data: Path, out: Path, *, compile: bool, micro: int | None = None
) -> WorkerConfig:
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
            micro_batch_size=micro,
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
    """One iteration of ``train()``'s loop (``loop_step``) on ``batches``."""
    window = LossWindow(run.ctx)

    def step() -> None:
        position, x, y = next(batches)
        if loop_step(run, position, x, y, window).diverged:
            raise RuntimeError(f"non-finite loss by step {run.state.step}: the benchmark diverged")

    return step


def raw_step(cfg: WorkerConfig, ctx: DistContext, like: Run, *, micro: int) -> Callable[[], None]:
    """A nanoGPT-style loop: same init, batches, micro-batch, compile, autocast and optimizer.

    ``like`` lends its dataset, model spec and precision (not its model or optimizer).
    """
    o = cfg.optim
    seed_everything(cfg.train.seed)  # as Run does: the same initial weights
    model = build_model(cfg.model, like.spec).to(ctx.device)
    fwd: Any = torch.compile(model) if cfg.train.compile else model
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
        autocast = lambda: torch.autocast(ctx.device.type, dtype=dtype, enabled=dtype is not None)  # noqa: E731
        for mx, my in zip(x.split(micro), y.split(micro), strict=True):
            # the model's own loss path (the chunked head when model.loss_chunk > 0)
            loss = forward_loss(fwd, "lm", mx, my, autocast) * (mx.shape[0] / n)
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


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None


def steady(step: Callable[[], None], device: torch.device, s: Settings) -> float:
    """Median seconds per step over ``s.repeats`` blocks after ``s.warmup`` untimed ones."""
    for _ in range(s.warmup):
        timed(step, s.steps, device)
    return statistics.median(timed(step, s.steps, device) for _ in range(s.repeats))


def measure_trainer(
    cfg: WorkerConfig, ctx: DistContext, s: Settings
) -> tuple[Run, float, float, float]:
    """The trainer on the real data path vs a resident batch, in interleaved blocks.

    Returns:
        The run (its model still built), the first step's seconds, the median step seconds
        and the median data-path ratio (real over resident).
    """
    device = ctx.device
    _reset_peak(device)
    run = build_run(cfg, ctx)
    _, x0, y0 = next(iter(run.stream))
    resident_batch = (DataPosition(), x0.to(device), y0.to(device))
    batches = training_batches(run)  # what train() iterates: the prefetcher by default
    try:
        real = trainer_step(run, batches)
        resident = trainer_step(run, itertools.repeat(resident_batch))
        first = first_step(real, device)
        for _ in range(s.warmup):
            timed(real, s.steps, device)
            timed(resident, s.steps, device)
        real_s: list[float] = []
        ratios: list[float] = []
        for r in range(s.repeats):
            # alternate which goes first so neither always follows the other
            if r % 2 == 0:
                a, b = timed(real, s.steps, device), timed(resident, s.steps, device)
            else:
                b, a = timed(resident, s.steps, device), timed(real, s.steps, device)
            real_s.append(a)
            ratios.append(a / b)
    finally:
        batches.close()
    return run, first, statistics.median(real_s), statistics.median(ratios)


def release(run: Run) -> None:
    """Free a run's model and optimizer (its dataset and spec stay for the next contender)."""
    for attr in ("raw_model", "fwd_model", "ddp", "optimizer", "scheduler"):
        setattr(run, attr, None)


def measure_side(cfg: WorkerConfig, ctx: DistContext, s: Settings, case: Case) -> Side:
    """The trainer under ``cfg`` (e.g. the old loss), with its own OOM fallback."""
    _reset_peak(ctx.device)
    run = build_run(cfg, ctx)
    batches = training_batches(run)
    try:
        step = trainer_step(run, batches)
        first_step(step, ctx.device)
        step_s = steady(step, ctx.device, s)
    finally:
        batches.close()
    side = Side(case.tokens_per_step / step_s, _peak_gb(ctx.device), run.state.micro_batch_size)
    release(run)
    del run, step, batches
    _free(ctx.device)
    return side


def measure_hf(cfg: WorkerConfig, ctx: DistContext, like: Run, s: Settings, case: Case) -> Side:
    """Hugging Face GPT-2 at the trainer's micro-batch (halved only if it does not fit)."""
    _reset_peak(ctx.device)
    micro = like.state.micro_batch_size
    (step, model), used = hf.oom_fallback(lambda m: hf.hf_step(cfg, ctx, like, micro=m), micro)
    step_s = steady(step, ctx.device, s)
    side = Side(case.tokens_per_step / step_s, _peak_gb(ctx.device), used)
    del step, model
    _free(ctx.device)
    return side


def measure(case: Case, ctx: DistContext, s: Settings) -> Row:
    """All contenders for one model, one after another on the same device."""
    device = ctx.device
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "tokens.parquet"
        write_tokens(case, data)
        cfg = make_config(case, data, Path(tmp) / "model", compile=s.compile, micro=s.micro)
        run, first, step_s, data_ratio = measure_trainer(cfg, ctx, s)
        micro = run.state.micro_batch_size
        peak_gb = _peak_gb(device)
        n_params = count_params(run.raw_model, exclude_embeddings=True)
        fpt = flops_per_token(case.model, run.spec, n_params)
        release(run)
        _free(device)

        raw_ratio = None
        if "raw" not in s.skip:  # the hand-written loop
            raw = raw_step(cfg, ctx, run, micro=micro)
            first_step(raw, device)
            raw_ratio = step_s / steady(raw, device, s)
            del raw
            _free(device)

        compile_s = speedup = None
        if s.compile and "eager" not in s.skip:  # eager, for the compile speedup
            compile_s = max(0.0, first - step_s)
            eager_cfg = replace(
                cfg, train=replace(cfg.train, compile=False, micro_batch_size=micro)
            )
            speedup = (
                case.tokens_per_step / step_s / measure_side(eager_cfg, ctx, s, case).tokens_per_s
            )

        old = None
        if "old" not in s.skip:
            old = measure_side(replace(cfg, model=replace(cfg.model, loss_chunk=0)), ctx, s, case)
        hf_side = None
        if "hf" not in s.skip and hf.hf_unavailable() is None:
            hf_side = measure_hf(cfg, ctx, run, s, case)
        del run
        _free(device)
        curve = None
        if "curve" not in s.skip and s.curve_steps > 0:
            new_chunk = case.model.loss_chunk
            a, b = hf.loss_curves(
                cfg, ctx, build_run, steps=s.curve_steps, loss_chunks=(new_chunk, 0)
            )
            curve = hf.curve_diff(a, b)
            _free(device)

    tokens_per_s = case.tokens_per_step / step_s
    return Row(
        case=case,
        n_params=n_params,
        flops_per_token=fpt,
        micro_batch=micro,
        step_s=step_s,
        tokens_per_s=tokens_per_s,
        mfu_datasheet=tokens_per_s * fpt / s.datasheet_flops if s.datasheet_flops else None,
        mfu_matmul=tokens_per_s * fpt / s.peak_flops,
        raw_ratio=raw_ratio,
        data_ratio=data_ratio,
        compile_s=compile_s,
        compile_speedup=speedup,
        peak_gb=peak_gb,
        old=old,
        hf=hf_side,
        curve=curve,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
        "--micro", type=int, default=None, help="micro-batch to start from (default: the batch)"
    )
    parser.add_argument(
        "--loss-chunk",
        type=int,
        default=None,
        help="model.loss_chunk of the trainer (default: the config default; 0 = old loss)",
    )
    parser.add_argument(
        "--skip",
        default="",
        help=f"contenders to leave out, comma-separated, of {','.join(CONTENDERS)}",
    )
    parser.add_argument(
        "--curve-steps",
        type=int,
        default=None,
        help="steps of the old-vs-new loss curve (default: 200 on CUDA, 20 on the CPU)",
    )
    parser.add_argument(
        "--datasheet-tflops",
        type=float,
        default=DATASHEET_BF16_FLOPS / 1e12,
        help="datasheet dense bf16 peak of the GPU (default: H100/H200 SXM)",
    )
    args = parser.parse_args(argv)
    if min(args.steps, args.repeats) < 1 or args.warmup < 0:
        parser.error("--steps and --repeats must be >= 1, --warmup >= 0")
    args.skip = frozenset(c.strip() for c in args.skip.split(",") if c.strip())
    if not args.skip <= set(CONTENDERS):
        parser.error(f"--skip must name some of {', '.join(CONTENDERS)}, got {sorted(args.skip)}")
    if (args.micro is not None and args.micro < 1) or (args.curve_steps or 0) < 0:
        parser.error("--micro must be >= 1 and --curve-steps >= 0")
    if args.loss_chunk is not None and args.loss_chunk < 0:
        parser.error("--loss-chunk must be >= 0")
    args.parser = parser
    return args


def select_cases(args: argparse.Namespace, tiny: bool) -> list[Case]:
    if tiny:
        cases = [TINY_CASE]
    else:
        names = [n.strip() for n in args.models.split(",") if n.strip()]
        unknown = [n for n in names if n not in GPU_CASES]
        if unknown or not names:
            args.parser.error(
                f"--models must name some of {', '.join(GPU_CASES)}, got {args.models!r}"
            )
        cases = [GPU_CASES[n] for n in names]
    if args.act_ckpt:
        cases = [replace(c, model=replace(c.model, activation_checkpointing=True)) for c in cases]
    if args.loss_chunk is not None:
        cases = [replace(c, model=replace(c.model, loss_chunk=args.loss_chunk)) for c in cases]
    return cases


def main(argv: list[str] | None = None) -> int:
    """Measures each model, prints the tables, and the headline ratio last.

    Returns:
        0, or 1 when the old and new loss paths' curves differ by more than bf16 noise.
    """
    args = parse_args(argv)
    ctx = dist.init()
    if ctx.is_distributed:
        args.parser.error("run it as one process (not under torchrun)")
    device = ctx.device
    cuda = device.type == "cuda"
    tiny = args.tiny or not cuda
    cases = select_cases(args, tiny)
    compile = args.compile if args.compile is not None else cuda
    torch.set_grad_enabled(True)

    peak_n = CPU_MATMUL_N if not cuda else GPU_MATMUL_N
    peak = matmul_peak(device, n=peak_n)
    datasheet = args.datasheet_tflops * 1e12 if cuda else None
    curve_steps = args.curve_steps if args.curve_steps is not None else (200 if cuda else 20)
    settings = Settings(
        compile=compile,
        steps=args.steps,
        repeats=args.repeats,
        warmup=args.warmup,
        peak_flops=peak,
        datasheet_flops=datasheet,
        skip=args.skip,
        curve_steps=curve_steps,
        micro=args.micro,
    )
    name = torch.cuda.get_device_name(device) if cuda else f"cpu, {torch.get_num_threads()} threads"
    precision = "bf16" if cuda else "fp32"
    print(
        f"device {device} ({name}), torch {torch.__version__}, {precision}, "
        f"compile {'on' if compile else 'off'}, activation checkpointing "
        f"{'on' if args.act_ckpt else 'off'}, loss_chunk {cases[0].model.loss_chunk}; "
        f"{args.repeats} blocks of {args.steps} steps (+{args.warmup} warmup)"
    )
    sheet = f"{args.datasheet_tflops:.0f} TFLOP/s datasheet" if cuda else "no datasheet peak"
    print(
        f"peak: {peak / 1e12:.4g} TFLOP/s measured ({peak_n}^3 {precision} matmul), {sheet}",
        flush=True,
    )
    if "hf" not in args.skip and hf.hf_unavailable() is None:
        import transformers

        print(f"hf: transformers {transformers.__version__}, GPT2LMHeadModel, sdpa")
    print(format_row([c for c, _ in COLUMNS]))
    rows: list[Row] = []
    for case in cases:
        row = measure(case, ctx, settings)
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
    return print_summary(rows, settings, cuda=cuda, tiny=tiny)


if __name__ == "__main__":
    sys.exit(main())
