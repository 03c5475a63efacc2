"""KFP 2.17's own UI (hack/cluster/addons/kfp-ui.sh) in headless chromium, used as a person uses
it: the compiled training pipeline uploaded through "Upload pipeline" and its graph drawn; a run
created from the pipeline's version with the form, followed on the run page to the end, where
the train step's logs and the evaluate step's plots and metrics are read as KFP renders them.

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

from tests.cluster import kube
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


def _open_sub_dag(pg: Any, task: str) -> None:
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
