"""Benchmark: per-rank memory of the training state and step time, DDP vs FSDP2, same model.

Both contenders train the same GPT (built by ``build_model`` after the same seed) with the same
AdamW (``trainer.training.optim.make_optimizer``), clipping and batches, in the same processes:
``--world`` ranks on the CPU with gloo, started with ``torch.multiprocessing``. **ddp** is
``DistributedDataParallel`` around the model, as ``trainer.training.run.Run`` wraps it; **fsdp**
is the same model sharded by ``trainer.distributed.sharding.apply_fsdp`` (``fully_shard`` per
block and at the root), as ``Run`` shards it under ``train.strategy=fsdp``.

Memory is what each rank holds at rest: its (local shard of the) parameters, its gradients
right after the backward pass (FSDP's are reduce-scattered into shards) and AdamW's moments,
summed over the tensors themselves (``DTensor.to_local()``), not read from the allocator; the
largest rank counts. Step time is forward + backward + clip + optimizer step; blocks of
``--steps`` steps alternate between the contenders for ``--repeats`` rounds and the medians are
reported. The two contenders' losses must agree step for step (``allclose``), else the
benchmark prints ``LOSSES DIFFER`` and exits 1.

On a CUDA machine it also runs one rank on the GPU, bf16, and reports FSDP's step time over the
unwrapped model's (what ``Run`` uses for one process) at world size 1 (goal <= 1.02).

The last line is the headline: FSDP's per-rank state over DDP's (goal <= 0.55 with 2 ranks).

    .venv/bin/python benchmarks/fsdp_memory.py [--world 2] [--steps 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

if __package__ in (None, ""):  # run as a file: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.config import DataConfig, ModelConfig, OutputConfig, WorkerConfig
from trainer.distributed import sharding
from trainer.distributed.precision import resolve_precision
from trainer.models import ModelSpec, build_model, compute_loss
from trainer.training.optim import make_optimizer

MB = 2**20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_config(a: dict[str, Any]) -> WorkerConfig:
    return WorkerConfig(
        data=DataConfig(train_uri="unused", kind="tokens", seq_len=a["seq"]),
        output=OutputConfig(model_uri="unused"),
        model=ModelConfig(
            name="gpt",
            n_layer=a["layers"],
            n_head=a["heads"],
            d_model=a["d_model"],
            vocab_size=a["vocab"],
        ),
    )


def _local_bytes(tensors: list[torch.Tensor]) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def _optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in opt.state.values() for v in state.values() if torch.is_tensor(v)]


class _Contender:
    """One model + optimizer, its step, its memory and its step times."""

    def __init__(self, model: nn.Module, cfg: WorkerConfig, device: torch.device, bf16: bool):
        self.model = model
        self.opt = make_optimizer(model, cfg, device)
        self.bf16 = bf16
        self.times: list[float] = []
        self.losses: list[float] = []
        self.memory: dict[str, int] = {}

    def step(self, x: torch.Tensor, y: torch.Tensor, *, timed: bool) -> None:
        sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
        sync()
        start = time.perf_counter()
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.model(x)
        loss = compute_loss("lm", out, y)
        loss.backward()
        params = list(self.model.parameters())
        if not self.memory:
            grads = [p.grad for p in params if p.grad is not None]
            self.memory = {"params": _local_bytes(params), "grads": _local_bytes(grads)}
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        sync()
        if timed:
            self.times.append(time.perf_counter() - start)
        self.losses.append(float(loss.detach()))
        if "optim" not in self.memory:
            self.memory["optim"] = _local_bytes(_optimizer_tensors(self.opt))


def _build(a: dict[str, Any], device: torch.device, world: int) -> dict[str, _Contender]:
    cfg = _worker_config(a)
    spec = ModelSpec(task="lm", seq_len=a["seq"])
    torch.manual_seed(0)
    plain = build_model(cfg.model, spec).to(device)
    base: nn.Module = plain
    if world > 1:
        base = DDP(plain, device_ids=[device] if device.type == "cuda" else None)
    torch.manual_seed(0)
    sharded = sharding.apply_fsdp(
        build_model(cfg.model, spec).to(device),
        precision=resolve_precision("bf16" if a["bf16"] else "fp32", device),
        cpu_offload=False,
        compile_units=False,
    )
    return {
        "ddp": _Contender(base, cfg, device, a["bf16"]),
        "fsdp": _Contender(sharded, cfg, device, a["bf16"]),
    }


def _rank_main(rank: int, world: int, port: int, a: dict[str, Any], out: str) -> None:
    """One rank: build both contenders, alternate timed blocks, report to ``out`` (rank 0)."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device("cuda", rank) if a["cuda"] else torch.device("cpu")
    if a["cuda"]:
        torch.cuda.set_device(device)
    tdist.init_process_group(
        "nccl" if a["cuda"] else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
    )
    try:
        contenders = _build(a, device, world)
        gen = torch.Generator().manual_seed(1000 + rank)
        n_blocks = a["warmup"] + a["repeats"]
        tokens = torch.randint(
            a["vocab"], (n_blocks * a["steps"], a["batch"], a["seq"] + 1), generator=gen
        ).to(device)
        for block in range(n_blocks):
            for c in contenders.values():
                for i in range(block * a["steps"], (block + 1) * a["steps"]):
                    x, y = tokens[i, :, :-1], tokens[i, :, 1:]
                    c.step(x, y, timed=block >= a["warmup"])
        report = {
            name: {"memory": c.memory, "ms": statistics.median(c.times) * 1e3, "losses": c.losses}
            for name, c in contenders.items()
        }
        reports: list[Any] = [None] * world
        tdist.all_gather_object(reports, report)
        if rank == 0:
            Path(out + ".part").write_text(json.dumps(reports))
            os.replace(out + ".part", out)  # whole or absent: run_ranks reads it after a crash
        # Every rank done sending before any tears gloo down, and the models' (FSDP's hooks and
        # their pending work) freed while the interpreter is whole: a rank torn down with either
        # still live died of SIGABRT ("terminate called without an active exception") in CI.
        del contenders
        gc.collect()
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def run_ranks(a: dict[str, Any], world: int) -> list[dict[str, Any]]:
    """Start ``world`` ranks on a fresh port and return every rank's report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "report.json")
        try:
            mp.start_processes(
                _rank_main,
                args=(world, _free_port(), a, out),
                nprocs=world,
                start_method="spawn",
            )
        except mp.ProcessExitedException as exc:
            # A rank killed by a signal after rank 0 wrote every rank's report died in gloo's
            # teardown, its measurement whole: say so and use it. Before the report: a failure.
            if exc.signal_name is None or not Path(out).exists():
                raise
            print(
                f"note: rank {exc.error_index} died of {exc.signal_name} in the process "
                "group's teardown, after every rank had reported",
                file=sys.stderr,
            )
        result: list[dict[str, Any]] = json.loads(Path(out).read_text())
        return result


def _state_mb(report: dict[str, Any]) -> tuple[float, float, float, float]:
    m = report["memory"]
    p, g, o = m["params"] / MB, m["grads"] / MB, m["optim"] / MB
    return p, g, o, p + g + o


def summarise(
    reports: list[dict[str, Any]], label: str, *, tol: float
) -> tuple[float, float, bool]:
    """Print the table; return (state ratio, step-time ratio, losses agree)."""
    print(f"{label}")
    print(
        f"{'strategy':10s} {'params MB':>10s} {'grads MB':>9s} {'optim MB':>9s} "
        f"{'state MB':>9s} {'step ms':>8s}"
    )
    worst: dict[str, float] = {}
    ms: dict[str, float] = {}
    for name in ("ddp", "fsdp"):
        rows = [_state_mb(r[name]) for r in reports]
        peak = max(rows, key=lambda row: row[3])
        worst[name] = peak[3]
        ms[name] = statistics.median(r[name]["ms"] for r in reports)
        print(
            f"{name:10s} {peak[0]:10.2f} {peak[1]:9.2f} {peak[2]:9.2f} {peak[3]:9.2f} "
            f"{ms[name]:8.1f}"
        )
    agree = all(
        torch.allclose(
            torch.tensor(r["fsdp"]["losses"]),
            torch.tensor(r["ddp"]["losses"]),
            rtol=tol,
            atol=tol,
        )
        for r in reports
    )
    return worst["fsdp"] / worst["ddp"], ms["fsdp"] / ms["ddp"], agree


def main(argv: list[str] | None = None) -> int:
    """Runs DDP and FSDP side by side on CPU ranks (and one GPU if present); ratio last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="CPU ranks")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--steps", type=int, default=3, help="steps per block")
    parser.add_argument("--repeats", type=int, default=5, help="measured blocks per contender")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured blocks per contender")
    parser.add_argument("--no-cuda", action="store_true", help="skip the GPU world-size-1 run")
    args = parser.parse_args(argv)
    if args.world < 2:
        parser.error(f"--world must be >= 2 to shard anything, got {args.world}")
    a: dict[str, Any] = {
        "layers": args.layers,
        "d_model": args.d_model,
        "heads": args.heads,
        "vocab": args.vocab,
        "seq": args.seq,
        "batch": args.batch,
        "steps": args.steps,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "cuda": False,
        "bf16": False,
    }
    params = sum(
        p.numel()
        for p in build_model(
            _worker_config(a).model, ModelSpec(task="lm", seq_len=args.seq)
        ).parameters()
    )
    print(
        f"GPT {args.layers} x {args.d_model}, {params / 1e6:.2f}M params, "
        f"torch {torch.__version__}; "
        f"{args.repeats} interleaved blocks of {args.steps} steps (+{args.warmup} warmup), "
        f"batch {args.batch} x {args.seq} per rank"
    )
    cpu_ratio, cpu_time, agree = summarise(
        run_ranks(a, args.world), f"{args.world} CPU ranks (gloo), fp32, per-rank state:", tol=1e-4
    )
    print(f"fsdp/ddp step time, {args.world} CPU ranks: {cpu_time:.3f}")
    if torch.cuda.is_available() and not args.no_cuda:
        _, gpu_time, gpu_agree = summarise(
            run_ranks({**a, "cuda": True, "bf16": True}, 1),
            "1 GPU, bf16 (ddp = unwrapped):",
            tol=2e-2,
        )
        agree = agree and gpu_agree
        print(f"fsdp/unwrapped step time at world size 1 (CUDA): {gpu_time:.3f} (goal <= 1.02)")
    if not agree:
        print("LOSSES DIFFER between DDP and FSDP")
        return 1
    print(f"fsdp_memory ratio: {cpu_ratio:.3f} (goal <= 0.55)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
