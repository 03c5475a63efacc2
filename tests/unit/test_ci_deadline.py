"""CI's time guard for the cluster tests (tests/cluster/conftest.py, GPUPIPE_CI_DEADLINE set by
.ci/run): a cluster test that could run past the budget skips with the reason; outside CI, and for
tests elsewhere, nothing changes."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.cluster import conftest as cluster_conftest

CLUSTER_TEST = SimpleNamespace(fspath=Path(cluster_conftest.__file__).parent / "test_katib.py")
OTHER_TEST = SimpleNamespace(fspath=Path(__file__))


def test_a_cluster_test_skips_once_the_budget_is_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPIPE_CI_DEADLINE", str(time.time() + 60))
    with pytest.raises(pytest.skip.Exception, match=r"CI's time budget: \d+ s left"):
        cluster_conftest.pytest_runtest_setup(CLUSTER_TEST)  # type: ignore[arg-type]


def test_a_cluster_test_runs_with_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    allowance = cluster_conftest.CI_TEST_ALLOWANCE_S
    monkeypatch.setenv("GPUPIPE_CI_DEADLINE", str(time.time() + allowance + 60))
    cluster_conftest.pytest_runtest_setup(CLUSTER_TEST)  # type: ignore[arg-type]


def test_a_longer_cluster_test_asks_for_its_own_allowance(monkeypatch: pytest.MonkeyPatch) -> None:
    marker = pytest.mark.ci_allowance(900).mark
    item = SimpleNamespace(
        fspath=CLUSTER_TEST.fspath,
        get_closest_marker=lambda name: marker if name == "ci_allowance" else None,
    )
    monkeypatch.setenv("GPUPIPE_CI_DEADLINE", str(time.time() + 600))
    with pytest.raises(pytest.skip.Exception, match="under the 900 s this cluster test may take"):
        cluster_conftest.pytest_runtest_setup(item)  # type: ignore[arg-type]


def test_outside_ci_or_the_cluster_folder_nothing_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPIPE_CI_DEADLINE", raising=False)
    cluster_conftest.pytest_runtest_setup(CLUSTER_TEST)  # type: ignore[arg-type]
    monkeypatch.setenv("GPUPIPE_CI_DEADLINE", str(time.time() - 10))
    cluster_conftest.pytest_runtest_setup(OTHER_TEST)  # type: ignore[arg-type]


def test_ci_sets_the_deadline_inside_its_budget() -> None:
    run = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "export GPUPIPE_CI_DEADLINE=$((start_epoch + 88 * 60))" in run
    # Exported before the background job that runs the cluster tests is started.
    assert run.index("export GPUPIPE_CI_DEADLINE") < run.index(".venv/bin/pytest -m cluster")
    assert run.index("export GPUPIPE_CI_DEADLINE") < run.index('; cluster_job"')
