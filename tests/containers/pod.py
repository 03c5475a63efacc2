"""Run the images the way a cluster runs them: ``docker run`` arguments read from a rendered
PyTorchJob (never hand-copied), the Training Operator's environment and pod names, and a
Docker engine check that says why the container tests cannot run.

The mapping from a pod template to ``docker run``:

=========================================  ==================================================
pod template                               docker run
=========================================  ==================================================
``securityContext.runAsUser/runAsGroup``   ``--user UID:GID``; ``fsGroup`` -> ``--group-add``
``readOnlyRootFilesystem: true``           ``--read-only``
``capabilities.drop: [ALL]``               ``--cap-drop ALL``
``allowPrivilegeEscalation: false``        ``--security-opt no-new-privileges``
``seccompProfile: RuntimeDefault``         Docker's default seccomp profile (nothing to add)
emptyDir ``medium: Memory`` at /dev/shm    ``--shm-size <sizeLimit>``
other emptyDir mounts                      ``--tmpfs <mountPath>``
``env`` values (``valueFrom`` left out)    ``--env NAME=VALUE``
``limits.memory`` / ``limits.cpu``         ``--memory`` / ``--cpus`` (at most this host's)
``command``                                the container command, exactly
=========================================  ==================================================
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from typing import Any

MASTER, WORKER = "Master", "Worker"
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``16Gi``, ``512M``, ``1000``) in bytes."""
    m = re.fullmatch(r"(\d+)([kMGT]i?)?", quantity)
    if m is None:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    return int(m[1]) * _UNITS[m[2] or ""]


def cpu_count(quantity: str) -> float:
    """A Kubernetes CPU quantity (``4``, ``500m``) in CPUs."""
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def docker(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the docker CLI; on failure the error names the command and its stderr."""
    proc = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
            f"\n{proc.stderr[-3000:]}"
        )
    return proc


@functools.cache
def engine_missing() -> str | None:
    """Why no container test can run here, or ``None`` when a Docker engine answers."""
    if shutil.which("docker") is None:
        return "needs a Docker engine: no docker client on PATH (hack/docker-up.sh installs one)"
    try:
        info = docker("info", "--format", "{{.ServerVersion}}", timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "needs a Docker engine: `docker info` did not answer within 20 s"
    if info.returncode != 0 or not info.stdout.strip():
        why = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"needs a Docker engine: `docker info` failed ({why}); run hack/docker-up.sh"
    return None


def replica(job: dict[str, Any], kind: str) -> dict[str, Any]:
    """The pod template spec of one replica type (``Master`` or ``Worker``)."""
    return job["spec"]["pytorchReplicaSpecs"][kind]["template"]["spec"]


def container(job: dict[str, Any], kind: str) -> dict[str, Any]:
    """The replica's training container (the operator requires the name ``pytorch``)."""
    (found,) = [c for c in replica(job, kind)["containers"] if c["name"] == "pytorch"]
    return found


def pod_name(job: dict[str, Any], kind: str, index: int) -> str:
    """The operator's pod name, also its hostname and its headless service's name."""
    return f"{job['metadata']['name']}-{kind.lower()}-{index}"


def run_args(job: dict[str, Any], kind: str) -> list[str]:
    """``docker run`` options carrying the replica's pod settings (see the module's table)."""
    pod, ctr = replica(job, kind), container(job, kind)
    psc, csc = pod.get("securityContext", {}), ctr.get("securityContext", {})
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    gid = csc.get("runAsGroup", psc.get("runAsGroup", uid))
    assert uid not in (None, 0), "the pod must name a non-root uid"
    args = ["--user", f"{uid}:{gid}"]
    if "fsGroup" in psc:
        args += ["--group-add", str(psc["fsGroup"])]
    if csc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    for cap in csc.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    for cap in csc.get("capabilities", {}).get("add", []):
        args += ["--cap-add", cap]
    if csc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    seccomp = csc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
    assert seccomp in (None, "RuntimeDefault"), f"unsupported seccomp profile {seccomp}"
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in ctr.get("volumeMounts", []):
        empty_dir = volumes[mount["name"]].get("emptyDir")
        assert empty_dir is not None, f"only emptyDir volumes are emulated: {mount}"
        if mount["mountPath"] == "/dev/shm" and empty_dir.get("medium") == "Memory":
            args += ["--shm-size", str(quantity_bytes(empty_dir["sizeLimit"]))]
        else:
            args += ["--tmpfs", f"{mount['mountPath']}:rw,exec,mode=1777"]
    for var in ctr.get("env", []):
        if "value" in var:
            args += ["--env", f"{var['name']}={var['value']}"]
    limits = ctr.get("resources", {}).get("limits", {})
    if "memory" in limits:
        args += ["--memory", str(quantity_bytes(limits["memory"]))]
    if "cpu" in limits:
        args += ["--cpus", f"{min(cpu_count(limits['cpu']), os.cpu_count() or 1):g}"]
    return args


def operator_env(job: dict[str, Any], kind: str, index: int) -> dict[str, str]:
    """The environment the Training Operator (v1.9) gives a replica's ``pytorch`` container.

    ``RANK`` is the node's index (the master is 0, worker i is i + 1), ``WORLD_SIZE`` the
    number of processes; torchrun reads the ``PET_*`` copies.
    """
    specs = job["spec"]["pytorchReplicaSpecs"]
    nodes = sum(int(s["replicas"]) for s in specs.values())
    nproc = int(job["spec"].get("nprocPerNode", "1"))
    port = next(
        p["containerPort"]
        for p in container(job, MASTER).get("ports", [])
        if p["name"] == "pytorchjob-port"
    )
    rank = index if kind == MASTER else index + int(specs[MASTER]["replicas"])
    master = pod_name(job, MASTER, 0)
    return {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nodes * nproc),
        "RANK": str(rank),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": str(port),
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": str(nproc),
        "PET_NODE_RANK": str(rank),
        "PYTHONUNBUFFERED": "1",
    }
