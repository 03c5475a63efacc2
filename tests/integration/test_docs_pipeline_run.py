"""docs/kfp.md's own-pipeline example, run as written under kfp.local (issue 62, item 1): the
user's own step writes the table as a Dataset with no extension, the shipped preprocess reads it
as an artifact (no data_uri, no store), train and evaluate run from their component.yaml files,
and the user's own check reads evaluate's metrics. (No ``from __future__ import annotations``
in the block: KFP reads the components' annotations as types.)"""

import json
import os
import sys
from pathlib import Path

import pytest
from kfp import local

from tests.docs_pipelines import OWN_PIPELINE, load_block, own_pipeline_block

# One run of five steps, training included: about 100 s on 2 cores (make test-slow).
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _outputs(run: Path, task: str) -> dict:
    (found,) = run.glob(f"*/{task}/executor_output.json")
    return json.loads(found.read_text())


@pytest.mark.timeout(300)
def test_the_own_pipeline_runs_under_kfp_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Components run `python3 -m kfp.dsl.executor_main`: the interpreter with gpupipe installed.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name in ("MLFLOW_TRACKING_URI", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    module = load_block(own_pipeline_block(), tmp_path)
    root = tmp_path / "root"
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root),
        raise_on_error=True,
    )
    getattr(module, OWN_PIPELINE)(
        rows=600, epochs=2, registry_uri=f"sqlite:///{tmp_path}/mlflow.db", min_roc_auc=0.55
    )
    (table,) = root.glob("*/make-table/table")
    assert table.is_file() and table.read_bytes()[:4] == b"PAR1", "a Parquet file, no extension"
    (dataset,) = root.glob("*/preprocess/dataset")
    assert {"train.parquet", "val.parquet", "test.parquet"} <= {p.name for p in dataset.iterdir()}
    roc_auc = _outputs(root, "check-metrics")["parameterValues"]["Output"]
    print(f"check-metrics: roc_auc {roc_auc:.3f}")
    assert 0.55 <= roc_auc <= 1.0
