"""Fixtures of the container tests: a Docker engine, the images built from this checkout, and a
shared folder that the containers' uid can write.

Every test here carries the ``containers`` marker and skips, with the reason, where no Docker
engine answers (``make test-containers`` starts one first: hack/docker-up.sh). The images are
built once per session by hack/build-images.sh (seconds when nothing changed; the layer cache
keeps the dependencies); ``GPUPIPE_SKIP_IMAGE_BUILD=1`` uses the images as they are. The CUDA
image (~3.5 GB of CUDA wheels on a machine without a registry) is opt-in:
``GPUPIPE_TEST_CUDA_IMAGE=1``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.images import CPU_IMAGE, CUDA_IMAGE
from tests.containers.pod import docker, engine_missing

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1800


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test here ``containers``; skip them all, with the reason, without an engine."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.containers)
            if reason := engine_missing():
                item.add_marker(pytest.mark.skip(reason=reason))


def _build(flavour: str, image: str) -> str:
    if os.environ.get("GPUPIPE_SKIP_IMAGE_BUILD") == "1":
        if docker("image", "inspect", image, check=False).returncode != 0:
            pytest.fail(f"GPUPIPE_SKIP_IMAGE_BUILD=1 but {image} is not built (make images)")
        return image
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", "hack/build-images.sh", flavour],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"building {image} failed:\n{proc.stdout[-4000:]}{proc.stderr}"
    # The build's own progress lines (the base, the wheel server, each image's time and size).
    steps = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.startswith("==> ")]
    print("\n".join([*steps, f"built {image} in {time.monotonic() - start:.0f} s"]))
    return image


@pytest.fixture(scope="session")
def cpu_image() -> str:
    """The CPU image, built from this checkout."""
    return _build("cpu", CPU_IMAGE)


@pytest.fixture(scope="session")
def cuda_image() -> str:
    """The CUDA image, built from this checkout (opt-in: GPUPIPE_TEST_CUDA_IMAGE=1)."""
    if os.environ.get("GPUPIPE_TEST_CUDA_IMAGE") != "1":
        pytest.skip("the CUDA image is opt-in (~3.5 GB to download): GPUPIPE_TEST_CUDA_IMAGE=1")
    return _build("cuda", CUDA_IMAGE)


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A folder for data, configs and outputs that any container uid can write (a stand-in for
    the object store or volume that the pods share); removed afterwards even when the
    containers' uid owns what is in it."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    yield folder
    subprocess.run(["chmod", "-R", "u+rwX", str(folder)], check=False)
