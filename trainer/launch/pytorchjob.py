"""The PyTorchJob launcher: a :class:`~trainer.launch.jobspec.JobSpec` built into a Training
Operator job (:func:`build_pytorchjob`) and run on the one watch loop
(:mod:`trainer.launch.watch`), its master's log streamed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainer.launch import podspec
from trainer.launch.joblauncher import ClusterJobLauncher, JobResource
from trainer.launch.jobspec import JobSpec, worker_command
from trainer.launch.kube import JOB_NAME_LABEL, PLURAL, VERSION
from trainer.launch.kube import PYTORCHJOB_API_CALLS as API_CALLS
from trainer.launch.owners import PodRef
from trainer.launch.queue import queue_of
from trainer.launch.watch import LaunchCancelled, job_state

__all__ = [
    "API_CALLS",
    "LaunchCancelled",
    "PodRef",
    "PyTorchJobLauncher",
    "build_pytorchjob",
    "job_state",
]

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER_NAME = "pytorch"
"""The operator injects its variables into the container of this name only."""
PORT_NAME = "pytorchjob-port"
"""The operator takes ``MASTER_PORT`` from the container port of this name."""
MASTER_PORT = 23456
"""Rendezvous port of the master (the operator's default)."""
RESTART_POLICY = "ExitCode"
"""Exit codes 1-127 (bad input, bugs) fail the job, 128-255 (signals, preemption) restart the
pod. ``Always`` would restart a finished pod forever."""
RUN_POLICY = {"cleanPodPolicy": "Running", "backoffLimit": 3, "ttlSecondsAfterFinished": 86400}
"""``Running``: pods still running when the job ends are deleted (their GPUs freed), failed pods
kept for their logs; three pod restarts under :data:`RESTART_POLICY`; the operator deletes the
finished job after a day."""


def _pod_template(spec: JobSpec, labels: dict[str, str]) -> dict[str, Any]:
    volumes, mounts = podspec.pod_volumes(spec)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.cluster.image,
        "command": worker_command(spec.run),
        "env": podspec.container_env(spec),
        "ports": [
            {"name": PORT_NAME, "containerPort": MASTER_PORT, "protocol": "TCP"},
            *podspec.metrics_ports(spec),
        ],
        "resources": podspec.container_resources(spec),
        "volumeMounts": mounts,
        "securityContext": podspec.container_security_context(),
    }
    pod: dict[str, Any] = {
        "securityContext": podspec.pod_security_context(),
        # Training never calls the Kubernetes API: no token in its pods.
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": volumes,
        **podspec.pod_placement(spec),
    }
    return {
        "metadata": {"labels": dict(labels), "annotations": podspec.pod_annotations(spec)},
        "spec": pod,
    }


def build_pytorchjob(spec: JobSpec) -> dict[str, Any]:
    """The PyTorchJob of ``spec``, as the dict to send to the API server.

    Args:
        spec: a validated job spec.

    Returns:
        A complete ``kubeflow.org/v1`` PyTorchJob (apiVersion, kind, metadata, spec) that
        validates against the upstream CRD schema and the operator's webhook rules.
    """
    metadata = podspec.job_metadata(spec)
    replicas: dict[str, Any] = {
        "Master": {
            "replicas": 1,
            "restartPolicy": RESTART_POLICY,
            "template": _pod_template(spec, podspec.job_labels(spec)),
        }
    }
    if spec.run.nnodes > 1:
        replicas["Worker"] = {
            "replicas": spec.run.nnodes - 1,
            "restartPolicy": RESTART_POLICY,
            "template": _pod_template(spec, podspec.job_labels(spec)),
        }
    run_policy: dict[str, Any] = dict(RUN_POLICY)
    if spec.run.timeout_s is not None:
        run_policy["activeDeadlineSeconds"] = spec.run.timeout_s
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "nprocPerNode": str(spec.procs_per_node),
            "pytorchReplicaSpecs": replicas,
            "runPolicy": run_policy,
        },
    }


class _PyTorchJob(JobResource):
    """A PyTorchJob on the watch loop: its master's log is streamed."""

    kind = "PyTorchJob"
    kubectl = "pytorchjob"
    version = VERSION
    plural = PLURAL
    container = CONTAINER_NAME

    def resume_patch(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        # A queued job is Kueue's to start: resuming it would run it past the queue.
        if queue_of(obj) is None and ((obj.get("spec") or {}).get("runPolicy") or {}).get(
            "suspend"
        ):
            return {"spec": {"runPolicy": {"suspend": False}}}
        return None

    def suspend_patch(self) -> dict[str, Any] | None:
        return {"spec": {"runPolicy": {"suspend": True}}}

    def pods(self) -> list[dict[str, Any]]:
        return self.api.master_pods(self.namespace, self.name)

    def all_pods(self) -> list[dict[str, Any]]:
        return self.api.list_pods(self.namespace, f"{JOB_NAME_LABEL}={self.name}", self.name)


class PyTorchJobLauncher(ClusterJobLauncher):
    """Runs the training job as a Training Operator PyTorchJob and waits for its outcome,
    streaming the master's log (see :class:`~trainer.launch.joblauncher.ClusterJobLauncher`)."""

    resource = _PyTorchJob

    def build(self, spec: JobSpec) -> dict[str, Any]:
        return build_pytorchjob(spec)
