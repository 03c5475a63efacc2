"""One typed :class:`JobSpec` of a training run on a cluster, and the pod pieces built from it.

The step's cluster settings (:class:`ClusterConfig`, with the pod's defaults) live here too, with
the one mapping from them to a :class:`JobSpec` (:meth:`ClusterConfig.job_spec`). The resources
that carry a spec are built elsewhere, from the pod pieces in :mod:`trainer.launch.podspec`:
:func:`trainer.launch.pytorchjob.build_pytorchjob` (Training Operator ``kubeflow.org/v1``) and
:func:`trainer.launch.trainjob.build_trainjob` (Kubeflow Trainer ``trainer.kubeflow.org/v1alpha1``).

Everything is plain dicts (no ``kubernetes`` or ``kubeflow.training`` import), so this module
works in the bare trainer image and in tests; the tests validate every generated job against the
upstream CRD schemas. Everything a user can get wrong is checked here, before the API server or the
operator sees it, with an :class:`~trainer.errors.InputError` naming the ``job.<field>``.

Decisions worth knowing:

- The container command is ``python -m trainer.launch -m trainer.worker --config <uri>``: torchrun
  inside a wrapper that maps the exit code (2 bad input, 143 preempted) so that
  ``restartPolicy: ExitCode`` can tell them apart (torchrun alone reports every failure as 1). No
  ``--nnodes``/``--nproc_per_node``: torchrun reads the ``PET_*`` variables the operator injects
  from ``spec.nprocPerNode`` and the replica counts, so the counts live in one place.
- With GPUs, one process per GPU: ``nproc_per_node`` defaults to ``gpus_per_node`` and any other
  value is an error (fewer processes idle GPUs that were paid for; more make NCCL fail on
  duplicate devices).
- Job names leave room for the operator's pod and service names (``<job>-worker-<i>`` must be a
  63-character DNS label too), so :func:`job_name` makes names of at most 48 characters.
- The root filesystem is read-only by default; ``/tmp`` is a writable emptyDir and ``HOME`` points
  there, so caches (torch, triton, matplotlib) still work.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from trainer.base.typedconfig import require
from trainer.launch.kubefields import (
    DNS1035,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_NAME,
    SECRET_KEY,
    RuntimeRef,
    check_dns,
    check_label_key,
    check_labels,
    check_toleration,
    parse_quantity,
)

LABEL_APP = "app.kubernetes.io/name"
LABEL_JOB = "gpupipe.dev/job"
ISTIO_INJECT = "sidecar.istio.io/inject"
"""An Istio sidecar keeps a finished pod running (the job never completes) and blocks NCCL ports."""
MAX_JOB_NAME_LEN = 48
"""What :func:`job_name` produces at most: 63 minus ``-worker-`` minus up to 7 index digits."""
WORKER_COMMAND = ["python", "-m", "trainer.launch", "-m", "trainer.worker", "--config"]
"""The training command of every replica (torchrun via :mod:`trainer.launch.torchrun`); the URI
follows."""

_RESERVED_ENV = ("GPUPIPE_JOB", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
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
# The spec
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class NcclConfig:
    """NCCL and PyTorch-NCCL settings that users tune, set as environment variables of the job.

    The collective timeout is not here: it is ``dist.timeout_s`` of the worker config, which
    ``init_process_group(timeout=...)`` takes and no environment variable can set.
    """

    socket_ifname: str | None = None
    """``NCCL_SOCKET_IFNAME``: interfaces for bootstrap and socket transport, e.g. ``eth0`` or
    ``^lo,docker`` (a leading ``^`` excludes)."""
    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] | None = None
    """``NCCL_DEBUG``: NCCL's log level; ``INFO`` shows the chosen transports and rings."""
    ib_disable: bool | None = None
    """``NCCL_IB_DISABLE``: ``True`` forces TCP sockets (clusters without working InfiniBand)."""
    heartbeat_timeout_s: int | None = None
    """``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``: the watchdog kills a process whose NCCL work is
    stuck this long (torch's default is 480 s)."""
    async_error_handling: bool = True
    """``TORCH_NCCL_ASYNC_ERROR_HANDLING``: ``1`` aborts the communicator and the process on a
    failed or timed-out collective, so a hung rank ends the job instead of holding its GPUs."""

    def __post_init__(self) -> None:
        require(
            self.socket_ifname is None
            or bool(re.match(r"^[\^=]?[A-Za-z0-9_.,:=^-]+$", self.socket_ifname)),
            "job.nccl.socket_ifname",
            "must be a comma-separated list of interface names or prefixes",
            self.socket_ifname,
        )
        require(
            self.debug in (None, "VERSION", "WARN", "INFO", "TRACE"),
            "job.nccl.debug",
            "must be VERSION, WARN, INFO or TRACE",
            self.debug,
        )
        require(
            self.heartbeat_timeout_s is None or self.heartbeat_timeout_s > 0,
            "job.nccl.heartbeat_timeout_s",
            "must be > 0 or null",
            self.heartbeat_timeout_s,
        )

    def env(self) -> dict[str, str]:
        """The environment variables these settings mean (unset fields are left out)."""
        out = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1" if self.async_error_handling else "0"}
        if self.socket_ifname is not None:
            out["NCCL_SOCKET_IFNAME"] = self.socket_ifname
        if self.debug is not None:
            out["NCCL_DEBUG"] = self.debug
        if self.ib_disable is not None:
            out["NCCL_IB_DISABLE"] = "1" if self.ib_disable else "0"
        if self.heartbeat_timeout_s is not None:
            out["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] = str(self.heartbeat_timeout_s)
        return out


@dataclass(kw_only=True, slots=True)
class SchedulingConfig:
    """Gang scheduling (Volcano or scheduler-plugins): all replicas start together or none do."""

    queue: str | None = None
    """Scheduler queue of the job's PodGroup (immutable once the job exists)."""
    priority_class: str | None = None
    """PriorityClass of the PodGroup (preemption order under contention)."""
    min_available: int | None = None
    """Replicas that must be schedulable together; ``None``: all of them (the operator's
    default), which is what DDP needs, since it cannot start with fewer."""

    def __post_init__(self) -> None:
        require(
            self.queue is None or bool(self.queue.strip()),
            "job.scheduling.queue",
            "must not be empty",
            self.queue,
        )
        if self.priority_class is not None:
            check_dns(
                self.priority_class,
                "job.scheduling.priority_class",
                DNS1123_SUBDOMAIN,
                "a DNS-1123 subdomain",
                253,
            )
        require(
            self.min_available is None or self.min_available >= 1,
            "job.scheduling.min_available",
            "must be >= 1 or null",
            self.min_available,
        )


@dataclass(kw_only=True, slots=True)
class SecretEnv:
    """One environment variable read from a key of a Kubernetes secret (object-store keys)."""

    env: str
    """Name of the environment variable, e.g. ``AWS_ACCESS_KEY_ID``."""
    secret: str
    """Name of the secret, in the job's namespace."""
    key: str
    """Key inside the secret."""
    optional: bool = False
    """``False``: pods do not start without the secret (a clear event instead of a late 403)."""

    def __post_init__(self) -> None:
        require(
            bool(ENV_NAME.match(self.env)),
            "job.secret_env.env",
            "must be an environment variable name",
            self.env,
        )
        check_dns(self.secret, "job.secret_env.secret", DNS1123_SUBDOMAIN, "a secret name", 253)
        require(
            bool(SECRET_KEY.match(self.key)),
            "job.secret_env.key",
            "must be a secret key (alphanumerics, '-', '_', '.')",
            self.key,
        )


@dataclass(kw_only=True, slots=True)
class OwnerRef:
    """The launcher pod (from the downward API): deleting it, e.g. with the run, deletes the job.

    The reference is written with ``controller: false`` (the pod does not reconcile the job) and
    ``blockOwnerDeletion: false`` (``true`` would need ``update`` on ``pods/finalizers`` under the
    OwnerReferencesPermissionEnforcement admission plugin; the garbage collector deletes the
    job either way). Owner and job must share a namespace.
    """

    name: str
    """Name of the owner, e.g. the pod's ``metadata.name``."""
    uid: str
    """UID of the owner, e.g. the pod's ``metadata.uid``."""
    api_version: str = "v1"
    """API version of the owner."""
    kind: str = "Pod"
    """Kind of the owner."""

    def __post_init__(self) -> None:
        require(bool(self.name), "job.owner.name", "must be set", self.name)
        require(
            bool(re.match(r"^[0-9a-fA-F-]{8,}$", self.uid)),
            "job.owner.uid",
            "must be a Kubernetes UID",
            self.uid,
        )
        require(bool(self.kind), "job.owner.kind", "must be set", self.kind)
        require(bool(self.api_version), "job.owner.api_version", "must be set", self.api_version)


@dataclass(kw_only=True, slots=True)
class JobSpec:
    """Everything that decides the job of one training run (a PyTorchJob or a TrainJob)."""

    name: str
    """Job name: a DNS-1035 label short enough for the operator's pod names (see
    :func:`job_name`)."""
    namespace: str
    """Namespace of the job (and of its secrets, service account and owner)."""
    image: str
    """Trainer image of every replica."""
    config_uri: str
    """URI of the worker config JSON; the pods read it, so never a path local to the launcher."""
    nnodes: int = 1
    """Nodes: one Master replica plus ``nnodes - 1`` Worker replicas."""
    nproc_per_node: int | None = None
    """Processes per node; ``None``: ``gpus_per_node`` (or 1 without GPUs). With GPUs it must
    equal ``gpus_per_node``."""
    gpus_per_node: int = 0
    """GPUs per node, as the limit of ``gpu_resource``; 0: a CPU job (gloo)."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource name of the GPU (``nvidia.com/gpu``, ``amd.com/gpu``, a MIG profile)."""
    cpu_request: str | None = None
    """CPU request per pod (Kubernetes quantity)."""
    cpu_limit: str | None = None
    """CPU limit per pod."""
    memory_request: str | None = None
    """Memory request per pod."""
    memory_limit: str | None = None
    """Memory limit per pod; the memory-backed ``/dev/shm`` counts against it."""
    shm_size: str = SHM_SIZE
    """Size of the memory-backed emptyDir at ``/dev/shm`` (the 64 MB default crashes NCCL and
    data loader workers)."""
    read_only_root_fs: bool = True
    """Read-only root filesystem; a writable emptyDir at ``/tmp`` (also ``HOME``) keeps caches
    working."""
    run_as_user: int = 1000
    """UID (and GID) of the training processes; the image's non-root user."""
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    """Pod tolerations, as Kubernetes dicts (``key``, ``operator``, ``value``, ``effect``)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Node labels the pods must land on, e.g. ``{"nvidia.com/gpu.product": "NVIDIA-H200"}``."""
    image_pull_secrets: list[str] = field(default_factory=list)
    """Names of docker-registry secrets for a private registry."""
    service_account: str | None = None
    """Service account of the pods; ``None``: the namespace's default."""
    automount_service_account_token: bool = False
    """Training never calls the Kubernetes API, so pods get no API token unless asked."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables; they override gpupipe's defaults (``HOME``, NCCL ones)."""
    secret_env: list[SecretEnv] = field(default_factory=list)
    """Environment variables from secrets, e.g. object-store credentials."""
    clean_pod_policy: Literal["None", "Running", "All"] = "Running"
    """Pods deleted when the job finishes: ``Running`` frees GPUs of stragglers but keeps failed
    pods' logs for diagnosis."""
    backoff_limit: int = 3
    """Pod restarts (under ``restart_policy``) before the job fails."""
    active_deadline_s: int | None = None
    """The operator fails the job after this many seconds, even if the launcher is gone."""
    ttl_s: int | None = 86400
    """The operator deletes the finished job after this many seconds; ``None``: never."""
    restart_policy: Literal["OnFailure", "ExitCode", "Never"] = "ExitCode"
    """``ExitCode``: exit codes 1-127 (bad input, bugs) fail the job, 128-255 (signals,
    preemption) restart the pod. ``Always`` is not offered: a finished pod would restart forever."""
    scheduling: SchedulingConfig | None = None
    """Gang scheduling; ``None``: the default scheduler, no PodGroup."""
    nccl: NcclConfig = field(default_factory=NcclConfig)
    """NCCL settings, as environment variables."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels of the job and its pods."""
    annotations: dict[str, str] = field(default_factory=dict)
    """Extra annotations of the job and its pods."""
    owner: OwnerRef | None = None
    """Owner of the job (the launcher pod), so that deleting the owner deletes the job."""
    port: int = 23456
    """Rendezvous port of the master (``MASTER_PORT``)."""

    def __post_init__(self) -> None:
        require(self.nnodes >= 1, "job.nnodes", "must be >= 1", self.nnodes)
        require(self.gpus_per_node >= 0, "job.gpus_per_node", "must be >= 0", self.gpus_per_node)
        require(
            self.nproc_per_node is None or self.nproc_per_node >= 1,
            "job.nproc_per_node",
            "must be >= 1 or null",
            self.nproc_per_node,
        )
        require(
            self.gpus_per_node == 0
            or self.nproc_per_node is None
            or self.nproc_per_node == self.gpus_per_node,
            "job.nproc_per_node",
            f"must equal job.gpus_per_node={self.gpus_per_node} (one process per GPU)",
            self.nproc_per_node,
        )
        longest_pod = "-master-0" if self.nnodes == 1 else f"-worker-{self.nnodes - 2}"
        check_dns(
            self.name,
            "job.name",
            DNS1035,
            f"a DNS-1035 label that leaves room for the pod name suffix {longest_pod!r}",
            63 - len(longest_pod),
        )
        check_dns(self.namespace, "job.namespace", DNS1123_LABEL, "a namespace name", 63)
        require(
            bool(self.image) and not any(c.isspace() for c in self.image),
            "job.image",
            "must be an image reference without spaces",
            self.image,
        )
        require(bool(self.config_uri), "job.config_uri", "must be set", self.config_uri)
        check_label_key(self.gpu_resource, "job.gpu_resource")
        require(
            "/" in self.gpu_resource,
            "job.gpu_resource",
            "must be an extended resource with a domain, like nvidia.com/gpu",
            self.gpu_resource,
        )
        self._check_resources()
        for i, tol in enumerate(self.tolerations):
            require(isinstance(tol, dict), f"job.tolerations[{i}]", "must be a mapping", tol)
            check_toleration(tol, f"job.tolerations[{i}]")
        for key, value in self.node_selector.items():
            check_label_key(key, "job.node_selector")
            require(isinstance(value, str), f"job.node_selector[{key}]", "must be a string", value)
        for secret in self.image_pull_secrets:
            check_dns(secret, "job.image_pull_secrets", DNS1123_SUBDOMAIN, "a secret name", 253)
        if self.service_account is not None:
            check_dns(
                self.service_account,
                "job.service_account",
                DNS1123_SUBDOMAIN,
                "a service account name",
                253,
            )
        self._check_env()
        require(
            self.clean_pod_policy in ("None", "Running", "All"),
            "job.clean_pod_policy",
            "must be None, Running or All",
            self.clean_pod_policy,
        )
        require(self.backoff_limit >= 0, "job.backoff_limit", "must be >= 0", self.backoff_limit)
        require(
            self.active_deadline_s is None or self.active_deadline_s > 0,
            "job.active_deadline_s",
            "must be > 0 or null",
            self.active_deadline_s,
        )
        require(
            self.ttl_s is None or self.ttl_s >= 0, "job.ttl_s", "must be >= 0 or null", self.ttl_s
        )
        require(
            self.restart_policy in ("OnFailure", "ExitCode", "Never"),
            "job.restart_policy",
            "must be OnFailure, ExitCode or Never",
            self.restart_policy,
        )
        if self.scheduling is not None and self.scheduling.min_available is not None:
            require(
                self.scheduling.min_available <= self.nnodes,
                "job.scheduling.min_available",
                f"must be <= job.nnodes={self.nnodes}",
                self.scheduling.min_available,
            )
        check_labels(self.labels, "job.labels", reserved=(LABEL_APP, LABEL_JOB))
        for key in self.annotations:
            check_label_key(key, "job.annotations")
        require(1 <= self.port <= 65535, "job.port", "must be in 1..65535", self.port)

    def _check_resources(self) -> None:
        values = {}
        for name in ("cpu_request", "cpu_limit", "memory_request", "memory_limit", "shm_size"):
            text = getattr(self, name)
            if text is not None:
                values[name] = parse_quantity(text, f"job.{name}")
        for kind in ("cpu", "memory"):
            req, lim = values.get(f"{kind}_request"), values.get(f"{kind}_limit")
            require(
                req is None or lim is None or req <= lim,
                f"job.{kind}_request",
                f"must be <= job.{kind}_limit={getattr(self, f'{kind}_limit')}",
                getattr(self, f"{kind}_request"),
            )
        # Pages of a memory-backed emptyDir are charged to the pod: a /dev/shm larger than the
        # memory limit would let the kernel OOM-kill the trainer instead of failing the write.
        lim = values.get("memory_limit")
        require(
            lim is None or values["shm_size"] <= lim,
            "job.shm_size",
            f"must be <= job.memory_limit={self.memory_limit} (/dev/shm counts against it)",
            self.shm_size,
        )

    def _check_env(self) -> None:
        names = [s.env for s in self.secret_env]
        for name in [*self.env, *names]:
            require(
                bool(ENV_NAME.match(name)), "job.env", "must use environment variable names", name
            )
            require(
                name not in _RESERVED_ENV and not name.startswith("PET_"),
                "job.env",
                "must not set a variable owned by gpupipe or the training operator",
                name,
            )
        dupes = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(self.env)))
        require(not dupes, "job.secret_env", "sets variables more than once", dupes)
        for key, value in self.env.items():
            require(isinstance(value, str), f"job.env[{key}]", "must be a string", value)

    @property
    def procs_per_node(self) -> int:
        """Processes per node: ``nproc_per_node``, else one per GPU, else 1."""
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 1


# --------------------------------------------------------------------------------------------
# The cluster settings of a step, and the job spec they give
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """Where and how the ``pytorchjob`` and ``trainjob`` launchers run the job (ignored by the
    local launcher).

    The step's config carries it (``train.cluster``, ``tune.train.cluster``); its defaults are
    the pod's defaults. :meth:`job_spec` is the one mapping to a :class:`JobSpec`, shared by the
    launcher, the Katib trial template and ``gpupipe render``.
    """

    namespace: str | None = None
    """Namespace of the job; ``None``: the launcher pod's own (downward API)."""
    image: str = ""
    """Image of the job's pods (the component sets the package's CUDA or CPU image)."""
    gpus_per_node: int = 0
    """GPUs each job pod requests (and processes per node when > 0)."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource that counts GPUs."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Node labels of the GPU nodes, e.g. ``{"nvidia.com/gpu.product": "NVIDIA-H200"}``."""
    object_store_secret: str | None = None
    """Secret with ``accesskey``/``secretkey`` of the artifact store, as AWS_* env vars."""
    cpu_request: str | None = TRAIN_POD_RESOURCES["cpu_request"]
    cpu_limit: str | None = TRAIN_POD_RESOURCES["cpu_limit"]
    memory_request: str | None = TRAIN_POD_RESOURCES["memory_request"]
    memory_limit: str | None = TRAIN_POD_RESOURCES["memory_limit"]
    shm_size: str = SHM_SIZE
    """Memory-backed /dev/shm (the 64 MB container default crashes NCCL and data loaders)."""
    on_exit: Literal["delete", "keep", "suspend"] = "delete"
    """What happens to the job when the step fails, times out or is cancelled."""
    service_account: str | None = None
    """Service account of the job's pods (none needed for reading the object store by secret)."""
    runtime: str = "torch-distributed"
    """TrainJob only: the training runtime, ``<name>`` (a ClusterTrainingRuntime) or
    ``TrainingRuntime/<name>`` (one in the job's namespace)."""
    runtime_patches: bool = True
    """TrainJob only: carry /dev/shm, /tmp, security contexts, placement, pull secrets and the
    service account in ``spec.runtimePatches``; ``False``: the runtime must set them."""

    def __post_init__(self) -> None:
        # Checked here, before any job exists.
        RuntimeRef.parse(self.runtime, "train.cluster.runtime")
        require(
            self.gpus_per_node >= 0,
            "train.cluster.gpus_per_node",
            "must be >= 0",
            self.gpus_per_node,
        )

    def job_spec(
        self,
        *,
        name: str,
        namespace: str,
        config_uri: str,
        nnodes: int,
        nproc_per_node: int,
        timeout_s: int | None,
    ) -> JobSpec:
        """The job spec of one run with these settings.

        Raises:
            InputError: a setting the job cannot have (names the ``job.<field>``).
        """
        secret_env = []
        if self.object_store_secret:
            secret_env = [
                SecretEnv(env=env, secret=self.object_store_secret, key=key)
                for key, env in OBJECT_STORE_ENV.items()
            ]
        return JobSpec(
            name=name,
            namespace=namespace,
            image=self.image,
            config_uri=config_uri,
            nnodes=nnodes,
            nproc_per_node=nproc_per_node,
            gpus_per_node=self.gpus_per_node,
            gpu_resource=self.gpu_resource,
            cpu_request=self.cpu_request,
            cpu_limit=self.cpu_limit,
            memory_request=self.memory_request,
            memory_limit=self.memory_limit,
            shm_size=self.shm_size,
            tolerations=[dict(GPU_TOLERATION)] if self.gpus_per_node > 0 else [],
            node_selector=dict(self.node_selector),
            secret_env=secret_env,
            service_account=self.service_account,
            active_deadline_s=timeout_s,
        )


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


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
