"""The pod pieces every job resource carries, built from one
:class:`~trainer.launch.jobspec.JobSpec`: labels, annotations, owner, the training container's
environment, resources and mounts, and the restricted Pod Security contexts. A PyTorchJob puts
them in each replica's pod template; a TrainJob in its ``trainer`` fields and its runtime patch."""

from __future__ import annotations

from typing import Any

from trainer.launch.jobspec import ISTIO_INJECT, LABEL_APP, LABEL_JOB, JobSpec


def job_labels(spec: JobSpec) -> dict[str, str]:
    """Labels of the job and its pods: the user's, then gpupipe's own."""
    return {**spec.labels, LABEL_APP: "gpupipe", LABEL_JOB: spec.name}


def pod_annotations(spec: JobSpec) -> dict[str, str]:
    """Annotations of the job's pods: the user's, and no Istio sidecar."""
    return {**spec.annotations, ISTIO_INJECT: "false"}


def owner_references(spec: JobSpec) -> list[dict[str, Any]]:
    """The job's ownerReferences: the launcher pod, when known (see :class:`OwnerRef`)."""
    if spec.owner is None:
        return []
    return [
        {
            "apiVersion": spec.owner.api_version,
            "kind": spec.owner.kind,
            "name": spec.owner.name,
            "uid": spec.owner.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]


def container_env(spec: JobSpec) -> list[dict[str, Any]]:
    """The training container's environment: gpupipe's defaults, NCCL, the user's, secrets."""
    plain = {"GPUPIPE_JOB": spec.name, "PYTHONUNBUFFERED": "1"}
    if spec.read_only_root_fs:
        plain["HOME"] = "/tmp"
    plain |= spec.nccl.env()
    plain |= spec.env
    plain["GPUPIPE_JOB"] = spec.name  # the trainer's logs use it as the job id
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain.items()]
    env += [
        {
            "name": s.env,
            "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key, "optional": s.optional}},
        }
        for s in spec.secret_env
    ]
    return env


def container_resources(spec: JobSpec) -> dict[str, Any]:
    """Requests and limits of the training container (GPUs as limits only)."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for kind in ("cpu", "memory"):
        if (req := getattr(spec, f"{kind}_request")) is not None:
            requests[kind] = req
        if (lim := getattr(spec, f"{kind}_limit")) is not None:
            limits[kind] = lim
    if spec.gpus_per_node > 0:
        # Extended resources are limits only; the API server copies them to requests.
        limits[spec.gpu_resource] = str(spec.gpus_per_node)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def pod_volumes(spec: JobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, the training container's mounts): memory-backed /dev/shm, and a writable /tmp
    under a read-only root."""
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}
    ]
    if spec.read_only_root_fs:
        mounts.append({"name": "tmp", "mountPath": "/tmp"})
        volumes.append({"name": "tmp", "emptyDir": {}})
    return volumes, mounts


def container_security_context(spec: JobSpec) -> dict[str, Any]:
    """The restricted Pod Security Standard for the training container."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": spec.read_only_root_fs,
        "runAsNonRoot": True,
    }


def pod_security_context(spec: JobSpec) -> dict[str, Any]:
    """The restricted Pod Security Standard for the pod: non-root, RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": spec.run_as_user,
        "runAsGroup": spec.run_as_user,
        "fsGroup": spec.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
