"""The CUDA image (opt-in: GPUPIPE_TEST_CUDA_IMAGE=1) holds a CUDA build of torch with NCCL, a
compiler, and starts the trainer under the GPU pod's settings (no GPU needed to check that)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.containers.jobs import rendered_job
from tests.containers.pod import MASTER, container, docker, run_args

pytestmark = pytest.mark.containers

PROBE = (
    "import json, shutil, torch, torch.distributed as dist; print(json.dumps({"
    "'torch': torch.__version__, 'cuda': torch.version.cuda, 'nccl': dist.is_nccl_available(),"
    "'nccl_version': list(torch.cuda.nccl.version()) if dist.is_nccl_available() else None,"
    "'gxx': shutil.which('g++') is not None}))"
)


def test_the_cuda_image_holds_cuda_torch_with_nccl(cuda_image: str, tmp_path: Path) -> None:
    job = rendered_job(tmp_path / "config.json", gpus_per_node=1)
    assert container(job, MASTER)["image"] == cuda_image
    args = run_args(job, MASTER)
    proc = docker("run", "--rm", *args, cuda_image, "python", "-c", PROBE, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["torch"].startswith("2.13.0") and found["cuda"], found
    assert found["nccl"] and found["nccl_version"][0] >= 2, found
    assert found["gxx"], found
    help_cmd = ["python", "-m", "trainer", "--help"]
    proc = docker("run", "--rm", *args, cuda_image, *help_cmd, check=False)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-3000:]
