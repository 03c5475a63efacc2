"""The TrainJob launcher: the same :class:`~trainer.launch.jobspec.JobSpec` as the PyTorchJob one,
built into a Kubeflow Trainer v2 TrainJob (:func:`build_trainjob`) and run on the one watch loop
(:mod:`trainer.launch.watch`), the node-0 pod's log streamed.

A TrainJob names a training runtime (by default the ``torch-distributed``
ClusterTrainingRuntime a Trainer install ships) and carries only what the TrainJob API has fields
for: image, command, environment, nodes, processes and resources per node, the deadline. The rest
of what every gpupipe training pod gets (the memory-backed ``/dev/shm``, a writable ``/tmp`` under a
read-only root, the restricted Pod Security contexts, Istio injection off, tolerations, node
selector, image pull secrets, service account) goes into one runtime patch
(``spec.runtimePatches[]`` keyed by :data:`MANAGER`) on the runtime's ``node`` replicated job.
What neither can carry is the runtime's to set: ``automountServiceAccountToken``, restart and
backoff policy, pod clean-up and gang scheduling (see docs/cluster.md).

Trainer's torch plugin injects ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the
pod's completion index) and ``PET_MASTER_ADDR``/``PORT`` (``<job>-node-0-0.<job>:29500``) into
the ``node`` container, so ``python -m trainer.launch -m trainer.worker`` runs unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainer.base.typedconfig import require
from trainer.launch import podspec
from trainer.launch.joblauncher import ClusterJobLauncher, JobResource
from trainer.launch.jobspec import JobSpec, worker_command
from trainer.launch.kube import TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS
from trainer.launch.kube import TRAINJOB_API_CALLS as API_CALLS
from trainer.launch.kubefields import RuntimeRef
from trainer.launch.owners import PodRef
from trainer.launch.queue import queue_of
from trainer.launch.watch import LaunchCancelled

__all__ = [
    "API_CALLS",
    "LaunchCancelled",
    "PodRef",
    "RuntimeRef",
    "TrainJobLauncher",
    "build_trainjob",
    "trainjob_state",
]

API_VERSION = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
KIND = "TrainJob"
NODE = "node"
"""The trainer's replicated job and container in Trainer's torch runtimes (``constants.Node``):
the torch plugin injects the ``PET_*`` variables into the container of this name."""
MANAGER = "gpupipe.dev/launcher"
"""Our key in ``spec.runtimePatches`` (patches are keyed by manager, e.g. Kueue's own)."""
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""JobSet's label on every pod of a JobSet; Trainer names the JobSet after the TrainJob."""
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""The pod's index in its Indexed Job (an annotation always, a label since Kubernetes 1.28):
Trainer's ``PET_NODE_RANK``."""


def _check(spec: JobSpec) -> None:
    # JobSet names node pods <job>-node-0-<index>-<5 random characters>, and its webhook refuses
    # the JobSet (which Trainer creates after admitting the TrainJob) when that name could pass 63
    # characters: the TrainJob would stay without pods.
    suffix = f"-{NODE}-0-{spec.run.nnodes - 1}-xxxxx"
    require(
        len(spec.name) + len(suffix) <= 63,
        "job.name",
        f"leaves no room for JobSet's pod name suffix {suffix!r} (at most "
        f"{63 - len(suffix)} characters)",
        spec.name,
    )


def _runtime_patch(spec: JobSpec) -> dict[str, Any]:
    """What the TrainJob API has no field for, as a patch of the runtime's ``node`` job."""
    volumes, mounts = podspec.pod_volumes(spec)
    pod: dict[str, Any] = {
        "securityContext": podspec.pod_security_context(),
        "volumes": volumes,
        "containers": [
            {
                "name": NODE,
                "volumeMounts": mounts,
                "securityContext": podspec.container_security_context(),
            }
        ],
        **podspec.pod_placement(spec),
    }
    template = {
        "metadata": {
            "labels": podspec.job_labels(spec),
            "annotations": podspec.pod_annotations(spec),
        },
        "spec": pod,
    }
    return {
        "manager": MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [{"name": NODE, "template": {"spec": {"template": template}}}]
                }
            }
        },
    }


def build_trainjob(spec: JobSpec) -> dict[str, Any]:
    """The TrainJob of ``spec``, as the dict to send to the API server.

    The training runtime is the one ``spec.cluster.runtime`` names; with
    ``spec.cluster.runtime_patches`` the pod settings the TrainJob API has no field for go in
    ``spec.runtimePatches`` (without, they are left to the runtime: a cluster whose runtime
    already sets them, or whose admission refuses patches).

    Args:
        spec: a validated job spec (the one a PyTorchJob would be built from).

    Returns:
        A complete ``trainer.kubeflow.org/v1alpha1`` TrainJob that validates against the
        upstream CRD schema and its CEL rules.

    Raises:
        InputError: ``spec`` asks for something a TrainJob cannot carry (gang scheduling), or
            its name leaves no room for JobSet's pod hostnames (``job.name``).
    """
    _check(spec)
    runtime = RuntimeRef.parse(spec.cluster.runtime)
    trainer: dict[str, Any] = {
        "image": spec.cluster.image,
        "command": worker_command(spec.run),
        "env": podspec.container_env(spec),
        "numNodes": spec.run.nnodes,
        "numProcPerNode": spec.procs_per_node,
    }
    if resources := podspec.container_resources(spec):
        trainer["resourcesPerNode"] = resources
    body: dict[str, Any] = {
        "runtimeRef": {"name": runtime.name, "apiGroup": TRAINER_GROUP, "kind": runtime.kind},
        "trainer": trainer,
    }
    if spec.cluster.runtime_patches:
        body["runtimePatches"] = [_runtime_patch(spec)]
    if spec.run.timeout_s is not None:
        body["activeDeadlineSeconds"] = spec.run.timeout_s
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": podspec.job_metadata(spec),
        "spec": body,
    }


_CONDITION_STATES = (("Failed", "Failed"), ("Complete", "Succeeded"), ("Suspended", "Suspended"))


def trainjob_state(obj: Mapping[str, Any]) -> str:
    """A TrainJob's state in the watch loop's words.

    Trainer writes three condition types: ``Complete`` (-> ``Succeeded``), ``Failed`` and
    ``Suspended`` (``status: "False"`` with reason ``Resumed`` once resumed). Before any of them
    is true the job is ``Running`` when a child Job has active or ready pods
    (``status.jobsStatus``), else ``Pending``.
    """
    conds = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or [] if c}
    for kind, state in _CONDITION_STATES:
        if (conds.get(kind) or {}).get("status") == "True":
            return state
    jobs = (obj.get("status") or {}).get("jobsStatus") or []
    if any((j.get("active") or 0) > 0 or (j.get("ready") or 0) > 0 for j in jobs):
        return "Running"
    return "Pending"


class _TrainJob(JobResource):
    """A TrainJob on the watch loop: its node-0 pod's log is streamed."""

    kind = "TrainJob"
    kubectl = "trainjob"
    group = TRAINER_GROUP
    version = TRAINER_VERSION
    plural = TRAINJOBS
    container = NODE
    # Seen on the test cluster: JobSet's webhook denied the JobSet of a TrainJob whose pod names
    # would pass 63 characters; Trainer retried forever and the TrainJob stayed without pods.
    creation_failed = ("TrainJobResourcesCreationFailed",)

    def state(self, obj: Mapping[str, Any]) -> str:
        return trainjob_state(obj)

    def resume_patch(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        # A queued job is Kueue's to start: resuming it would run it past the queue.
        if queue_of(obj) is None and (obj.get("spec") or {}).get("suspend"):
            return {"spec": {"suspend": False}}
        return None

    def suspend_patch(self) -> dict[str, Any] | None:
        return {"spec": {"suspend": True}}

    def all_pods(self) -> list[dict[str, Any]]:
        return self.api.list_pods(self.namespace, f"{JOBSET_NAME_LABEL}={self.name}", self.name)

    def pods(self) -> list[dict[str, Any]]:
        """The pods of node 0, selected by JobSet's labels (the TrainJob's JobSet, its ``node``
        replicated job, job index 0), then by the Indexed Job's completion index 0, read from
        the annotation that every Kubernetes version writes (the label exists only since 1.28).
        """
        selector = (
            f"{JOBSET_NAME_LABEL}={self.name},{REPLICATED_JOB_LABEL}={NODE},{JOB_INDEX_LABEL}=0"
        )
        return [
            p
            for p in self.api.list_pods(self.namespace, selector, self.name)
            if _completion_index(p) in (None, "0")
        ]


def _completion_index(pod: Mapping[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    found = (meta.get("annotations") or {}).get(COMPLETION_INDEX)
    return found if found is not None else (meta.get("labels") or {}).get(COMPLETION_INDEX)


class TrainJobLauncher(ClusterJobLauncher):
    """Runs the training job as a Kubeflow Trainer v2 TrainJob and waits for its outcome.

    The same behaviour as :class:`~trainer.launch.pytorchjob.PyTorchJobLauncher`, on the same
    loop (see :class:`~trainer.launch.joblauncher.ClusterJobLauncher`): a suspended TrainJob is
    resumed through ``spec.suspend``, and the node-0 pod's log is streamed.
    """

    resource = _TrainJob
    role = "node 0"

    def build(self, spec: JobSpec) -> dict[str, Any]:
        return build_trainjob(spec)
