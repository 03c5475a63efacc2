"""FSDP2 on a CUDA device: bf16 parameters with fp32 reduction, per-block compile, CPU offload.

The CPU-runnable parts of FSDP (2 gloo ranks: equivalence with DDP, sharded resume, OOM, NaN,
export) are in tests/integration/test_fsdp.py; these need what a CPU cannot give: the bf16
mixed-precision policy on a GPU, ``torch.compile`` of each block (Triton), and
``CPUOffloadPolicy`` (FSDP refuses it without an accelerator). One GPU is enough: a single
process shards over a one-rank group. Run with ``PYTHONPATH=. python -m pytest tests/gpu -m gpu``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from tests.gpu.test_gpu_training import gpt_config, history, losses, torchrun, write
from trainer.models import export

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def token_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A repeating 24-token sequence over a vocabulary of 64 (as in test_gpu_training)."""
    tmp = tmp_path_factory.mktemp("tokens")
    cycle = np.random.default_rng(0).permutation(64)[:24]
    uris = []
    for name, cycles in (("train", 1000), ("val", 50)):
        path = tmp / f"{name}.parquet"
        pq.write_table(pa.table({"tokens": np.tile(cycle, cycles).astype(np.int64)}), path)
        uris.append(str(path))
    return uris[0], uris[1]


def fsdp_run(tmp: Path, name: str, data: tuple[str, str], **train: Any) -> Path:
    run = tmp / name
    torchrun(write(run, gpt_config(run, data, strategy="fsdp", **train)))
    return run


@pytest.mark.parametrize(
    "train",
    [
        {"precision": "bf16"},
        {"precision": "bf16", "compile": True},
        {"precision": "bf16", "fsdp_cpu_offload": True},
        {"precision": "fp16"},  # fp16 parameters under a GradScaler over DTensor gradients
    ],
    ids=["bf16", "bf16-compile-per-block", "bf16-cpu-offload", "fp16-scaler"],
)
def test_fsdp_on_one_gpu_learns_and_exports_fp32(
    tmp_path: Path, token_data: tuple[str, str], train: dict[str, Any]
) -> None:
    run = fsdp_run(tmp_path, "run", token_data, **train)
    start = next(r for r in history(run) if r["event"] == "start")
    assert start["strategy"] == "fsdp" and start["device"] == "cuda:0"
    curve = losses(run)
    assert curve[-1] < 0.5 * curve[0], curve
    weights = load_file(str(run / "model" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in weights.values())  # fp32 master weights
    meta = json.loads((run / "model" / "model.json").read_text())
    assert meta["tied"] == {"lm_head.weight": "wte.weight"}
    loaded = export.load_model(str(run / "model"), device="cuda")
    idx = torch.arange(16, device="cuda").remainder(64).unsqueeze(0)
    with torch.no_grad():
        assert torch.isfinite(loaded.module(idx)).all()


def test_fsdp_bf16_resume_from_the_sharded_checkpoint_ends_where_the_run_did(
    tmp_path: Path, token_data: tuple[str, str]
) -> None:
    run = tmp_path / "run"
    cfg = gpt_config(run, token_data, strategy="fsdp", precision="bf16")
    cfg["checkpoint"].update(every_steps=10, keep_last=100)
    torchrun(write(run, cfg))
    first = load_file(str(run / "model" / "model.safetensors"))
    for step_dir in (run / "ckpt").glob("step-*"):
        if int(step_dir.name[5:]) > 20:
            shutil.rmtree(step_dir)  # as if the job had died after step 20's checkpoint
    torchrun(write(run, cfg))
    restore = [r for r in history(run) if r["event"] == "restore"]
    assert restore and restore[-1]["step"] == 20
    again = load_file(str(run / "model" / "model.safetensors"))
    for k in first:
        torch.testing.assert_close(again[k], first[k], rtol=1e-3, atol=1e-4, msg=k)
