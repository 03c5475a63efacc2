"""Telemetry: JSON lines a machine can parse, the history file, and a bar only for people."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from trainer.training.telemetry import Telemetry, gpu_memory_gb


class Terminal(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def parse(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_one_json_object_per_line() -> None:
    out = io.StringIO()
    tel = Telemetry(enabled=True, job="job-1", total_steps=10, stream=out)
    tel.emit("start", step=0, world_size=2, resumed_from=None)
    tel.emit("step", step=5, loss=0.123456789, lr=1e-3, grad_norm=None)
    tel.close()
    records = parse(out.getvalue())
    assert [r["event"] for r in records] == ["start", "step"]
    assert all(r["job"] == "job-1" and isinstance(r["time"], float) for r in records)
    assert "resumed_from" not in records[0] and "grad_norm" not in records[1]  # None is left out
    assert records[1]["loss"] == 0.123457 and records[1]["lr"] == 0.001


@pytest.mark.parametrize(
    ("value", "shown"),
    [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")],
    ids=["nan", "inf", "minus-inf"],
)
def test_non_finite_values_keep_the_line_parseable(value: float, shown: str) -> None:
    out = io.StringIO()
    tel = Telemetry(enabled=True, job="j", total_steps=1, stream=out)
    tel.emit("step", step=1, loss=value)
    line = out.getvalue().strip()
    assert "NaN" not in line and "Infinity" not in line
    assert json.loads(line, parse_constant=pytest.fail)["loss"] == shown


def test_history_is_written_as_json_lines(tmp_path: Path) -> None:
    uri = tmp_path / "sub" / "history.jsonl"
    tel = Telemetry(
        enabled=True, job="j", total_steps=3, history_uri=str(uri), stream=io.StringIO()
    )
    for step in (1, 2, 3):
        tel.emit("step", step=step, loss=1.0 / step)
    tel.emit("eval", step=3, val_loss=float("nan"))
    tel.close()
    records = parse(uri.read_text())
    assert [(r["event"], r["step"]) for r in records] == [
        ("step", 1),
        ("step", 2),
        ("step", 3),
        ("eval", 3),
    ]
    assert records[-1]["val_loss"] == "nan"


def test_resume_keeps_earlier_history_up_to_the_checkpoint(tmp_path: Path) -> None:
    uri = str(tmp_path / "history.jsonl")
    first = Telemetry(enabled=True, job="j", total_steps=9, history_uri=uri, stream=io.StringIO())
    first.emit("start", step=0)
    for step in (2, 4, 6):
        first.emit("step", step=step, loss=1.0)
    first.close()
    with open(uri, "a") as f:
        f.write('{"event": "step", "st')  # a torn last line from a killed writer
    second = Telemetry(enabled=True, job="j", total_steps=9, history_uri=uri, stream=io.StringIO())
    second.resume(4)
    second.emit("start", step=4)
    second.emit("step", step=6, loss=0.5)
    second.close()
    records = parse(Path(uri).read_text())
    assert [(r["event"], r["step"]) for r in records] == [
        ("step", 2),
        ("step", 4),
        ("start", 4),
        ("step", 6),
    ]
    assert records[-1]["loss"] == 0.5  # the abandoned step 6 is gone


def test_disabled_on_non_main_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = tmp_path / "history.jsonl"
    tel = Telemetry(enabled=False, job="j", total_steps=5, history_uri=str(uri))
    tel.emit("step", step=1, loss=1.0)
    tel.resume(1)
    tel.close()
    assert capsys.readouterr().out == ""
    assert tel.history == [] and not uri.exists()


def test_prints_to_stdout_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    tel = Telemetry(enabled=True, job="j", total_steps=5)
    tel.emit("done", step=5)
    tel.close()
    assert parse(capsys.readouterr().out)[0]["event"] == "done"


@pytest.mark.parametrize(
    ("stdout_tty", "stderr_tty", "bar"),
    [(False, False, False), (True, False, False), (False, True, False), (True, True, True)],
    ids=["pipes", "stdout-only-tty", "stderr-only-tty", "terminal"],
)
def test_progress_bar_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, stdout_tty: bool, stderr_tty: bool, bar: bool
) -> None:
    out = Terminal() if stdout_tty else io.StringIO()
    err = Terminal() if stderr_tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    tel = Telemetry(enabled=True, job="j", total_steps=4, stream=out)
    tel.emit("step", step=2, loss=1.0)
    tel.advance(2)
    tel.close()
    assert ("2/4" in err.getvalue()) is bar
    # the JSON lines stay clean either way
    assert [r["event"] for r in parse(out.getvalue())] == ["step"]


def test_gpu_memory_is_none_off_gpu() -> None:
    assert gpu_memory_gb(torch.device("cpu")) is None
