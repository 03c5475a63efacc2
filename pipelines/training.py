"""The training pipeline: fingerprint -> preprocess -> train -> evaluate -> register (if passed).

Cluster settings live here, in one place: GPU limits and accelerator type on the train step,
CPU and memory on every step, caching (on for preprocess, configurable for train, off for
register), retries with exponential backoff where a retry pays, a memory-backed ``/dev/shm``,
GPU tolerations and node selector, and object-store credentials from a Kubernetes secret.
``kfp.local`` ignores the Kubernetes settings; the compiled YAML carries them to the cluster.

Retries (:data:`RETRIED`): KFP 2.17's ``set_retry`` takes only a count and a backoff, and the
compiled ``retryPolicy`` (``maxRetryCount``, ``backoffDuration``, ``backoffFactor``,
``backoffMaxDuration``) becomes an Argo ``retryStrategy`` with no policy: the DSL cannot reach
Argo's ``retryPolicy`` or ``expression``, so no retry can be limited to retryable exit codes.
The policy is then the cluster's: upstream KFP's Argo defaults give every template ``OnError``,
which retries a step whose pod errs (deleted, lost with its node) and never one whose container
exits non-zero (docs/kfp.md#retries; tests/cluster/test_kfp.py pins both); an Argo configured
``Always`` or without those defaults retries any failure, where a step that rejects its input
(exit 2, permanent by our own rules) would run three times: Argo sees only the exit code of
KFP's launcher (1 for any failure of the step), so no policy could tell the two apart. So only
the steps where a retry pays are retried: train (it resumes from its newest checkpoint, and a
killed or preempted training pod is the common failure), the train launcher (it re-attaches to
its job by name), tune (it resumes its study) and register (network calls to the registry;
idempotent per pipeline run). Preprocess and evaluate read only the pipeline's own inputs and
artifacts: their failures are bad input or a bug, which a retry repeats.
"""

import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from kfp import dsl, kubernetes

from components import evaluate, fingerprint, notify, preprocess, register, train, tune
from components.images import CPU_IMAGE, CUDA_IMAGE
from trainer.base.errors import InputError
from trainer.launch.jobspec import RUN_ID_ENV
from trainer.steps.train import GPU_TOLERATION, OBJECT_STORE_ENV, SHM_SIZE, TRAIN_POD_RESOURCES

PIPELINE_NAME = "gpupipe-training"


@dataclass(frozen=True, slots=True)
class StepResources:
    """CPU and memory of one step's pod (the train step's GPUs come from pipeline parameters)."""

    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str


RESOURCES = {
    "fingerprint": StepResources("100m", "500m", "256Mi", "512Mi"),
    "preprocess": StepResources("1", "4", "4Gi", "16Gi"),
    "train": StepResources(**TRAIN_POD_RESOURCES),  # a pod that trains, as a PyTorchJob's are
    "train-launcher": StepResources("250m", "1", "512Mi", "2Gi"),
    "tune": StepResources("2", "8", "4Gi", "16Gi"),
    "evaluate": StepResources("1", "2", "2Gi", "8Gi"),
    "register": StepResources("500m", "1", "1Gi", "2Gi"),
    "notify": StepResources("100m", "500m", "256Mi", "512Mi"),
}

RESOURCES_ENV = "GPUPIPE_STEP_RESOURCES"
"""Compile-time override of :data:`RESOURCES`: JSON ``{"<step>": {"<field>": "<quantity>"}}``,
e.g. ``{"preprocess": {"cpu_request": "250m"}}`` for a small cluster (the test cluster's single
2-core node sets every request low). Read when the pipeline is compiled, like
``GPUPIPE_IMAGE_REGISTRY``: ``gpupipe compile``, ``upload`` and ``run --host --compiled``."""
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")


def step_resources(env: dict[str, str] | None = None) -> dict[str, StepResources]:
    """:data:`RESOURCES` with :data:`RESOURCES_ENV`'s overrides applied.

    Raises:
        InputError: ``E_PARAM`` naming the variable and what in it is wrong.
    """
    raw = (os.environ if env is None else env).get(RESOURCES_ENV, "").strip()
    if not raw:
        return dict(RESOURCES)
    try:
        overrides = json.loads(raw)
    except ValueError as e:
        raise InputError("E_PARAM", f"{RESOURCES_ENV} is not JSON: {e}", RESOURCES_ENV) from e
    if not isinstance(overrides, dict):
        raise InputError("E_PARAM", f"{RESOURCES_ENV} must be a JSON object", RESOURCES_ENV)
    fields = set(StepResources.__slots__)
    out = dict(RESOURCES)
    for step, values in overrides.items():
        if step not in RESOURCES:
            raise InputError(
                "E_PARAM",
                f"{RESOURCES_ENV} names no step {step!r} (steps: {', '.join(sorted(RESOURCES))})",
                RESOURCES_ENV,
            )
        if not isinstance(values, dict) or not set(values) <= fields:
            raise InputError(
                "E_PARAM",
                f"{RESOURCES_ENV}[{step!r}] must map some of {sorted(fields)} to quantities, "
                f"got {values!r}",
                RESOURCES_ENV,
            )
        for field, value in values.items():
            if not isinstance(value, str) or not _QUANTITY.match(value):
                raise InputError(
                    "E_PARAM",
                    f"{RESOURCES_ENV}[{step!r}][{field!r}] must be a quantity like 250m or "
                    f"2Gi, got {value!r}",
                    RESOURCES_ENV,
                )
        out[step] = replace(out[step], **values)
    return out


RETRIES = 2
"""Retries of each step in :data:`RETRIED`; the train step's retry resumes from the job's newest
checkpoint."""
RETRIED = frozenset({"train", "train-launcher", "tune", "register"})
"""The steps a retry can help (see the module docstring): the rest fail once, at once."""
BACKOFF = {"backoff_duration": "30s", "backoff_factor": 2.0, "backoff_max_duration": "600s"}
TRAIN_CACHING = False
"""Caching of the train step. Off by default: a cached train step would skip training whenever
the dataset artifact name and parameters repeat, even if the code changed under the same tag.
(Turned on, it would also need the run's id out of train's parameters: KFP's cache key holds
the resolved id, so no run would hit it.)"""

RUN_ID_LABEL = "pipeline/runid"
"""The label KFP's backend puts on every pod of a run (its Workflow's podMetadata), the run's id."""

DOWNWARD_API_ENV = {
    "POD_NAME": "metadata.name",
    "POD_NAMESPACE": "metadata.namespace",
    "POD_UID": "metadata.uid",
    RUN_ID_ENV: f"metadata.labels['{RUN_ID_LABEL}']",
}
"""The cluster launchers' own pod: the job's namespace and its ownerReference (a deleted run
then takes the job with it), and the run's id, which names the job."""


def _configure(
    task: dsl.PipelineTask, step: str, object_store_secret: str, *, retries: int
) -> dsl.PipelineTask:
    r = step_resources()[step]
    task.set_cpu_request(r.cpu_request).set_cpu_limit(r.cpu_limit)
    task.set_memory_request(r.memory_request).set_memory_limit(r.memory_limit)
    if retries > 0 and step in RETRIED:
        task.set_retry(num_retries=retries, **BACKOFF)
    kubernetes.use_secret_as_env(
        task, secret_name=object_store_secret, secret_key_to_env=OBJECT_STORE_ENV
    )
    return task


REGISTRY_SECRET = "mlflow-auth"
"""The secret manifests/mlflow's server takes its admin account from (the default of the
pipeline parameter ``registry_secret``)."""
REGISTRY_ENV = {"username": "MLFLOW_TRACKING_USERNAME", "password": "MLFLOW_TRACKING_PASSWORD"}
"""Where MLflow's client reads an account for HTTP basic authentication."""


def _registry_account(task: dsl.PipelineTask, registry_secret: Any) -> None:
    """The registry's account from ``registry_secret`` into the step's environment. Optional: a
    registry without authentication (or a file store) needs none, and the pod starts without."""
    kubernetes.use_secret_as_env(
        task, secret_name=registry_secret, secret_key_to_env=REGISTRY_ENV, optional=True
    )


@dataclass(frozen=True, slots=True)
class _Gpu:
    """The pipeline parameters (channels) that place a training pod on GPUs."""

    type: Any
    per_node: Any
    """The GPU limit: text (an upstream step's output), as KFP's driver reads it."""
    node_selector: Any
    object_store_secret: Any


def _train_in_step(tr: dsl.PipelineTask, gpu: _Gpu, *, retries: int) -> dsl.PipelineTask:
    """The train step that trains in its own pod: GPUs, /dev/shm, toleration, node selector."""
    tr.set_display_name("train")
    _configure(tr, "train", gpu.object_store_secret, retries=retries)
    tr.set_caching_options(TRAIN_CACHING)
    _run_id_env(tr)
    tr.set_accelerator_type(gpu.type).set_accelerator_limit(gpu.per_node)
    kubernetes.empty_dir_mount(
        tr, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=SHM_SIZE
    )
    kubernetes.add_toleration(tr, **GPU_TOLERATION)
    kubernetes.add_node_selector_json(tr, gpu.node_selector)
    return tr


def _train_launcher(
    job: dsl.PipelineTask, object_store_secret: Any, *, retries: int
) -> dsl.PipelineTask:
    """The train step that launches and watches a cluster job: no GPU, its own pod's identity."""
    job.set_display_name("train (cluster job)")
    _configure(job, "train-launcher", object_store_secret, retries=retries)
    job.set_caching_options(TRAIN_CACHING)
    return _own_pod(job)


def _run_id_env(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """The run's id in the step's environment (:data:`RUN_ID_ENV`, from the pod's label), for a
    step that names its jobs or trials from it. Never a parameter
    (``dsl.PIPELINE_JOB_ID_PLACEHOLDER``): KFP's driver resolves it before it computes the cache
    key, so a cached step that took it would never be served from the cache."""
    kubernetes.use_field_path_as_env(
        task, env_name=RUN_ID_ENV, field_path=DOWNWARD_API_ENV[RUN_ID_ENV]
    )
    return task


def _own_pod(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """The step's own pod's identity in its environment (:data:`DOWNWARD_API_ENV`): a step that
    may launch a job (train, preprocess with ``launcher: pytorchjob``) names its namespace and
    owns it."""
    for env, path in DOWNWARD_API_ENV.items():
        kubernetes.use_field_path_as_env(task, env_name=env, field_path=path)
    return task


GROUP_NAMES = {"condition-branches": "launcher-choice"}
"""Display names of the groups KFP's SDK names itself: ``dsl.ExitHandler``, ``dsl.If`` and
``dsl.Else`` take a ``name`` (each group here has one), but the group KFP 2.17 wraps an If/Else
pair in (``ConditionBranches``, the two train branches) takes none, and the run graph would show
``condition-branches-2``. The task keys (``exit-handler-1``, ``condition-3``) stay KFP's: they
are what the spec wires by, and the UI's graph labels a group by its display name."""


def _name_generated_groups(pipeline: Any) -> None:
    """Give the groups in :data:`GROUP_NAMES` their display name (``taskInfo.name``) in the
    compiled spec, which the compiler, kfp.local and uploads all read."""
    spec = pipeline.pipeline_spec
    dags = [spec.root.dag]
    dags += [c.dag for c in spec.components.values() if c.WhichOneof("implementation") == "dag"]
    for dag in dags:
        for key, task in dag.tasks.items():
            kind = key.rsplit("-", 1)[0]
            if kind in GROUP_NAMES and task.task_info.name == key:
                task.task_info.name = GROUP_NAMES[kind]


def build_training_pipeline(*, retries: int = RETRIES, cluster: bool = True) -> Any:
    """Build the pipeline: ``retries`` per step; ``cluster`` adds the cluster-job branch
    (PyTorchJob or TrainJob).

    Local runs (``pipelines/local.py``) use ``retries=0, cluster=False``: KFP's retry policy
    cannot tell a permanent failure (bad input, exit code 2) from a transient one, and a person
    is waiting; and the cluster launchers need a cluster, while kfp.local 2.17 cannot join
    the two train branches (``dsl.OneOf`` over artifacts inside the exit handler fails there).
    """

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Preprocess a table, train on GPUs (DDP), evaluate against the "
        "champion, and register the model when it passes the gate.",
    )
    def training_pipeline(
        data_uri: str,
        target: str = "churned",
        task: str = "auto",
        column_roles_json: str = "{}",
        csv_delimiter: str = "auto",
        csv_header: bool = True,
        csv_encoding: str = "utf-8",
        csv_null_values: str = "",
        csv_decimal: str = ".",
        preprocess_config_json: str = "{}",
        model_name: str = "mlp",
        epochs: int = 0,
        learning_rate: float = 0.003,
        batch_size: int = 0,
        seed: int = 0,
        gpu_type: str = "nvidia.com/gpu",
        gpu_hour_usd: float = 0.0,
        gpu_prices: dict = {},  # noqa: B006 - compiled into the YAML, never mutated
        gpus_per_node: int = 1,
        nodes: int = 1,
        launcher: str = "local",
        trainer_runtime: str = "torch-distributed",
        gpu_node_selector: dict = {},  # noqa: B006 - compiled into the YAML, never mutated
        image_pull_secrets: list = [],  # noqa: B006
        job_labels: dict = {},  # noqa: B006
        job_annotations: dict = {},  # noqa: B006
        job_env: dict = {},  # noqa: B006
        gang_queue: str = "",
        gang_priority_class: str = "",
        one_worker_per_node: bool = False,
        hyperparams_json: str = "{}",
        tune_enabled: bool = False,
        tune_engine: str = "local",
        tune_space_json: str = "{}",
        tune_trial_epochs: int = 0,
        train_config_json: str = "{}",
        gate_metric: str = "auto",
        gate_threshold: float = 0.0,
        gate_baseline: str = "trivial",
        max_champion_bytes: int = 1 << 30,
        registry_uri: str = "",
        registered_model_name: str = "gpupipe-model",
        registry_secret: str = REGISTRY_SECRET,
        object_store_secret: str = "mlpipeline-minio-artifact",
    ) -> None:
        """Train and register a model on a table.

        Args:
            data_uri: Parquet or CSV file or folder (local path, s3://, gs://, minio://).
            target: target column.
            task: ``classification``, ``regression`` or ``auto``.
            column_roles_json: roles of feature columns, overriding inference: a JSON object
                ``{"zip": "categorical", "customer_id": "keep", "signup": "date"}``
                (``numeric``, ``categorical``, ``date``, ``keep`` or ``drop``; ``keep``: never
                left out as an identifier or constant); columns not named are inferred.
            csv_delimiter: CSV field separator: one character, ``tab``, or ``auto`` (a tab for
                ``.tsv`` files, else a comma).
            csv_header: whether CSV files start with a header line (without one, columns are
                ``column_1``, ``column_2`` ...).
            csv_encoding: text encoding of CSV files, e.g. ``latin-1`` (default ``utf-8``).
            csv_null_values: extra CSV values read as missing, comma-separated (``?,-``); the
                empty field, ``NA``, ``N/A``, ``null``, ``NaN`` and the like always are.
            csv_decimal: decimal separator of CSV numbers: ``.`` or ``,`` (``26,9``; with
                ``csv_delimiter`` ``auto``, fields are then separated by ``;``).
            preprocess_config_json: further preprocess settings (``PreprocessConfig`` fields),
                e.g. ``{"val_fraction": 0.2, "test_fraction": 0.2, "max_categories": 20}``.
            model_name: ``mlp`` or a user model ``package.module:build`` baked into the image.
            epochs: passes over the training split (0: chosen from the table and model size).
            learning_rate: AdamW peak learning rate.
            batch_size: global batch (all GPUs and nodes together; 0: chosen from the table
                size).
            seed: split, initialisation and shuffling seed.
            gpu_type: accelerator resource of the train step (``nvidia.com/gpu``).
            gpu_hour_usd: price of one GPU-hour in USD (0: no cost reported): the run's cost is
                GPU-hours held x this, in the metrics, the summary, the report and the model's
                tags. No prices are built in.
            gpu_prices: price of one GPU-hour per ``gpu_type``, e.g.
                ``{"nvidia.com/gpu": 3.5, "nvidia.com/mig-1g.18gb": 0.5}``; the run's
                ``gpu_type`` is looked up here first (a table without it and no
                ``gpu_hour_usd`` is an error).
            gpus_per_node: GPUs per node (= processes per node).
            nodes: nodes of the training job.
            launcher: ``local`` (torchrun in the train step's pod), ``pytorchjob`` (a Kubeflow
                Training Operator PyTorchJob) or ``trainjob`` (a Kubeflow Trainer v2 TrainJob).
            trainer_runtime: the TrainJob's training runtime (``launcher=trainjob``):
                ``<name>`` of a ClusterTrainingRuntime or ``TrainingRuntime/<name>`` in the
                run's namespace.
            gpu_node_selector: node labels for the GPU nodes, e.g.
                ``{"nvidia.com/gpu.product": "NVIDIA-H200"}``.
            image_pull_secrets: cluster jobs (``launcher`` pytorchjob or trainjob, Katib
                trials): docker-registry secrets in the run's namespace for a private
                registry, e.g. ``["regcred"]`` (the steps' own pods take the pipeline runner's
                service account's).
            job_labels: cluster jobs: extra labels of the job and its pods, e.g. Kueue's
                ``{"kueue.x-k8s.io/queue-name": "gpu-team"}``.
            job_annotations: cluster jobs: extra annotations of the job and its pods, e.g.
                ``{"karpenter.sh/do-not-disrupt": "true"}``.
            job_env: extra environment variables of the training processes (of a cluster
                job, or of launcher=local's), e.g. ``{"NCCL_SOCKET_IFNAME": "eth0",
                "NCCL_DEBUG": "INFO"}``; ``{"GPUPIPE_ALLOW_NO_CUDA": "1"}`` lets a pod that holds
                GPUs train on the CPU when torch finds none (E_NO_CUDA otherwise).
            gang_queue: cluster jobs: Kueue's LocalQueue (empty: none); the job starts only
                when all of its pods fit the queue's quota, and the step says where it waits.
            gang_priority_class: cluster jobs: Kueue's WorkloadPriorityClass of the job
                (empty: none).
            one_worker_per_node: cluster jobs: each pod on a node of its own (a required
                anti-affinity among the job's pods; a job of more nodes than the cluster has
                then waits).
            hyperparams_json: dotted trainer overrides, e.g. ``{"optim.weight_decay": 0.1}``.
            tune_enabled: run the hyperparameter search before training; train takes its best
                parameters (applied after ``hyperparams_json``).
            tune_engine: ``local`` (an Optuna study in the tune step's pod, CPU) or ``katib``
                (a Katib Experiment whose trials are PyTorchJobs with the train step's GPUs).
            tune_space_json: the search space in Katib's vocabulary (``{}``: a built-in space
                over learning rate, width, weight decay and dropout; TPE with median stopping).
            tune_trial_epochs: epochs per trial (0: chosen from the data, as for training).
            train_config_json: further train-step settings (``TrainStepConfig`` fields).
            gate_metric: metric that decides registration (``auto``: accuracy or rmse).
            gate_threshold: the candidate must reach this (0: no threshold).
            gate_baseline: ``trivial``: the candidate must not be worse than the trivial
                predictor (majority class, mean); ``best``: it must beat the best baseline
                (trivial, linear, gradient boosting), all scored on the same split.
            max_champion_bytes: the most bytes of the registry's champion the evaluate step
                downloads to compare with (1 GiB); a larger one fails the step in one E_MODEL
                line, before or while it is fetched.
            registry_uri: MLflow tracking URI, e.g. ``http://mlflow.kubeflow:5000``. Empty: on
                a cluster, ``MLFLOW_TRACKING_URI`` from the steps' environment, else the run
                is refused at its first step (an embedded store would die with the pod);
                ``gpupipe run --local``: a registry under ``--root``.
            registered_model_name: name of the model in the registry.
            registry_secret: Kubernetes secret with the registry's account (keys ``username``
                and ``password``; manifests/mlflow's server asks for one): the evaluate and
                register steps read it, never ``registry_uri``. A missing secret means no
                account.
            object_store_secret: Kubernetes secret with the artifact store's credentials.
        """
        exit_task = notify(pipeline_name=PIPELINE_NAME)
        _configure(exit_task, "notify", object_store_secret, retries=0)
        exit_task.set_caching_options(False)

        with dsl.ExitHandler(exit_task, name="training"):
            # Never cached: its output, a parameter of preprocess, puts the data's content into
            # preprocess's cache key (KFP's key holds the URI, not what is behind it).
            fp = fingerprint(data_uri=data_uri, registry_uri=registry_uri)
            _configure(fp, "fingerprint", object_store_secret, retries=retries)
            fp.set_caching_options(False)
            prep = preprocess(
                data_uri=data_uri,
                target=target,
                task=task,
                seed=seed,
                column_roles_json=column_roles_json,
                csv_delimiter=csv_delimiter,
                csv_header=csv_header,
                csv_encoding=csv_encoding,
                csv_null_values=csv_null_values,
                csv_decimal=csv_decimal,
                config_json=preprocess_config_json,
                data_fingerprint=fp.output,
                task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
                cpu_image=CPU_IMAGE,
                object_store_secret=object_store_secret,
                image_pull_secrets=image_pull_secrets,
            )
            _configure(prep, "preprocess", object_store_secret, retries=retries)
            _own_pod(prep).set_caching_options(True)

            # What tune's trials and the trained model's job share: the train step's settings
            # (the one mapping, trainer.steps.train.step_settings, reads them in both).
            train_settings = {
                "model_name": model_name,
                "learning_rate": learning_rate,
                "batch_size": batch_size,
                "seed": seed,
                "gpus_per_node": gpus_per_node,
                "hyperparams_json": hyperparams_json,
                "task_name": dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
                # An input, not only a resource setting: KFP 2.17 passes a channel that only
                # set_accelerator_type reads into no sub-DAG, and the run fails.
                "gpu_type": gpu_type,
                "gpu_node_selector": gpu_node_selector,
                "object_store_secret": object_store_secret,
                "cuda_image": CUDA_IMAGE,
                "cpu_image": CPU_IMAGE,
                "image_pull_secrets": image_pull_secrets,
                "job_labels": job_labels,
                "job_annotations": job_annotations,
                "job_env": job_env,
                "gang_queue": gang_queue,
                "gang_priority_class": gang_priority_class,
                "one_worker_per_node": one_worker_per_node,
                "gpu_hour_usd": gpu_hour_usd,
                "gpu_prices": gpu_prices,
            }

            # Always in the DAG: with tune_enabled false it passes no parameters on at once.
            # (A dsl.If around it would need dsl.OneOf to join train's inputs, which kfp.local
            # cannot resolve inside the exit handler.)
            tn = tune(
                dataset=prep.outputs["dataset"],
                enabled=tune_enabled,
                engine=tune_engine,
                space_json=tune_space_json,
                trial_epochs=tune_trial_epochs,
                train_config_json=train_config_json,
                **train_settings,
            )
            _configure(tn, "tune", object_store_secret, retries=retries)
            tn.set_caching_options(True)  # a finished search is reused; a retry resumes it
            _run_id_env(tn)

            def train_task() -> dsl.PipelineTask:
                return train(
                    dataset=prep.outputs["dataset"],
                    epochs=epochs,
                    nnodes=nodes,
                    launcher=launcher,
                    tuned_hyperparams_json=tn.outputs["best_hyperparams_json"],
                    config_json=train_config_json,
                    trainer_runtime=trainer_runtime,
                    gpu_limit=tn.outputs["train_gpu_limit"],
                    # Train is never cached (TRAIN_CACHING): the run's id as a parameter names
                    # its job from the same id register tags the model with, under kfp.local too
                    # (whose pods have no KFP_RUN_ID label).
                    pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                    **train_settings,
                )

            # The GPU limit as tune's text output: KFP 2.17's driver reads an accelerator count
            # from a channel only as a string (resolvePodSpecInputRuntimeParameter), and the int
            # pipeline parameter gpus_per_node resolved to nothing, so no limit was set.
            # It is also the train step's input, so that it reaches the step's sub-DAG.
            gpu_limit = tn.outputs["train_gpu_limit"]
            gpu = _Gpu(gpu_type, gpu_limit, gpu_node_selector, object_store_secret)
            if not cluster:
                model = _train_in_step(train_task(), gpu, retries=retries).outputs["model"]
            else:
                # Both cluster launchers (PyTorchJob, TrainJob): this pod only creates and
                # watches the job, so it needs no GPU; the launcher parameter picks the resource.
                with dsl.If(launcher != "local", name="train-on-cluster"):
                    job = _train_launcher(train_task(), object_store_secret, retries=retries)
                with dsl.Else(name="train-in-step"):
                    tr = _train_in_step(train_task(), gpu, retries=retries)
                model = dsl.OneOf(job.outputs["model"], tr.outputs["model"])

            ev = evaluate(
                model=model,
                dataset=prep.outputs["dataset"],
                gate_metric=gate_metric,
                gate_threshold=gate_threshold,
                gate_baseline=gate_baseline,
                registry_uri=registry_uri,
                registered_model_name=registered_model_name,
                model_name=model_name,
                max_champion_bytes=max_champion_bytes,
            )
            _configure(ev, "evaluate", object_store_secret, retries=retries)
            _registry_account(ev, registry_secret)
            ev.set_caching_options(False)  # the champion it compares with can change between runs

            with dsl.If(ev.outputs["Output"] == True, name="gate-passed"):  # noqa: E712
                reg = register(
                    model=model,
                    metrics=ev.outputs["metrics"],
                    baselines=ev.outputs["baselines"],
                    evaluation=ev.outputs["report"],
                    data_hash=prep.outputs["data_hash"],
                    gate_passed=True,
                    pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                    registry_uri=registry_uri,
                    registered_model_name=registered_model_name,
                    params_json=hyperparams_json,
                )
                _configure(reg, "register", object_store_secret, retries=retries)
                _registry_account(reg, registry_secret)
                reg.set_caching_options(False)

    _name_generated_groups(training_pipeline)
    return training_pipeline


training_pipeline = build_training_pipeline()
"""The pipeline as compiled for clusters (retries with exponential backoff on every step)."""

PIPELINES = {PIPELINE_NAME: training_pipeline}
"""Every pipeline ``gpupipe compile`` writes, by name."""
