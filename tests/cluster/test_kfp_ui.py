"""KFP 2.17's own UI (hack/cluster/addons/kfp-ui.sh) in headless chromium, used as a person uses
it: the compiled training pipeline uploaded through "Upload pipeline" and its graph drawn; a run
created from the pipeline's version with the form, followed on the run page to the end, where
the train step's logs and the evaluate step's plots and metrics are read as KFP renders them; a
run stopped with "Terminate" while its PyTorchJob trains; a failed run's step and its error line.

The run page takes each node's state, artifacts and visualizations from ML Metadata through the
grpc-web proxy (the UI server's /ml_metadata proxy): a green node here is that whole path working.
Each test saves screenshots of what it checked (tests/cluster/ui.py: the session's tmp folder, and
$GPUPIPE_UI_SCREENSHOTS when set).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import kfp, kube
from tests.cluster.kfp import api, gpupipe
from tests.cluster.test_kfp import host, table  # noqa: F401  (fixtures: the API, the demo table)
from tests.cluster.ui import browser, page, screenshot, ui  # noqa: F401  (fixtures)

pytestmark = [
    pytest.mark.skipif(
        not (kube.STATE / "addons" / "kfp-ui").is_dir(),
        reason="the kfp-ui add-on is not installed in this cluster (GPUPIPE_CLUSTER_ADDONS)",
    ),
    pytest.mark.timeout(1500),  # one whole run on this 2-core node
    pytest.mark.ci_allowance(600),
]

MLFLOW = "http://mlflow.kubeflow:5000"
Shot = Callable[[Any, str], Path]
DONE = "CheckCircleIcon"
"""The icon KFP's run graph puts on a node whose execution is COMPLETE (ExecutionNode.tsx)."""


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training pipeline compiled as `gpupipe compile` writes it, with this node's small step
    requests (kfp.SMALL_STEPS)."""
    out = tmp_path_factory.mktemp("ui-compiled")
    done = gpupipe("compile", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out / "gpupipe-training.yaml"


@pytest.fixture(scope="module")
def uploaded(ui: str, browser: Any, compiled: Path) -> dict[str, str]:  # noqa: F811
    """The compiled YAML uploaded through the UI's "Upload pipeline" form under a new name; the
    page it lands on is the pipeline's (its id and its first version's id from the URL)."""
    name = kube.unique("gpupipe-ui")
    context = browser.new_context()
    pg = context.new_page()
    try:
        pg.goto(f"{ui}/#/pipelines")
        pg.get_by_role("button", name="Upload pipeline").click()
        pg.locator("#newPipelineName").fill(name)
        pg.get_by_label("Upload a file").check()
        pg.locator("input[type=file]").set_input_files(str(compiled))
        pg.get_by_role("button", name="Create").click()
        pg.wait_for_url(re.compile(r"#/pipelines/details/[^/]+/version/[^/]+$"))
        pid, vid = re.findall(r"#/pipelines/details/([^/]+)/version/([^/]+)$", pg.url)[0]
    finally:
        context.close()
    return {"name": name, "pipeline_id": pid, "version_id": vid}


def _nodes(pg: Any) -> Any:
    return pg.locator(".react-flow__node")


def _node(pg: Any, task: str) -> Any:
    """The graph's node of task TASK (React Flow's data-id ``task.<name>``)."""
    return pg.locator(f".react-flow__node[data-id='task.{task}']")


def _close_panel(pg: Any) -> None:
    """Close the side panel of the node opened before, if any: it covers part of the graph."""
    close = pg.get_by_role("button", name="close", exact=True)
    if close.count():
        close.first.click()


def _open_sub_dag(pg: Any, task: str) -> None:
    _close_panel(pg)
    _node(pg, task).click()
    pg.get_by_role("button", name="OPEN SUB-DAG").click()


def _fit(pg: Any) -> None:
    pg.get_by_role("button", name="Fit View").click()


# -- 1. upload ---------------------------------------------------------------------------------


def test_upload_in_the_ui_draws_the_graph_and_the_cli_adds_a_version_the_ui_lists(
    ui: str,  # noqa: F811
    host: str,  # noqa: F811
    page: Any,  # noqa: F811
    screenshot: Shot,  # noqa: F811
    uploaded: dict[str, str],
) -> None:
    expect = _expect()
    pid, vid, name = uploaded["pipeline_id"], uploaded["version_id"], uploaded["name"]
    # The API server holds what the form sent: the pipeline under its name, one version.
    assert api(host, "GET", f"/apis/v2beta1/pipelines/{pid}")["display_name"] == name
    versions = api(host, "GET", f"/apis/v2beta1/pipelines/{pid}/versions")["pipeline_versions"]
    assert [v["pipeline_version_id"] for v in versions] == [vid]
    page.goto(f"{ui}/#/pipelines/details/{pid}/version/{vid}")
    expect(page.get_by_text(f"{name} ({name})")).to_be_visible()
    # The root: the training steps' exit handler and the notify step that always runs.
    expect(_node(page, "exit-handler-1")).to_contain_text("training")
    expect(_node(page, "notify")).to_be_visible()
    screenshot(page, "ui-upload-graph-root")
    # One level down: the steps.
    _open_sub_dag(page, "exit-handler-1")
    for task in ("fingerprint", "preprocess", "tune", "evaluate"):
        expect(_node(page, task)).to_contain_text(task)
    _fit(page)
    screenshot(page, "ui-upload-graph-training")
    # `gpupipe upload` of the same pipeline afterwards adds a version (named by the YAML's hash),
    # and the UI lists it beside the one the form made, and shows it as the newest.
    out = gpupipe("upload", "--host", host, "--pipeline", name)
    assert out.returncode == 0, out.stderr
    added = re.search(r"added version '([^']+)'", out.stdout)
    assert added, out.stdout
    page.goto(f"{ui}/#/pipelines/details/{pid}")
    expect(page.get_by_text(f"{name} ({added.group(1)})")).to_be_visible()
    page.get_by_text("Show Summary").click()
    page.get_by_role("combobox").first.click()
    options = page.get_by_role("option")
    expect(options).to_have_count(2)
    assert sorted(options.all_inner_texts()) == sorted([name, added.group(1)])
    page.wait_for_timeout(500)  # the menu's opening transition
    screenshot(page, "ui-upload-versions")


# -- 2. a run created in the UI ----------------------------------------------------------------


def _create_run(
    page: Any,  # noqa: F811
    ui: str,  # noqa: F811
    host: str,  # noqa: F811
    uploaded: dict[str, str],
    params: dict[str, str],
    screenshot: Shot | None = None,  # noqa: F811
) -> str:
    """Create run on the pipeline's version page: an experiment chosen in the dialog, PARAMS
    typed into the form's fields, Start; the run's id from the run page it opens."""
    exp = api(host, "POST", "/apis/v2beta1/experiments", {"display_name": kube.unique("ui-exp")})
    page.goto(
        f"{ui}/#/pipelines/details/{uploaded['pipeline_id']}/version/{uploaded['version_id']}"
    )
    page.get_by_role("button", name="Create run").click()
    page.locator("#chooseExperimentBtn").click()
    page.get_by_role("dialog").get_by_text(exp["display_name"]).click()
    page.locator("#useExperimentBtn").click()
    for name, value in params.items():
        page.locator(f"[id='{name}']").fill(value)
    if screenshot is not None:
        screenshot(page, "ui-create-run-form")
    page.locator("#startNewRunBtn").click()
    page.wait_for_url(re.compile(r"#/runs/details/[0-9a-f-]+$"))
    return str(re.findall(r"#/runs/details/([0-9a-f-]+)$", page.url)[0])


def _done_icon(pg: Any, task: str) -> Any:
    return _node(pg, task).locator(f"svg[data-testid='{DONE}']")


def _open_node(pg: Any, node: str, tab: str) -> Any:
    """Click graph node NODE (``task.x`` or ``artifact.x.y``) and its side panel's TAB."""
    _close_panel(pg)
    pg.locator(f".react-flow__node[data-id='{node}']").click()
    pg.get_by_role("button", name=tab, exact=True).click()
    return pg


def test_a_run_created_in_the_ui_succeeds_and_shows_the_logs_plots_and_metrics(
    ui: str,  # noqa: F811
    host: str,  # noqa: F811
    table: str,  # noqa: F811
    page: Any,  # noqa: F811
    screenshot: Shot,  # noqa: F811
    uploaded: dict[str, str],
) -> None:
    expect = _expect()
    model = kube.unique("gpupipe-ui-model")
    # What a person types for a run on this CPU node: the data, a short training, no GPU, and
    # the in-cluster MLflow (its account comes from the default registry_secret).
    params = {
        "data_uri": table,
        "epochs": "2",
        "gpus_per_node": "0",
        "registry_uri": MLFLOW,
        "registered_model_name": model,
    }
    run_id = _create_run(page, ui, host, uploaded, params, screenshot)
    done = kfp.wait_run(host, run_id)
    assert done["state"] == "SUCCEEDED", kfp.task_states(done)
    # The form sent each value with its parameter's type.
    sent = done["runtime_config"]["parameters"]
    assert sent["data_uri"] == table and sent["epochs"] == 2 and sent["gpus_per_node"] == 0, sent
    # The graph, as ML Metadata tells the page through the grpc-web proxy: every step that ran is
    # green, layer by layer; the other train branch (the cluster job's) did not run.
    page.reload()
    for task in ("exit-handler-1", "notify"):
        expect(_done_icon(page, task)).to_be_visible()
    screenshot(page, "ui-run-graph-root")
    _open_sub_dag(page, "exit-handler-1")
    steps = ("fingerprint", "preprocess", "tune", "condition-branches-2", "evaluate", "condition-5")
    for task in steps:
        expect(_done_icon(page, task)).to_be_visible()
    _fit(page)
    screenshot(page, "ui-run-graph")
    # The evaluate step's outputs as KFP renders them: the confusion matrix and ROC curve of
    # its ClassificationMetrics, the scalar metrics, and the HTML report.
    _open_node(page, "artifact.evaluate.classification", "Visualization")
    expect(page.get_by_text(re.compile(r"^Confusion Matrix: "))).to_be_visible()
    roc = page.get_by_text(re.compile(r"^ROC Curve: "))
    expect(roc).to_be_visible()
    matrix = page.get_by_text(re.compile(r"^Confusion Matrix: "))
    expect(matrix).to_be_visible()
    page.wait_for_timeout(2000)  # the curve is drawn by an animation
    screenshot(roc.locator("xpath=../.."), "ui-run-evaluate-roc")
    screenshot(matrix.locator("xpath=../.."), "ui-run-evaluate-confusion-matrix")
    _open_node(page, "artifact.evaluate.metrics", "Visualization")
    expect(page.get_by_text(re.compile(r"^Scalar Metrics: "))).to_be_visible()
    expect(page.get_by_text("accuracy", exact=True).first).to_be_visible()
    screenshot(page, "ui-run-evaluate-metrics")
    _open_node(page, "artifact.evaluate.report", "Visualization")
    expect(page.frame_locator("iframe").first.locator("body")).to_contain_text(
        "Model evaluation report"
    )
    screenshot(page, "ui-run-evaluate-report")
    # The train step (the local launcher's branch) and its logs: the trainer's own lines.
    _open_sub_dag(page, "condition-branches-2")
    expect(_done_icon(page, "condition-4")).to_be_visible()
    expect(_node(page, "condition-3").locator("svg[data-testid='CheckCircleIcon']")).to_have_count(
        0
    )
    _open_sub_dag(page, "condition-4")
    expect(_done_icon(page, "train-2")).to_be_visible()
    _open_node(page, "task.train-2", "Logs")
    expect(
        page.get_by_text(re.compile(r"\[rank0\] INFO trainer\.training\.run: ")).first
    ).to_be_visible()
    screenshot(page, "ui-run-train-logs")


# -- 6. a failed run ---------------------------------------------------------------------------


def test_a_failed_run_shows_the_failed_step_and_its_one_error_line(
    ui: str,  # noqa: F811
    host: str,  # noqa: F811
    table: str,  # noqa: F811
    page: Any,  # noqa: F811
    screenshot: Shot,  # noqa: F811
    uploaded: dict[str, str],
) -> None:
    expect = _expect()
    params = {"data_uri": table, "target": "no_such_column", "gpus_per_node": "0"}
    run_id = _create_run(page, ui, host, uploaded, params)
    done = kfp.wait_run(host, run_id, timeout=600)
    assert done["state"] == "FAILED", kfp.task_states(done)
    page.reload()
    expect(_node(page, "exit-handler-1").locator("svg[data-testid='ErrorIcon']")).to_be_visible()
    _open_sub_dag(page, "exit-handler-1")
    expect(_node(page, "fingerprint").locator(f"svg[data-testid='{DONE}']")).to_be_visible()
    expect(_node(page, "preprocess").locator("svg[data-testid='ErrorIcon']")).to_be_visible()
    # Nothing after the failed step ran: those nodes carry no state icon at all.
    for task in ("tune", "evaluate"):
        expect(_node(page, task).locator("[data-testid='execution-icon-default']")).to_be_visible()
        expect(_node(page, task).locator("svg[data-testid$='Icon']")).to_have_count(0)
    _open_node(page, "task.preprocess", "Logs")
    line = "ERROR [preprocess] E_COLUMN: target column 'no_such_column'"
    expect(page.get_by_text(line).first).to_be_visible()
    screenshot(page, "ui-failed-run-preprocess-logs")


# -- 5. terminate from the UI ------------------------------------------------------------------


def test_terminate_in_the_ui_stops_the_train_steps_job_and_its_pods(
    ui: str,  # noqa: F811
    host: str,  # noqa: F811
    table: str,  # noqa: F811
    page: Any,  # noqa: F811
    screenshot: Shot,  # noqa: F811
    uploaded: dict[str, str],
) -> None:
    import json

    from tests.cluster.test_kfp import JOB_SETTINGS, _job_of, _running

    expect = _expect()
    # A 2-node PyTorchJob long enough to be stopped while it trains.
    params = {
        "data_uri": table,
        "epochs": "40",
        "gpus_per_node": "0",
        "launcher": "pytorchjob",
        "nodes": "2",
        "train_config_json": json.dumps({f"cluster.{k}": v for k, v in JOB_SETTINGS.items()}),
    }
    run_id = _create_run(page, ui, host, uploaded, params)
    job = kube.wait_until("the train step's PyTorchJob", lambda: _job_of(run_id), 600, 3)
    kube.wait_until("its pods to run", lambda: _running(kube.job_pods(kfp.NS, job)), 300, 2)
    page.reload()
    page.locator("#terminateRunBtn").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Terminate this run?")
    dialog.get_by_role("button", name="Terminate").click()
    kube.wait_until("the PyTorchJob to go", lambda: kube.job_gone(kfp.NS, job), 180, 2)
    kube.wait_until("its pods to go", lambda: not kube.job_pods(kfp.NS, job), 180, 2)
    done = kfp.wait_run(host, run_id, timeout=300)
    # KFP 2.17 here ends a run terminated during a step FAILED, not CANCELED (as test_kfp.py's
    # terminate through the API finds): the page then shows it failed, not "Terminated".
    assert done["state"] in {"CANCELED", "FAILED"}, done["state"]
    # The page shows a run that has ended: Terminate is off, Retry is on.
    page.reload()
    expect(page.locator("#terminateRunBtn")).to_be_disabled()
    expect(page.get_by_role("button", name="Retry")).to_be_enabled()
    screenshot(page, "ui-terminated-run")
