"""``gpupipe run --local --runner docker``: every step in its own image, under the pod's settings.

kfp.local's ``DockerRunner`` starts one container per step, mounting only the run's pipeline
root. Here the steps also get what a cluster pod of the suite gets (what
:mod:`trainer.launch.podspec` fixes): a non-root uid, a read-only root filesystem with a
writable ``/tmp``, no capabilities, no privilege escalation and the memory-backed ``/dev/shm``
size. The whole ``--root`` (run folders, the embedded registry and its artifacts, demo data) is
mounted at its own path, and so is a local ``--data`` path, read-only. Containers use the
host's network, so a registry or object store on ``localhost`` answers as in a host run.

Files the steps write are owned by the pod's uid when gpupipe runs as root (the root folder is
handed to that uid first); otherwise the steps run as the calling user, who then owns them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainer.base.errors import InputError
from trainer.launch.jobspec import SHM_SIZE
from trainer.launch.kubefields import parse_quantity
from trainer.launch.podspec import RUN_AS_USER

RUNNERS = ("subprocess", "docker")
"""Where ``gpupipe run --local`` runs the steps: host processes, or containers of the images."""


def pod_defaults() -> dict[str, Any]:
    """``run_as_user``, ``shm_size`` and ``read_only_root_fs`` of a cluster job's pods."""
    return {"run_as_user": RUN_AS_USER, "shm_size": SHM_SIZE, "read_only_root_fs": True}


def parse_image_overrides(pairs: list[str]) -> dict[str, str]:
    """``ORIGINAL=REPLACEMENT`` pairs (``--image-override``) as a dict.

    Raises:
        InputError: ``E_PARAM`` for a pair without ``=`` or with an empty side.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        original, sep, replacement = pair.partition("=")
        if not sep or not original.strip() or not replacement.strip():
            raise InputError("E_PARAM", f"expected ORIGINAL=REPLACEMENT, got {pair!r}", pair)
        out[original.strip()] = replacement.strip()
    return out


def set_step_images(pipeline: Any, overrides: dict[str, str]) -> list[str]:
    """Apply ``overrides`` to the images of ``pipeline``'s steps; the images it then uses.

    Raises:
        InputError: ``E_PARAM`` when an override names an image no step uses.
    """
    executors = pipeline.pipeline_spec.deployment_spec["executors"]
    used = {executors[name]["container"]["image"] for name in executors}
    for original in overrides:
        if original not in used:
            raise InputError(
                "E_PARAM",
                f"no step uses {original} (the steps use {', '.join(sorted(used))})",
                "--image-override",
            )
    for name in executors:
        container = executors[name]["container"]
        container["image"] = overrides.get(container["image"], container["image"])
    return sorted({executors[name]["container"]["image"] for name in executors})


def check_images(images: list[str]) -> None:
    """Every image is in the local Docker engine (kfp.local would try to pull it otherwise).

    Raises:
        InputError: ``E_IMAGE`` naming the missing image, or ``E_DOCKER`` when no engine answers.
    """
    try:
        import docker
    except ImportError:
        raise InputError(
            "E_DOCKER", "--runner docker needs the docker package: pip install docker", "docker"
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        reason = " ".join(str(e).split())[:200]
        raise InputError("E_DOCKER", f"no Docker engine answers: {reason}", "docker") from None
    try:
        for image in images:
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                raise InputError(
                    "E_IMAGE",
                    "the step image is not in the local Docker engine: build it (make images) "
                    "or pull it, or map it to one you have with --image-override",
                    image,
                ) from None
    finally:
        client.close()


def _local_path(uri: str) -> Path | None:
    if "://" in uri and not uri.startswith("file://"):
        return None
    return Path(uri.removeprefix("file://")).expanduser().absolute()


def docker_runner(root: Path, data_uri: str) -> Any:
    """kfp.local's ``DockerRunner`` with the pod's settings and the mounts a run needs.

    Args:
        root: the prepared ``--root`` (absolute); handed to the pod's uid when running as root.
        data_uri: the data URI; a local path outside ``root`` is mounted read-only.
    """
    import docker.types
    from kfp import local

    pod = pod_defaults()
    if os.getuid() == 0:
        uid = gid = int(pod["run_as_user"])
        _hand_over(root, uid)
    else:
        uid, gid = os.getuid(), os.getgid()
    mounts = [docker.types.Mount(target=str(root), source=str(root), type="bind")]
    data = _local_path(data_uri)
    if data is not None and data.exists() and root not in (data, *data.parents):
        mounts.append(
            docker.types.Mount(target=str(data), source=str(data), type="bind", read_only=True)
        )
    return local.DockerRunner(
        user=f"{uid}:{gid}",
        read_only=bool(pod["read_only_root_fs"]),
        tmpfs={"/tmp": "rw,exec,mode=1777"},
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        shm_size=int(parse_quantity(str(pod["shm_size"]), "shm_size")),
        network_mode="host",
        mounts=mounts,
    )


def _hand_over(root: Path, uid: int) -> None:
    """Make ``root`` and everything in it (but kfp.local's host-side cache) owned by ``uid``."""
    os.chown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root and "cache" in dirnames:
            dirnames.remove("cache")
        for name in [*dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
