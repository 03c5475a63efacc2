"""The PyTorchJob launcher: a :class:`~trainer.launch.jobspec.JobSpec` built into a Training
Operator job (:func:`build_pytorchjob`) and run on the one watch loop
(:mod:`trainer.launch.watch`), its master's log streamed."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from trainer.launch.joblauncher import ClusterJobLauncher
from trainer.launch.jobspec import WORKER_COMMAND, JobSpec
from trainer.launch.kube import PLURAL, VERSION, KubeApi
from trainer.launch.kube import PYTORCHJOB_API_CALLS as API_CALLS
from trainer.launch.podlog import PodLog
from trainer.launch.podspec import (
    container_env,
    container_resources,
    container_security_context,
    job_labels,
    owner_references,
    pod_annotations,
    pod_security_context,
    pod_volumes,
)
from trainer.launch.watch import (
    TERMINAL,
    LaunchCancelled,
    PodRef,
    Resource,
    job_state,
)

__all__ = [
    "API_CALLS",
    "LaunchCancelled",
    "PodRef",
    "PyTorchJobLauncher",
    "build_pytorchjob",
    "job_state",
]

log = logging.getLogger(__name__)

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER_NAME = "pytorch"
"""The operator injects its variables into the container of this name only."""
PORT_NAME = "pytorchjob-port"
"""The operator takes ``MASTER_PORT`` from the container port of this name."""


def _pod_template(spec: JobSpec, labels: dict[str, str]) -> dict[str, Any]:
    volumes, mounts = pod_volumes(spec)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "command": [*WORKER_COMMAND, spec.config_uri],
        "env": container_env(spec),
        "ports": [{"name": PORT_NAME, "containerPort": spec.port, "protocol": "TCP"}],
        "resources": container_resources(spec),
        "volumeMounts": mounts,
        "securityContext": container_security_context(spec),
    }
    pod: dict[str, Any] = {
        "securityContext": pod_security_context(spec),
        "automountServiceAccountToken": spec.automount_service_account_token,
        "containers": [container],
        "volumes": volumes,
    }
    if spec.service_account is not None:
        pod["serviceAccountName"] = spec.service_account
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [dict(t) for t in spec.tolerations]
    return {
        "metadata": {"labels": dict(labels), "annotations": pod_annotations(spec)},
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
    labels = job_labels(spec)
    metadata: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace, "labels": labels}
    if spec.annotations:
        metadata["annotations"] = dict(spec.annotations)
    if owners := owner_references(spec):
        metadata["ownerReferences"] = owners
    replicas: dict[str, Any] = {
        "Master": {
            "replicas": 1,
            "restartPolicy": spec.restart_policy,
            "template": _pod_template(spec, labels),
        }
    }
    if spec.nnodes > 1:
        replicas["Worker"] = {
            "replicas": spec.nnodes - 1,
            "restartPolicy": spec.restart_policy,
            "template": _pod_template(spec, labels),
        }
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": spec.clean_pod_policy,
        "backoffLimit": spec.backoff_limit,
    }
    if spec.active_deadline_s is not None:
        run_policy["activeDeadlineSeconds"] = spec.active_deadline_s
    if spec.ttl_s is not None:
        run_policy["ttlSecondsAfterFinished"] = spec.ttl_s
    if spec.scheduling is not None:
        sched: dict[str, Any] = {}
        if spec.scheduling.queue is not None:
            sched["queue"] = spec.scheduling.queue
        if spec.scheduling.priority_class is not None:
            sched["priorityClass"] = spec.scheduling.priority_class
        if spec.scheduling.min_available is not None:
            sched["minAvailable"] = spec.scheduling.min_available
        run_policy["schedulingPolicy"] = sched
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


class _PyTorchJob(Resource):
    """A PyTorchJob on the watch loop: its state is logged and its master's log streamed."""

    kind = "PyTorchJob"
    kubectl = "pytorchjob"
    version = VERSION
    plural = PLURAL

    def __init__(self, api: KubeApi, namespace: str, name: str, log_tail: int) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.log_tail = log_tail
        self.reported: str | None = None
        self.pod: dict[str, Any] | None = None
        self.master = PodLog(api, namespace, tail=log_tail, reattached=False)

    def observe(self, obj: dict[str, Any], state: str) -> bool:
        if state != self.reported:
            log.info("PyTorchJob %s/%s: %s", self.namespace, self.name, state)
            self.reported = state
        self.pod = self.master_pod()
        self.master.pump(self.pod)
        return state in TERMINAL

    def on_adopt(self) -> None:
        # A re-attached launcher shows the recent past, not hours of an earlier attempt's log.
        self.master = PodLog(self.api, self.namespace, tail=self.log_tail, reattached=True)

    def describe(self, state: str) -> str:
        return f"train.timeout_s; it was {state}"

    def resume_patch(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        if ((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"):
            return {"spec": {"runPolicy": {"suspend": False}}}
        return None

    def suspend_patch(self) -> dict[str, Any] | None:
        return {"spec": {"runPolicy": {"suspend": True}}}

    def master_pod(self) -> dict[str, Any] | None:
        """The live master pod (the newest, while the operator replaces one)."""
        pods = self.api.master_pods(self.namespace, self.name)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")] or pods
        if not live:
            return None
        return max(live, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))


class PyTorchJobLauncher(ClusterJobLauncher):
    """Runs the training job as a Training Operator PyTorchJob and waits for its outcome.

    The job is named by the caller from the KFP run and task, so a retried or restarted step
    finds its job and re-attaches instead of creating a second one (a finished job is reported,
    not re-run; a suspended one is resumed). While waiting it streams the master's log into
    this step's stdout. When the job fails, the deadline passes or the step is cancelled
    (SIGTERM), ``on_exit`` decides what happens to the job: ``delete`` it (and its pods),
    ``keep`` it for inspection, or ``suspend`` it (pods go, the job and its state stay).

    Args:
        namespace: namespace of the job (the launcher pod's, for the ownerReference).
        cluster: the step's cluster settings, which :meth:`launch` turns into a
            :class:`JobSpec`; :meth:`run` takes a :class:`JobSpec` as it is.
        api: the Kubernetes API; ``None``: in-cluster config, else the kubeconfig.
        on_exit: what to do with the job on failure, deadline and cancellation.
        poll_s: seconds between looks at the job and its log.
        log_tail: master log lines kept for a failure's message.
        own_pod: the launcher's pod; the job gets an ownerReference to it.

    Raises:
        ValueError: an argument is out of range.
    """

    def run(self, spec: JobSpec, *, timeout_s: float | None) -> None:
        """Create (or re-attach to) the PyTorchJob of ``spec``; return when it succeeded.

        Raises:
            ValueError: ``spec`` is for another namespace.
            InputError, RuntimeError, TimeoutError: as :meth:`launch`.
        """
        self.check_namespace(spec)
        job = _PyTorchJob(self.api, self.namespace, spec.name, self.log_tail)
        watch = self.watch(job, spec.name, timeout_s)
        found = watch.run(build_pytorchjob(spec))
        if watch.state == "Succeeded":
            log.info("PyTorchJob %s succeeded", watch.ref)
            return
        diagnosis = watch.diagnose(found, pod=job.pod, pod_log=job.master, container=CONTAINER_NAME)
        done = watch.apply_on_exit()
        if job.master.errors:
            log.error("%s\n%s", diagnosis, done)
            raise job.master.errors[0]
        raise RuntimeError(f"{diagnosis}\n{done}")
