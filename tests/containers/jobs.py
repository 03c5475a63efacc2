"""Worker configs and rendered PyTorchJobs for the container tests (data in a shared folder)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from pipelines.render import train_job_spec
from tests.helpers import make_config, write_data
from trainer.launch.pytorchjob import build_pytorchjob


def worker_config(shared: Path, name: str, **sections: dict[str, Any]) -> Path:
    """A small worker config under shared/name (any uid may write there), reading the shared
    data (written once); two epochs unless ``train`` says otherwise."""
    data = shared / "data"
    if not (data / "train.parquet").exists():
        data.mkdir(exist_ok=True)
        write_data(data)
    (shared / name).mkdir(mode=0o777)
    (shared / name).chmod(0o777)
    train = {"epochs": 2, **sections.pop("train", {})}
    splits = (str(data / "train.parquet"), str(data / "val.parquet"))
    return make_config(shared, name, data=splits, train=train, **sections)


def rendered_job(config_uri: Path, **params: Any) -> dict[str, Any]:
    """The PyTorchJob the train step creates for these pipeline parameters (as ``gpupipe render
    pytorchjob`` prints it), with a fresh name and the real worker config URI."""
    spec = train_job_spec(
        {"gpus_per_node": 0, **params},
        run_id=f"ctr-{secrets.token_hex(3)}",
        config_uri=str(config_uri),
    )
    return build_pytorchjob(spec)
