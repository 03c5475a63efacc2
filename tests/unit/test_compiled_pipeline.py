"""The committed pipeline YAML carries every cluster setting, read the way KFP stores it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainer.version import __version__

REPO = Path(__file__).resolve().parents[2]
COMPILED = REPO / "pipelines" / "compiled" / "gpupipe-training.yaml"
STEPS = ("preprocess", "train", "evaluate", "register", "notify")
RETRIED_STEPS = ("preprocess", "train", "evaluate", "register")
EXIT_HANDLER = "notify"
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
    """The two YAML documents of a compiled pipeline, with lookups that follow KFP's wiring."""

    spec: dict[str, Any]
    platform: dict[str, Any]
    text: str

    def _dags(self) -> dict[str, dict[str, Any]]:
        dags = {ROOT: self.spec["root"]["dag"]}
        for name, comp in self.spec["components"].items():
            if "dag" in comp:
                dags[name] = comp["dag"]
        return dags

    def owner(self, task_name: str) -> str:
        """The DAG (component name, or ROOT) that holds the task."""
        owners = [d for d, dag in self._dags().items() if task_name in dag["tasks"]]
        assert len(owners) == 1, f"task {task_name!r} found in {owners}"
        return owners[0]

    def task(self, task_name: str) -> dict[str, Any]:
        return self._dags()[self.owner(task_name)]["tasks"][task_name]

    def parent(self, dag_component: str) -> tuple[str, str]:
        """(owner DAG, task name) of the task that runs ``dag_component``."""
        for owner, dag in self._dags().items():
            for name, task in dag["tasks"].items():
                if task["componentRef"]["name"] == dag_component:
                    return owner, name
        raise AssertionError(f"no task runs {dag_component!r}")

    def ancestors(self, task_name: str) -> list[str]:
        """Names of the DAG tasks (exit handler, condition) enclosing a task, innermost first."""
        out, owner = [], self.owner(task_name)
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

    def task_input_source(self, task_name: str, name: str) -> str:
        """The pipeline parameter behind one input parameter of a task."""
        source = self.task(task_name)["inputs"]["parameters"][name]
        assert "componentInputParameter" in source, f"{task_name}.{name} is {source}"
        return self.root_parameter(self.owner(task_name), source["componentInputParameter"])

    def executor_label(self, task_name: str) -> str:
        component = self.task(task_name)["componentRef"]["name"]
        return self.spec["components"][component]["executorLabel"]

    def container(self, task_name: str) -> dict[str, Any]:
        executors = self.spec["deploymentSpec"]["executors"]
        return executors[self.executor_label(task_name)]["container"]

    def k8s(self, task_name: str) -> dict[str, Any]:
        executors = self.platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        return executors.get(self.executor_label(task_name), {})


@pytest.fixture(scope="module")
def compiled() -> Compiled:
    text = COMPILED.read_text()
    docs = list(yaml.safe_load_all(text))
    assert len(docs) == 2, "expected the pipeline spec and the platform spec"
    return Compiled(spec=docs[0], platform=docs[1], text=text)


@pytest.mark.parametrize(
    ("name", "parameter_type", "required"),
    [
        ("data_uri", "STRING", True),
        ("target", "STRING", False),
        ("task", "STRING", False),
        ("model_name", "STRING", False),
        ("epochs", "NUMBER_INTEGER", False),
        ("gpu_type", "STRING", False),
        ("gpus_per_node", "NUMBER_INTEGER", False),
        ("nodes", "NUMBER_INTEGER", False),
        ("gpu_node_selector", "STRUCT", False),
        ("object_store_secret", "STRING", False),
    ],
    ids=lambda v: str(v),
)
def test_pipeline_parameters(
    compiled: Compiled, name: str, parameter_type: str, required: bool
) -> None:
    params = compiled.spec["root"]["inputDefinitions"]["parameters"]
    assert name in params, f"pipeline parameter {name!r} missing; have {sorted(params)}"
    assert params[name]["parameterType"] == parameter_type
    assert params[name].get("isOptional", False) is not required
    assert params[name].get("description"), f"parameter {name!r} has no description in the UI"


@pytest.mark.parametrize(
    ("field", "parameter"),
    [("resourceType", "gpu_type"), ("resourceCount", "gpus_per_node")],
    ids=["accelerator-type", "gpu-limit"],
)
def test_train_accelerator_comes_from_pipeline_parameters(
    compiled: Compiled, field: str, parameter: str
) -> None:
    accelerator = compiled.container("train")["resources"]["accelerator"]
    match = _PLACEHOLDER.match(str(accelerator[field]))
    assert match, f"accelerator {field} is a constant ({accelerator[field]!r}), not a parameter"
    assert compiled.task_input_source("train", match.group(1)) == parameter


@pytest.mark.parametrize(
    ("task_input", "parameter"),
    [("nproc_per_node", "gpus_per_node"), ("nnodes", "nodes"), ("gpu_type", "gpu_type")],
    ids=["processes-per-node", "nodes", "gpu-type"],
)
def test_train_job_shape_follows_the_gpu_parameters(
    compiled: Compiled, task_input: str, parameter: str
) -> None:
    assert compiled.task_input_source("train", task_input) == parameter


@pytest.mark.parametrize("step", [s for s in STEPS if s != "train"], ids=str)
def test_only_train_asks_for_gpus(compiled: Compiled, step: str) -> None:
    assert "accelerator" not in compiled.container(step).get("resources", {})


@pytest.mark.parametrize("step", STEPS, ids=str)
def test_cpu_and_memory_requests_and_limits(compiled: Compiled, step: str) -> None:
    resources = compiled.container(step).get("resources", {})
    for kind in ("Cpu", "Memory"):
        request = resources.get(f"resource{kind}Request")
        limit = resources.get(f"resource{kind}Limit")
        assert request and limit, f"{step}: {kind.lower()} request/limit missing: {resources}"
        assert _quantity(request) <= _quantity(limit), f"{step}: {kind} {request} > {limit}"


@pytest.mark.parametrize(
    ("step", "enabled"),
    [
        ("preprocess", True),
        ("train", False),
        ("evaluate", False),
        ("register", False),
        ("notify", False),
    ],
    ids=str,
)
def test_caching(compiled: Compiled, step: str, enabled: bool) -> None:
    options = compiled.task(step).get("cachingOptions", {})
    assert options.get("enableCache", False) is enabled, f"{step}: cachingOptions {options}"


@pytest.mark.parametrize("step", RETRIED_STEPS, ids=str)
def test_retry_with_exponential_backoff(compiled: Compiled, step: str) -> None:
    policy = compiled.task(step).get("retryPolicy")
    assert policy, f"{step} has no retryPolicy"
    assert policy["maxRetryCount"] >= 1
    assert float(policy["backoffFactor"]) > 1
    assert re.fullmatch(r"\d+s", policy["backoffDuration"]) and policy["backoffDuration"] != "0s"


def test_exit_handler_is_not_retried(compiled: Compiled) -> None:
    assert "retryPolicy" not in compiled.task(EXIT_HANDLER)


def test_train_has_memory_backed_dev_shm(compiled: Compiled) -> None:
    mounts = compiled.k8s("train").get("emptyDirMounts", [])
    shm = [m for m in mounts if m["mountPath"] == "/dev/shm"]
    assert len(shm) == 1, f"train emptyDirMounts: {mounts}"
    assert shm[0]["medium"] == "Memory"
    # A memory-backed emptyDir counts against the container's memory limit.
    limit = compiled.container("train")["resources"]["resourceMemoryLimit"]
    assert _quantity(shm[0]["sizeLimit"]) < _quantity(limit)


def test_train_tolerates_gpu_taint(compiled: Compiled) -> None:
    tolerations = compiled.k8s("train").get("tolerations", [])
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_train_node_selector_from_parameter(compiled: Compiled) -> None:
    selector = compiled.k8s("train").get("nodeSelector", {})
    source = selector.get("nodeSelectorJson", {}).get("componentInputParameter")
    assert source, f"train nodeSelector is not read from a parameter: {selector}"
    assert compiled.root_parameter(compiled.owner("train"), source) == "gpu_node_selector"


@pytest.mark.parametrize("step", [s for s in STEPS if s != "train"], ids=str)
def test_gpu_scheduling_only_on_train(compiled: Compiled, step: str) -> None:
    k8s = compiled.k8s(step)
    assert not k8s.get("tolerations") and not k8s.get("nodeSelector")
    assert not k8s.get("emptyDirMounts")


@pytest.mark.parametrize("step", STEPS, ids=str)
def test_object_store_credentials_from_secret(compiled: Compiled, step: str) -> None:
    secrets = compiled.k8s(step).get("secretAsEnv", [])
    assert len(secrets) == 1, f"{step} secretAsEnv: {secrets}"
    envs = {e["envVar"] for e in secrets[0]["keyToEnv"]}
    assert envs == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    source = secrets[0]["secretNameParameter"]["componentInputParameter"]
    assert compiled.root_parameter(compiled.owner(step), source) == "object_store_secret"


def test_register_runs_only_when_evaluate_passes_the_gate(compiled: Compiled) -> None:
    condition_dag = compiled.owner("register")
    owner, condition_task = compiled.parent(condition_dag)
    task = compiled._dags()[owner]["tasks"][condition_task]
    condition = task.get("triggerPolicy", {}).get("condition", "")
    match = re.search(r"parameter_values\['([^']+)'\]\s*==\s*true", condition)
    assert match, f"register is not under a condition on a boolean: {condition!r}"
    source = task["inputs"]["parameters"][match.group(1)]["taskOutputParameter"]
    assert source == {"producerTask": "evaluate", "outputParameterKey": "Output"}
    assert "evaluate" in task.get("dependentTasks", [])


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
        ("train", "trainer-cuda"),
        ("evaluate", "trainer-cpu"),
        ("register", "trainer-cpu"),
        ("notify", "trainer-cpu"),
    ],
    ids=str,
)
def test_image_pinned_to_package_version(compiled: Compiled, step: str, image: str) -> None:
    ref = compiled.container(step)["image"]
    assert re.fullmatch(rf"[\w.\-/:]+/{image}:{re.escape(__version__)}", ref), ref


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
