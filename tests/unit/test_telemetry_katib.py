"""Telemetry for Katib: ``name=value`` lines after each evaluation, only when asked for."""

from __future__ import annotations

import io
import json
import re

import pytest

from trainer.base.typedconfig import from_dict
from trainer.config import TrainConfig
from trainer.training.telemetry import Telemetry

# Katib's default StdOut filter.
KATIB_FILTER = re.compile(r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)")


def emit_eval(*, enabled: bool = True, metrics_stdout: bool) -> list[str]:
    out = io.StringIO()
    tel = Telemetry(
        enabled=enabled, job="j", total_steps=10, stream=out, metrics_stdout=metrics_stdout
    )
    tel.emit("step", step=1, loss=0.9)
    tel.emit("eval", step=5, epoch=1.0, val_loss=0.123456789, val_accuracy=0.75)
    return out.getvalue().splitlines()


def test_eval_prints_name_value_lines_after_the_json_line() -> None:
    lines = emit_eval(metrics_stdout=True)
    assert json.loads(lines[1])["event"] == "eval"
    assert lines[2:] == ["val_loss=0.123456789", "val_accuracy=0.75"]
    found = {
        m.group(1): float(m.group(2)) for line in lines[2:] if (m := KATIB_FILTER.search(line))
    }
    assert found == {"val_loss": 0.123456789, "val_accuracy": 0.75}


def test_json_lines_carry_no_katib_metric() -> None:
    """Katib's filter must not read the JSON lines as metrics (only the name=value lines)."""
    for line in emit_eval(metrics_stdout=True)[:2]:
        assert "val_loss=" not in line


@pytest.mark.parametrize(
    ("enabled", "metrics_stdout"), [(True, False), (False, True)], ids=["off", "not-main-rank"]
)
def test_no_name_value_lines_when_off_or_not_main_rank(enabled: bool, metrics_stdout: bool) -> None:
    lines = emit_eval(enabled=enabled, metrics_stdout=metrics_stdout)
    assert not any("=" in line and not line.startswith("{") for line in lines)


def test_non_finite_metrics_are_left_out() -> None:
    out = io.StringIO()
    tel = Telemetry(enabled=True, job="j", total_steps=1, stream=out, metrics_stdout=True)
    tel.emit("eval", step=1, val_loss=float("nan"), val_rmse=2.0)
    assert out.getvalue().splitlines()[1:] == ["val_rmse=2.0"]


def test_config_field_defaults_off_and_parses() -> None:
    assert TrainConfig().metrics_stdout is False
    assert from_dict(TrainConfig, {"metrics_stdout": True}).metrics_stdout is True
