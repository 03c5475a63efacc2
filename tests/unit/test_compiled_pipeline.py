"""The committed pipeline YAML carries every cluster setting, read the way KFP stores it.

Steps are found by their display names (what the KFP UI shows) and checked to run the
component they claim to, so KFP's generated task and executor names (``train-2``,
``exec-train-2``) are nobody's contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainer.base.version import __version__

REPO = Path(__file__).resolve().parents[2]
COMPILED = REPO / "pipelines" / "compiled" / "gpupipe-training.yaml"
TRAIN_ON_CLUSTER = "train (cluster job)"
"""The cluster branch's train task (PyTorchJob or TrainJob): it only creates and watches the job."""
TRAIN_IN_STEP = "train"
"""The in-step branch's train task: torchrun on the step's own GPUs."""
TRAINS = (TRAIN_ON_CLUSTER, TRAIN_IN_STEP)
STEPS = ("fingerprint", "preprocess", "tune", *TRAINS, "evaluate", "register", "notify")
RETRIED_STEPS = ("tune", *TRAINS, "register")
"""Steps a retry can help: resumable (train, tune), re-attaching (launcher), network (register)."""
NOT_RETRIED_STEPS = ("fingerprint", "preprocess", "evaluate", "notify")
"""KFP retries any failure, and these fail on bad input (exit 2, permanent) or a bug."""
NO_GPU_STEPS = tuple(s for s in STEPS if s != TRAIN_IN_STEP)
EXIT_HANDLER = "notify"
STEP_FUNCTION = {step: "train" if step in TRAINS else step for step in STEPS}
"""The component function each step runs."""
DOWNWARD_API_ENV = {
    "POD_NAME": "metadata.name",
    "POD_NAMESPACE": "metadata.namespace",
    "POD_UID": "metadata.uid",
    "KFP_RUN_ID": "metadata.labels['pipeline/runid']",
}
RUN_SCOPED = re.compile(
    r"\{\{\$\.pipeline_(job_(uuid|name|resource_name|create_time_utc|schedule_time_utc)|task_uuid)\}\}"
)
"""KFP's placeholders whose value changes from run to run: its driver resolves them before it
computes a task's cache key (backend/src/v2/driver/resolve.go), so a cached task that took one
would never be served from the cache."""
STEPS_NAMING_JOBS = ("preprocess", "tune", TRAIN_ON_CLUSTER, TRAIN_IN_STEP)
"""The steps that name their jobs or trials from the run's id."""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ROOT = "<root>"
_PLACEHOLDER = re.compile(r"^\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}$")
_UNITS = {"": 1, "m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _quantity(text: str) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``16Gi``) as a number."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti)?", text)
    assert match, f"not a Kubernetes quantity: {text!r}"
    return float(match.group(1)) * _UNITS[match.group(2) or ""]


@dataclass
class Compiled:
    """The two YAML documents of a compiled pipeline, with lookups that follow KFP's wiring.

    A *step* is a task's display name (``taskInfo.name``); DAG tasks (exit handler,
    conditions) are addressed by their task names.
    """

    spec: dict[str, Any]
    platform: dict[str, Any]
    text: str

    @classmethod
    def load(cls, text: str) -> Compiled:
        docs = list(yaml.safe_load_all(text))
        assert len(docs) == 2, "expected the pipeline spec and the platform spec"
        return cls(spec=docs[0], platform=docs[1], text=text)

    def _dags(self) -> dict[str, dict[str, Any]]:
        dags = {ROOT: self.spec["root"]["dag"]}
        for name, comp in self.spec["components"].items():
            if "dag" in comp:
                dags[name] = comp["dag"]
        return dags

    def executor_tasks(self) -> dict[str, tuple[str, str]]:
        """Display name -> (owner DAG, task name) of every task that runs a container."""
        out: dict[str, tuple[str, str]] = {}
        for dag_name, dag in self._dags().items():
            for name, task in dag["tasks"].items():
                if "executorLabel" not in self.spec["components"][task["componentRef"]["name"]]:
                    continue
                step = task.get("taskInfo", {}).get("name", name)
                assert step not in out, f"two tasks are displayed as {step!r}"
                out[step] = (dag_name, name)
        return out

    def _locate(self, step: str) -> tuple[str, str]:
        """(owner DAG, task name) of a step, or of a DAG task by its task name."""
        tasks = self.executor_tasks()
        if step in tasks:
            return tasks[step]
        owners = [d for d, dag in self._dags().items() if step in dag["tasks"]]
        assert len(owners) == 1, f"no step displayed as {step!r} (have {sorted(tasks)})"
        return owners[0], step

    def owner(self, step: str) -> str:
        """The DAG (component name, or ROOT) that holds the task."""
        return self._locate(step)[0]

    def task_name(self, step: str) -> str:
        return self._locate(step)[1]

    def task(self, step: str) -> dict[str, Any]:
        owner, name = self._locate(step)
        return self._dags()[owner]["tasks"][name]

    def parent(self, dag_component: str) -> tuple[str, str]:
        """(owner DAG, task name) of the task that runs ``dag_component``."""
        for owner, dag in self._dags().items():
            for name, task in dag["tasks"].items():
                if task["componentRef"]["name"] == dag_component:
                    return owner, name
        raise AssertionError(f"no task runs {dag_component!r}")

    def ancestors(self, step: str) -> list[str]:
        """Names of the DAG tasks (exit handler, condition) enclosing a task, innermost first."""
        out, owner = [], self.owner(step)
        while owner != ROOT:
            owner, name = self.parent(owner)
            out.append(name)
        return out

    def root_parameter(self, dag: str, channel: str) -> str:
        """Follow a DAG input parameter up to the pipeline parameter it comes from."""
        while dag != ROOT:
            assert channel in self.spec["components"][dag]["inputDefinitions"]["parameters"], (
                f"{dag} has no input {channel!r}"
            )
            dag, task_name = self.parent(dag)
            source = self._dags()[dag]["tasks"][task_name]["inputs"]["parameters"][channel]
            channel = source["componentInputParameter"]
        assert channel in self.spec["root"]["inputDefinitions"]["parameters"], channel
        return channel

    def task_input_source(self, step: str, name: str) -> str:
        """The pipeline parameter behind one input parameter of a task."""
        source = self.task(step)["inputs"]["parameters"][name]
        assert "componentInputParameter" in source, f"{step}.{name} is {source}"
        return self.root_parameter(self.owner(step), source["componentInputParameter"])

    def parameter_origin(self, step: str, name: str) -> tuple[str, str]:
        """Where an input parameter of a task comes from: ``("", <pipeline parameter>)`` or
        ``(<producer task>, <its output key>)``, followed up through the DAGs."""
        dag, source = self.owner(step), self.task(step)["inputs"]["parameters"][name]
        while "componentInputParameter" in source:
            channel = source["componentInputParameter"]
            if dag == ROOT:
                return "", channel
            dag, parent_task = self.parent(dag)
            source = self._dags()[dag]["tasks"][parent_task]["inputs"]["parameters"][channel]
        out = source["taskOutputParameter"]
        return out["producerTask"], out["outputParameterKey"]

    def artifact_producers(self, step: str, name: str) -> tuple[set[str], set[tuple[str, str]]]:
        """Where input artifact ``name`` of a task comes from.

        Returns:
            The DAG components the artifact passes out of on its way (a ``dsl.OneOf`` is a
            condition-branches DAG output), and the (step, output key) pairs that produce it.
        """
        dag, task = self.owner(step), self.task(step)
        source = task["inputs"]["artifacts"][name]
        while "componentInputArtifact" in source:  # up to the DAG that wires it in
            channel = source["componentInputArtifact"]
            dag, parent_task = self.parent(dag)
            source = self._dags()[dag]["tasks"][parent_task]["inputs"]["artifacts"][channel]
        via: set[str] = set()
        producers: set[tuple[str, str]] = set()
        pending = [(dag, source["taskOutputArtifact"])]
        while pending:  # down through DAG outputs to the container tasks
            dag, out = pending.pop()
            producer = self._dags()[dag]["tasks"][out["producerTask"]]
            component = producer["componentRef"]["name"]
            if "dag" not in self.spec["components"][component]:
                step_name = producer.get("taskInfo", {}).get("name", out["producerTask"])
                producers.add((step_name, out["outputArtifactKey"]))
                continue
            via.add(component)
            outputs = self.spec["components"][component]["dag"]["outputs"]["artifacts"]
            for selector in outputs[out["outputArtifactKey"]]["artifactSelectors"]:
                pending.append(
                    (
                        component,
                        {
                            "producerTask": selector["producerSubtask"],
                            "outputArtifactKey": selector["outputArtifactKey"],
                        },
                    )
                )
        return via, producers

    def executor_label(self, step: str) -> str:
        component = self.task(step)["componentRef"]["name"]
        return self.spec["components"][component]["executorLabel"]

    def container(self, step: str) -> dict[str, Any]:
        executors = self.spec["deploymentSpec"]["executors"]
        return executors[self.executor_label(step)]["container"]

    def function(self, step: str) -> str:
        """The Python function a lightweight component's container runs."""
        args = self.container(step)["args"]
        return args[args.index("--function_to_execute") + 1]

    def k8s(self, step: str) -> dict[str, Any]:
        executors = self.platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        return executors.get(self.executor_label(step), {})


@pytest.fixture(scope="module")
def compiled() -> Compiled:
    return Compiled.load(COMPILED.read_text())


@pytest.fixture(scope="module")
def local_compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    """The pipeline ``pipelines/local.py`` runs: no retries, one train task."""
    from kfp import compiler

    from pipelines.training import build_training_pipeline

    out = tmp_path_factory.mktemp("local") / "local.yaml"
    compiler.Compiler().compile(build_training_pipeline(retries=0, cluster=False), str(out))
    return Compiled.load(out.read_text())


# --- structure ------------------------------------------------------------------------------


def test_every_step_runs_its_component(compiled: Compiled) -> None:
    steps = compiled.executor_tasks()
    assert set(steps) == set(STEPS), f"steps (by display name): {sorted(steps)}"
    assert {s: compiled.function(s) for s in STEPS} == STEP_FUNCTION


def test_both_train_tasks_run_the_same_train_component(compiled: Compiled) -> None:
    on_cluster, in_step = (compiled.container(s) for s in TRAINS)
    for key in ("image", "command", "args"):
        assert on_cluster[key] == in_step[key], f"the train tasks differ in {key}"
    definitions = [
        compiled.spec["components"][compiled.task(s)["componentRef"]["name"]]["inputDefinitions"]
        for s in TRAINS
    ]
    assert definitions[0] == definitions[1]


def _branch_condition(compiled: Compiled, step: str) -> tuple[str, str, str]:
    """(condition-branches DAG, condition, pipeline parameter it reads) of a train task."""
    branch_dag, branch_task = compiled.parent(compiled.owner(step))
    task = compiled._dags()[branch_dag]["tasks"][branch_task]
    condition = task.get("triggerPolicy", {}).get("condition", "")
    match = re.search(r"inputs\.parameter_values\['([^']+)'\]", condition)
    assert match, f"{step} is not under a condition on a parameter: {condition!r}"
    channel = task["inputs"]["parameters"][match.group(1)]["componentInputParameter"]
    return branch_dag, condition, compiled.root_parameter(branch_dag, channel)


def test_train_branches_are_conditions_on_the_launcher_parameter(compiled: Compiled) -> None:
    on_cluster = _branch_condition(compiled, TRAIN_ON_CLUSTER)
    in_step = _branch_condition(compiled, TRAIN_IN_STEP)
    assert on_cluster[2] == in_step[2] == "launcher"
    assert on_cluster[0] == in_step[0], "the train tasks are not branches of one If/Else"
    assert on_cluster[0].startswith("comp-condition-branches"), on_cluster[0]
    # Both cluster launchers (pytorchjob, trainjob) take this branch; only local trains in-step.
    assert re.fullmatch(r"inputs\.parameter_values\['[^']+'\] != 'local'", on_cluster[1])
    assert in_step[1] == f"!({on_cluster[1]})", "the in-step branch is not the Else"


@pytest.mark.parametrize("step", ["evaluate", "register"], ids=str)
def test_downstream_steps_consume_the_oneof_of_both_train_branches(
    compiled: Compiled, step: str
) -> None:
    via, producers = compiled.artifact_producers(step, "model")
    assert producers == {(TRAIN_ON_CLUSTER, "model"), (TRAIN_IN_STEP, "model")}
    assert any(c.startswith("comp-condition-branches") for c in via), via
    branches = {_branch_condition(compiled, s)[0] for s in TRAINS}
    assert branches <= via, f"{step} reads the model past the branches' OneOf ({via})"


def test_evaluate_waits_for_the_train_branches(compiled: Compiled) -> None:
    (branches,) = {_branch_condition(compiled, s)[0] for s in TRAINS}
    _, branches_task = compiled.parent(branches)
    assert branches_task in compiled.task("evaluate").get("dependentTasks", [])


# --- resources ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "origin"),
    [("resourceType", ("", "gpu_type")), ("resourceCount", ("tune", "train_gpu_limit"))],
    ids=["accelerator-type", "gpu-limit"],
)
def test_train_accelerator_comes_from_a_text_channel(
    compiled: Compiled, field: str, origin: tuple[str, str]
) -> None:
    # KFP 2.17's driver reads a channel's accelerator type and count only as strings
    # (resolvePodSpecInputRuntimeParameter: GetStringValue): the int pipeline parameter
    # gpus_per_node resolved to nothing and the limit was dropped, so the count is tune's
    # text output of gpus_per_node.
    accelerator = compiled.container(TRAIN_IN_STEP)["resources"]["accelerator"]
    match = _PLACEHOLDER.match(str(accelerator[field]))
    assert match, f"accelerator {field} is a constant ({accelerator[field]!r}), not a channel"
    assert compiled.parameter_origin(TRAIN_IN_STEP, match.group(1)) == origin
    producer, key = origin
    if producer:
        outputs = compiled.spec["components"]["comp-tune"]["outputDefinitions"]["parameters"]
        assert outputs[key]["parameterType"] == "STRING"
    else:
        root = compiled.spec["root"]["inputDefinitions"]["parameters"][key]
        assert root["parameterType"] == "STRING"


PREPROCESS_PARAMETERS = {
    # pipeline parameter: (preprocess input, KFP parameter type, default)
    "column_roles_json": ("column_roles_json", "STRING", "{}"),
    "csv_delimiter": ("csv_delimiter", "STRING", "auto"),
    "csv_header": ("csv_header", "BOOLEAN", True),
    "csv_encoding": ("csv_encoding", "STRING", "utf-8"),
    "csv_null_values": ("csv_null_values", "STRING", ""),
    "preprocess_config_json": ("config_json", "STRING", "{}"),
}


@pytest.mark.parametrize("parameter", PREPROCESS_PARAMETERS, ids=str)
def test_preprocess_settings_are_pipeline_parameters(compiled: Compiled, parameter: str) -> None:
    task_input, kind, default = PREPROCESS_PARAMETERS[parameter]
    root = compiled.spec["root"]["inputDefinitions"]["parameters"][parameter]
    assert (root["parameterType"], root["defaultValue"], root["isOptional"]) == (
        kind,
        default,
        True,
    )
    assert compiled.task_input_source("preprocess", task_input) == parameter


def test_preprocess_parameters_type_like_the_cluster_cli_sends_them() -> None:
    from pipelines.params import typed_parameters

    typed = typed_parameters(
        [
            "data_uri=s3://b/d.csv",
            "csv_delimiter=;",
            "csv_header=false",
            'column_roles_json={"zip": "categorical"}',
            "csv_null_values=?,-",
        ]
    )
    assert typed == {
        "data_uri": "s3://b/d.csv",
        "csv_delimiter": ";",
        "csv_header": False,
        "column_roles_json": '{"zip": "categorical"}',
        "csv_null_values": "?,-",
    }


@pytest.mark.parametrize(
    ("pairs", "delimiter"),
    [
        (["data_uri=d.csv"], ","),
        (["data_uri=d.tsv"], "\t"),
        (["data_uri=d.csv", "csv_delimiter=tab"], "\t"),
        (["data_uri=d.csv", "csv_delimiter=;"], ";"),
    ],
    ids=["csv-auto", "tsv-auto", "tab", "semicolon"],
)
def test_parameters_give_preprocess_the_delimiter_csv_input_is_split_on(
    pairs: list[str], delimiter: str
) -> None:
    from pipelines.params import check_parameters, preprocess_config, typed_parameters

    params = check_parameters(typed_parameters(pairs))
    csv = preprocess_config(params).csv_options()
    assert csv.delimiter_for(params["data_uri"]) == delimiter


@pytest.mark.parametrize(
    ("pair", "named"),
    [
        ("csv_delimiter=;;", "csv_delimiter"),
        ("csv_encoding=utf-9", "csv_encoding"),
        ("column_roles_json=[1]", "column_roles_json"),
        ('column_roles_json={"zip": "text"}', "column_roles_json"),
        ('preprocess_config_json={"val_fraction": 0}', "preprocess_config_json"),
        ('preprocess_config_json={"csv_delimiter": "ab"}', "preprocess_config_json"),
    ],
    ids=["delimiter", "encoding", "roles-not-object", "unknown-role", "fraction", "config-csv"],
)
def test_bad_preprocess_parameters_fail_before_any_step(pair: str, named: str) -> None:
    from pipelines.params import check_parameters, typed_parameters
    from trainer.base.errors import InputError

    with pytest.raises(InputError) as info:
        check_parameters(typed_parameters(["data_uri=d.csv", pair]))

    assert (info.value.code, info.value.where) == ("E_PARAM", named), str(info.value)
    assert pair.split("=")[1].strip("[]{}").split(":")[-1].strip(' "') in str(info.value)


@pytest.mark.parametrize("step", TRAINS, ids=str)
@pytest.mark.parametrize(
    ("task_input", "parameter"),
    [
        ("gpus_per_node", "gpus_per_node"),
        ("nnodes", "nodes"),
        ("gpu_type", "gpu_type"),
        ("gpu_node_selector", "gpu_node_selector"),
        ("object_store_secret", "object_store_secret"),
        ("launcher", "launcher"),
    ],
    ids=["gpus-per-node", "nodes", "gpu-type", "node-selector", "secret", "launcher"],
)
def test_train_job_shape_follows_the_gpu_parameters(
    compiled: Compiled, step: str, task_input: str, parameter: str
) -> None:
    assert compiled.task_input_source(step, task_input) == parameter


TRAINING_SETTINGS = (
    "model_name",
    "learning_rate",
    "batch_size",
    "seed",
    "gpus_per_node",
    "gpu_type",
    "hyperparams_json",
)
"""Pipeline parameters that both the train step and every tune trial train with."""


@pytest.mark.parametrize("step", ("tune", *TRAINS), ids=str)
@pytest.mark.parametrize("parameter", TRAINING_SETTINGS, ids=str)
def test_train_and_tune_trials_get_the_same_training_settings(
    compiled: Compiled, step: str, parameter: str
) -> None:
    assert compiled.task_input_source(step, parameter) == parameter


@pytest.mark.parametrize(
    ("step", "task_input"), [("tune", "train_config_json"), *((t, "config_json") for t in TRAINS)]
)
def test_train_config_reaches_train_and_tune_trials(
    compiled: Compiled, step: str, task_input: str
) -> None:
    assert compiled.task_input_source(step, task_input) == "train_config_json"


@pytest.mark.parametrize("step", TRAINS, ids=str)
@pytest.mark.parametrize(
    ("task_input", "image"), [("cuda_image", "trainer-cuda"), ("cpu_image", "trainer-cpu")]
)
def test_train_job_images_pinned_to_package_version(
    compiled: Compiled, step: str, task_input: str, image: str
) -> None:
    ref = compiled.task(step)["inputs"]["parameters"][task_input]["runtimeValue"]["constant"]
    assert re.fullmatch(rf"[\w.\-/:]+/{image}:{re.escape(__version__)}", ref), ref


@pytest.mark.parametrize("step", NO_GPU_STEPS, ids=str)
def test_only_the_in_step_train_asks_for_gpus(compiled: Compiled, step: str) -> None:
    assert "accelerator" not in compiled.container(step).get("resources", {})


@pytest.mark.parametrize("step", STEPS, ids=str)
def test_cpu_and_memory_requests_and_limits(compiled: Compiled, step: str) -> None:
    resources = compiled.container(step).get("resources", {})
    for kind in ("Cpu", "Memory"):
        request = resources.get(f"resource{kind}Request")
        limit = resources.get(f"resource{kind}Limit")
        assert request and limit, f"{step}: {kind.lower()} request/limit missing: {resources}"
        assert _quantity(request) <= _quantity(limit), f"{step}: {kind} {request} > {limit}"


@pytest.mark.parametrize("kind", ["Cpu", "Memory"])
def test_the_job_launcher_reserves_less_than_in_step_training(
    compiled: Compiled, kind: str
) -> None:
    launcher, trainer = (compiled.container(s)["resources"] for s in TRAINS)
    for bound in ("Request", "Limit"):
        key = f"resource{kind}{bound}"
        assert _quantity(launcher[key]) < _quantity(trainer[key]), f"{key}: {launcher[key]}"


@pytest.mark.parametrize(
    ("step", "enabled"),
    [
        ("preprocess", True),
        ("tune", True),
        ("fingerprint", False),
        (TRAIN_ON_CLUSTER, False),
        (TRAIN_IN_STEP, False),
        ("evaluate", False),
        ("register", False),
        ("notify", False),
    ],
    ids=str,
)
def test_caching(compiled: Compiled, step: str, enabled: bool) -> None:
    options = compiled.task(step).get("cachingOptions", {})
    assert options.get("enableCache", False) is enabled, f"{step}: cachingOptions {options}"


def _run_scoped_inputs(compiled: Compiled, step: str) -> dict[str, str]:
    """The input parameters of a task whose value is a run-scoped placeholder, followed up
    through the DAGs that pass them on."""
    found: dict[str, str] = {}
    for name, source in compiled.task(step)["inputs"].get("parameters", {}).items():
        dag = compiled.owner(step)
        while "componentInputParameter" in source and dag != ROOT:
            channel = source["componentInputParameter"]
            dag, parent = compiled.parent(dag)
            source = compiled._dags()[dag]["tasks"][parent]["inputs"]["parameters"][channel]
        constant = str((source.get("runtimeValue") or {}).get("constant", ""))
        if RUN_SCOPED.search(constant):
            found[name] = constant
    return found


def test_no_cached_step_takes_a_value_that_changes_every_run(compiled: Compiled) -> None:
    """The run's id as a parameter made preprocess and tune a cache miss on every run of the
    real backend (kfp.local keys on the placeholder, so local runs still hit): the steps read it
    from their pod's label instead (KFP_RUN_ID)."""
    cached = [
        s
        for s in compiled.executor_tasks()
        if compiled.task(s).get("cachingOptions", {}).get("enableCache")
    ]
    assert {"preprocess", "tune"} <= set(cached), cached
    for step in cached:
        assert _run_scoped_inputs(compiled, step) == {}, step


@pytest.mark.parametrize("step", STEPS_NAMING_JOBS, ids=str)
def test_a_step_that_names_jobs_knows_its_run_from_its_pods_label(
    compiled: Compiled, step: str
) -> None:
    env = {e["name"]: e["fieldPath"] for e in compiled.k8s(step).get("fieldPathAsEnv", [])}
    assert env.get("KFP_RUN_ID") == DOWNWARD_API_ENV["KFP_RUN_ID"], env


def test_preprocess_cache_key_holds_the_data_fingerprint(compiled: Compiled) -> None:
    # KFP's cache keys on parameters and artifact names: the uncached fingerprint step's output,
    # a parameter of preprocess, makes changed data a changed key.
    param = compiled.task("preprocess")["inputs"]["parameters"]["data_fingerprint"]
    assert param["taskOutputParameter"]["producerTask"] == "fingerprint", param


@pytest.mark.parametrize("step", RETRIED_STEPS, ids=str)
def test_retry_with_exponential_backoff(compiled: Compiled, step: str) -> None:
    policy = compiled.task(step).get("retryPolicy")
    assert policy, f"{step} has no retryPolicy"
    assert policy["maxRetryCount"] >= 1
    assert float(policy["backoffFactor"]) > 1
    assert re.fullmatch(r"\d+s", policy["backoffDuration"]) and policy["backoffDuration"] != "0s"


@pytest.mark.parametrize("step", NOT_RETRIED_STEPS, ids=str)
def test_steps_that_fail_on_bad_input_are_not_retried(compiled: Compiled, step: str) -> None:
    """KFP's retryPolicy cannot tell exit 2 (bad input) from a transient failure: a retry of
    preprocess or evaluate would only run the same rejection three times."""
    assert "retryPolicy" not in compiled.task(step), f"{step} is retried"


def test_train_has_memory_backed_dev_shm(compiled: Compiled) -> None:
    mounts = compiled.k8s(TRAIN_IN_STEP).get("emptyDirMounts", [])
    shm = [m for m in mounts if m["mountPath"] == "/dev/shm"]
    assert len(shm) == 1, f"train emptyDirMounts: {mounts}"
    assert shm[0]["medium"] == "Memory"
    # A memory-backed emptyDir counts against the container's memory limit.
    limit = compiled.container(TRAIN_IN_STEP)["resources"]["resourceMemoryLimit"]
    assert _quantity(shm[0]["sizeLimit"]) < _quantity(limit)


def test_train_tolerates_gpu_taint(compiled: Compiled) -> None:
    assert GPU_TOLERATION in compiled.k8s(TRAIN_IN_STEP).get("tolerations", [])


def test_train_node_selector_from_parameter(compiled: Compiled) -> None:
    selector = compiled.k8s(TRAIN_IN_STEP).get("nodeSelector", {})
    source = selector.get("nodeSelectorJson", {}).get("componentInputParameter")
    assert source, f"train nodeSelector is not read from a parameter: {selector}"
    assert compiled.root_parameter(compiled.owner(TRAIN_IN_STEP), source) == "gpu_node_selector"


@pytest.mark.parametrize("step", NO_GPU_STEPS, ids=str)
def test_gpu_scheduling_only_on_train(compiled: Compiled, step: str) -> None:
    k8s = compiled.k8s(step)
    assert not k8s.get("tolerations") and not k8s.get("nodeSelector")
    assert not k8s.get("emptyDirMounts")


def test_job_launcher_knows_its_own_pod(compiled: Compiled) -> None:
    env = compiled.k8s(TRAIN_ON_CLUSTER).get("fieldPathAsEnv", [])
    assert {e["name"]: e["fieldPath"] for e in env} == DOWNWARD_API_ENV


@pytest.mark.parametrize("step", STEPS, ids=str)
def test_object_store_credentials_from_secret(compiled: Compiled, step: str) -> None:
    """Every step: the store's keys (a required secret). Evaluate and register, which talk to
    the registry: its account too, from the secret registry_secret names (optional: a registry
    without authentication needs none)."""
    secrets = compiled.k8s(step).get("secretAsEnv", [])
    by_parameter = {
        compiled.root_parameter(
            compiled.owner(step), s["secretNameParameter"]["componentInputParameter"]
        ): ({e["envVar"] for e in s["keyToEnv"]}, s.get("optional", False))
        for s in secrets
    }
    expected = {"object_store_secret": ({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, False)}
    if step in ("evaluate", "register"):
        account = {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
        expected["registry_secret"] = (account, True)
    assert by_parameter == expected, f"{step} secretAsEnv: {secrets}"
    assert len(secrets) == len(expected)


def test_register_runs_only_when_evaluate_passes_the_gate(compiled: Compiled) -> None:
    condition_dag = compiled.owner("register")
    owner, condition_task = compiled.parent(condition_dag)
    task = compiled._dags()[owner]["tasks"][condition_task]
    condition = task.get("triggerPolicy", {}).get("condition", "")
    match = re.search(r"parameter_values\['([^']+)'\]\s*==\s*true", condition)
    assert match, f"register is not under a condition on a boolean: {condition!r}"
    source = task["inputs"]["parameters"][match.group(1)]["taskOutputParameter"]
    evaluate = compiled.task_name("evaluate")
    assert source == {"producerTask": evaluate, "outputParameterKey": "Output"}
    assert evaluate in task.get("dependentTasks", [])


_GENERATED_GROUP = re.compile(r"^(condition|condition-branches|exit-handler|for-loop)-\d+$")
"""The names KFP's SDK gives a group that has none of its own."""


def _group_names(c: Compiled) -> dict[str, str]:
    """Task key -> display name (``taskInfo.name``, the UI's label) of every group task."""
    return {
        key: task["taskInfo"]["name"]
        for dag in c._dags().values()
        for key, task in dag["tasks"].items()
        if "dag" in c.spec["components"][task["componentRef"]["name"]]
    }


def test_every_group_has_a_name_a_person_reads(
    compiled: Compiled, local_compiled: Compiled
) -> None:
    """Issue 62, item 3: the run graph labels a group by its display name; KFP's own
    (``condition-branches-2``) says nothing to a person."""
    groups = _group_names(compiled)
    assert sorted(groups.values()) == [
        "gate-passed", "launcher-choice", "train-in-step", "train-on-cluster", "training"
    ]  # fmt: skip
    assert sorted(_group_names(local_compiled).values()) == ["gate-passed", "training"]
    for key, name in groups.items():
        assert not _GENERATED_GROUP.match(name), f"group {key} is shown as {name!r}"


def test_evaluate_keeps_the_baselines_apart_and_register_records_both(compiled: Compiled) -> None:
    """Issue 62, item 3: the UI's metrics table pages at 10 rows; evaluate's ``metrics`` holds
    the model's own, ``baselines`` the 12 baseline scores, and register takes both."""
    component = compiled.spec["components"][compiled.task("evaluate")["componentRef"]["name"]]
    outputs = component["outputDefinitions"]["artifacts"]
    for name in ("metrics", "baselines"):
        assert outputs[name]["artifactType"]["schemaTitle"] == "system.Metrics"
        assert compiled.artifact_producers("register", name) == (set(), {("evaluate", name)})


def test_notify_is_the_exit_handler_with_final_status(compiled: Compiled) -> None:
    assert compiled.owner(EXIT_HANDLER) == ROOT
    task = compiled.task(EXIT_HANDLER)
    assert task["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    handled = task["inputs"]["parameters"]["status"]["taskFinalStatus"]["producerTask"]
    assert task["dependentTasks"] == [handled]
    component = compiled.spec["components"][task["componentRef"]["name"]]
    assert component["inputDefinitions"]["parameters"]["status"]["parameterType"] == (
        "TASK_FINAL_STATUS"
    )
    for step in RETRIED_STEPS:
        assert handled in compiled.ancestors(step), f"{step} is outside the exit handler"


@pytest.mark.parametrize(
    ("step", "image"),
    [
        ("preprocess", "trainer-cpu"),
        ("tune", "trainer-cuda"),
        (TRAIN_ON_CLUSTER, "trainer-cuda"),
        (TRAIN_IN_STEP, "trainer-cuda"),
        ("evaluate", "trainer-cpu"),
        ("register", "trainer-cpu"),
        ("notify", "trainer-cpu"),
    ],
    ids=str,
)
def test_image_pinned_to_package_version(compiled: Compiled, step: str, image: str) -> None:
    ref = compiled.container(step)["image"]
    assert re.fullmatch(rf"[\w.\-/:]+/{image}:{re.escape(__version__)}", ref), ref


# --- the local pipeline ---------------------------------------------------------------------


def test_local_pipeline_has_no_retries(local_compiled: Compiled) -> None:
    assert "retryPolicy" not in local_compiled.text
    for dag in local_compiled._dags().values():
        for name, task in dag["tasks"].items():
            assert "retryPolicy" not in task, f"{name} is retried in the local pipeline"


def test_local_pipeline_trains_in_one_task(local_compiled: Compiled) -> None:
    steps = local_compiled.executor_tasks()
    trains = [s for s in steps if local_compiled.function(s) == "train"]
    assert trains == [TRAIN_IN_STEP]
    branches = [c for c in local_compiled.spec["components"] if "condition-branches" in c]
    assert not branches, f"the local pipeline has train branches: {branches}"
    for step in ("evaluate", "register"):
        assert local_compiled.artifact_producers(step, "model") == (
            set(),
            {(TRAIN_IN_STEP, "model")},
        )
    assert "accelerator" in local_compiled.container(TRAIN_IN_STEP)["resources"]


_SECRET_PATTERNS = {
    "aws-access-key-id": r"\b(AKIA|ASIA)[0-9A-Z]{16}\b",
    "private-key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    "github-token": r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    "huggingface-token": r"\bhf_[A-Za-z0-9]{20,}",
    "slack-token": r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    "bearer": r"(?i)bearer\s+[A-Za-z0-9._\-]{16,}",
    "assigned-secret": r"(?i)(password|passwd|api[_-]?key|token|secret_access_key)\s*[:=]\s*\S",
    "minio-defaults": r"\b(minio123|minioadmin)\b",
    "credentials-in-uri": r"[a-z+]+://[^/\s:@'\"]+:[^/\s@'\"]+@",
}


@pytest.mark.parametrize("pattern", _SECRET_PATTERNS.values(), ids=_SECRET_PATTERNS.keys())
def test_no_credentials_in_yaml(compiled: Compiled, pattern: str) -> None:
    hits = re.findall(pattern, compiled.text)
    assert not hits, f"credential-like text in {COMPILED.name}: {hits[:3]}"


@pytest.mark.parametrize("step", STEPS, ids=str)
def test_credentials_not_set_as_plain_env(compiled: Compiled, step: str) -> None:
    env = {e["name"] for e in compiled.container(step).get("env", [])}
    assert not env & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN"}


# --- golden files ---------------------------------------------------------------------------

COMMITTED = sorted(
    [*REPO.glob("pipelines/compiled/*.yaml"), *REPO.glob("components/*/component.yaml")]
)
STALE = "stale: run `make compile`"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Everything ``compile_all`` writes, by path relative to the repository root."""
    from pipelines.compile import compile_all

    out = tmp_path_factory.mktemp("compiled")
    written = compile_all(out / "pipelines" / "compiled", components_dir=out / "components")
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in written}


def test_golden_files_cover_everything_compiled(fresh: dict[str, bytes]) -> None:
    committed = {p.relative_to(REPO).as_posix() for p in COMMITTED}
    assert committed == set(fresh), f"{STALE} (missing or extra files: {committed ^ set(fresh)})"


@pytest.mark.parametrize("path", COMMITTED, ids=[p.relative_to(REPO).as_posix() for p in COMMITTED])
def test_golden_file_is_fresh(fresh: dict[str, bytes], path: Path) -> None:
    rel = path.relative_to(REPO).as_posix()
    assert rel in fresh, f"{STALE} ({rel} is no longer compiled)"
    assert path.read_bytes() == fresh[rel], f"{STALE} ({rel} differs from compile_all's output)"
