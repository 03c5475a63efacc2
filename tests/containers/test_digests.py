"""Images compiled by digest (issue 60, item 12): `hack/build-images.sh --push` pushes to a real
registry and records the digest the registry answered; `GPUPIPE_IMAGE_DIGESTS` compiles the
pipeline and every component with it, so a tag re-pushed later cannot change what a run pulls.

The registry is CNCF Distribution's (hack/registry.sh builds it from the Go module proxy once),
on 127.0.0.1, which Docker pushes to without TLS.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers.pod import docker
from trainer.base.version import __version__

pytestmark = pytest.mark.timeout(1800)  # a cold image build, then a push of ~1.5 GB

ROOT = Path(__file__).resolve().parents[2]
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry on 127.0.0.1 with its own storage; its host:port."""
    built = subprocess.run(
        ["bash", "hack/registry.sh"], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert built.returncode == 0, built.stderr[-3000:]
    folder = tmp_path_factory.mktemp("registry")
    host = f"127.0.0.1:{_free_port()}"
    config = folder / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
        f"http:\n  addr: {host}\n"
    )
    with (folder / "log").open("w") as log:
        proc = subprocess.Popen(
            [built.stdout.strip(), "serve", str(config)], stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as r:
                    assert r.status == 200
                break
            except OSError:
                assert proc.poll() is None, (folder / "log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the registry did not answer in 30 s"
                time.sleep(0.2)
        yield host
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _script(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "hack/build-images.sh", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env=os.environ | env,
    )


def _registry_digest(host: str, repo: str, tag: str) -> str:
    request = urllib.request.Request(
        f"http://{host}/v2/{repo}/manifests/{tag}",
        method="HEAD",
        headers={"Accept": MANIFEST_TYPES},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return str(r.headers["Docker-Content-Digest"])


def test_push_records_the_registrys_digest_and_compile_pins_every_image_by_it(
    registry: str, cpu_image: str, tmp_path: Path
) -> None:
    prefix = f"{registry}/gpupipe"
    digests = tmp_path / "digests.json"
    env = {"GPUPIPE_IMAGE_REGISTRY": prefix, "GPUPIPE_IMAGE_DIGESTS": str(digests)}
    # The CPU image, built (from the layer cache: the same recipe under the registry's name)
    # and pushed; the CUDA image's stand-in (the CPU image under its name: the CUDA image is
    # opt-in here) pushed as built before.
    pushed = _script("--push", "cpu", env=env)
    assert pushed.returncode == 0, pushed.stdout[-2000:] + pushed.stderr[-2000:]
    docker("tag", cpu_image, f"{prefix}/trainer-cuda:{__version__}")
    try:
        pushed = _script("--push-only", "cuda", env=env)
    finally:
        for flavour in ("cpu", "cuda"):  # the local tags (the registry keeps the images)
            docker("rmi", f"{prefix}/trainer-{flavour}:{__version__}", check=False)
    assert pushed.returncode == 0, pushed.stdout[-2000:] + pushed.stderr[-2000:]

    table = json.loads(digests.read_text())
    for flavour in ("cpu", "cuda"):
        tag = f"{prefix}/trainer-{flavour}:{__version__}"
        answered = _registry_digest(registry, f"gpupipe/trainer-{flavour}", __version__)
        assert table[tag] == f"{prefix}/trainer-{flavour}@{answered}"
    # The pushed reference is pullable by its digest.
    pulled = docker("pull", table[f"{prefix}/trainer-cpu:{__version__}"], check=False)
    assert pulled.returncode == 0, pulled.stderr

    out = tmp_path / "compiled"
    comps = tmp_path / "components"
    for args in (["--out", str(out)], ["--components-dir", str(comps)]):
        compiled = subprocess.run(
            [str(ROOT / ".venv/bin/gpupipe"), "compile", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env=os.environ | env,
        )  # fmt: skip
        assert compiled.returncode == 0, compiled.stderr
    # Every image the YAML names (the executors' and the launchers' job images, constants of
    # the tasks' inputs) is a pushed digest.
    images: set[str] = set()
    files = [*out.glob("*.yaml"), *comps.glob("*/component.yaml")]
    assert len(files) > 5, files
    for f in files:
        images |= set(re.findall(r"[^\s'\"]*/trainer-(?:cpu|cuda)[@:][^\s'\"]*", f.read_text()))
    assert images == set(table.values()), images

    version = subprocess.run(
        [str(ROOT / ".venv/bin/gpupipe"), "--version"],
        capture_output=True, text=True, timeout=120, env=os.environ | env,
    )  # fmt: skip
    assert version.returncode == 0, version.stderr
    assert f"by digest from {digests}" in version.stdout
    assert table[f"{prefix}/trainer-cuda:{__version__}"] in version.stdout


def test_a_push_the_registry_refuses_fails_in_one_line_and_records_nothing(
    cpu_image: str, tmp_path: Path
) -> None:
    # Nothing listens on the port: the push fails; the map is not written.
    prefix = f"127.0.0.1:{_free_port()}/gpupipe"
    docker("tag", cpu_image, f"{prefix}/trainer-cpu:{__version__}")
    digests = tmp_path / "digests.json"
    env = {"GPUPIPE_IMAGE_REGISTRY": prefix, "GPUPIPE_IMAGE_DIGESTS": str(digests)}
    try:
        pushed = _script("--push-only", "cpu", env=env)
    finally:
        docker("rmi", f"{prefix}/trainer-cpu:{__version__}", check=False)
    assert pushed.returncode == 1
    assert f"error: docker push {prefix}/trainer-cpu:{__version__} failed" in pushed.stderr
    assert not digests.exists()
