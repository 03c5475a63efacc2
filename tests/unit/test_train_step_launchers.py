"""The train step's launchers: which one runs, the job a PyTorchJob step creates, one mapping."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from components.images import CPU_IMAGE, CUDA_IMAGE
from pipelines.render import render_pytorchjob
from tests.fakes.kube_api import FakeKubeApi, Scenario
from tests.helpers import assert_valid_job, needs_crd
from trainer.base import outputs, storage
from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.launch.jobspec import ClusterConfig, JobSpec, job_name
from trainer.launch.kube import KubeApi, RetryPolicy
from trainer.launch.local import LocalLauncher
from trainer.launch.pytorchjob import PyTorchJobLauncher, build_pytorchjob
from trainer.steps.train import TrainStepConfig, train_step
from trainer.steps.train.step import make_launcher

NS = "team-a"
IMAGE = "ghcr.io/gpupipe/trainer-cuda:test"
SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-H200"}
SECRET = "s3-creds"
CONFIG_URI = "s3://bucket/run/train/model-work/worker-config.json"
POD_ENV = ("POD_NAME", "POD_NAMESPACE", "POD_UID")
LAUNCHER_POD = {"POD_NAME": "train-launcher-x1", "POD_NAMESPACE": NS, "POD_UID": "uid-1234"}


@pytest.fixture(autouse=True)
def no_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start outside a pod, whatever the machine running them has set."""
    for name in POD_ENV:
        monkeypatch.delenv(name, raising=False)


def cluster_cfg(**overrides: Any) -> TrainStepConfig:
    """A pytorchjob step on 2 nodes x 8 GPUs with every cluster setting given."""
    settings: dict[str, Any] = {
        "launcher": "pytorchjob",
        "gpus_per_node": 8,
        "nnodes": 2,
        "timeout_s": 3600,
        "cluster": {
            "namespace": NS,
            "image": IMAGE,
            "gpu_resource": "nvidia.com/gpu",
            "node_selector": dict(SELECTOR),
            "object_store_secret": SECRET,
            "cpu_request": "8",
            "cpu_limit": "32",
            "memory_request": "64Gi",
            "memory_limit": "256Gi",
        },
    }
    for key, value in overrides.items():
        if key == "cluster":
            settings["cluster"] = {**settings["cluster"], **value}
        else:
            settings[key] = value
    return from_dict(TrainStepConfig, settings)


def job_spec(cfg: TrainStepConfig, name: str = "gpupipe-run-train", namespace: str = NS) -> JobSpec:
    """The job spec the step's launcher makes: the step's run, in ``namespace``."""
    run = cfg.training_run(job_name=name, config_uri=CONFIG_URI)
    return JobSpec(namespace=namespace, run=run, cluster=cfg.cluster)


def pod(job: dict[str, Any], rtype: str = "Master") -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]


def container(job: dict[str, Any], rtype: str = "Master") -> dict[str, Any]:
    (c,) = pod(job, rtype)["containers"]
    return c


def secret_env(job: dict[str, Any], rtype: str = "Master") -> dict[str, tuple[str, str]]:
    """Env var -> (secret, key) of the variables read from secrets."""
    return {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container(job, rtype)["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }


# --- (a) which launcher ---------------------------------------------------------------------


def test_local_launcher_for_local() -> None:
    assert isinstance(make_launcher(TrainStepConfig(launcher="local")), LocalLauncher)


@pytest.mark.parametrize(
    ("cluster_namespace", "pod_namespace", "expected"),
    [("team-b", None, "team-b"), (None, NS, NS), ("team-b", NS, "team-b")],
    ids=["from-config", "from-downward-api", "config-wins"],
)
def test_pytorchjob_launcher_namespace(
    monkeypatch: pytest.MonkeyPatch,
    cluster_namespace: str | None,
    pod_namespace: str | None,
    expected: str,
) -> None:
    if pod_namespace is not None:
        monkeypatch.setenv("POD_NAMESPACE", pod_namespace)
    cfg = cluster_cfg(cluster={"namespace": cluster_namespace})

    launcher = make_launcher(cfg)

    assert isinstance(launcher, PyTorchJobLauncher)
    assert launcher.namespace == expected
    assert isinstance(launcher.cluster, ClusterConfig)
    spec = job_spec(cfg, namespace=launcher.namespace)
    assert build_pytorchjob(spec)["metadata"]["namespace"] == expected


def test_pytorchjob_launcher_owns_the_job_by_its_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in LAUNCHER_POD.items():
        monkeypatch.setenv(name, value)

    launcher = make_launcher(cluster_cfg(cluster={"namespace": None}))

    assert isinstance(launcher, PyTorchJobLauncher)
    assert launcher.own_pod is not None and launcher.own_pod.uid == LAUNCHER_POD["POD_UID"]


def test_pytorchjob_launcher_without_namespace_names_the_setting() -> None:
    with pytest.raises(InputError) as info:
        make_launcher(cluster_cfg(cluster={"namespace": None}))
    assert info.value.where == "train.cluster.namespace"
    assert "POD_NAMESPACE" in str(info.value)


# --- (b) config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: TrainStepConfig(launcher="pytorchjob"),
        lambda: from_dict(TrainStepConfig, {"launcher": "pytorchjob", "cluster": {"image": ""}}),
    ],
    ids=["dataclass", "from-dict"],
)
def test_pytorchjob_without_image_names_the_setting(build: Any) -> None:
    with pytest.raises(InputError) as info:
        build()
    assert info.value.where == "train.cluster.image"


def test_local_launcher_needs_no_image() -> None:
    assert TrainStepConfig(launcher="local").cluster.image == ""


# --- (c) the job spec -----------------------------------------------------------------------


def test_job_spec_maps_the_cluster_settings() -> None:
    spec = job_spec(cluster_cfg())

    assert (spec.name, spec.namespace, spec.cluster.image, spec.run.config_uri) == (
        "gpupipe-run-train",
        NS,
        IMAGE,
        CONFIG_URI,
    )
    assert (spec.run.nnodes, spec.procs_per_node, spec.run.gpus_per_node) == (2, 8, 8)
    assert spec.cluster.gpu_resource == "nvidia.com/gpu"
    assert spec.cluster.node_selector == SELECTOR
    assert spec.cluster.object_store_secret == SECRET
    assert (spec.cluster.cpu_request, spec.cluster.cpu_limit) == ("8", "32")
    assert (spec.cluster.memory_request, spec.cluster.memory_limit) == ("64Gi", "256Gi")
    assert spec.run.timeout_s == 3600
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
        spec.tolerations
    )


def test_built_job_carries_the_cluster_settings() -> None:
    cfg = cluster_cfg()
    job = build_pytorchjob(job_spec(cfg))

    assert job["metadata"]["namespace"] == NS
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    for rtype in ("Master", "Worker"):
        c = container(job, rtype)
        assert c["image"] == IMAGE
        assert c["command"][-2:] == ["--config", CONFIG_URI]
        assert c["resources"]["limits"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}
        assert c["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
        assert pod(job, rtype)["nodeSelector"] == SELECTOR
        assert secret_env(job, rtype) == {
            "AWS_ACCESS_KEY_ID": (SECRET, "accesskey"),
            "AWS_SECRET_ACCESS_KEY": (SECRET, "secretkey"),
        }


def test_cpu_job_without_secret_or_timeout() -> None:
    cfg = cluster_cfg(
        gpus_per_node=0, timeout_s=None, cluster={"node_selector": {}, "object_store_secret": None}
    )
    job = build_pytorchjob(job_spec(cfg, name="gpupipe-cpu"))

    assert "nvidia.com/gpu" not in container(job)["resources"]["limits"]
    assert "tolerations" not in pod(job) and "nodeSelector" not in pod(job)
    assert secret_env(job) == {}
    assert "activeDeadlineSeconds" not in job["spec"]["runPolicy"]


@needs_crd
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"nnodes": 1},
        {"gpus_per_node": 0, "cluster": {"object_store_secret": None}},
        {"cluster": {"service_account": "trainer", "gpu_resource": "amd.com/gpu"}},
    ],
    ids=["2x8-gpus", "one-node", "cpu", "service-account-amd"],
)
def test_built_job_is_valid_against_the_crd(overrides: dict[str, Any]) -> None:
    cfg = cluster_cfg(**overrides)
    assert_valid_job(build_pytorchjob(job_spec(cfg)))


# --- one mapping: render == the train step ---------------------------------------------------

RENDER_CASES = {
    "2x8-h200": (
        {
            "nodes": 2,
            "gpus_per_node": 8,
            "gpu_node_selector": SELECTOR,
            "object_store_secret": SECRET,
            "train_config_json": '{"timeout_s": 3600}',
        },
        {"cluster": {"image": CUDA_IMAGE}},
    ),
    "cpu-cluster": (
        {"nodes": 2, "gpus_per_node": 0, "object_store_secret": SECRET},
        {
            "gpus_per_node": 0,
            "timeout_s": None,
            "cluster": {"image": CPU_IMAGE, "node_selector": {}},
        },
    ),
}


@pytest.mark.parametrize(
    ("params", "overrides"), list(RENDER_CASES.values()), ids=list(RENDER_CASES)
)
def test_render_builds_what_the_train_step_builds(
    params: dict[str, Any], overrides: dict[str, Any]
) -> None:
    (rendered,) = yaml.safe_load_all(render_pytorchjob(params, namespace=NS, config_uri=CONFIG_URI))
    # Neither the pipeline nor the render sets cpu/memory of the job: ClusterConfig's defaults.
    d = ClusterConfig()
    defaults = {
        "cpu_request": d.cpu_request,
        "cpu_limit": d.cpu_limit,
        "memory_request": d.memory_request,
        "memory_limit": d.memory_limit,
    }
    cfg = cluster_cfg(**{**overrides, "cluster": {**defaults, **overrides["cluster"]}})

    name = rendered["metadata"]["name"]  # a placeholder run id names the rendered job
    built = build_pytorchjob(job_spec(cfg, name=name))

    assert rendered == built


# --- (d) the whole step against the fake API server -----------------------------------------

FEATURES = ["tenure", "plan", "monthly_spend"]
METRICS = {"val_accuracy": 0.875, "val_loss": 0.31}


@pytest.fixture
def fake() -> Iterator[FakeKubeApi]:
    with FakeKubeApi(Scenario(lines=["step 1 loss 0.700", "step 2 loss 0.410"])) as server:
        yield server


@pytest.fixture
def api(fake: FakeKubeApi) -> KubeApi:
    cfg = client.Configuration(host=fake.url)
    cfg.retries = False
    return KubeApi(
        client.ApiClient(cfg),
        retry=RetryPolicy(attempts=2, backoff_s=0.01, max_backoff_s=0.02),
        request_timeout_s=10.0,  # only a hung request times out, not one a loaded machine slowed
        sleep=lambda s: None,
    )


@pytest.fixture
def uris(tmp_path: Path) -> dict[str, str]:
    """A preprocessed dataset, and the model the job's rank 0 wrote (the fake runs nothing)."""
    dataset = str(tmp_path / "artifacts" / "preprocess" / "dataset")
    model = str(tmp_path / "artifacts" / "train" / "model")
    schema = {"target": "churned", "task": "classification", "features": FEATURES}
    storage.write_json(storage.join(dataset, "schema.json"), schema)
    storage.write_bytes(storage.join(dataset, "train.parquet"), b"PAR1")
    storage.write_bytes(storage.join(dataset, "val.parquet"), b"PAR1")
    storage.write_json(storage.join(model, "metrics.json"), METRICS)
    storage.write_json(storage.join(model, "model.json"), {"extra": {"train": {"steps": 42}}})
    # As export.save_model publishes it: with the train step's marker, so the step may replace it.
    storage.write_json(outputs.marker_uri(model), outputs.marker("train"))
    return {"dataset": dataset, "model": model, "work": model + "-work"}


def _uri_values(node: Any, key: str = "") -> list[str]:
    """Every string in a config under a key that names a URI."""
    if isinstance(node, dict):
        return [v for k, child in node.items() for v in _uri_values(child, k)]
    if isinstance(node, list):
        return [v for child in node for v in _uri_values(child, key)]
    return [node] if isinstance(node, str) and (key == "uri" or key.endswith("_uri")) else []


def test_train_step_creates_the_pytorchjob_and_reads_back_the_model(
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeKubeApi,
    api: KubeApi,
    uris: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in LAUNCHER_POD.items():
        monkeypatch.setenv(name, value)
    cfg = cluster_cfg(cluster={"namespace": None})
    real = make_launcher(cfg)  # the step's own cluster settings -> JobSpec -> PyTorchJob
    assert isinstance(real, PyTorchJobLauncher)
    launcher = PyTorchJobLauncher(
        namespace=real.namespace,
        cluster=real.cluster,
        own_pod=real.own_pod,
        on_exit=real.on_exit,
        api=api,
        poll_s=0.05,
    )
    name = job_name("run-7d2e", "train")

    result = train_step(
        cfg,
        dataset_uri=uris["dataset"],
        model_uri=uris["model"],
        work_uri=uris["work"],
        job_name=name,
        launcher=launcher,
    )

    assert result.metrics == METRICS and result.steps == 42 and result.job_name == name
    assert "step 2 loss 0.410" in capsys.readouterr().out  # the master's log, streamed
    (post,) = fake.calls("POST", r"/namespaces/team-a/pytorchjobs$")
    job = post.body
    assert fake.created == [f"{NS}/{name}"]
    config_uri = storage.join(uris["work"], "worker-config.json")
    for rtype in ("Master", "Worker"):
        c = container(job, rtype)
        assert c["command"][-2:] == ["--config", config_uri]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert pod(job, rtype)["nodeSelector"] == SELECTOR
        assert secret_env(job, rtype) == {
            "AWS_ACCESS_KEY_ID": (SECRET, "accesskey"),
            "AWS_SECRET_ACCESS_KEY": (SECRET, "secretkey"),
        }
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Pod", LAUNCHER_POD["POD_UID"])

    worker = json.loads(storage.read_text(config_uri))
    data = worker["data"]
    assert data["train_uri"] == storage.join(uris["dataset"], "train.parquet")
    assert data["val_uri"] == storage.join(uris["dataset"], "val.parquet")
    assert data["schema_uri"] == storage.join(uris["dataset"], "schema.json")
    assert (data["target"], data["features"]) == ("churned", FEATURES)
    assert worker["output"]["model_uri"] == uris["model"]
    # The job's pods see nothing of the launcher's: every location is under a URI it was given.
    locations = _uri_values(worker)
    assert len(locations) >= 5, locations
    for uri in locations:
        assert uri.startswith((uris["dataset"], uris["model"])), uri


def test_the_train_component_puts_the_job_parameters_on_its_pytorchjob(
    monkeypatch: pytest.MonkeyPatch, fake: FakeKubeApi, api: KubeApi, uris: dict[str, str]
) -> None:
    """From the component's inputs (what the pipeline passes) to the job the API server gets."""
    from kfp import dsl

    from components.train import train

    for name, value in LAUNCHER_POD.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(KubeApi, "from_config", classmethod(lambda cls, **_: api))

    train.python_func(
        dataset=dsl.Dataset(uri=uris["dataset"]),
        model=dsl.Model(uri=uris["model"]),
        metrics=dsl.Metrics(uri=uris["model"] + "-metrics"),
        gpus_per_node=2,
        nnodes=2,
        launcher="pytorchjob",
        pipeline_run_id="run-7d2e",
        cuda_image=IMAGE,
        image_pull_secrets=["regcred"],
        job_labels={"team": "research"},
        job_annotations={"karpenter.sh/do-not-disrupt": "true"},
        job_env={"NCCL_DEBUG": "INFO"},
        gang_queue="gpu-team",
        gang_priority_class="high",
    )

    (post,) = fake.calls("POST", r"/namespaces/team-a/pytorchjobs$")
    job = post.body
    labels = job["metadata"]["labels"]
    assert labels["team"] == "research"
    assert labels["kueue.x-k8s.io/queue-name"] == "gpu-team"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"
    assert job["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    assert "schedulingPolicy" not in job["spec"]["runPolicy"]
    for rtype in ("Master", "Worker"):
        assert pod(job, rtype)["imagePullSecrets"] == [{"name": "regcred"}]
        env = {e["name"]: e.get("value") for e in container(job, rtype)["env"]}
        assert env["NCCL_DEBUG"] == "INFO"
        assert container(job, rtype)["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert job["spec"]["nprocPerNode"] == "2"
