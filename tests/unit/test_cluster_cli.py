"""``gpupipe upload | run --host | schedule`` against a fake KFP v2beta1 API server on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipelines import cluster, cluster_auth, cluster_package, cron
from tests.fakes.kfp_api import FakeKfp, RunScript, check_model, serve
from tests.helpers import gpupipe_cli

TOKEN = "s3cr3t-token-value"


_gp = gpupipe_cli


def _body(fake: FakeKfp, method: str, path: str) -> dict:
    return json.loads(fake.calls(method, path)[-1].body)


REGISTRY = "http://mlflow.kubeflow:5000"


@pytest.fixture
def uploaded(kfp: FakeKfp, capsys: pytest.CaptureFixture[str]) -> FakeKfp:
    """The pipeline uploaded as a platform team does: with the cluster's registry baked in."""
    assert _gp(capsys, "upload", "--host", kfp.url, "--set", f"registry_uri={REGISTRY}")[0] == 0
    return kfp


# -- upload ----------------------------------------------------------------------------------------


def test_upload_creates_pipeline_and_content_named_version(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _gp(capsys, "upload", "--host", kfp.url)
    assert code == 0
    (pipeline,) = kfp.pipelines.values()
    (version,) = kfp.versions[pipeline.pipeline_id]
    digest = cluster_package.compile_training_pipeline().digest
    assert version.name == f"v-{digest[:12]}"
    assert version.description.startswith(f"sha256:{digest}")
    assert "created pipeline and version" in out
    assert (
        f"/#/pipelines/details/{pipeline.pipeline_id}/version/{version.pipeline_version_id}" in out
    )
    upload = kfp.calls("POST", "/apis/v2beta1/pipelines/upload_version")[-1]
    assert upload.query["pipelineid"] == pipeline.pipeline_id


def test_upload_same_yaml_twice_is_a_no_op(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    again = ["upload", "--host", uploaded.url, "--set", f"registry_uri={REGISTRY}"]
    code, out, _ = _gp(capsys, *again)
    assert code == 0
    assert out.startswith("unchanged: this YAML is already uploaded")
    assert len(uploaded.calls("POST", "/apis/v2beta1/pipelines/upload_version")) == 1
    assert sum(len(v) for v in uploaded.versions.values()) == 1


def _changed() -> cluster_package.Compiled:
    c = _real_compile()
    text = c.yaml_text.replace("sdkVersion: kfp-", "sdkVersion: kfp-changed-", 1)
    assert text != c.yaml_text
    return dataclasses.replace(c, yaml_text=text, digest=cluster_package.content_digest(text))


_real_compile = cluster_package.compile_training_pipeline


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--param", "data_uri=s3://b/d.parquet"],
        ["run", "--param", "data_uri=s3://b/d.parquet", "--param", "registry_uri="],
        ["run", "--compiled", "--param", "data_uri=s3://b/d.parquet"],
        ["schedule", "--cron", "0 0 2 * * *", "--param", "data_uri=s3://b/d.parquet"],
    ],
    ids=["run", "run-empty", "run-compiled", "schedule"],
)
def test_a_run_with_no_registry_is_refused_before_it_is_submitted(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    # Issue 60, item 0: with registry_uri empty, a cluster run "registered" its model into a
    # SQLite file inside the register step's pod, gone with the pod, and SUCCEEDED.
    assert _gp(capsys, "upload", "--host", kfp.url)[0] == 0
    code, _, err = _gp(capsys, command[0], "--host", kfp.url, *command[1:])
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "E_PARAM" in line and "registry_uri is empty" in line and "--set registry_uri" in line
    assert not kfp.calls("POST", "/apis/v2beta1/runs")
    assert not kfp.calls("POST", "/apis/v2beta1/recurringruns")


def test_upload_set_bakes_defaults_that_runs_take_and_lists_them(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _gp(
        capsys, "upload", "--host", kfp.url, "--set", f"registry_uri={REGISTRY}",
        "--set", "gpus_per_node=0",
    )  # fmt: skip
    assert code == 0
    assert f'defaults     gpus_per_node=0, registry_uri="{REGISTRY}"' in out
    (pipeline,) = kfp.pipelines.values()
    (version,) = kfp.versions[pipeline.pipeline_id]
    params = version.pipeline_spec["root"]["inputDefinitions"]["parameters"]
    assert params["registry_uri"]["defaultValue"] == REGISTRY
    assert params["gpus_per_node"]["defaultValue"] == 0
    assert "defaults set: gpus_per_node=0" in version.description
    assert REGISTRY in version.pipeline_spec["pipelineInfo"]["description"]
    # A run given only the table takes the baked registry: accepted, and KFP fills it in.
    code, _, err = _gp(capsys, "run", "--host", kfp.url, "--param", "data_uri=s3://b/d.parquet")
    assert code == 0, err
    body = _body(kfp, "POST", "/apis/v2beta1/runs")
    assert "registry_uri" not in body["runtime_config"]["parameters"]


@pytest.mark.parametrize(
    ("pair", "expected"),
    [
        ("nope=1", "unknown pipeline parameter"),
        ("gpus_per_node=two", "gpus_per_node"),
        ("registry_uri=http://u:pw@mlflow:5000", "must not hold an account"),
        ("registry_uri", "NAME=VALUE"),
    ],
    ids=["unknown", "wrong-type", "secret", "no-equals"],
)
def test_upload_set_refuses_a_bad_default_before_any_request(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], pair: str, expected: str
) -> None:
    code, _, err = _gp(capsys, "upload", "--host", kfp.url, "--set", pair)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "E_PARAM" in line and expected in line, line
    assert "pw" not in line.replace("pw@", "")  # the password is never repeated
    assert not kfp.calls()


def test_compile_set_bakes_the_defaults_upload_set_would(
    tmp_path: Path, kfp: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 62, item 2: ``gpupipe compile --set`` writes the package ``upload --set`` uploads
    (one code path), for a platform team that uploads with its own tools or ``--package``."""
    import yaml
    from kfp import components

    out = tmp_path / "platform"
    code, stdout, err = _gp(
        capsys, "compile", "--out", str(out), "--set", f"registry_uri={REGISTRY}",
        "--set", "gpus_per_node=0",
    )  # fmt: skip
    assert code == 0, err
    assert f'defaults     gpus_per_node=0, registry_uri="{REGISTRY}"' in stdout
    (path,) = out.glob("*.yaml")  # the pipeline only: the components have no --set
    spec = next(yaml.safe_load_all(path.read_text()))
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["registry_uri"]["defaultValue"] == REGISTRY
    assert params["gpus_per_node"] == {**params["gpus_per_node"], "defaultValue": 0}
    assert f'gpus_per_node=0, registry_uri="{REGISTRY}"' in spec["pipelineInfo"]["description"]
    upload = cluster_package.with_defaults(
        cluster_package.compile_training_pipeline(),
        {"registry_uri": REGISTRY, "gpus_per_node": 0},
    )
    assert path.read_text() == upload.yaml_text
    # KFP's SDK reads the defaults; uploaded as a package, the version opens the form with them.
    loaded = components.load_component_from_file(str(path))
    assert loaded.component_spec.inputs["registry_uri"].default == REGISTRY
    assert _gp(capsys, "upload", "--host", kfp.url, "--package", str(path))[0] == 0
    (pipeline,) = kfp.pipelines.values()
    (version,) = kfp.versions[pipeline.pipeline_id]
    uploaded = version.pipeline_spec["root"]["inputDefinitions"]["parameters"]
    assert uploaded["registry_uri"]["defaultValue"] == REGISTRY


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--set", "nope=1"], "unknown pipeline parameter 'nope'"),
        (["--set", "gpus_per_node=two"], "gpus_per_node must be an integer"),
        (["--set", "registry_uri=http://u:pw@mlflow:5000"], "must not hold an account"),
        (["--set", "registry_uri"], "NAME=VALUE"),
        (["--set", "epochs=-1"], "epochs"),
    ],
    ids=["unknown", "wrong-type", "secret", "no-equals", "step-refuses"],
)
def test_compile_set_refuses_a_bad_default_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    out = tmp_path / "platform"
    code, _, err = _gp(capsys, "compile", "--out", str(out), *argv)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("ERROR [gpupipe compile] E_PARAM: ") and expected in line, line
    assert "pw@" not in line  # the password is never repeated
    assert not out.exists()


@pytest.mark.parametrize("out", [None, "pipelines/compiled"], ids=["no-out", "golden"])
def test_compile_set_never_bakes_into_the_golden_files(
    capsys: pytest.CaptureFixture[str], out: str | None
) -> None:
    golden = Path("pipelines/compiled/gpupipe-training.yaml")
    before = golden.read_bytes()
    code, _, err = _gp(
        capsys, "compile", *(["--out", out] if out else []), "--set", "gpus_per_node=0"
    )
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "E_PARAM: --set bakes a platform's defaults into a package of its own" in line
    assert "--out FOLDER" in line
    assert golden.read_bytes() == before


def test_upload_changed_content_adds_a_version(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_package, "compile_training_pipeline", _changed)
    code, out, _ = _gp(capsys, "upload", "--host", uploaded.url)
    assert code == 0
    assert out.startswith("added version")
    (versions,) = uploaded.versions.values()
    assert len({v.name for v in versions}) == 2


def test_upload_explicit_version_with_other_content_is_refused(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _gp(capsys, "upload", "--host", uploaded.url, "--version", "prod")[0] == 0
    monkeypatch.setattr(cluster_package, "compile_training_pipeline", _changed)
    code, _, err = _gp(capsys, "upload", "--host", uploaded.url, "--version", "prod")
    assert code == 2
    assert err.startswith("ERROR [gpupipe upload] E_CONFLICT: version 'prod'")


# -- run -------------------------------------------------------------------------------------------


def test_run_sends_typed_parameters_and_version_reference(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _gp(
        capsys, "run", "--host", uploaded.url, "--experiment", "nightly",
        "--param", "data_uri=s3://b/churn.parquet", "--param", "epochs=3",
        "--param", "learning_rate=0.01", "--param", "target=123",
        "--param", 'gpu_node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"}',
    )  # fmt: skip
    assert code == 0
    body = _body(uploaded, "POST", "/apis/v2beta1/runs")
    check_model(body, "V2beta1Run")
    assert body["runtime_config"]["parameters"] == {
        "data_uri": "s3://b/churn.parquet",
        "epochs": 3,
        "learning_rate": 0.01,
        "target": "123",
        "gpu_node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
    }
    (pipeline,) = uploaded.pipelines.values()
    (version,) = uploaded.versions[pipeline.pipeline_id]
    assert body["pipeline_version_reference"] == {
        "pipeline_id": pipeline.pipeline_id,
        "pipeline_version_id": version.pipeline_version_id,
    }
    (experiment,) = uploaded.experiments.values()
    assert (experiment.display_name, body["experiment_id"]) == ("nightly", experiment.experiment_id)
    (run_id,) = uploaded.runs
    assert f"/#/runs/details/{run_id}" in out


def test_run_compiled_sends_the_spec_inline(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--host", kfp.url, "--compiled", "--data", "s3://b/d.parquet"]
    code, _, _ = _gp(capsys, *argv, "--param", f"registry_uri={REGISTRY}")
    assert code == 0
    body = _body(kfp, "POST", "/apis/v2beta1/runs")
    assert "pipeline_version_reference" not in body
    assert body["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "gpupipe-training"
    assert "platform_spec" in body["pipeline_spec"]


@pytest.mark.parametrize(
    ("script", "code", "expected"),
    [
        (RunScript(states=["PENDING", "RUNNING", "SUCCEEDED"]), 0, "SUCCEEDED"),
        (
            RunScript(states=["PENDING", "RUNNING", "FAILED"], failed_task="train", error="OOM"),
            1,
            "failed task: train: OOM",
        ),
    ],
    ids=["succeeded", "failed-names-task"],
)
def test_run_wait_follows_the_run(
    uploaded: FakeKfp,
    capsys: pytest.CaptureFixture[str],
    script: RunScript,
    code: int,
    expected: str,
) -> None:
    uploaded.run_script = script
    rc, out, err = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=x", "--wait", "--timeout", "30"
    )
    assert rc == code
    assert "RUNNING" in out
    assert expected in (out if code == 0 else err)
    if code:
        assert err.startswith("ERROR [gpupipe run] E_RUN_FAILED:")
        assert "preprocess" not in err and "root" not in err
    assert len(uploaded.calls("GET", "/apis/v2beta1/runs/")) >= 3


@pytest.mark.parametrize(
    ("states", "ended"),
    [(["RUNNING", "CANCELING", "FAILED"], " (KFP ended it FAILED)"), (["RUNNING", "CANCELED"], "")],
    ids=["canceling-then-failed", "canceled"],
)
def test_run_wait_names_a_terminated_run_as_terminated(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str], states: list[str], ended: str
) -> None:
    # KFP 2.17 ends a run terminated mid-step FAILED; its history shows it was CANCELING.
    uploaded.run_script = RunScript(states=states, failed_task="train", error="terminated")
    rc, out, err = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=x", "--wait", "--timeout", "30"
    )
    run_id = re.search(r"started run (\S+)", out).group(1)  # type: ignore[union-attr]
    assert rc == 1
    assert err.startswith(
        f"ERROR [gpupipe run] E_RUN_CANCELED: run {run_id} was terminated{ended} (http"
    ), err
    assert len(err.strip().splitlines()) == 1, err


def test_run_wait_says_once_why_a_steps_pod_waits(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    # A GPU step on a cluster without a free GPU: its pod waits for a node. Without a word the
    # user would watch "RUNNING" until the timeout; the ordinary "ContainerCreating" is no news.
    why = "Unschedulable: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    uploaded.run_script = RunScript(
        states=["PENDING", "RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"],
        pending={"exit-handler-1.train(0).executor(0)": why},
    )
    rc, out, _ = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=x", "--wait", "--timeout", "30"
    )
    assert rc == 0
    said = [line for line in out.splitlines() if "waits" in line]
    assert said == [f"  step train waits: {why}"], out
    assert len(uploaded.calls("GET", "/apis/v1beta1/runs/")) >= 3


def test_run_wait_goes_on_when_the_workflow_cannot_be_read(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    uploaded.fail("GET", r"/apis/v1beta1/runs/", 404, times=100)
    rc, out, _ = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=x", "--wait", "--timeout", "30"
    )
    assert rc == 0 and "SUCCEEDED" in out and "waits" not in out


@pytest.mark.parametrize(
    ("node", "step"),
    [
        ("wf.exit-handler-1.train(0).executor(0)", "train"),
        ("wf.exit-handler-1.train(1).executor(0)", "train"),
        ("wf.exit-handler-1.evaluate-driver(0)", "evaluate (driver)"),
        ("wf.root-driver(0)", "root (driver)"),
    ],
)
def test_a_workflow_node_is_named_by_its_step(node: str, step: str) -> None:
    assert cluster._step_of(node) == step


def test_run_wait_timeout_is_one_line(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    uploaded.run_script = RunScript(states=["RUNNING"])
    code, _, err = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=x", "--wait", "--timeout", "0.1"
    )
    assert code == 1
    assert err.startswith("ERROR [gpupipe run] E_TIMEOUT: run ")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (["data_uri=x", "epochz=3"], "unknown pipeline parameter 'epochz'; did you mean 'epochs'?"),
        (["data_uri=x", "epochs=three"], "parameter epochs must be an integer, got 'three'"),
        (["data_uri=x", "gpu_node_selector=[1]"], "gpu_node_selector must be"),
        (["epochs=3"], "missing required pipeline parameter 'data_uri'"),
    ],
    ids=["unknown", "wrong-type", "not-a-dict", "missing-required"],
)
def test_bad_params_exit_2_before_any_request(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], params: list[str], message: str
) -> None:
    argv = ["run", "--host", kfp.url]
    for p in params:
        argv += ["--param", p]
    code, _, err = _gp(capsys, *argv)
    assert code == 2
    assert err.startswith("ERROR [gpupipe run] E_PARAM: ")
    assert message in err
    assert kfp.requests == []


@pytest.mark.parametrize("command", ["run", "schedule"])
@pytest.mark.parametrize(
    "uri", ["http://alice:s3cret-pw@mlflow.kubeflow:5000", "https://s3cret-pw@mlflow.example.com"]
)
def test_an_account_inside_registry_uri_is_refused_naming_the_secret(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], command: str, uri: str
) -> None:
    """KFP stores parameters and shows them in pod arguments: the account goes in a secret."""
    argv = [command, "--host", kfp.url, "--param", "data_uri=x", "--param", f"registry_uri={uri}"]
    argv += ["--param", "registry_secret=team-mlflow"]
    if command == "schedule":
        argv += ["--cron", "0 0 3 * * *", "--name", "nightly"]
    code, out, err = _gp(capsys, *argv)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith(
        f"ERROR [gpupipe {command}] E_PARAM: registry_uri must not hold an account"
    )
    assert "'team-mlflow'" in line and line.endswith("(registry_uri)")
    assert "s3cret-pw" not in out + err
    assert kfp.requests == []


def test_a_registry_uri_without_an_account_is_sent(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = "http://mlflow.kubeflow:5000"
    code, _, err = _gp(
        capsys,
        "run",
        "--host",
        uploaded.url,
        "--param",
        "data_uri=x",
        "--param",
        f"registry_uri={uri}",
    )
    assert code == 0, err
    params = _body(uploaded, "POST", "/apis/v2beta1/runs")["runtime_config"]["parameters"]
    assert params["registry_uri"] == uri


def test_run_of_unknown_pipeline_says_upload_first(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _gp(capsys, "run", "--host", kfp.url, "--param", "data_uri=x")
    assert code == 2
    assert "E_NOT_FOUND: no pipeline 'gpupipe-training'" in err
    assert "gpupipe upload" in err


# -- schedule --------------------------------------------------------------------------------------


def test_schedule_create_sends_the_trigger_and_limits(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _gp(
        capsys, "schedule", "--host", uploaded.url, "--cron", "0 0 2 * * *", "--name", "nightly",
        "--max-concurrency", "2", "--no-catchup", "--param", "data_uri=s3://b/d", "--param",
        "nodes=2", "--start", "2030-01-01T00:00:00Z", "--end", "2030-12-31T00:00:00",
    )  # fmt: skip
    assert code == 0, out
    body = _body(uploaded, "POST", "/apis/v2beta1/recurringruns")
    check_model(body, "V2beta1RecurringRun")
    assert body["display_name"] == "nightly"
    assert body["max_concurrency"] == "2"
    assert body["no_catchup"] is True
    assert body["mode"] == "ENABLE"
    cs = body["trigger"]["cron_schedule"]
    assert cs["cron"] == "0 0 2 * * *"
    assert datetime.fromisoformat(cs["start_time"]) == datetime(2030, 1, 1, tzinfo=UTC)
    assert datetime.fromisoformat(cs["end_time"]) == datetime(2030, 12, 31, tzinfo=UTC)
    assert body["runtime_config"]["parameters"] == {"data_uri": "s3://b/d", "nodes": 2}
    assert "pipeline_version_id" in body["pipeline_version_reference"]
    assert out.startswith("created recurring run 'nightly'")


def test_schedule_again_is_unchanged_and_a_change_replaces_it(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["schedule", "--host", uploaded.url, "--cron", "0 0 2 * * *", "--param", "data_uri=x"]
    assert _gp(capsys, *argv)[0] == 0
    (first,) = uploaded.recurring
    code, out, _ = _gp(capsys, *argv)
    assert (code, list(uploaded.recurring)) == (0, [first])
    assert out.startswith("unchanged")
    code, out, _ = _gp(capsys, *argv[:-1], "data_uri=y")
    assert code == 0 and out.startswith("replaced")
    (second,) = uploaded.recurring.values()
    assert second.recurring_run_id != first
    assert second.runtime_config.parameters == {"data_uri": "y"}


@pytest.mark.parametrize(
    ("expr", "field"),
    [
        ("0 0 2 * *", "six fields"),
        ("60 0 2 * * *", "field 1 (seconds) '60': out of range 0-59"),
        ("0 0 25 * * *", "field 3 (hours) '25'"),
        ("0 0 2 0 * *", "field 4 (day-of-month) '0'"),
        ("0 0 2 * FOO *", "field 5 (month) 'FOO'"),
        ("0 0 2 * * 1-9", "field 6 (day-of-week) '9'"),
        ("0 */0 2 * * *", "field 2 (minutes) '*/0': step"),
        ("? 0 2 * * *", "field 1 (seconds) '?'"),
        ("0 0 5-2 * * *", "field 3 (hours) '5-2': range start"),
    ],
    ids=[
        "five-fields",
        "seconds",
        "hours",
        "dom",
        "month-name",
        "dow",
        "step",
        "question",
        "range",
    ],
)
def test_invalid_cron_exits_2_naming_the_field_without_requests(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], expr: str, field: str
) -> None:
    code, _, err = _gp(
        capsys, "schedule", "--host", kfp.url, "--cron", expr, "--param", "data_uri=x"
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("ERROR [gpupipe schedule] E_CRON: ")
    assert field in err
    assert kfp.requests == []


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("0 0 2 * * *", "2030-01-01T00:00:00", "2030-01-01T02:00:00"),
        ("0 0 2 * * *", "2030-01-01T02:00:00", "2030-01-02T02:00:00"),
        ("*/20 * * * * *", "2030-01-01T00:00:41", "2030-01-01T00:01:00"),
        ("0 30 9 ? * MON-FRI", "2030-01-04T10:00:00", "2030-01-07T09:30:00"),
        ("0 0 0 1 JAN,JUL ?", "2030-02-01T00:00:00", "2030-07-01T00:00:00"),
        ("0 0 0 13 * 5", "2030-01-01T00:00:00", "2030-01-04T00:00:00"),
        ("0 0 12 29 2 *", "2030-03-01T00:00:00", "2032-02-29T12:00:00"),
    ],
    ids=["daily", "strictly-after", "step", "weekdays", "month-list", "dom-or-dow", "leap-day"],
)
def test_next_fire(expr: str, after: str, expected: str) -> None:
    t = cron.next_fire(cron.parse(expr), datetime.fromisoformat(after))
    assert t == datetime.fromisoformat(expected)


def test_schedule_enable_disable_delete_and_list(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["schedule", "--host", uploaded.url]
    assert _gp(capsys, *base, "--cron", "0 0 2 * * *", "--name", "nightly",
               "--start", "2030-01-01T00:00:00Z", "--param", "data_uri=x")[0] == 0  # fmt: skip
    (rid,) = uploaded.recurring
    code, out, _ = _gp(capsys, *base, "--list")
    assert code == 0
    assert "2030-01-01T02:00:00Z" in out and "nightly" in out and rid in out
    assert _gp(capsys, *base, "--disable", "nightly")[0] == 0
    assert uploaded.recurring[rid].mode == "DISABLE"
    assert "- (disabled)" in _gp(capsys, *base, "--list")[1]
    assert _gp(capsys, *base, "--enable", "nightly")[0] == 0
    assert uploaded.recurring[rid].mode == "ENABLE"
    assert uploaded.calls("POST", f"/apis/v2beta1/recurringruns/{rid}:enable")
    assert _gp(capsys, *base, "--delete", "nightly")[0] == 0
    assert uploaded.recurring == {}
    assert _gp(capsys, *base, "--list")[1].strip() == "no recurring runs"
    code, _, err = _gp(capsys, *base, "--enable", "nightly")
    assert code == 2 and "E_NOT_FOUND: no recurring run named 'nightly'" in err


def test_enable_and_disable_return_once_kfp_reads_the_new_mode_back(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """KFP's persistence agent can put a recurring run's old mode back for a while after an
    enable or disable (what CI saw on the real backend): the command waits until it reads the new
    one, and says so when it never does."""
    base = ["schedule", "--host", uploaded.url]
    made = _gp(capsys, *base, "--cron", "0 0 2 * * *", "--name", "nightly", "--param", "data_uri=x")
    assert made[0] == 0, made
    (rid,) = uploaded.recurring
    one = f"/apis/v2beta1/recurringruns/{rid}"
    uploaded.stale_mode_reads = 3
    reads = len(uploaded.calls("GET", one))
    assert _gp(capsys, *base, "--disable", "nightly")[0] == 0
    assert len(uploaded.calls("GET", one)) - reads == 4  # three old answers, then DISABLE
    assert "- (disabled)" in _gp(capsys, *base, "--list")[1]
    uploaded.stale_mode_reads = 10**6
    monkeypatch.setattr(cluster, "MODE_SETTLE_S", 0.2)
    code, out, err = _gp(capsys, *base, "--enable", "nightly")
    assert code == 1 and out == "", out
    assert err.startswith(
        f"ERROR [gpupipe schedule] E_MODE: KFP accepted 'enable' for recurring run {rid} but "
        "still reads it as DISABLE after 0.2 s"
    ), err
    assert len(err.strip().splitlines()) == 1, err


# -- auth and errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["flag", "env-file"], ids=["--token", "KF_PIPELINES_SA_TOKEN_PATH"])
def test_token_is_sent_as_bearer_and_never_printed(
    kfp: FakeKfp,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    how: str,
) -> None:
    kfp.token = TOKEN
    extra: list[str] = []
    if how == "flag":
        extra = ["--token", TOKEN]
    else:
        path = tmp_path / "token"
        path.write_text(TOKEN + "\n")
        monkeypatch.setenv(cluster_auth.TOKEN_PATH_ENV, str(path))
    code, out, err = _gp(capsys, "upload", "--host", kfp.url, *extra)
    assert code == 0, err
    assert {r.headers.get("authorization") for r in kfp.requests} == {f"Bearer {TOKEN}"}
    upload = kfp.calls("POST", "/apis/v2beta1/pipelines/upload_version")[-1]
    assert TOKEN.encode() not in upload.body  # the compiled YAML carries no credential
    kfp.token = "another"
    code, out2, err2 = _gp(capsys, "upload", "--host", kfp.url, *extra)
    assert code == 2
    assert "E_AUTH" in err2 and "401" in err2
    assert TOKEN not in out + err + out2 + err2


def test_missing_token_401_says_how_to_pass_one(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    kfp.token = TOKEN
    code, _, err = _gp(capsys, "upload", "--host", kfp.url)
    assert code == 2
    assert "no token was sent: pass --token-file FILE (or --token), or set " in err
    assert "authorization" not in kfp.requests[0].headers


def test_unreachable_host_is_one_line_with_port_forward_hint(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "REFUSED_GRACE_S", 1.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    code, _, err = _gp(capsys, "upload", "--host", f"http://127.0.0.1:{port}")
    assert code == 1
    assert err.strip() == (
        f"ERROR [gpupipe upload] E_UNREACHABLE: cannot reach KFP at http://127.0.0.1:{port}: "
        "connection refused (is the port-forward running? "
        "kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80)"
    )


def test_a_port_forward_started_a_moment_before_is_waited_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kubectl port-forward ... &` then `gpupipe upload` at once (the README's block pasted):
    the port listens a moment later, and the upload goes through."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    up = threading.Event()
    done = threading.Event()

    def listen() -> None:
        time.sleep(1.5)
        for _ in serve(port=port):
            up.set()
            done.wait(60)

    t = threading.Thread(target=listen)
    t.start()
    try:
        code, out, err = _gp(capsys, "upload", "--host", f"http://127.0.0.1:{port}")
    finally:
        done.set()
        t.join()
    assert up.is_set()
    assert code == 0, err
    assert "created pipeline and version" in out


def test_a_refused_remote_host_is_not_waited_for() -> None:
    from pipelines.cluster import _is_loopback

    assert _is_loopback("http://localhost:8080") and _is_loopback("http://127.0.0.2:80")
    assert _is_loopback("http://[::1]:8080")
    assert not _is_loopback("https://kfp.example.com") and not _is_loopback("http://10.0.0.1:80")


def test_forbidden_namespace_names_it(kfp: FakeKfp, capsys: pytest.CaptureFixture[str]) -> None:
    kfp.forbidden_namespaces = {"team-b"}
    code, _, err = _gp(capsys, "upload", "--host", kfp.url, "--namespace", "team-b")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert (
        "E_FORBIDDEN: not allowed to list pipelines named 'gpupipe-training' in namespace team-b"
        in err
    )
    assert "contributor" in err


@pytest.mark.parametrize(("failures", "code"), [(2, 0), (4, 1)], ids=["recovers", "gives-up"])
def test_server_errors_are_retried_a_bounded_number_of_times(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], failures: int, code: int
) -> None:
    kfp.fail("GET", r"/pipelines$", 503, times=failures)
    rc, _, err = _gp(capsys, "upload", "--host", kfp.url)
    assert rc == code
    if code:
        assert "E_SERVER" in err and "503" in err and "after 4 tries" in err
    assert len(kfp.calls("GET", "/apis/v2beta1/pipelines")) >= min(failures, 4)


def test_namespace_reaches_pipeline_experiment_and_schedule_listing(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = ["--namespace", "team-a"]
    assert _gp(capsys, "upload", "--host", kfp.url, *ns)[0] == 0
    params = ["--param", "data_uri=x", "--param", f"registry_uri={REGISTRY}"]
    assert _gp(capsys, "run", "--host", kfp.url, *ns, *params)[0] == 0
    assert _gp(capsys, "schedule", "--host", kfp.url, *ns, "--list")[0] == 0
    (pipeline,) = kfp.pipelines.values()
    (experiment,) = kfp.experiments.values()
    assert (pipeline.namespace, experiment.namespace) == ("team-a", "team-a")
    assert kfp.calls("GET", "/apis/v2beta1/recurringruns")[-1].query["namespace"] == "team-a"


@pytest.mark.parametrize(
    ("body", "type_name", "error"),
    [
        ({"display_name": "x", "bogus": 1}, "V2beta1Run", 'unknown field "bogus"'),
        ({"max_concurrency": 2}, "V2beta1RecurringRun", "expected str"),
        ({"state": "DONE"}, "V2beta1Run", "invalid value 'DONE'"),
        (
            {"trigger": {"cron_schedule": {"start_time": "tomorrow"}}},
            "V2beta1RecurringRun",
            "bad time",
        ),
    ],
    ids=["unknown-field", "wrong-type", "bad-enum", "bad-time"],
)
def test_fake_rejects_bodies_the_models_do_not_allow(
    body: dict, type_name: str, error: str
) -> None:
    from tests.fakes.kfp_api import ApiError

    with pytest.raises(ApiError, match=error):
        check_model(body, type_name)


def test_cluster_summary_reads_what_the_steps_wrote_under_the_runs_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """KFP 2.17's driver names outputs <root>/<pipeline>/<run>/<task>/<salt>/<output>. (The
    root here is the caller's: one that KFP answers is read only when it is an object store's.)"""
    import json

    import kfp_server_api as kapi

    from pipelines.cli.run import print_summary
    from pipelines.cluster_summary import run_summary

    run_id = "0b5e8a52-8d4e-4c1a-9f3e-2a7c1d9e6b10"
    run_dir = tmp_path / "gpupipe-training" / run_id
    metrics = run_dir / "evaluate" / "123" / "metrics"
    metrics.parent.mkdir(parents=True)
    metrics.write_text(
        json.dumps(
            {
                "accuracy": 0.91,
                "gate_passed": 1.0,
                "gate_reason": "accuracy 0.910 >= trivial 0.600",
            }
        )
    )
    (metrics.parent / "baselines").write_text(json.dumps({"trivial_accuracy": 0.6}))
    (run_dir / "evaluate" / "123" / "report").write_text("<html></html>")
    model = run_dir / "train-2" / "456" / "model"
    model.mkdir(parents=True)
    (model / "model.json").write_text("{}")
    tasks = [
        kapi.V2beta1PipelineTaskDetail(display_name=n, state="SUCCEEDED")
        for n in ("preprocess", "evaluate", "register")
    ]
    run = kapi.V2beta1Run(
        run_id=run_id,
        state="SUCCEEDED",
        runtime_config=kapi.V2beta1RuntimeConfig(
            parameters={"registry_uri": "http://mlflow:5000", "registered_model_name": "m"},
        ),
        run_details=kapi.V2beta1RunDetails(task_details=tasks),
    )
    s = run_summary(
        run,
        pipeline_name="gpupipe-training",
        link="http://kfp/#/runs/details/r-1",
        pipeline_root=str(tmp_path),
    )
    assert s["metrics"] == {"accuracy": 0.91, "baseline_trivial_accuracy": 0.6}
    assert s["gate_passed"] is True and s["gate_reason"].startswith("accuracy 0.910")
    assert s["model_uri"] == str(model) and s["report"].endswith("/123/report")
    print_summary(s)
    out = capsys.readouterr().out
    assert "pipeline run http://kfp/#/runs/details/r-1: SUCCEEDED" in out
    assert "accuracy       0.9100" in out and "vs trivial" in out
    assert "gate           passed: accuracy 0.910 >= trivial 0.600" in out
    registry = f"registry       http://mlflow:5000 (model m version tagged with KFP run {run_id})"
    assert registry in out


def test_cluster_summary_names_what_to_set_when_the_store_is_unreadable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kfp_server_api as kapi

    from pipelines.cluster_summary import run_summary

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MINIO_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MINIO_ACCESS_KEY", "k")
    monkeypatch.setenv("MINIO_SECRET_KEY", "s")
    run_id = "5f0c2d9a-1b7e-4f3a-8c6d-0e9b2a4c7d15"
    run = kapi.V2beta1Run(run_id=run_id, state="FAILED")
    summary = run_summary(run, pipeline_name="p", link="l")
    assert "metrics" not in summary and summary["failed_step"] == "(none reported)"
    assert summary["artifacts_error"].startswith(
        f"cannot read minio://mlpipeline/v2/artifacts/p/{run_id}"
    )
    assert "MINIO_ENDPOINT" in summary["artifacts_error"]


# --- issue 39, item 8: a token never goes over plain http to another machine unasked ---------


@pytest.mark.parametrize(
    "host",
    ["http://kfp.example.com:8080", "http://10.0.0.7:8888", "http://ml-pipeline.kubeflow:8888"],
    ids=["name", "address", "in-cluster-service"],
)
def test_a_token_over_plain_http_to_another_host_is_refused_before_any_request(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], host: str
) -> None:
    code, out, err = _gp(capsys, "upload", "--host", host, "--token", TOKEN)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("ERROR [gpupipe upload] E_INSECURE: refusing to send the bearer token")
    assert "--insecure" in line and line.endswith(f"({host})")
    assert TOKEN not in out + err
    assert kfp.calls() == []


@pytest.mark.parametrize(
    "host",
    ["https://kfp.example.com", "http://localhost:8888", "http://127.0.0.1:8888", "http://[::1]:1"],
    ids=["https", "localhost", "loopback", "loopback-v6"],
)
def test_a_token_goes_over_https_or_to_this_machine(host: str) -> None:
    auth = cluster_auth.Auth(source="--token", token=TOKEN)
    assert cluster.KfpCluster(host, auth=auth).host == host


def test_insecure_allows_plain_http_and_no_token_needs_nothing() -> None:
    host = "http://kfp.example.com:8080"
    token = cluster_auth.Auth(source="--token", token=TOKEN)
    assert cluster.KfpCluster(host, auth=token, insecure=True).host == host
    assert cluster.KfpCluster(host, auth=cluster_auth.Auth(source="none")).host == host


LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    + ["pipelineInfo: {name: laughs}"]
)
"""A "billion laughs": nine levels of nine aliases, 9**9 strings once expanded."""


@pytest.mark.parametrize("kind", ["aliases", "too-large"])
def test_upload_package_refuses_a_yaml_bomb_or_an_oversized_file_before_any_request(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    # Issue 60, item 8: YAML aliases expanded without bound in upload --package.
    package = tmp_path / "p.yaml"
    if kind == "aliases":
        package.write_text(LAUGHS)
    else:
        with package.open("wb") as f:
            f.truncate(cluster_package.MAX_PACKAGE_BYTES + 1)
    code, _, err = _gp(capsys, "upload", "--host", kfp.url, "--package", str(package))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "E_PACKAGE" in line and str(package) in line, line
    assert ("alias (*a) at line 2" if kind == "aliases" else "over the 33554432") in line, line
    assert not kfp.calls()


def test_upload_package_sends_a_compiled_pipeline(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    package = tmp_path / "gpupipe-training.yaml"
    package.write_text(cluster_package.compile_training_pipeline().yaml_text)
    code, out, err = _gp(capsys, "upload", "--host", kfp.url, "--package", str(package))
    assert code == 0, err
    assert "created pipeline and version" in out
