"""A whole local run with a price: the summary shows the estimate beside the actual, and the
cost reaches the train step's KFP metrics, the model's metadata, the report and the registered
model's tags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_local_pipeline import RUN_TIMEOUT_S, gpupipe

# Two whole runs (the text summary, then --json).
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300),
]


def test_a_priced_run_reports_its_estimate_and_its_actual_cost(tmp_path: Path) -> None:
    data = tmp_path / "churn.parquet"
    made = gpupipe("demo-data", "--out", str(data), "--rows", "3000", cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    prices = json.dumps({"nvidia.com/gpu": 3.6, "nvidia.com/mig-1g.18gb": 0.5})
    argv = ["run", "--local", "--root", str(tmp_path / "root"), "--data", str(data)]
    argv += ["--target", "churned", "--param", "epochs=3", "--param", f"gpu_prices={prices}"]
    text = gpupipe(*argv, cwd=tmp_path)
    assert text.returncode == 0, text.stderr[-4000:]
    lines = text.stdout.splitlines()
    estimate = next(ln for ln in lines if ln.startswith("  cost estimate "))
    actual = next(ln for ln in lines if ln.startswith("  cost actual "))
    # This machine has no GPU: the run's default gpus_per_node 1 found none, so it trained on
    # the CPU and neither the estimate nor the actual bills a GPU-hour (issue 60, item 13).
    assert "measured; on the CPU: no GPU-hours" in estimate
    assert "$0.0000 (0.000000 GPU-hours, on the CPU)" in actual
    # the train step's log (in the run's log, whose path the summary names), with its assumptions
    log = Path(next(ln for ln in lines if ln.startswith("  log ")).split(maxsplit=1)[1])
    assert "cost estimate:" in log.read_text()
    assert "samples/s for the whole job (measured)" in log.read_text()

    summary = json.loads(
        gpupipe(*argv, "--json", "--param", "seed=1", cwd=tmp_path).stdout.splitlines()[-1]
    )
    assert summary["state"] == "SUCCEEDED"
    est, act = summary["cost"]["estimate"], summary["cost"]["actual"]
    assert est["gpu_hour_usd"] == 3.6 and est["throughput_source"] == "measured"
    assert act["cost_usd"] == 0 and act["gpu_hours"] == 0 and act["device"] == "cpu"
    assert est["gpus"] == 0 and est["total_cost_usd"] == 0

    run_dir = Path(summary["run_dir"])
    train_out = json.loads((run_dir / "train" / "executor_output.json").read_text())
    (model,) = train_out["artifacts"]["model"]["artifacts"]
    assert model["metadata"]["cost_usd"] == pytest.approx(act["cost_usd"])
    assert "Cost</h2>" in (run_dir / "evaluate" / "report").read_text()
