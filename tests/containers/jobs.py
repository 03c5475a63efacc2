"""Worker configs and rendered PyTorchJobs for the container tests (data in a shared folder)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from pipelines.render import train_job_spec
from tests.integration.test_torchrun import write_data
from trainer.launch.pytorchjob import build_pytorchjob


def worker_config(shared: Path, name: str, **sections: dict[str, Any]) -> Path:
    """A small worker config under shared/name, reading the shared data (written once)."""
    data = shared / "data"
    if not (data / "train.parquet").exists():
        data.mkdir(exist_ok=True)
        write_data(data)
    run = shared / name
    run.mkdir(mode=0o777)
    run.chmod(0o777)
    cfg: dict[str, Any] = {
        "data": {
            "train_uri": str(data / "train.parquet"),
            "val_uri": str(data / "val.parquet"),
            "target": "label",
        },
        "model": {"name": "mlp", "hidden_dim": 32, "num_layers": 2},
        "optim": {"lr": 5e-3, "warmup_steps": 5},
        "train": {"epochs": 2, "global_batch_size": 64, "log_every_steps": 8, "seed": 7},
        "checkpoint": {"uri": str(run / "ckpt"), "every_steps": 16, "keep_last": 2},
        "output": {"model_uri": str(run / "model"), "history_uri": str(run / "history.jsonl")},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    path = run / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def history(cfg: Path) -> list[dict[str, Any]]:
    """The worker's history lines (``start``, ``step``, ``eval``, ``restore`` ...)."""
    path = cfg.parent / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def rendered_job(config_uri: Path, **params: Any) -> dict[str, Any]:
    """The PyTorchJob the train step creates for these pipeline parameters (as ``gpupipe render
    pytorchjob`` prints it), with a fresh name and the real worker config URI."""
    spec = train_job_spec(
        {"gpus_per_node": 0, **params},
        run_id=f"ctr-{secrets.token_hex(3)}",
        config_uri=str(config_uri),
    )
    return build_pytorchjob(spec)
