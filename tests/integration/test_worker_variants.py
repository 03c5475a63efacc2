"""The worker beyond the MLP demo: streamed Parquet, GPT, a plugin, regression, precision."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import GPT, ROOT, env, history, tokens, torchrun
from trainer.data.datasets import load_dataset
from trainer.data.streaming import StreamingParquetDataset
from trainer.demo import make_table
from trainer.models.export import load_model

pytestmark = pytest.mark.integration


def config(tmp: Path, name: str, cfg: dict[str, Any]) -> Path:
    run = tmp / name
    run.mkdir(parents=True, exist_ok=True)
    base: dict[str, Any] = {
        "checkpoint": {"uri": str(run / "ckpt"), "every_steps": 1000, "keep_last": 1},
        "output": {"model_uri": str(run / "model"), "history_uri": str(run / "history.jsonl")},
    }
    path = run / "config.json"
    path.write_text(json.dumps({**base, **cfg}))
    return path


def worker(cfg: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """One plain ``python -m trainer.worker`` process: what torchrun starts, minus torchrun."""
    sets = [a for o in overrides for a in ("--set", o)]
    return subprocess.run(
        [sys.executable, "-m", "trainer.worker", "--config", str(cfg), *sets],
        env=env(),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )


def losses(cfg: Path) -> list[float]:
    return [r["loss"] for r in history(cfg) if r["event"] == "step"]


def tabular(
    tmp: Path, rows: int, *, task: str = "classification", rg: int = 4096
) -> tuple[str, str]:
    table = make_table(rows + 1024, features=8, classes=3, seed=4, task=task)
    train, val = tmp / f"{task}-train.parquet", tmp / f"{task}-val.parquet"
    pq.write_table(table.slice(0, rows), train, row_group_size=4096)
    pq.write_table(table.slice(rows), val)
    return str(train), str(val)


# ---------------------------------------------------------------------------- (a) streaming


def test_parquet_larger_than_memory_streams_and_learns(tmp_path: Path) -> None:
    train, val = tabular(tmp_path, 40_000)  # ~1.6 MB uncompressed, 10 row groups
    assert isinstance(
        load_dataset(
            train, kind="tabular", target="label", task="classification", max_memory_bytes=2**20
        ),
        StreamingParquetDataset,
    )
    cfg = config(
        tmp_path,
        "stream",
        {
            "data": {"train_uri": train, "val_uri": val, "max_memory_mb": 1},
            "model": {"name": "mlp", "hidden_dim": 32, "num_layers": 2},
            "optim": {"lr": 5e-3, "warmup_steps": 5},
            "train": {
                "epochs": 1,
                "max_steps": 60,
                "global_batch_size": 256,
                "log_every_steps": 10,
            },
        },
    )
    torchrun(cfg, 2)
    curve = losses(cfg)
    assert curve[-1] < 0.7 * curve[0], curve
    evals = [r for r in history(cfg) if r["event"] == "eval"]
    assert evals[-1]["val_accuracy"] > 0.6
    start = next(r for r in history(cfg) if r["event"] == "start")
    assert start["world_size"] == 2
    # Nothing in the start event says the data is streamed (reported as a suggestion).


# ------------------------------------------------------------------------------------ (b) GPT


def gpt_config(tmp: Path, name: str, **data: Any) -> Path:
    train = tokens(tmp / "tok-train.parquet", 400)
    val = tokens(tmp / "tok-val.parquet", 40)
    return config(
        tmp,
        name,
        {
            "data": {"train_uri": train, "val_uri": val, "kind": "tokens", "seq_len": 16, **data},
            "model": GPT,
            "optim": {"lr": 3e-3, "warmup_steps": 5, "weight_decay": 0.0},
            "train": {"epochs": 3, "global_batch_size": 32, "log_every_steps": 5},
        },
    )


def test_gpt_on_tokens_learns_a_repeating_sequence(tmp_path: Path) -> None:
    # data.target is set to the token column: see test_gpt_with_the_documented_token_column.
    cfg = gpt_config(tmp_path, "gpt", target="tokens")
    torchrun(cfg, 2)
    curve = losses(cfg)
    assert curve[-1] < 0.5 * curve[0], curve
    evals = [r for r in history(cfg) if r["event"] == "eval"]
    assert evals and evals[-1]["val_perplexity"] < 8.0  # uniform guessing is 64
    metrics = json.loads((cfg.parent / "model" / "metrics.json").read_text())
    assert metrics["val_perplexity"] == pytest.approx(evals[-1]["val_perplexity"], rel=1e-4)
    meta = json.loads((cfg.parent / "model" / "model.json").read_text())
    assert meta["spec"]["task"] == "lm" and meta["model"]["name"] == "gpt"


def test_gpt_with_the_documented_token_column(tmp_path: Path) -> None:
    cfg = gpt_config(tmp_path, "gpt-default")
    proc = worker(cfg, "train.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-1500:]


# --------------------------------------------------------------- (c) plugin and (d) regression


def test_user_model_plugin_trains_and_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train, val = tabular(tmp_path, 2048)
    cfg = config(
        tmp_path,
        "plugin",
        {
            "data": {"train_uri": train, "val_uri": val},
            "model": {"name": "tests.plugins.tiny:build", "options": {"bias": False}},
            "optim": {"lr": 1e-2},
            "train": {"epochs": 2, "global_batch_size": 128, "log_every_steps": 4},
        },
    )
    proc = worker(cfg)
    assert proc.returncode == 0, proc.stderr[-1500:]
    weights = load_file(str(cfg.parent / "model" / "model.safetensors"))
    assert list(weights) == ["weight"] and tuple(weights["weight"].shape) == (3, 8)
    meta = json.loads((cfg.parent / "model" / "model.json").read_text())
    assert meta["model"]["name"] == "tests.plugins.tiny:build"
    curve = losses(cfg)
    assert curve[-1] < curve[0]
    # Loading an artifact imports a plugin only when allowed, and never from the working dir.
    monkeypatch.chdir(tmp_path)
    loaded = load_model(str(cfg.parent / "model"), allowed_plugins=["tests.plugins.tiny"])
    assert tuple(loaded.module(torch.zeros(2, 8)).shape) == (2, 3)


def test_regression_reports_val_rmse(tmp_path: Path) -> None:
    train, val = tabular(tmp_path, 4096, task="regression")
    cfg = config(
        tmp_path,
        "regression",
        {
            "data": {"train_uri": train, "val_uri": val, "task": "regression"},
            "model": {"name": "mlp", "hidden_dim": 32, "num_layers": 2},
            "optim": {"lr": 5e-3},
            "train": {"epochs": 3, "global_batch_size": 128, "log_every_steps": 8},
        },
    )
    torchrun(cfg, 1)
    curve = losses(cfg)
    assert curve[-1] < 0.5 * curve[0], curve
    metrics = json.loads((cfg.parent / "model" / "metrics.json").read_text())
    assert "val_accuracy" not in metrics
    assert 0 < metrics["val_rmse"] < 1.0
    assert metrics["val_rmse"] ** 2 == pytest.approx(metrics["val_loss"], rel=1e-3)


# ------------------------------------------------------------------------------ (e) precision


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return tabular(tmp_path_factory.mktemp("small"), 1024)


def test_fp16_on_cpu_is_a_one_line_exit_2(tmp_path: Path, small: tuple[str, str]) -> None:
    cfg = config(tmp_path, "fp16", {"data": {"train_uri": small[0], "val_uri": small[1]}})
    proc = worker(cfg, "train.precision=fp16")
    assert proc.returncode == 2, proc.stderr[-1500:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
    assert len(errors) == 1 and errors[0].startswith("ERROR [train] E_")
    assert "train.precision 'fp16' needs a CUDA device" in errors[0]
    assert not (cfg.parent / "model").exists()


def test_bf16_on_cpu_trains_with_autocast(tmp_path: Path, small: tuple[str, str]) -> None:
    cfg = config(
        tmp_path,
        "bf16",
        {
            "data": {"train_uri": small[0], "val_uri": small[1]},
            # from random weights, so the loss has somewhere to fall
            "model": {"name": "mlp", "hidden_dim": 32, "linear": "none"},
            "optim": {"lr": 5e-3},
            "train": {
                "epochs": 3,
                "global_batch_size": 64,
                "log_every_steps": 8,
                "precision": "bf16",
            },
        },
    )
    proc = worker(cfg)
    assert proc.returncode == 0, proc.stderr[-1500:]
    start = next(r for r in history(cfg) if r["event"] == "start")
    assert start["precision"] == "bf16" and start["device"] == "cpu"
    curve = losses(cfg)
    assert curve[-1] < 0.8 * curve[0], curve
    weights = load_file(str(cfg.parent / "model" / "model.safetensors"))
    assert all(str(t.dtype) == "torch.float32" for t in weights.values())


# ------------------------------------------------------------------------ (f) GPUs held, none found


def test_a_pod_holding_gpus_that_torch_cannot_see_refuses_to_train_on_the_cpu(
    tmp_path: Path, small: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher tells a job's pod how many GPUs it holds (GPUPIPE_GPUS_PER_NODE, its GPU
    limit); torch here has no CUDA: one line naming the mismatch, exit 2, nothing written. With
    GPUPIPE_ALLOW_NO_CUDA=1 (the test cluster's fake GPUs), the same worker trains on the CPU."""
    data = {"data": {"train_uri": small[0], "val_uri": small[1]}, "train": {"epochs": 1}}
    monkeypatch.setenv("GPUPIPE_GPUS_PER_NODE", "1")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-fake-0")
    cfg = config(tmp_path, "held", data)
    proc = worker(cfg)
    assert proc.returncode == 2, proc.stderr[-1500:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
    assert errors == [errors[-1]] and errors[0].startswith("ERROR [train] E_NO_CUDA: "), errors
    assert (
        "holds 1 GPU(s) but torch" in errors[0] and "NVIDIA_VISIBLE_DEVICES=GPU-fake-0" in errors[0]
    )
    assert "GPUPIPE_ALLOW_NO_CUDA=1" in errors[0]
    assert not (cfg.parent / "model").exists() and not (cfg.parent / "ckpt").exists()
    monkeypatch.setenv("GPUPIPE_ALLOW_NO_CUDA", "1")
    allowed = config(tmp_path, "allowed", data)
    proc = worker(allowed)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "holds 1 GPU(s) but torch finds no CUDA device: training on the CPU" in proc.stderr
    assert (allowed.parent / "model").exists()


def test_a_pipeline_step_pod_asked_for_gpus_refuses_the_cpu_a_machine_of_ones_own_trains(
    tmp_path: Path, small: tuple[str, str]
) -> None:
    """launcher=local in a KFP step's pod (Kubernetes' service env present) with gpus_per_node=1:
    KFP gave the pod the GPU limit, so the workers must find CUDA: the step fails with the
    worker's E_NO_CUDA line. The same run on a machine of one's own trains on the CPU."""
    from trainer.base.errors import InputError
    from trainer.launch import TrainingRun
    from trainer.launch.local import LocalLauncher

    data = {"data": {"train_uri": small[0], "val_uri": small[1]}, "train": {"epochs": 1}}
    run_env = {k: v for k, v in env().items() if not k.startswith(("GPUPIPE_", "KUBERNETES_"))}
    in_pod = config(tmp_path, "in-pod", data)
    with pytest.raises(InputError) as refused:
        LocalLauncher(env={**run_env, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}).launch(
            TrainingRun(job_name="in-pod", config_uri=str(in_pod), gpus_per_node=1, timeout_s=120)
        )
    assert refused.value.code == "E_NO_CUDA", refused.value
    assert not (in_pod.parent / "model").exists()
    own = config(tmp_path, "own", data)
    LocalLauncher(env=run_env).launch(
        TrainingRun(job_name="own", config_uri=str(own), gpus_per_node=1, timeout_s=120)
    )
    assert (own.parent / "model").exists()
