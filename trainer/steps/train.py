"""The train step: turn a preprocessed dataset into a worker config and launch the training job.

The job itself is always ``torchrun ... -m trainer.worker --config <uri>``; a :class:`Launcher`
decides where it runs. :class:`LocalLauncher` runs it as a subprocess on this machine (what
``kfp.local`` and laptops use); the PyTorchJob launcher runs it on a cluster behind the same
protocol. Everything the job needs travels as URIs, never as local paths of the launcher.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from trainer import outputs, storage
from trainer.config import (
    DistConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
    WorkerConfig,
    _require,
    from_dict,
    to_dict,
    to_json,
)
from trainer.errors import InputError, StepFailure, parse_error_line
from trainer.launchers.jobspec import JobSpec, SecretEnv
from trainer.redact import redact

OBJECT_STORE_ENV = {"accesskey": "AWS_ACCESS_KEY_ID", "secretkey": "AWS_SECRET_ACCESS_KEY"}
"""Keys of KFP's artifact-store secret (``mlpipeline-minio-artifact``) -> environment variables."""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
"""Lets GPU pods onto nodes tainted for GPU work (the common cloud setup)."""

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """Where and how the ``pytorchjob`` launcher runs the job (ignored by the local launcher)."""

    namespace: str | None = None
    """Namespace of the PyTorchJob; ``None``: the launcher pod's own (downward API)."""
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
    cpu_request: str | None = "4"
    cpu_limit: str | None = "16"
    memory_request: str | None = "16Gi"
    memory_limit: str | None = "64Gi"
    shm_size: str = "16Gi"
    """Memory-backed /dev/shm (the 64 MB container default crashes NCCL and data loaders)."""
    on_exit: Literal["delete", "keep", "suspend"] = "delete"
    """What happens to the job when the step fails, times out or is cancelled."""
    service_account: str | None = None
    """Service account of the job's pods (none needed for reading the object store by secret)."""

    def __post_init__(self) -> None:
        _require(
            self.gpus_per_node >= 0,
            "train.cluster.gpus_per_node",
            "must be >= 0",
            self.gpus_per_node,
        )


@dataclass(kw_only=True, slots=True)
class TrainStepConfig:
    """What the pipeline's train step asks for; data and output locations come from KFP."""

    launcher: Literal["local", "pytorchjob"] = "local"
    """``local``: torchrun subprocess here; ``pytorchjob``: a Training Operator job."""
    nproc_per_node: int = 1
    """Processes per node: GPUs per node on a cluster, CPU processes locally."""
    nnodes: int = 1
    """Nodes (PyTorchJob replicas); the local launcher supports 1."""
    timeout_s: int | None = None
    """Fail (and stop the job) if training has not finished after this many seconds."""
    checkpoint_every_steps: int = 100
    """Checkpoint period; a retried step resumes from the newest checkpoint."""
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        if self.launcher == "pytorchjob":
            _require(
                bool(self.cluster.image),
                "train.cluster.image",
                "must be set for launcher 'pytorchjob'",
                self.cluster.image,
            )
        _require(
            self.nproc_per_node > 0, "train.nproc_per_node", "must be > 0", self.nproc_per_node
        )
        _require(self.nnodes > 0, "train.nnodes", "must be > 0", self.nnodes)
        _require(
            self.timeout_s is None or self.timeout_s > 0,
            "train.timeout_s",
            "must be > 0 or null",
            self.timeout_s,
        )
        _require(
            self.checkpoint_every_steps > 0,
            "train.checkpoint_every_steps",
            "must be > 0",
            self.checkpoint_every_steps,
        )


@dataclass
class TrainStepResult:
    """Where the model went and what it reported."""

    model_uri: str
    metrics: dict[str, float]
    steps: int
    job_name: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_uri": self.model_uri,
            "metrics": self.metrics,
            "steps": self.steps,
            "job_name": self.job_name,
        }


class Launcher(Protocol):
    """Runs ``torchrun ... -m trainer.worker --config <config_uri>`` somewhere and waits."""

    def launch(
        self,
        *,
        job_name: str,
        config_uri: str,
        nproc_per_node: int,
        nnodes: int,
        timeout_s: int | None,
    ) -> None:
        """Return when the job succeeded.

        Raises:
            InputError: the job rejected its input (the worker's ``ERROR [train] E_...`` line).
            RuntimeError: the job failed, naming the job and its last log lines.
            TimeoutError: the deadline passed (the job has been stopped).
        """
        ...


def torchrun_command(
    config_uri: str, *, nproc_per_node: int, standalone: bool, python: str = sys.executable
) -> list[str]:
    """The one training command, shared by every launcher.

    torchrun runs inside :mod:`trainer.launch`, which turns torchrun's blanket exit code 1 back
    into the workers' own codes (2 bad input, 143 preempted).
    """
    cmd = [python, "-m", "trainer.launch"]
    if standalone:
        cmd.append("--standalone")
    cmd += [f"--nproc_per_node={nproc_per_node}", "-m", "trainer.worker", "--config", config_uri]
    return cmd


class LocalLauncher:
    """torchrun as a child process: output streamed into this step's log, stopped on SIGTERM.

    The child gets its own process group so that stopping it (deadline, cancellation) stops
    every rank; torchrun forwards SIGTERM to the workers, which checkpoint before exiting.
    """

    def __init__(
        self, *, tail_lines: int = 40, grace_s: float = 60.0, env: dict[str, str] | None = None
    ) -> None:
        self.tail_lines = tail_lines
        self.grace_s = grace_s
        self.env = env

    def launch(
        self,
        *,
        job_name: str,
        config_uri: str,
        nproc_per_node: int,
        nnodes: int,
        timeout_s: int | None,
    ) -> None:
        if nnodes != 1:
            raise InputError(
                "E_CONFIG", f"the local launcher runs one node, got nnodes={nnodes}", "train.nnodes"
            )
        cmd = torchrun_command(config_uri, nproc_per_node=nproc_per_node, standalone=True)
        env = dict(os.environ if self.env is None else self.env)
        env["GPUPIPE_JOB"] = job_name
        env.setdefault("OMP_NUM_THREADS", "1")
        log.info("launching %s: %s", job_name, redact(" ".join(cmd)))
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        tail: collections.deque[str] = collections.deque(maxlen=self.tail_lines)
        errors: list[InputError | StepFailure] = []

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = redact(raw)
                sys.stdout.write(line)
                sys.stdout.flush()
                tail.append(line.rstrip("\n"))
                if err := parse_error_line(line):
                    errors.append(err)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        previous = _forward_sigterm(proc)
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while proc.poll() is None:
                if deadline is not None and time.monotonic() > deadline:
                    self._stop(proc)
                    raise TimeoutError(
                        f"training job {job_name} did not finish within "
                        f"{timeout_s} s (train.timeout_s); it was stopped"
                    )
                time.sleep(0.2)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            reader.join(timeout=5)
        if proc.returncode == 0:
            return
        if errors:
            raise errors[0]
        last = "\n".join(tail)  # redacted as it was read
        raise RuntimeError(
            f"training job {job_name} failed (exit code {proc.returncode}); last log lines:\n{last}"
        )

    def _stop(self, proc: subprocess.Popen[str]) -> None:
        """SIGTERM the whole group (workers checkpoint), then SIGKILL after the grace period."""
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


def _forward_sigterm(proc: subprocess.Popen[str]) -> Any:
    """Pass a SIGTERM of this step (a cancelled run) on to torchrun, which tells the workers."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        log.warning("SIGTERM: stopping the training job (workers write a checkpoint)")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    return signal.signal(signal.SIGTERM, handler)


def read_schema(dataset_uri: str) -> dict[str, Any]:
    """The preprocess step's ``schema.json`` of a dataset directory.

    Raises:
        InputError: the dataset has no readable schema.
    """
    uri = storage.join(dataset_uri, "schema.json")
    if not storage.exists(uri):
        raise InputError("E_DATA", "dataset has no schema.json: is it a preprocess output?", uri)
    schema = storage.read_json(uri)
    for key in ("target", "task", "features"):
        if key not in schema:
            raise InputError("E_DATA", f"schema.json has no {key!r}", uri)
    return dict(schema)


def _check_batch_fits(schema: dict[str, Any], batch_size: int, dataset_uri: str) -> None:
    """Fail before launching when the training split is smaller than one global batch.

    The job would fail the same way, but only preprocess's record knows the user's data file,
    so the message can name it and the pipeline parameter to change (``batch_size``).
    """
    rows = (schema.get("splits") or {}).get("train")
    if not isinstance(rows, int) or rows >= batch_size:
        return
    smaller = 1 << (rows.bit_length() - 1) if rows > 0 else 0
    source = schema.get("source") or dataset_uri
    raise InputError(
        "E_CONFIG",
        f"batch_size {batch_size} (train.global_batch_size) is larger than the training split "
        f"of {source} ({rows} rows): training needs one full batch; add rows"
        + (f", or lower it, e.g. --param batch_size={smaller}" if smaller else ""),
        "batch_size",
    )


def build_worker_config(
    cfg: TrainStepConfig, *, dataset_uri: str, model_uri: str, work_uri: str
) -> WorkerConfig:
    """The worker config for a preprocessed dataset: splits, schema and target from the data."""
    schema = read_schema(dataset_uri)
    _check_batch_fits(schema, cfg.train.global_batch_size, dataset_uri)
    val_uri = storage.join(dataset_uri, "val.parquet")
    return from_dict(
        WorkerConfig,
        {
            "data": {
                "train_uri": storage.join(dataset_uri, "train.parquet"),
                "val_uri": val_uri if storage.exists(val_uri) else None,
                "kind": "tabular",
                "target": schema["target"],
                "task": schema["task"],
                "features": list(schema["features"]),
                "schema_uri": storage.join(dataset_uri, "schema.json"),
            },
            "model": to_dict(cfg.model),
            "optim": to_dict(cfg.optim),
            "train": to_dict(cfg.train),
            "dist": to_dict(cfg.dist),
            "checkpoint": {
                "uri": storage.join(work_uri, "checkpoints"),
                "every_steps": cfg.checkpoint_every_steps,
            },
            "output": {
                "model_uri": model_uri,
                "history_uri": storage.join(work_uri, "history.jsonl"),
            },
        },
    )


def train_step(
    cfg: TrainStepConfig,
    *,
    dataset_uri: str,
    model_uri: str,
    work_uri: str,
    job_name: str,
    launcher: Launcher | None = None,
) -> TrainStepResult:
    """Write the worker config under ``work_uri``, launch the job, return the model's metrics.

    ``work_uri`` must be stable across retries of the step: it holds the checkpoints a retried
    step resumes from. Both it and ``model_uri`` must be absent, empty, or this step's own
    earlier output (see :mod:`trainer.outputs`); anything else fails with ``E_OUTPUT`` before
    the job starts.
    """
    # Before any work: the model and the work folder must be new, empty or ours.
    outputs.check_output_location(
        model_uri, "train", inputs={"dataset": dataset_uri, "work folder": work_uri}
    )
    work_inputs = {"dataset": dataset_uri, "model folder": model_uri}
    outputs.check_output_location(work_uri, "train-work", inputs=work_inputs)
    worker_cfg = build_worker_config(
        cfg, dataset_uri=dataset_uri, model_uri=model_uri, work_uri=work_uri
    )
    outputs.claim_output_dir(work_uri, "train-work", inputs=work_inputs)
    config_uri = storage.join(work_uri, "worker-config.json")
    storage.write_text(config_uri, to_json(worker_cfg))
    if launcher is None:
        launcher = make_launcher(cfg)
    launcher.launch(
        job_name=job_name,
        config_uri=config_uri,
        nproc_per_node=cfg.nproc_per_node,
        nnodes=cfg.nnodes,
        timeout_s=cfg.timeout_s,
    )
    history = storage.join(work_uri, "history.jsonl")
    if storage.exists(history):
        storage.write_bytes(storage.join(model_uri, "history.jsonl"), storage.read_bytes(history))
    metrics = storage.read_json(storage.join(model_uri, "metrics.json"))
    meta = storage.read_json(storage.join(model_uri, "model.json"))
    steps = int(meta.get("extra", {}).get("train", {}).get("steps", 0))
    return TrainStepResult(
        model_uri=model_uri,
        metrics={k: float(v) for k, v in metrics.items()},
        steps=steps,
        job_name=job_name,
    )


def job_spec(cfg: TrainStepConfig, *, name: str, namespace: str, config_uri: str) -> JobSpec:
    """The PyTorchJob spec of a train step: one mapping, shared with ``gpupipe render``."""
    c = cfg.cluster
    secret_env = []
    if c.object_store_secret:
        secret_env = [
            SecretEnv(env=env, secret=c.object_store_secret, key=key)
            for key, env in OBJECT_STORE_ENV.items()
        ]
    return JobSpec(
        name=name,
        namespace=namespace,
        image=c.image,
        config_uri=config_uri,
        nnodes=cfg.nnodes,
        nproc_per_node=cfg.nproc_per_node,
        gpus_per_node=c.gpus_per_node,
        gpu_resource=c.gpu_resource,
        cpu_request=c.cpu_request,
        cpu_limit=c.cpu_limit,
        memory_request=c.memory_request,
        memory_limit=c.memory_limit,
        shm_size=c.shm_size,
        tolerations=[dict(GPU_TOLERATION)] if c.gpus_per_node > 0 else [],
        node_selector=dict(c.node_selector),
        secret_env=secret_env,
        service_account=c.service_account,
        active_deadline_s=cfg.timeout_s,
    )


def make_launcher(cfg: TrainStepConfig) -> Launcher:
    """The launcher ``cfg.launcher`` names, configured from the step's cluster settings."""
    if cfg.launcher == "local":
        return LocalLauncher()
    from trainer.launchers.jobspec import build_pytorchjob
    from trainer.launchers.pytorchjob import PyTorchJobLauncher

    namespace = cfg.cluster.namespace or os.environ.get("POD_NAMESPACE")
    if not namespace:
        raise InputError(
            "E_CONFIG",
            "the pytorchjob launcher needs a namespace: set "
            "train.cluster.namespace or POD_NAMESPACE (downward API)",
            "train.cluster.namespace",
        )

    def factory(name: str, config_uri: str, nproc: int, nnodes: int) -> dict[str, Any]:
        return build_pytorchjob(
            job_spec(cfg, name=name, namespace=namespace, config_uri=config_uri)
        )

    return PyTorchJobLauncher.from_environment(
        spec_factory=factory, namespace=namespace, on_exit=cfg.cluster.on_exit
    )
