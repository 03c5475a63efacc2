"""The pieces every job resource carries, built from one :class:`~trainer.launch.jobspec.JobSpec`:
metadata, the training container's environment, resources and mounts, the pod's placement and
the restricted Pod Security contexts. A PyTorchJob puts them in each replica's pod template; a
TrainJob in its ``trainer`` fields and its runtime patch.

What is the same for every job is fixed here, not a setting: a read-only root filesystem with a
writable ``/tmp`` (also ``HOME``), the image's non-root user, no Istio sidecar, and NCCL's
asynchronous error handling (a hung rank ends the job instead of holding its GPUs)."""

from __future__ import annotations

from typing import Any

from trainer.launch.jobspec import (
    GPUS_ENV,
    ISTIO_INJECT,
    LABEL_APP,
    LABEL_JOB,
    METRICS_PORT_NAME,
    OBJECT_STORE_ENV,
    SCRAPE_ANNOTATIONS,
    JobSpec,
)
from trainer.launch.queue import PRIORITY_LABEL, QUEUE_LABEL

HOSTNAME = "kubernetes.io/hostname"
"""The node label that tells nodes apart (every kubelet sets it): one worker per node's key."""
RUN_AS_USER = 1000
"""UID (and GID) of the training processes: the image's non-root user."""
DEFAULT_ENV = {"PYTHONUNBUFFERED": "1", "HOME": "/tmp", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
"""The training container's environment before the user's ``env``: ``HOME`` on the writable
``/tmp``; ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` aborts the communicator and the process on a
failed or timed-out collective."""


def job_labels(spec: JobSpec) -> dict[str, str]:
    """Labels of the job and its pods: the user's, then gpupipe's own."""
    return {**spec.cluster.labels, LABEL_APP: "gpupipe", LABEL_JOB: spec.name}


def queue_labels(spec: JobSpec) -> dict[str, str]:
    """Kueue's labels of the job (not its pods: Kueue admits the job as a whole): its
    LocalQueue and WorkloadPriorityClass (``gang_queue``, ``gang_priority_class``)."""
    c = spec.cluster
    pairs = ((QUEUE_LABEL, c.gang_queue), (PRIORITY_LABEL, c.gang_priority_class))
    return {key: value for key, value in pairs if value is not None}


def pod_annotations(spec: JobSpec) -> dict[str, str]:
    """Annotations of the job's pods: the user's, no Istio sidecar and, with a metrics
    endpoint, the usual Prometheus scrape annotations (gpupipe's win over the user's)."""
    out = {**spec.cluster.annotations, ISTIO_INJECT: "false"}
    if (port := spec.run.metrics_port) is not None:
        scrape, port_key, path = SCRAPE_ANNOTATIONS
        out.update({scrape: "true", port_key: str(port), path: "/metrics"})
    return out


def metrics_ports(spec: JobSpec) -> list[dict[str, Any]]:
    """The training container's declared metrics port (none without an endpoint)."""
    if spec.run.metrics_port is None:
        return []
    return [{"name": METRICS_PORT_NAME, "containerPort": spec.run.metrics_port, "protocol": "TCP"}]


def job_metadata(spec: JobSpec) -> dict[str, Any]:
    """The job's own metadata: name, namespace, labels and the user's annotations (the launcher
    pod's ownerReference is added by the watch loop, which knows the pod)."""
    metadata: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": {**job_labels(spec), **queue_labels(spec)},
    }
    if spec.cluster.annotations:
        metadata["annotations"] = dict(spec.cluster.annotations)
    return metadata


def container_env(spec: JobSpec) -> list[dict[str, Any]]:
    """The training container's environment: gpupipe's defaults, the user's, secrets."""
    held = {GPUS_ENV: str(spec.run.gpus_per_node)} if spec.run.gpus_per_node > 0 else {}
    plain = {"GPUPIPE_JOB": spec.name, **DEFAULT_ENV, **held, **spec.cluster.env}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain.items()]
    refs = [(name, *ref.partition("/")[::2]) for name, ref in spec.cluster.secret_env.items()]
    if store := spec.cluster.object_store_secret:
        refs += [(name, store, key) for key, name in OBJECT_STORE_ENV.items()]
    env += [
        {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": False}},
        }
        for name, secret, key in refs
    ]
    return env


def container_resources(spec: JobSpec) -> dict[str, Any]:
    """Requests and limits of the training container (GPUs as limits only)."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for kind in ("cpu", "memory"):
        if (req := getattr(spec.cluster, f"{kind}_request")) is not None:
            requests[kind] = req
        if (lim := getattr(spec.cluster, f"{kind}_limit")) is not None:
            limits[kind] = lim
    if spec.run.gpus_per_node > 0:
        # Extended resources are limits only; the API server copies them to requests.
        limits[spec.cluster.gpu_resource] = str(spec.run.gpus_per_node)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def pod_volumes(spec: JobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, the training container's mounts): memory-backed /dev/shm, and a writable /tmp
    under the read-only root."""
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.cluster.shm_size}},
        {"name": "tmp", "emptyDir": {}},
    ]
    return volumes, mounts


def pod_placement(spec: JobSpec) -> dict[str, Any]:
    """The pod spec's identity and placement: service account, pull secrets, node selector,
    tolerations and, with ``one_worker_per_node``, an anti-affinity among the job's pods (each
    only where set)."""
    c = spec.cluster
    pod: dict[str, Any] = {}
    if c.service_account is not None:
        pod["serviceAccountName"] = c.service_account
    if c.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in c.image_pull_secrets]
    if c.node_selector:
        pod["nodeSelector"] = dict(c.node_selector)
    if spec.tolerations:
        pod["tolerations"] = spec.tolerations
    if c.one_worker_per_node:
        pod["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {LABEL_JOB: spec.name}}, "topologyKey": HOSTNAME}
        ]}}  # fmt: skip
    return pod


def container_security_context() -> dict[str, Any]:
    """The restricted Pod Security Standard for the training container."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def pod_security_context() -> dict[str, Any]:
    """The restricted Pod Security Standard for the pod: non-root, RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
