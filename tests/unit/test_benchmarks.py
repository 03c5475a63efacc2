"""The ratio benchmarks run end to end at a tiny size and print their headline last."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import data_loader, trainer_overhead


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """``dist.init()`` (called by the overhead benchmark) sets up the root logger: undo it."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)


TINY_OVERHEAD = ["--steps", "2", "--repeats", "2", "--warmup", "1", "--rows", "2048"]


def test_trainer_overhead_with_the_metrics_endpoint_scraped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = trainer_overhead.main([*TINY_OVERHEAD, "--cases", "mlp-small", "--metrics", "0.01"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, "\n".join(lines)
    assert any("metrics endpoint on, scraped" in line for line in lines)
    assert re.fullmatch(r"trainer_overhead ratio: \d+\.\d{3} \(goal <= 1\.03\)", lines[-1])


@pytest.mark.parametrize("case", ["mlp-small", "gpt"], ids=["mlp", "gpt"])
def test_trainer_overhead_prints_ratio_and_losses_match(
    case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = trainer_overhead.main([*TINY_OVERHEAD, "--cases", case])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, "\n".join(lines)
    assert re.fullmatch(r"trainer_overhead ratio: \d+\.\d{3} \(goal <= 1\.03\)", lines[-1])
    row = next(line for line in lines if line.startswith(trainer_overhead.CASES[case].name))
    assert "LOSSES DIFFER" not in row
    assert float(row.split()[-1]) == 0.0  # one CPU process: the two loops agree bitwise


def test_trainer_overhead_fails_when_losses_differ(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only the hand-written loop reads this module's lr_multiplier: its schedule now differs.
    monkeypatch.setattr(trainer_overhead, "lr_multiplier", lambda step, **_: 2.0)
    rc = trainer_overhead.main([*TINY_OVERHEAD, "--cases", "mlp-small"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "LOSSES DIFFER" in out
    assert "trainer_overhead ratio" not in out


def test_data_loader_prints_speedup(capsys: pytest.CaptureFixture[str]) -> None:
    data_loader.main(["--rows", "20000", "--repeats", "1", "--workers", "0"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "(one epoch)" in lines[0]
    assert any(line.startswith("serve-only speedup") for line in lines)
    assert re.fullmatch(r"data_loader speedup: \d+\.\dx \(goal >= 10x\)", lines[-1])


def test_tune_efficiency_prints_ratio_and_saves_curves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("optuna")
    from benchmarks import tune_efficiency

    plot = tmp_path / "anytime.png"
    args = ["--seeds", "1", "--trials", "3", "--epochs", "2", "--rows", "200"]
    assert tune_efficiency.main([*args, "--plot", str(plot)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert plot.is_file() and plot.stat().st_size > 0
    assert re.fullmatch(r"tune_efficiency ratio: \d+\.\d\d \(goal >= 3\)", lines[-1])


@pytest.mark.integration  # two spawned CPU ranks: ~10 s
def test_fsdp_memory_prints_the_state_ratio_and_losses_match(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import fsdp_memory

    tiny = ["--steps", "1", "--repeats", "2", "--layers", "2", "--d-model", "64"]
    rc = fsdp_memory.main([*tiny, "--vocab", "256", "--seq", "16", "--no-cuda"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, "\n".join(lines)
    assert "LOSSES DIFFER" not in "\n".join(lines)
    match = re.fullmatch(r"fsdp_memory ratio: (\d+\.\d{3}) \(goal <= 0\.55\)", lines[-1])
    assert match and 0.4 < float(match[1]) <= 0.55  # two ranks: about half of DDP's state


def test_default_models_prints_a_table_per_dataset_and_the_worst_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import default_models

    args = ["--tables", "iris", "--max-steps", "30", "--min-test-rows", "40"]
    assert default_models.main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # 24 test rows a split (stratified): two splits score the 40 asked for
    assert (
        lines[0] == "iris (150 rows, classification, test accuracy, mean of 2 splits, 48 test rows)"
    )
    assert lines[1].split() == ["who", "accuracy", "vs", "model", "log_loss"]
    assert [line.split()[0] for line in lines[2:6]] == ["model", "trivial", "linear", "hgb"]
    assert any(line.startswith("  trained 30 steps") for line in lines)
    assert re.fullmatch(
        r"default_models ratio: \d+\.\d{3} \(goal >= 0\.99; worst: iris\)", lines[-1]
    )


def test_tabular_device_trains_the_demo_step_and_reads_settings_written_where_kfp_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import tabular_device

    settings = tmp_path / "settings.json"
    assert tabular_device.main(["--write-settings", str(settings)]) == 0
    written = settings.read_text()
    assert '"target": "churned"' in written and '"launcher": "local"' in written
    capsys.readouterr()
    rc = tabular_device.main(["--rows", "300", "--repeats", "1", "--settings", str(settings)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, "\n".join(lines)
    trained = [line for line in lines if re.match(r"(warm-up|pair \d+) +cpu ", line)]
    assert len(trained) == 2 and all("accuracy" in line for line in trained)  # warm-up + 1
    assert re.fullmatch(r"tabular_device cpu_seconds: \d+\.\d\d \(no CUDA device: no ratio\)",
                        lines[-1])  # fmt: skip


def test_preprocess_scale_prints_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    """At a tiny size: ours, DuckDB and the in-memory path all run, ours equals the in-memory
    path row for row, and the ours/DuckDB ratio is the last line."""
    from benchmarks import preprocess_scale

    rc = preprocess_scale.main(["--sizes", "5000", "--budget", str(256 << 20)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, "\n".join(lines)
    assert sum(" in-memory " in line for line in lines) == 1
    assert re.fullmatch(r"preprocess_scale ratio: \d+\.\d\d \(.*goal <= 1\.0\)", lines[-1])


def test_step_start_prints_each_step_and_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    """Every component is timed, none but evaluate loads torch, and the ratio is the last line."""
    from benchmarks import step_start

    assert step_start.main(["--repeats", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    components = sorted(p.parent.name for p in Path("components").glob("*/__init__.py"))
    rows = {line.split()[0]: line.split()[-1] for line in lines[1:-1]}
    assert {c: rows[c] for c in components} == {
        c: "yes" if c == "evaluate" else "no" for c in components
    }
    assert re.fullmatch(r"step_start ratio: \d+\.\d\d \(\w+, .*goal <= 1\.5\)", lines[-1])
