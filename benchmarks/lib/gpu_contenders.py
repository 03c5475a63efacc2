"""Contenders for ``benchmarks/gpu_throughput.py``: Hugging Face GPT-2 and the loss-curve check.

Kept apart so the benchmark module stays readable; nothing here is a benchmark of its own (it is
under ``lib/`` so that ``make bench`` does not run it).

- :func:`hf_step`: Hugging Face transformers' ``GPT2LMHeadModel`` with the trainer GPT's shape
  (vocabulary, width, depth, heads, sequence; tied embeddings; dropout 0), SDPA attention, bf16
  autocast, ``torch.compile`` and fused AdamW, trained the way a user would train it
  (``model(input_ids=x, labels=x).loss``: HF shifts the labels itself). ``transformers`` is not
  a project dependency: it is imported lazily, and :func:`hf_unavailable` says why it cannot run.
- :func:`loss_curves`: the trainer with the new (chunked) and the old (full-logits) loss, each
  trained the same number of steps from the same seed on the same learnable token stream.
"""

from __future__ import annotations

import gc
import itertools
import math
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from trainer.config import WorkerConfig
from trainer.data.datasets import BatchStream
from trainer.distributed.dist import DistContext
from trainer.training.optim import make_optimizer
from trainer.training.rng import seed_everything
from trainer.training.run import Run, training_batches


def hf_unavailable() -> str | None:
    """Why the Hugging Face contender cannot run here, or None if it can."""
    try:
        import transformers
    except ImportError as e:
        return f"transformers is not importable ({e})"
    try:
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401
    except ImportError as e:
        return f"transformers {transformers.__version__} has no GPT-2 ({e})"
    return None


def hf_model(cfg: WorkerConfig, seq_len: int, device: torch.device) -> torch.nn.Module:
    """``GPT2LMHeadModel`` of the trainer GPT's shape with SDPA attention, on ``device``.

    Raises:
        RuntimeError: If transformers did not take SDPA attention.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    m = cfg.model
    config = GPT2Config(
        vocab_size=m.vocab_size,
        n_positions=seq_len,
        n_embd=m.d_model,
        n_layer=m.n_layer,
        n_head=m.n_head,
        resid_pdrop=m.dropout,
        embd_pdrop=m.dropout,
        attn_pdrop=m.dropout,
        use_cache=False,
        bos_token_id=m.vocab_size - 1,
        eos_token_id=m.vocab_size - 1,
        tie_word_embeddings=True,
        attn_implementation="sdpa",  # transformers 5.x reads it from the config
    )
    seed_everything(cfg.train.seed)
    model = GPT2LMHeadModel(config).to(device).train()
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "sdpa":
        raise RuntimeError(f"GPT2LMHeadModel took attention {impl!r}, not 'sdpa'")
    return model


def hf_step(
    cfg: WorkerConfig, ctx: DistContext, like: Run, *, micro: int
) -> tuple[Callable[[], None], torch.nn.Module]:
    """One optimizer step of Hugging Face GPT-2 on the benchmark's batches, as a callable.

    Same batches, micro-batch, autocast, compile, AdamW settings (fused on CUDA, decay on
    matrices only) and gradient clipping as the trainer; ``like`` lends the dataset and
    precision.

    Returns:
        The step and the (uncompiled) model, whose parameters the caller may count.
    """
    o = cfg.optim
    model = hf_model(cfg, like.spec.seq_len or 1, ctx.device)
    fwd = torch.compile(model) if cfg.train.compile else model
    opt = make_optimizer(model, cfg, ctx.device)  # the trainer's AdamW groups, fused on CUDA
    dtype = like.precision.autocast_dtype
    device = ctx.device
    stream = BatchStream(
        like.train_ds, global_batch_size=cfg.train.global_batch_size, rank=0, world_size=1, seed=0
    )
    it = iter(stream)
    counter = itertools.count(1)

    def step() -> None:
        _, x, _ = next(it)
        if device.type == "cuda":  # as the raw loop: nanoGPT's pinned, non-blocking copy
            x = x.pin_memory().to(device, non_blocking=True)
        n = x.shape[0]
        loss = torch.zeros((), device=device)
        for mx in x.split(micro):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = fwd(input_ids=mx, labels=mx).loss * (mx.shape[0] / n)
            loss.backward()
        if o.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if next(counter) % cfg.train.log_every_steps == 0:
            loss.item()  # the usual logging sync

    return step, model


# ---------------------------------------------------------------------------------- loss curves


def write_learnable_tokens(path: Path, *, vocab: int, seq_len: int, rows: int, seed: int) -> None:
    """A token stream with something to learn: a random period-257 cycle, 10% of it noise.

    Uniform random tokens (what the throughput rows use) keep the loss at ln(vocab) for good;
    this stream's loss falls steeply, so two loss paths that drift apart show it.
    """
    rng = np.random.default_rng(seed)
    n = rows * (seq_len + 1)
    cycle = rng.integers(0, vocab, 257)
    tokens = np.resize(cycle, n)
    noise = rng.random(n) < 0.1
    tokens[noise] = rng.integers(0, vocab, int(noise.sum()))
    pq.write_table(pa.table({"tokens": tokens.astype(np.int64)}), path)


def loss_curves(
    cfg: WorkerConfig,
    ctx: DistContext,
    build_run: Callable[[WorkerConfig, DistContext], Run],
    *,
    steps: int,
    loss_chunks: tuple[int, int],
) -> tuple[list[float], list[float]]:
    """Per-step training losses of the trainer with two ``model.loss_chunk`` settings.

    Both start from ``cfg``'s seed and see the same batches of a learnable stream
    (:func:`write_learnable_tokens`, ``steps`` global batches so no batch repeats).

    Returns:
        The two loss curves, ``steps`` values each.
    """
    curves: list[list[float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "learnable.parquet"
        assert cfg.data.seq_len is not None
        write_learnable_tokens(
            data,
            vocab=cfg.model.vocab_size,
            seq_len=cfg.data.seq_len,
            rows=steps * cfg.train.global_batch_size + 1,
            seed=cfg.train.seed,
        )
        for chunk in loss_chunks:
            run_cfg = replace(
                cfg,
                data=replace(cfg.data, train_uri=str(data)),
                model=replace(cfg.model, loss_chunk=chunk),
            )
            run = build_run(run_cfg, ctx)
            batches = training_batches(run)
            losses: list[torch.Tensor] = []
            try:
                for _ in range(steps):
                    _, x, y = next(batches)
                    loss, _ = run.step_with_oom_fallback(x, y)
                    run.state.step += 1
                    losses.append(loss.detach())
            finally:
                batches.close()
            curves.append(torch.stack(losses).float().cpu().tolist())
            del run, batches, losses
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
    return curves[0], curves[1]


def curve_diff(a: list[float], b: list[float]) -> tuple[float, float]:
    """Max |a - b| over the steps, and |difference| of the means of the last 10% of the steps."""
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    k = max(1, math.ceil(len(a) / 10))
    tail = abs(sum(a[-k:]) / k - sum(b[-k:]) / k)
    return max(diffs), tail


def oom_fallback(make: Callable[[int], Any], micro: int) -> tuple[Any, int]:
    """``make(micro)`` (a tuple whose first item is a step) and one step, halving ``micro`` on
    OOM down to 1; returns what ``make`` made and the micro-batch that fit."""
    while True:
        made = None
        try:
            made = make(micro)
            made[0]()
            return made, micro
        except torch.OutOfMemoryError:
            if micro <= 1:
                raise
            made = None
        micro //= 2
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
