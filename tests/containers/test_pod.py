"""The train pod's own settings, read from the rendered PyTorchJob, hold in the CPU image: the
trainer starts, trains with two processes, and torch.compile builds its C++ kernels."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from components.images import CPU_IMAGE
from tests.containers.jobs import rendered_job, worker_config
from tests.containers.pod import (
    MASTER,
    container,
    docker,
    operator_env,
    pod_name,
    quantity_bytes,
    replica,
    run_args,
)
from tests.helpers import history

pytestmark = pytest.mark.containers


def pod_run(job: dict, shared: Path, *command: str, timeout: float = 300):
    """``docker run`` of the master's container as the operator starts it (pod settings, env,
    hostname); the shared folder is mounted at its own path (the stand-in for the object store
    every pod reaches)."""
    image = container(job, MASTER)["image"]
    assert image == CPU_IMAGE, "gpus_per_node=0 renders the CPU image"
    env = [f"--env={k}={v}" for k, v in operator_env(job, MASTER, 0).items()]
    return docker(
        "run", "--rm", "--hostname", pod_name(job, MASTER, 0), *run_args(job, MASTER), *env,
        "-v", f"{shared}:{shared}", image, *command, timeout=timeout, check=False,
    )  # fmt: skip


def test_the_pod_settings_hold_inside_the_container(cpu_image: str, shared: Path) -> None:
    job = rendered_job(shared / "config.json")
    pod, ctr = replica(job, MASTER), container(job, MASTER)
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]
    probe = (
        "id -u; id -g; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
        "df -B1 --output=size /dev/shm | tail -n 1; "
        "touch /opt/venv/x 2>&1 || true; touch $HOME/x && echo home-writable; "
        f"touch {shared}/by-pod && stat -c %u {shared}/by-pod"
    )
    proc = pod_run(job, shared, "sh", "-c", probe)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    uid = pod["securityContext"]["runAsUser"]
    assert lines[0] == lines[1] == str(uid) == "1000"
    assert re.fullmatch(r"CapEff:\s+0+", lines[2]), lines[2]  # capabilities: drop ALL
    assert re.fullmatch(r"NoNewPrivs:\s+1", lines[3]), lines[3]
    assert int(lines[4]) == quantity_bytes(shm) == 16 * 2**30  # memory-backed /dev/shm
    assert "Read-only file system" in lines[5]
    assert lines[6] == "home-writable" and ctr["securityContext"]["readOnlyRootFilesystem"]
    assert lines[7] == str(uid)  # what the pod writes to a shared volume is the pod's uid's


def test_trainer_help_runs_in_the_pod(cpu_image: str, shared: Path) -> None:
    job = rendered_job(shared / "config.json")
    proc = pod_run(job, shared, "python", "-m", "trainer", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout and "train" in proc.stdout


def test_two_processes_train_in_the_pod(cpu_image: str, shared: Path) -> None:
    cfg = worker_config(shared, "ddp")
    job = rendered_job(cfg)
    # The train step's local launcher inside one pod: torchrun with two gloo processes.
    command = ["python", "-m", "trainer.launch", "--standalone", "--nproc_per_node=2"]
    proc = pod_run(job, shared, *command, "-m", "trainer.worker", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = next(r for r in history(cfg) if r["event"] == "start")
    assert start["world_size"] == 2
    steps = [r for r in history(cfg) if r["event"] == "step"]
    assert steps[-1]["loss"] < steps[0]["loss"]
    model = cfg.parent / "model"
    assert (model / "model.safetensors").stat().st_uid == 1000
    assert json.loads((model / "model.json").read_text())["features"]


def test_torch_compile_builds_its_kernels_in_the_pod(cpu_image: str, shared: Path) -> None:
    cfg = worker_config(shared, "compiled", train={"epochs": 1, "compile": True})
    job = rendered_job(cfg)
    proc = pod_run(job, shared, *container(job, MASTER)["command"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (cfg.parent / "model" / "model.safetensors").exists()
    # inductor really compiled C++ (under /tmp: the only writable place)
    smoke = (
        "import torch, pathlib; f = torch.compile(lambda x: torch.sin(x) * 2 + x.cos()); "
        "x = torch.randn(64); assert torch.allclose(f(x), torch.sin(x) * 2 + x.cos(), atol=1e-6); "
        "print(len(list(pathlib.Path('/tmp/torchinductor').rglob('*.so'))))"
    )
    proc = pod_run(job, shared, "python", "-c", smoke)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) >= 1
