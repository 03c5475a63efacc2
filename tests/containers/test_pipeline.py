"""The whole pipeline in the images: ``gpupipe run --local --runner docker`` runs every step in
its container (kfp.local's DockerRunner) under the pod's settings, with the data outside the
root mounted read-only and the embedded registry under the root."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from components.images import CPU_IMAGE, CUDA_IMAGE
from tests.containers.conftest import ROOT
from trainer.steps.preprocess import write_demo_data

pytestmark = pytest.mark.containers


def gpupipe(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env=env,
    )


def test_the_pipeline_runs_every_step_in_its_image(cpu_image: str, shared: Path) -> None:
    data = shared / "user-data" / "churn.parquet"
    write_demo_data(str(data), rows=2000, task="classification", seed=0)
    root = shared / "root"
    args = [
        "run", "--local", "--runner", "docker", "--root", str(root), "--json",
        "--data", str(data), "--target", "churned", "--param", "epochs=2",
        # no GPU here: the train and tune steps run in the CPU image
        "--image-override", f"{CUDA_IMAGE}={CPU_IMAGE}",
    ]  # fmt: skip
    proc = gpupipe(*args)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["state"] == "SUCCEEDED", summary
    assert summary["registered_version"] == "1"
    # every step ran in a container of the image (kfp.local says which image it started, in
    # the run's log); the terminal got a line per step as it started and ended
    log = Path(summary["log"]).read_text()
    assert log.count(f"Found image '{CPU_IMAGE}'") >= 4, log[-3000:]
    assert "Found image" not in proc.stdout + proc.stderr
    assert re.search(r"^  train +SUCCEEDED +\d+\.\d s$", proc.stderr, re.M), proc.stderr
    # written by the pod's uid, inside the root; the user's data untouched, nothing beside it
    run_dir = Path(summary["run_dir"])
    model = run_dir / "train" / "model" / "model.safetensors"
    assert model.exists() and model.stat().st_uid == 1000
    assert (root / "mlflow.db").stat().st_uid == 1000
    # (gpupipe demo-data marks the table it wrote as its own, beside it)
    marker = ".churn.parquet.gpupipe-output.json"
    assert sorted(p.name for p in data.parent.iterdir()) == [marker, "churn.parquet"]


def test_a_missing_image_is_refused_before_any_step(cpu_image: str, shared: Path) -> None:
    proc = gpupipe(
        "run", "--local", "--runner", "docker", "--root", str(shared / "root"),
        "--image-override", f"{CUDA_IMAGE}={CPU_IMAGE}",
        "--image-override", f"{CPU_IMAGE}=gpupipe.invalid/none:0",
    )  # fmt: skip
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "E_IMAGE" in last and "gpupipe.invalid/none:0" in last, last
    assert not (shared / "root" / "runs").exists()  # no step started
