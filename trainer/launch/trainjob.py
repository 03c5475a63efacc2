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
backoff policy, pod clean-up and gang scheduling (see the README).

Trainer's torch plugin injects ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the
pod's completion index) and ``PET_MASTER_ADDR``/``PORT`` (``<job>-node-0-0.<job>:29500``) into
the ``node`` container, so ``python -m trainer.launch -m trainer.worker`` runs unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from trainer.base.typedconfig import require
from trainer.launch.joblauncher import ClusterJobLauncher
from trainer.launch.jobspec import WORKER_COMMAND, JobSpec
from trainer.launch.kube import TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS, KubeApi
from trainer.launch.kube import TRAINJOB_API_CALLS as API_CALLS
from trainer.launch.kubefields import RuntimeRef
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
)

__all__ = [
    "API_CALLS",
    "LaunchCancelled",
    "PodRef",
    "RuntimeRef",
    "TrainJobLauncher",
    "build_trainjob",
    "trainjob_state",
]

log = logging.getLogger(__name__)

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
    require(
        spec.scheduling is None,
        "job.scheduling",
        "cannot be set on a TrainJob: gang scheduling is the runtime's podGroupPolicy (or Kueue's)",
        spec.scheduling,
    )
    # JobSet names node pods <job>-node-0-<index>-<5 random characters>, and its webhook refuses
    # the JobSet (which Trainer creates after admitting the TrainJob) when that name could pass 63
    # characters: the TrainJob would stay without pods.
    suffix = f"-{NODE}-0-{spec.nnodes - 1}-xxxxx"
    require(
        len(spec.name) + len(suffix) <= 63,
        "job.name",
        f"leaves no room for JobSet's pod name suffix {suffix!r} (at most "
        f"{63 - len(suffix)} characters)",
        spec.name,
    )


def _runtime_patch(spec: JobSpec) -> dict[str, Any]:
    """What the TrainJob API has no field for, as a patch of the runtime's ``node`` job."""
    volumes, mounts = pod_volumes(spec)
    pod: dict[str, Any] = {
        "securityContext": pod_security_context(spec),
        "volumes": volumes,
        "containers": [
            {
                "name": NODE,
                "volumeMounts": mounts,
                "securityContext": container_security_context(spec),
            }
        ],
    }
    if spec.service_account is not None:
        pod["serviceAccountName"] = spec.service_account
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [dict(t) for t in spec.tolerations]
    template = {
        "metadata": {"labels": job_labels(spec), "annotations": pod_annotations(spec)},
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


def build_trainjob(
    spec: JobSpec, *, runtime: RuntimeRef | None = None, runtime_patches: bool = True
) -> dict[str, Any]:
    """The TrainJob of ``spec``, as the dict to send to the API server.

    Args:
        spec: a validated job spec (the one a PyTorchJob would be built from).
        runtime: the training runtime; ``None``: the ``torch-distributed``
            ClusterTrainingRuntime.
        runtime_patches: carry the pod settings the TrainJob API has no field for in
            ``spec.runtimePatches``; ``False``: leave them to the runtime (a cluster whose
            runtime already sets them, or whose admission refuses patches).

    Returns:
        A complete ``trainer.kubeflow.org/v1alpha1`` TrainJob that validates against the
        upstream CRD schema and its CEL rules.

    Raises:
        InputError: ``spec`` asks for something a TrainJob cannot carry (``job.scheduling``),
            or its name leaves no room for JobSet's pod hostnames (``job.name``).
    """
    _check(spec)
    runtime = runtime or RuntimeRef()
    metadata: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": job_labels(spec),
    }
    if spec.annotations:
        metadata["annotations"] = dict(spec.annotations)
    if owners := owner_references(spec):
        metadata["ownerReferences"] = owners
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": [*WORKER_COMMAND, spec.config_uri],
        "env": container_env(spec),
        "numNodes": spec.nnodes,
        "numProcPerNode": spec.procs_per_node,
    }
    if resources := container_resources(spec):
        trainer["resourcesPerNode"] = resources
    body: dict[str, Any] = {
        "runtimeRef": {"name": runtime.name, "apiGroup": TRAINER_GROUP, "kind": runtime.kind},
        "trainer": trainer,
    }
    if runtime_patches:
        body["runtimePatches"] = [_runtime_patch(spec)]
    if spec.active_deadline_s is not None:
        body["activeDeadlineSeconds"] = spec.active_deadline_s
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": body}


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


class _TrainJob(Resource):
    """A TrainJob on the watch loop: its state is logged and its node-0 pod's log streamed."""

    kind = "TrainJob"
    kubectl = "trainjob"
    group = TRAINER_GROUP
    version = TRAINER_VERSION
    plural = TRAINJOBS

    def __init__(self, api: KubeApi, namespace: str, name: str, log_tail: int) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.log_tail = log_tail
        self.reported: str | None = None
        self.pod: dict[str, Any] | None = None
        self.node0 = self._log(reattached=False)

    def _log(self, *, reattached: bool) -> PodLog:
        return PodLog(
            self.api, self.namespace, tail=self.log_tail, reattached=reattached, container=NODE
        )

    def state(self, obj: Mapping[str, Any]) -> str:
        return trainjob_state(obj)

    def observe(self, obj: dict[str, Any], state: str) -> bool:
        if state != self.reported:
            log.info("TrainJob %s/%s: %s", self.namespace, self.name, state)
            self.reported = state
        self.pod = self.node0_pod()
        self.node0.pump(self.pod)
        return state in TERMINAL

    def on_adopt(self) -> None:
        # A re-attached launcher shows the recent past, not hours of an earlier attempt's log.
        self.node0 = self._log(reattached=True)

    def describe(self, state: str) -> str:
        return f"train.timeout_s; it was {state}"

    def resume_patch(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        if (obj.get("spec") or {}).get("suspend"):
            return {"spec": {"suspend": False}}
        return None

    def suspend_patch(self) -> dict[str, Any] | None:
        return {"spec": {"suspend": True}}

    def node0_pod(self) -> dict[str, Any] | None:
        """The live pod of node 0 (the newest, while JobSet or the Job replaces one).

        Selected by JobSet's labels (the TrainJob's JobSet, its ``node`` replicated job, job
        index 0), then by the Indexed Job's completion index 0, read from the annotation that
        every Kubernetes version writes (the label exists only since 1.28).
        """
        selector = (
            f"{JOBSET_NAME_LABEL}={self.name},{REPLICATED_JOB_LABEL}={NODE},{JOB_INDEX_LABEL}=0"
        )
        pods = [
            p
            for p in self.api.list_pods(self.namespace, selector, self.name)
            if _completion_index(p) in (None, "0")
        ]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")] or pods
        if not live:
            return None
        return max(live, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))


def _completion_index(pod: Mapping[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    found = (meta.get("annotations") or {}).get(COMPLETION_INDEX)
    return found if found is not None else (meta.get("labels") or {}).get(COMPLETION_INDEX)


class TrainJobLauncher(ClusterJobLauncher):
    """Runs the training job as a Kubeflow Trainer v2 TrainJob and waits for its outcome.

    The same behaviour as :class:`~trainer.launch.pytorchjob.PyTorchJobLauncher`, on the same
    loop: a deterministic name (a retried step re-attaches; a finished job is reported, a
    suspended one resumed through ``spec.suspend``), the node-0 pod's log streamed into this
    step's stdout, a deadline, SIGTERM, and ``on_exit`` (``delete``, ``keep`` or ``suspend``)
    when the job fails, the deadline passes or the step is cancelled.

    Args:
        namespace: namespace of the job (the launcher pod's, for the ownerReference).
        cluster: the step's cluster settings, which :meth:`launch` turns into a
            :class:`JobSpec` (and whose ``runtime`` and ``runtime_patches`` it uses).
        api: the Kubernetes API; ``None``: in-cluster config, else the kubeconfig.
        on_exit: what to do with the job on failure, deadline and cancellation.
        poll_s: seconds between looks at the job and its log.
        log_tail: node-0 log lines kept for a failure's message.
        own_pod: the launcher's pod; the job gets an ownerReference to it.

    Raises:
        ValueError: an argument is out of range.
    """

    @property
    def runtime(self) -> RuntimeRef:
        """The training runtime ``cluster.runtime`` names (checked when the settings were made)."""
        return RuntimeRef.parse(self.cluster.runtime)

    def run(self, spec: JobSpec, *, timeout_s: float | None) -> None:
        """Create (or re-attach to) the TrainJob of ``spec``; return when it succeeded.

        Raises:
            ValueError: ``spec`` is for another namespace.
            InputError, RuntimeError, TimeoutError: as :meth:`launch`.
        """
        self.check_namespace(spec)
        body = build_trainjob(
            spec, runtime=self.runtime, runtime_patches=self.cluster.runtime_patches
        )
        job = _TrainJob(self.api, self.namespace, spec.name, self.log_tail)
        watch = self.watch(job, spec.name, timeout_s)
        found = watch.run(body)
        if watch.state == "Succeeded":
            log.info("TrainJob %s succeeded", watch.ref)
            return
        diagnosis = watch.diagnose(
            found, pod=job.pod, pod_log=job.node0, container=NODE, role="node 0"
        )
        done = watch.apply_on_exit()
        if job.node0.errors:
            log.error("%s\n%s", diagnosis, done)
            raise job.node0.errors[0]
        raise RuntimeError(f"{diagnosis}\n{done}")
