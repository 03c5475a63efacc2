"""The job of a training run on a cluster: the step's cluster settings and one typed
:class:`JobSpec`.

:class:`ClusterConfig` holds what a user sets for the cluster jobs of a step (with the pod's
defaults) and checks it when the step's config is read, before anything is written or created;
a :class:`JobSpec` is those settings for one :class:`~trainer.launch.TrainingRun` in one
namespace. The resources that carry a spec are built from the pod pieces in
:mod:`trainer.launch.podspec`: :func:`trainer.launch.pytorchjob.build_pytorchjob` (Training
Operator ``kubeflow.org/v1``) and :func:`trainer.launch.trainjob.build_trainjob` (Kubeflow
Trainer ``trainer.kubeflow.org/v1alpha1``).

Everything is plain dicts (no ``kubernetes`` or ``kubeflow.training`` import), so this module
works in the bare trainer image and in tests; the tests validate every generated job against the
upstream CRD schemas. Everything a user can get wrong is checked here, before the API server or the
operator sees it, with an :class:`~trainer.errors.InputError` naming the ``train.cluster.<field>``
(which the pipeline's parameter check reports as the pipeline parameter that set it).

Decisions worth knowing:

- The container command is ``python -m trainer.launch -m trainer.worker --config <uri>``: torchrun
  inside a wrapper that maps the exit code (2 bad input, 143 preempted) so that
  ``restartPolicy: ExitCode`` can tell them apart (torchrun alone reports every failure as 1). No
  ``--nnodes``/``--nproc_per_node``: torchrun reads the ``PET_*`` variables the operator injects
  from ``spec.nprocPerNode`` and the replica counts, so the counts live in one place.
- One process per GPU, and one per node without GPUs: the count follows from the run's
  ``gpus_per_node`` alone (fewer processes idle GPUs that were paid for; more make NCCL fail on
  duplicate devices).
- Job names leave room for the operator's pod and service names (``<job>-worker-<i>`` must be a
  63-character DNS label too), so :func:`job_name` makes names of at most 48 characters.
- The root filesystem is read-only; ``/tmp`` is a writable emptyDir and ``HOME`` points there, so
  caches (torch, triton, matplotlib) still work.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import ClassVar, Literal

from trainer.base.redact import secret_name
from trainer.base.typedconfig import require
from trainer.launch import TrainingRun
from trainer.launch.kubefields import (
    DNS1035,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_NAME,
    RuntimeRef,
    check_dns,
    check_label_key,
    check_labels,
    parse_quantity,
)
from trainer.launch.queue import PRIORITY_LABEL, QUEUE_LABEL

LABEL_APP = "app.kubernetes.io/name"
LABEL_JOB = "gpupipe.dev/job"
ISTIO_INJECT = "sidecar.istio.io/inject"
METRICS_PORT = 9464
"""Port of a cluster job's Prometheus endpoint (the train step sets the worker's
``metrics.port`` to it; the exporter port OpenTelemetry's Prometheus exporter also uses)."""
METRICS_PORT_NAME = "metrics"
"""Name of that container port (a PodMonitor selects it by name)."""
SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
"""The annotations that Prometheus' usual ``kubernetes-pods`` scrape config reads."""
"""An Istio sidecar keeps a finished pod running (the job never completes) and blocks NCCL ports."""
MAX_JOB_NAME_LEN = 48
"""What :func:`job_name` produces at most: 63 minus ``-worker-`` minus up to 7 index digits."""
WORKER_COMMAND = ["python", "-m", "trainer.launch", "-m", "trainer.worker", "--config"]
"""The training command of every replica (torchrun via :mod:`trainer.launch.torchrun`); the URI
follows."""


def worker_command(run: TrainingRun) -> list[str]:
    """The command of every replica of ``run``'s job: :data:`WORKER_COMMAND` with the run's
    module (``trainer.worker`` unless the run names another), its config URI and arguments."""
    return [*WORKER_COMMAND[:4], run.module, "--config", run.config_uri, *run.args]


SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
"""A key of a Kubernetes Secret's data."""
GPUS_ENV = "GPUPIPE_GPUS_PER_NODE"
"""The GPUs a job's pod holds (its GPU limit), which the worker checks that torch finds
(trainer.distributed.dist.check_gpus_found): the downward API exposes no extended resource."""
RESERVED_ENV = ("GPUPIPE_JOB", GPUS_ENV, "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
"""Set by gpupipe or the operator; a user value would silently break rendezvous or logs."""
OBJECT_STORE_ENV = {"accesskey": "AWS_ACCESS_KEY_ID", "secretkey": "AWS_SECRET_ACCESS_KEY"}
"""Keys of KFP's artifact-store secret (``mlpipeline-minio-artifact``) -> environment variables."""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
"""Lets GPU pods onto nodes tainted for GPU work (the common cloud setup)."""
SHM_SIZE = "16Gi"
"""Memory-backed /dev/shm of a training pod (the 64 MB container default crashes NCCL and data
loaders): every PyTorchJob replica, and the pipeline's in-step train pod."""
TRAIN_POD_RESOURCES = {
    "cpu_request": "4",
    "cpu_limit": "16",
    "memory_request": "16Gi",
    "memory_limit": "64Gi",
}
"""CPU and memory of a training pod: every PyTorchJob replica, and the in-step train pod."""

# --------------------------------------------------------------------------------------------
# The cluster settings of a step
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """Where and how the ``pytorchjob`` and ``trainjob`` launchers run the job (ignored by the
    local launcher).

    The step's config carries it (``train.cluster``, ``tune.train.cluster``); its defaults are
    the pod's defaults. With a run and a namespace it makes the job's :class:`JobSpec`, for the
    launcher, the Katib trial template and ``gpupipe render`` alike. The run's size (nodes, GPUs
    per node) is not here: it travels with the :class:`~trainer.launch.TrainingRun`.
    """

    SECTION: ClassVar[str] = "train.cluster"
    """Where these settings sit in the step's config: the errors name ``<SECTION>.<field>``."""

    namespace: str | None = None
    """Namespace of the job; ``None``: the launcher pod's own (downward API)."""
    image: str = ""
    """Image of the job's pods (the component sets the package's CUDA or CPU image)."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource that counts GPUs (``nvidia.com/gpu``, ``amd.com/gpu``, a MIG profile).
    (Pipeline parameter ``gpu_type``.)"""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Node labels of the GPU nodes, e.g. ``{"nvidia.com/gpu.product": "NVIDIA-H200"}``.
    (Pipeline parameter ``gpu_node_selector``.)"""
    object_store_secret: str | None = None
    """Secret with ``accesskey``/``secretkey`` of the artifact store, as AWS_* env vars; pods do
    not start without it (a clear event instead of a late 403)."""
    cpu_request: str | None = TRAIN_POD_RESOURCES["cpu_request"]
    """CPU request per pod (Kubernetes quantity)."""
    cpu_limit: str | None = TRAIN_POD_RESOURCES["cpu_limit"]
    """CPU limit per pod."""
    memory_request: str | None = TRAIN_POD_RESOURCES["memory_request"]
    """Memory request per pod."""
    memory_limit: str | None = TRAIN_POD_RESOURCES["memory_limit"]
    """Memory limit per pod; the memory-backed ``/dev/shm`` counts against it."""
    shm_size: str = SHM_SIZE
    """Memory-backed /dev/shm (the 64 MB container default crashes NCCL and data loaders)."""
    on_exit: Literal["delete", "keep", "suspend"] = "delete"
    """What happens to the job when the step fails, times out or is cancelled."""
    service_account: str | None = None
    """Service account of the job's pods (none needed for reading the object store by secret)."""
    runtime: str = "torch-distributed"
    """TrainJob only: the training runtime, ``<name>`` (a ClusterTrainingRuntime) or
    ``TrainingRuntime/<name>`` (one in the job's namespace). (Pipeline parameter
    ``trainer_runtime``.)"""
    runtime_patches: bool = True
    """TrainJob only: carry /dev/shm, /tmp, security contexts, placement, pull secrets, the
    service account and the pods' labels in ``spec.runtimePatches``; ``False``: the runtime must
    set them (its pods labelled ``app.kubernetes.io/name: gpupipe`` where manifests/kfp's
    NetworkPolicy guards the object store)."""
    image_pull_secrets: list[str] = field(default_factory=list)
    """Docker-registry secrets (in the job's namespace) for a private registry. (Pipeline
    parameter ``image_pull_secrets``.)"""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables of the training container, e.g. ``NCCL_SOCKET_IFNAME``,
    ``NCCL_DEBUG``; they override gpupipe's defaults (``HOME``,
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING``); launcher=local's workers get them too.
    ``GPUPIPE_ALLOW_NO_CUDA=1``: a pod that holds GPUs trains on the CPU when torch finds no
    CUDA device (else ``E_NO_CUDA``). (Pipeline parameter ``job_env``.)"""
    secret_env: dict[str, str] = field(default_factory=dict)
    """Environment variables of the training container taken from Kubernetes Secrets in the
    job's namespace, ``{"HF_TOKEN": "hf-account/token"}`` (``<secret>/<key>``): the pod spec
    carries a ``secretKeyRef``, never the value. A secret-named variable in ``env`` is refused:
    it would be a plain value in the pod spec that anyone who reads pods sees."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels of the job and its pods, e.g. Kueue's ``kueue.x-k8s.io/queue-name``.
    (Pipeline parameter ``job_labels``.)"""
    annotations: dict[str, str] = field(default_factory=dict)
    """Extra annotations of the job and its pods, e.g. ``karpenter.sh/do-not-disrupt``.
    (Pipeline parameter ``job_annotations``.)"""
    one_worker_per_node: bool = False
    """Place the job's pods on different nodes (a required pod anti-affinity on
    ``kubernetes.io/hostname`` among the job's own pods), as production multi-node jobs want: a
    node's loss then takes one worker, and no two workers share a node's network or GPUs' PCIe
    switch. A job of more nodes than the cluster has stays Pending (the launcher says why).
    (Pipeline parameter ``one_worker_per_node``.)"""
    gpu_node_check: bool = True
    """Before a GPU job is created, read the nodes' allocatable ``gpu_resource`` and refuse the
    job (``E_NO_GPU_NODE``) when no node with ``node_selector``'s labels has as many as a pod
    asks: it would wait for ever. Set false where a cluster autoscaler adds GPU nodes when pods
    ask for them (none may exist before). The check needs the ClusterRole of manifests/rbac
    (list nodes); without it the job is created unchecked."""
    gang_queue: str | None = None
    """Kueue's LocalQueue for the job (its ``kueue.x-k8s.io/queue-name`` label; PyTorchJob,
    TrainJob and Katib's trial jobs alike): Kueue starts the job only when all of its pods fit
    the queue's quota, so two jobs never each hold half their pods. While it waits, the step
    logs its place in the queue and Kueue's reason; a job the queue can never admit fails the
    step (``E_QUEUE_REFUSED``). (Pipeline parameter ``gang_queue``.)"""
    gang_priority_class: str | None = None
    """Kueue's WorkloadPriorityClass of the job (its ``kueue.x-k8s.io/priority-class`` label):
    the order of admission and preemption under contention. (Pipeline parameter
    ``gang_priority_class``.)"""

    def __post_init__(self) -> None:
        # Checked here, when the step's config is read: before any output or job exists.
        RuntimeRef.parse(self.runtime, f"{self.SECTION}.runtime")
        require(
            not any(c.isspace() for c in self.image),
            f"{self.SECTION}.image",
            "must be an image reference without spaces",
            self.image,
        )
        check_label_key(self.gpu_resource, f"{self.SECTION}.gpu_resource")
        require(
            "/" in self.gpu_resource,
            f"{self.SECTION}.gpu_resource",
            "must be an extended resource with a domain, like nvidia.com/gpu",
            self.gpu_resource,
        )
        self._check_resources()
        for key, value in self.node_selector.items():
            check_label_key(key, f"{self.SECTION}.node_selector")
            require(
                isinstance(value, str),
                f"{self.SECTION}.node_selector[{key}]",
                "must be a string",
                value,
            )
        names: list[tuple[str, str | None, str]] = [
            ("object_store_secret", self.object_store_secret or None, "a secret name"),
            ("service_account", self.service_account, "a service account name"),
            ("gang_priority_class", self.gang_priority_class, "a WorkloadPriorityClass name"),
        ]
        names += [("image_pull_secrets", s, "a secret name") for s in self.image_pull_secrets]
        for name, given, what in names:
            if given is not None:
                check_dns(given, f"{self.SECTION}.{name}", DNS1123_SUBDOMAIN, what, 253)
        self._check_env()
        check_labels(self.labels, f"{self.SECTION}.labels", reserved=(LABEL_APP, LABEL_JOB))
        for key, value in self.annotations.items():
            check_label_key(key, f"{self.SECTION}.annotations")
            require(
                isinstance(value, str),
                f"{self.SECTION}.annotations[{key}]",
                "must be a string",
                value,
            )
        require(
            self.gang_queue is None or bool(self.gang_queue.strip()),
            f"{self.SECTION}.gang_queue",
            "must not be empty",
            self.gang_queue,
        )
        if self.gang_queue is not None:
            check_dns(self.gang_queue, f"{self.SECTION}.gang_queue", DNS1123_SUBDOMAIN,
                      "a LocalQueue name", 253)  # fmt: skip
        for name, key in (("gang_queue", QUEUE_LABEL), ("gang_priority_class", PRIORITY_LABEL)):
            given, labelled = getattr(self, name), self.labels.get(key)
            require(
                given is None or labelled is None or given == labelled,
                f"{self.SECTION}.{name}",
                f"differs from the label {key}={labelled!r} in labels: set it once",
                given,
            )

    def _check_resources(self) -> None:
        values: dict[str, Decimal] = {}
        for name in ("cpu_request", "cpu_limit", "memory_request", "memory_limit", "shm_size"):
            text = getattr(self, name)
            if text is not None:
                values[name] = parse_quantity(text, f"{self.SECTION}.{name}")
        for kind in ("cpu", "memory"):
            req, lim = values.get(f"{kind}_request"), values.get(f"{kind}_limit")
            require(
                req is None or lim is None or req <= lim,
                f"{self.SECTION}.{kind}_request",
                f"must be <= {self.SECTION}.{kind}_limit={getattr(self, f'{kind}_limit')}",
                getattr(self, f"{kind}_request"),
            )
        # Pages of a memory-backed emptyDir are charged to the pod: a /dev/shm larger than the
        # memory limit would let the kernel OOM-kill the trainer instead of failing the write.
        lim = values.get("memory_limit")
        require(
            lim is None or values["shm_size"] <= lim,
            f"{self.SECTION}.shm_size",
            f"must be <= {self.SECTION}.memory_limit={self.memory_limit} (/dev/shm counts "
            "against it)",
            self.shm_size,
        )

    def _check_env(self) -> None:
        for name, value in self.env.items():
            require(
                bool(ENV_NAME.match(name)),
                f"{self.SECTION}.env",
                "must use environment variable names",
                name,
            )
            require(
                name not in RESERVED_ENV and not name.startswith("PET_"),
                f"{self.SECTION}.env",
                "must not set a variable owned by gpupipe or the training operator",
                name,
            )
            require(
                not (self.object_store_secret and name in OBJECT_STORE_ENV.values()),
                f"{self.SECTION}.env",
                f"must not set a variable read from object_store_secret "
                f"{self.object_store_secret!r}",
                name,
            )
            require(
                isinstance(value, str), f"{self.SECTION}.env[{name}]", "must be a string", value
            )
            require(
                not secret_name(name),
                f"{self.SECTION}.env",
                "must not carry a secret as a plain value (the pod spec shows it to anyone who "
                f"reads pods): name its Secret in {self.SECTION}.secret_env, "
                '{"NAME": "<secret>/<key>"}, which the pod reads through secretKeyRef',
                name,
            )
        for name, ref in self.secret_env.items():
            require(
                bool(ENV_NAME.match(name)) and name not in self.env,
                f"{self.SECTION}.secret_env",
                f"must use environment variable names not also in {self.SECTION}.env",
                name,
            )
            require(
                name not in RESERVED_ENV
                and not name.startswith("PET_")
                and name not in OBJECT_STORE_ENV.values(),
                f"{self.SECTION}.secret_env",
                "must not set a variable owned by gpupipe, the training operator or the store",
                name,
            )
            secret, _, key = str(ref).partition("/")
            require(
                bool(secret) and bool(key) and "/" not in key,
                f"{self.SECTION}.secret_env[{name}]",
                "must be <secret>/<key>",
                ref,
            )
            where = f"{self.SECTION}.secret_env[{name}]"
            check_dns(secret, where, DNS1123_SUBDOMAIN, "a secret name", 253)
            require(
                bool(SECRET_KEY.match(key)),
                f"{self.SECTION}.secret_env[{name}]",
                "must name a Secret key (letters, digits, '-', '_', '.')",
                key,
            )


# --------------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """Everything that decides the job of one training run (a PyTorchJob or a TrainJob): the
    run, the namespace it runs in and the step's cluster settings."""

    namespace: str
    """Namespace of the job (and of its secrets, service account and owner)."""
    run: TrainingRun
    """The run: job name, worker config URI, nodes, GPUs per node, deadline."""
    cluster: ClusterConfig
    """The step's cluster settings (checked when they were made)."""

    def __post_init__(self) -> None:
        run = self.run
        require(run.nnodes >= 1, "job.nnodes", "must be >= 1", run.nnodes)
        require(run.gpus_per_node >= 0, "job.gpus_per_node", "must be >= 0", run.gpus_per_node)
        require(
            run.timeout_s is None or run.timeout_s > 0,
            "job.active_deadline_s",
            "must be > 0 or null",
            run.timeout_s,
        )
        longest_pod = "-master-0" if run.nnodes == 1 else f"-worker-{run.nnodes - 2}"
        check_dns(
            run.job_name,
            "job.name",
            DNS1035,
            f"a DNS-1035 label that leaves room for the pod name suffix {longest_pod!r}",
            63 - len(longest_pod),
        )
        check_dns(self.namespace, "job.namespace", DNS1123_LABEL, "a namespace name", 63)
        require(
            bool(self.cluster.image),
            f"{self.cluster.SECTION}.image",
            "must be set",
            self.cluster.image,
        )
        require(bool(run.config_uri), "job.config_uri", "must be set", run.config_uri)

    @property
    def name(self) -> str:
        """The job's name (the run's)."""
        return self.run.job_name

    @property
    def procs_per_node(self) -> int:
        """Processes per node: one per GPU, else 1."""
        return self.run.procs_per_node

    @property
    def tolerations(self) -> list[dict[str, str]]:
        """The pods' tolerations: the GPU taint's, when the job asks for GPUs."""
        return [dict(GPU_TOLERATION)] if self.run.gpus_per_node > 0 else []


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


RUN_ID_ENV = "KFP_RUN_ID"
"""The KFP run's id, from the step pod's ``pipeline/runid`` label (downward API; the pipeline sets
it on the steps that name jobs). Never a parameter of a cached step: KFP's driver puts a
parameter's resolved value into the cache key, and a run id there makes every run a cache miss."""


def run_id(given: str = "") -> str:
    """The run id a step names its jobs from: ``given`` (a parameter, kept for pipelines that pass
    one), else :data:`RUN_ID_ENV`, else ``local`` (outside KFP's backend)."""
    return given or os.environ.get(RUN_ID_ENV, "") or "local"


def job_name(run_id: str, task_name: str, prefix: str = "gpupipe") -> str:
    """The job name of one task of one run: the same inputs always give the same name.

    A retried or restarted launcher computes the same name and re-attaches to its job instead of
    creating a second one. The name reads ``<prefix>-<task>-<run id start>-<hash>``, where the
    hash is 10 hex digits of the SHA-256 of run id and task, so different runs get different
    names even when their readable parts are cut short.

    Args:
        run_id: the KFP run (pipeline job) id.
        task_name: the pipeline task's name.
        prefix: leading word of the name.

    Returns:
        A DNS-1035 label of at most :data:`MAX_JOB_NAME_LEN` characters.

    Raises:
        InputError: ``run_id`` or ``task_name`` is empty.
    """
    require(bool(run_id), "job_name.run_id", "must not be empty", run_id)
    require(bool(task_name), "job_name.task_name", "must not be empty", task_name)
    digest = hashlib.sha256(f"{run_id}\x00{task_name}".encode()).hexdigest()[:10]
    readable = "-".join(p for p in (_slug(prefix), _slug(task_name), _slug(run_id)[:8]) if p)
    if not readable[:1].isalpha():
        readable = f"j-{readable}".rstrip("-")
    readable = readable[: MAX_JOB_NAME_LEN - len(digest) - 1].rstrip("-")
    return f"{readable}-{digest}"
