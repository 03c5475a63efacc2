"""Training on a CUDA device: NCCL with DDP, bf16 autocast on the GPT, fp16 with a grad scaler.

Run on a GPU machine with ``PYTHONPATH=. python -m pytest tests/gpu -m gpu``. Only torch, numpy,
pyarrow and safetensors are needed (no kfp, optuna or mlflow).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as tdist
from safetensors.torch import load_file

from trainer.base.typedconfig import from_dict
from trainer.checkpoint.manager import CheckpointManager
from trainer.config import WorkerConfig
from trainer.demo import make_table
from trainer.distributed import dist
from trainer.training import loop
from trainer.training import run as run_module

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "PET_NNODES",
    "GROUP_RANK",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def table_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    tmp = tmp_path_factory.mktemp("tabular")
    table = make_table(9216, features=8, classes=3, seed=0)
    pq.write_table(table.slice(0, 8192), tmp / "train.parquet")
    pq.write_table(table.slice(8192), tmp / "val.parquet")
    return str(tmp / "train.parquet"), str(tmp / "val.parquet")


@pytest.fixture(scope="module")
def token_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A repeating 24-token sequence over a vocabulary of 64: the next token is always knowable."""
    tmp = tmp_path_factory.mktemp("tokens")
    cycle = np.random.default_rng(0).permutation(64)[:24]
    uris = []
    for name, cycles in (("train", 1000), ("val", 50)):
        path = tmp / f"{name}.parquet"
        pq.write_table(pa.table({"tokens": np.tile(cycle, cycles).astype(np.int64)}), path)
        uris.append(str(path))
    return uris[0], uris[1]


def mlp_config(run: Path, data: tuple[str, str], **train: Any) -> dict[str, Any]:
    return {
        "data": {"train_uri": data[0], "val_uri": data[1]},
        "model": {"name": "mlp", "hidden_dim": 64, "num_layers": 2, "linear": "none"},
        "optim": {"lr": 5e-3, "warmup_steps": 5},
        "train": {"epochs": 2, "global_batch_size": 256, "log_every_steps": 8, **train},
        "checkpoint": {"uri": str(run / "ckpt"), "every_steps": 1000, "keep_last": 1},
        "output": {"model_uri": str(run / "model"), "history_uri": str(run / "history.jsonl")},
    }


def gpt_config(run: Path, data: tuple[str, str], **train: Any) -> dict[str, Any]:
    return {
        # data.target names the token column until loop.py reads data.token_column (reported).
        "data": {
            "train_uri": data[0],
            "val_uri": data[1],
            "kind": "tokens",
            "seq_len": 16,
            "target": "tokens",
        },
        "model": {"name": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "vocab_size": 64},
        "optim": {"lr": 3e-3, "warmup_steps": 5, "weight_decay": 0.0},
        "train": {"epochs": 4, "global_batch_size": 64, "log_every_steps": 5, **train},
        "checkpoint": {"uri": str(run / "ckpt"), "every_steps": 1000, "keep_last": 1},
        "output": {"model_uri": str(run / "model"), "history_uri": str(run / "history.jsonl")},
    }


def write(run: Path, cfg: dict[str, Any]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    path = run / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def history(run: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (run / "history.jsonl").read_text().splitlines()]


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in history(run) if r["event"] == "step"]


def torchrun(config: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    sets = [a for o in overrides for a in ("--set", o)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            "-m",
            "trainer.worker",
            "--config",
            str(config),
            *sets,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def assert_mlp_learned(run: Path, data: tuple[str, str]) -> None:
    """The MLP's last training loss and validation loss are under half the trivial predictor's
    (the entropy of the training split's class shares, about 1.09 nats here).

    The MLP trains from scratch (``model.linear=none``): with the fitted linear path it starts
    at about 0.28, where it ends (seen on an H100 and on the CPU, even at a learning rate of
    1e-7), so the check before, "the curve fell by 40%", failed a model that had nothing left to
    learn and could not tell one that learned from one that did not."""
    labels = pq.read_table(data[0], columns=["label"]).column(0).to_numpy()
    shares = np.bincount(labels) / len(labels)
    trivial = float(-(shares[shares > 0] * np.log(shares[shares > 0])).sum())
    curve = losses(run)
    evals = [r["val_loss"] for r in history(run) if r["event"] == "eval"]
    assert curve and evals, "no step or eval record in the history"
    assert curve[-1] < 0.5 * trivial and evals[-1] < 0.5 * trivial, (trivial, curve, evals)


def assert_fp32_export(run: Path) -> None:
    weights = load_file(str(run / "model" / "model.safetensors"))
    assert weights and all(t.dtype == torch.float32 for t in weights.values())
    assert all(torch.isfinite(t).all() for t in weights.values())


# ------------------------------------------------------------------------------------- NCCL


def test_worker_under_torchrun_trains_the_mlp_on_cuda(
    tmp_path: Path, table_data: tuple[str, str]
) -> None:
    # One process: trainer.distributed.dist starts no process group: the CUDA path, not NCCL.
    run = tmp_path / "mlp"
    torchrun(write(run, mlp_config(run, table_data)), "dist.backend=nccl", "train.precision=fp32")
    start = next(r for r in history(run) if r["event"] == "start")
    assert start["device"] == "cuda:0" and start["world_size"] == 1
    assert_mlp_learned(run, table_data)
    steps = [r for r in history(run) if r["event"] == "step"]
    assert steps[-1]["gpu_mem_gb"] > 0
    assert [r for r in history(run) if r["event"] == "eval"][-1]["val_accuracy"] > 0.75
    assert_fp32_export(run)


@pytest.fixture
def nccl_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[dist.DistContext]:
    """A real one-rank NCCL process group (plus the gloo control group that dist keeps).

    ``dist.init`` creates no group for one process, so the group is started here the way
    ``dist.init`` does for N > 1, and the context says so; everything downstream (DDP, the
    gradient all-reduce, the control collectives) then runs the multi-process code path.
    """
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    tdist.init_process_group("nccl", device_id=device)
    try:
        monkeypatch.setattr(dist, "_control_group", tdist.new_group(backend="gloo"))
        yield dist.DistContext(
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            node_rank=0,
            device=device,
            backend="nccl",
            run_id="nccl-test",
        )
    finally:
        tdist.destroy_process_group()


def test_nccl_all_reduce_and_ddp_training_on_one_gpu(
    tmp_path: Path,
    table_data: tuple[str, str],
    nccl_group: dist.DistContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = nccl_group
    assert tdist.get_backend() == "nccl"
    t = torch.full((4,), 2.5, device=ctx.device)
    tdist.all_reduce(t)
    torch.cuda.synchronize()
    assert t.tolist() == [2.5] * 4
    assert dist.control_any(ctx, False, True) == (False, True)  # over the gloo control group

    wrapped: list[Any] = []
    real_ddp = run_module.DDP

    def spy(module: torch.nn.Module, **kwargs: Any) -> Any:
        ddp = real_ddp(module, **kwargs)
        wrapped.append(ddp)
        return ddp

    monkeypatch.setattr(run_module, "DDP", spy)
    run = tmp_path / "ddp"
    cfg = from_dict(WorkerConfig, mlp_config(run, table_data, precision="fp32"))
    result = loop.train(cfg, ctx)
    assert len(wrapped) == 1 and wrapped[0].device_ids == [0]
    assert result.steps == 2 * (8192 // 256)
    assert_mlp_learned(run, table_data)
    assert_fp32_export(run)


# -------------------------------------------------------------------------- mixed precision


def test_bf16_autocast_trains_the_gpt(tmp_path: Path, token_data: tuple[str, str]) -> None:
    run = tmp_path / "gpt-bf16"
    torchrun(write(run, gpt_config(run, token_data, precision="bf16")))
    start = next(r for r in history(run) if r["event"] == "start")
    assert start["precision"] == "bf16" and start["device"] == "cuda:0"
    curve = losses(run)
    assert curve[-1] < 0.5 * curve[0], curve
    evals = [r for r in history(run) if r["event"] == "eval"]
    assert evals[-1]["val_perplexity"] < 8.0  # uniform guessing is 64
    assert_fp32_export(run)


def test_auto_precision_picks_bf16_on_this_gpu(tmp_path: Path, token_data: tuple[str, str]) -> None:
    run = tmp_path / "gpt-auto"
    torchrun(write(run, gpt_config(run, token_data, precision="auto", max_steps=5)))
    start = next(r for r in history(run) if r["event"] == "start")
    expected = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp32"
    assert start["precision"] == expected


@pytest.mark.parametrize("model", ["mlp", "gpt"], ids=["mlp", "gpt"])
def test_fp16_with_grad_scaler_trains(
    tmp_path: Path, table_data: tuple[str, str], token_data: tuple[str, str], model: str
) -> None:
    run = tmp_path / f"{model}-fp16"
    cfg = (
        mlp_config(run, table_data, precision="fp16")
        if model == "mlp"
        else gpt_config(run, token_data, precision="fp16")
    )
    torchrun(write(run, cfg))
    start = next(r for r in history(run) if r["event"] == "start")
    assert start["precision"] == "fp16"
    if model == "mlp":
        assert_mlp_learned(run, table_data)
    else:
        curve = losses(run)
        assert curve[-1] < 0.5 * curve[0], curve
    assert_fp32_export(run)
    ckpt = CheckpointManager(str(run / "ckpt"), keep_last=1)
    scaler = ckpt.load(ckpt.steps()[-1])["scaler"]
    assert scaler is not None and scaler["scale"] > 0  # the grad scaler's state is checkpointed
