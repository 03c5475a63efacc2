"""What the images and the manifests fetch is named by its content (issue 60, item 12).

Every remote kustomize base is pinned by a commit (a tag can be moved to other files; a commit
cannot), and every image's ``pip install`` from an index checks each file against a hashed lock
(``--require-hashes``), which hack/lock-images.sh (``make lock``) writes from the pins already
kept beside each image; here each lock is held to those pins. Base images are still pulled by
tag: no registry is reachable here to read their digests (the issue note says what is left).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADDON_IMAGES = ROOT / "hack" / "cluster" / "addons" / "images"
VERSIONS = dict(
    re.findall(r"^([A-Z0-9_]+)=(\S+)$", (ROOT / "hack/cluster/versions.env").read_text(), re.M)
)
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """A lock's entries: normalized name -> (version, its hashes)."""
    body = "\n".join(ln for ln in path.read_text().splitlines() if not ln.startswith("#"))
    entries = {}
    for entry in re.split(r"\n(?=\S)", body.strip()):
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", entry)
        assert m, f"{path.name}: not a pinned entry: {entry[:80]!r}"
        entries[_norm(m[1])] = (m[2], HASH.findall(entry))
    return entries


def _pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a pins file, by normalized name."""
    return {
        _norm(m[1]): m[2]
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", path.read_text(), re.M)
    }


LOCKS = sorted([*ROOT.glob("images/*.lock"), *ADDON_IMAGES.glob("*/*.lock")])


# --- remote kustomize bases -----------------------------------------------------------------------


def _remote_bases() -> list[tuple[str, str]]:
    """(kustomization, URL) of every remote base the repository's kustomizations name."""
    found = []
    for k in sorted(ROOT.glob("**/kustomization.yaml")):
        if ".venv" in k.parts or "site" in k.parts:
            continue
        for url in re.findall(r"^\s*-\s+((?:https://)?github\.com/\S+)$", k.read_text(), re.M):
            found.append((str(k.relative_to(ROOT)), url))
    return found


def test_every_remote_base_is_pinned_by_a_commit() -> None:
    bases = _remote_bases()
    assert len(bases) >= 6, bases  # KFP's two, Trainer's two, the Training Operator, Katib
    for where, url in bases:
        refs = re.findall(r"[?&]ref=([^&\s]+)", url)
        assert len(refs) == 1 and re.fullmatch(r"[0-9a-f]{40}", refs[0]), f"{where}: {url}"


@pytest.mark.parametrize(
    ("module", "release"),
    [("github.com/kubeflow/trainer/v2", "TRAINER"),
     ("github.com/kubeflow/training-operator", "TRAINING_OPERATOR"),
     ("github.com/kubeflow/katib", "KATIB")],
    ids=["trainer", "training-operator", "katib"],
)  # fmt: skip
def test_each_commit_is_the_one_its_release_tag_names(module: str, release: str) -> None:
    """Where Go's module cache recorded the tag's commit (``Origin`` in the version's .info,
    from the same download the test cluster builds from), versions.env agrees with it."""
    try:
        cache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no Go here to read its module cache: {e}")
    info = (
        Path(cache) / "cache/download" / module / "@v" / f"v{VERSIONS[f'{release}_VERSION']}.info"
    )
    origin = json.loads(info.read_text()).get("Origin", {}) if info.exists() else {}
    if "Hash" not in origin:
        pytest.skip(f"{info} records no commit")
    assert origin["Ref"] == f"refs/tags/v{VERSIONS[f'{release}_VERSION']}"
    assert origin["Hash"] == VERSIONS[f"{release}_COMMIT"]


# --- pip installs in images -----------------------------------------------------------------------


def _installs() -> list[tuple[str, str]]:
    """(file, command) of every ``pip install`` in the images' Dockerfiles and scripts, its
    continuation lines joined; comments left out."""
    files = [
        *ROOT.glob("images/*/Dockerfile"),
        *ROOT.glob("images/*.sh"),
        *ADDON_IMAGES.glob("*/Dockerfile*"),
    ]
    found = []
    for f in sorted(files):
        text = "\n".join(ln for ln in f.read_text().splitlines() if not ln.lstrip().startswith("#"))
        text = re.sub(r"\\\n\s*", " ", text)
        for m in re.finditer(r"pip install[^&;\n]*", text):
            found.append((str(f.relative_to(ROOT)), m.group(0)))
    return found


def test_every_pip_install_of_an_image_checks_hashes() -> None:
    installs = _installs()
    assert len(installs) >= 7, installs
    for where, command in installs:
        if "--no-index" in command and command.rstrip().endswith(" ."):
            continue  # gpupipe itself, from the build context: nothing fetched
        assert "--require-hashes" in command, f"{where}: {command}"
        assert "--no-deps" in command, f"{where}: a lock is complete, nothing is resolved"
        words = command.split()[2:]
        with_value = {"-r", "--index-url", "--only-binary", "--prefix"}
        values = {words[i + 1] for i, w in enumerate(words[:-1]) if w in with_value}
        named = [w for w in words if not w.startswith("-") and w not in values]
        locks = [v for v in values if v.endswith(".lock")]
        assert len(locks) == 1 and not named, f"{where}: one lock and nothing else: {command}"


def test_every_lock_an_image_copies_is_here() -> None:
    # (Katib's Dockerfile.python gets requirements-<service>.lock as requirements.lock from
    # katib.sh: test_each_add_on_lock_is_its_pins checks each.)
    dockerfiles = [*ROOT.glob("images/*/Dockerfile"), *ADDON_IMAGES.glob("*/Dockerfile*")]
    for dockerfile in [d for d in dockerfiles if d.name != "Dockerfile.python"]:
        for copy in re.findall(r"^COPY\s+(.*)$", dockerfile.read_text(), re.M):
            for src in [s for s in copy.split()[:-1] if s.endswith(".lock")]:
                base = ROOT if src.startswith("images/") else dockerfile.parent
                assert (base / src).is_file(), f"{dockerfile.name} copies {src}, not here"
    assert "requirements.lock" in (ADDON_IMAGES / "katib/Dockerfile.python").read_text()
    assert (
        'cp "$pins" "${ctx}/requirements.lock"'
        in (ROOT / "hack/cluster/addons/katib.sh").read_text()
    )


# --- the locks against their pins -----------------------------------------------------------------


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_entry_of_a_lock_is_pinned_and_hashed(lock: Path) -> None:
    entries = _lock(lock)
    assert entries, lock
    for name, (_, hashes) in entries.items():
        assert hashes, f"{lock.name}: {name} has no hash"
    assert "make lock" in lock.read_text().splitlines()[0]


def test_the_trainer_lock_is_pyproject_at_the_constraints() -> None:
    out = subprocess.run(
        [sys.executable, "images/requirements.py", "pyproject.toml", "pipelines"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    wanted = {_norm(re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0]) for r in out.stdout.split()}
    locked = _lock(ROOT / "images/requirements.lock")
    assert "torch" not in locked, "torch is each flavour's own (torch-*.lock)"
    assert wanted - {"torch"} <= set(locked), sorted(wanted - {"torch"} - set(locked))
    assert "setuptools" in locked, "the package stage builds with it, without a download"
    pins = _pins(ROOT / "constraints.txt")
    drifted = {n: (v, pins[n]) for n, (v, _) in locked.items() if n in pins and pins[n] != v}
    assert drifted == {}, f"locked, pinned: {drifted} (make lock)"


def test_the_torch_locks_are_constraints_pin() -> None:
    pin = _pins(ROOT / "constraints.txt")["torch"]
    cpu = _lock(ROOT / "images/torch-cpu.lock")
    assert list(cpu) == ["torch"] and cpu["torch"][0] == f"{pin}+cpu"
    (wheel_hash,) = re.findall(
        r"^([0-9a-f]{64})\s+torch-", (ROOT / "images/wheels.sha256").read_text(), re.M
    )
    assert cpu["torch"][1] == [f"--hash=sha256:{wheel_hash}"], "the wheel build-images.sh serves"
    cuda = _lock(ROOT / "images/torch-cuda.lock")
    assert cuda["torch"][0] == pin
    assert any(n.startswith("nvidia-nccl") for n in cuda), "the CUDA build's NCCL"


def _katib_services() -> list[str]:
    script = (ROOT / "hack/cluster/addons/katib.sh").read_text()
    block = re.search(r"PY_SERVICES=\(\n(.*?)\n\)", script, re.S)
    assert block
    return [line.split()[0].strip('"') for line in block.group(1).splitlines()]


@pytest.mark.parametrize(
    ("lock", "pins"),
    [
        ("mlflow/requirements.lock", "mlflow/constraints.txt"),
        ("kfp/requirements-mlmd.lock", "kfp/requirements-mlmd.txt"),
        *[
            (f"katib/requirements-{s}.lock", f"katib/constraints-{s}.txt")
            for s in _katib_services()
        ],
    ],
)
def test_each_add_on_lock_is_its_pins(lock: str, pins: str) -> None:
    locked = _lock(ADDON_IMAGES / lock)
    pinned = _pins(ADDON_IMAGES / pins)
    drifted = {n: (v, pinned.get(n)) for n, (v, _) in locked.items() if pinned.get(n) != v}
    assert drifted == {}, f"{lock}: locked, pinned: {drifted} (make lock)"
    if lock.startswith("mlflow/"):
        assert locked["mlflow"][0] == VERSIONS["MLFLOW_VERSION"] and "boto3" in locked
    if lock.startswith("kfp/"):
        assert set(locked) == set(pinned), "the image installs exactly its pins"


def test_the_lock_script_is_what_make_lock_runs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lock:.*\n\thack/lock-images\.sh$", makefile, re.M)
    assert os.access(ROOT / "hack/lock-images.sh", os.X_OK)
