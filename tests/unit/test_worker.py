"""``python -m trainer.worker``: exit codes and the one-line errors a person reads."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.helpers import TORCHRUN_VARS
from trainer import worker
from trainer.base.errors import EXIT_PEER_LOST
from trainer.demo import make_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    tmp = tmp_path_factory.mktemp("data")
    table = make_table(384, features=4, classes=2, seed=2)
    pq.write_table(table.slice(0, 256), tmp / "train.parquet")
    pq.write_table(table.slice(256), tmp / "val.parquet")
    return str(tmp / "train.parquet"), str(tmp / "val.parquet")


def write_config(tmp: Path, uris: tuple[str, str], **sections: dict[str, Any]) -> Path:
    cfg: dict[str, Any] = {
        "data": {"train_uri": uris[0], "val_uri": uris[1]},
        "model": {"hidden_dim": 8, "num_layers": 1},
        "train": {"epochs": 1, "global_batch_size": 64, "log_every_steps": 2},
        "output": {"model_uri": str(tmp / "model"), "history_uri": str(tmp / "history.jsonl")},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    path = tmp / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def run_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "trainer.worker", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a Python importing torch: seconds of CPU, 20x that on a loaded machine
        cwd=ROOT,
    )


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("ERROR")]


def test_success_exits_0_and_writes_the_model(
    tmp_path: Path, data: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, data)
    assert worker.main(["--config", str(cfg)]) == 0
    out, err = capsys.readouterr()
    events = [json.loads(line)["event"] for line in out.splitlines()]
    assert events[0] == "start" and events[-1] == "done" and "eval" in events
    assert not error_lines(err)
    assert (tmp_path / "model" / "model.safetensors").exists()


def test_set_override_is_applied(
    tmp_path: Path, data: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, data)
    code = worker.main(
        ["--config", str(cfg), "--set", "train.max_steps=3", "--set", "optim.lr=0.004"]
    )
    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records[0]["total_steps"] == 3 and records[-1]["step"] == 3
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert meta["extra"]["train"]["config"]["optim"]["lr"] == 0.004


CASES = [
    # (what to break, expected fragment of the single error line)
    ("bad-value", "ERROR [train] E_CONFIG: train.epochs must be > 0, got -3 (train.epochs)"),
    ("unknown-key", "ERROR [train] E_CONFIG: unknown config key train.epochz"),
    ("bad-override", "ERROR [train] E_CONFIG: optim.lr must be > 0, got -1.0 (optim.lr)"),
    ("override-without-equals", "override must look like section.key=value, got 'optim.lr'"),
    ("invalid-json", "ERROR [train] E_CONFIG: config is not valid JSON"),
    ("missing-config", "nope/config.json"),
    ("missing-data", "E_DATA: dataset not found"),
    ("missing-column", "target column 'nope' not found"),
]


def broken(case: str, tmp: Path, data: tuple[str, str]) -> tuple[list[str], str]:
    """Arguments for ``trainer.worker`` that fail as ``case`` says, and the path they name."""
    cfg = write_config(tmp, data)
    named = str(cfg)
    extra: list[str] = []
    if case == "bad-value":
        write_config(tmp, data, train={"epochs": -3})
    elif case == "unknown-key":
        write_config(tmp, data, train={"epochz": 3})
    elif case == "bad-override":
        extra = ["--set", "optim.lr=-1"]
    elif case == "override-without-equals":
        extra = ["--set", "optim.lr"]
    elif case == "invalid-json":
        cfg.write_text('{"data": {')
    elif case == "missing-config":
        cfg = tmp / "nope" / "config.json"
        named = str(cfg)
    elif case == "missing-data":
        named = str(tmp / "absent.parquet")
        write_config(tmp, data, data={"train_uri": named})
    elif case == "missing-column":
        write_config(tmp, data, data={"target": "nope"})
        named = "train.parquet"
    return ["--config", str(cfg), *extra], named


@pytest.mark.parametrize(("case", "message"), CASES, ids=[c for c, _ in CASES])
def test_bad_input_is_one_line_and_exit_2_in_process(
    tmp_path: Path,
    data: tuple[str, str],
    capfd: pytest.CaptureFixture[str],
    case: str,
    message: str,
) -> None:
    args, named = broken(case, tmp_path, data)
    assert worker.main(args) == 2
    err = capfd.readouterr().err
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith("ERROR [train] E_") and message in lines[0]
    if case in ("invalid-json", "missing-config", "missing-data", "missing-column"):
        assert named in lines[0]
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize(
    "case", ["bad-value", "missing-data"], ids=["bad-config", "missing-data-file"]
)
def test_bad_input_as_a_subprocess(tmp_path: Path, data: tuple[str, str], case: str) -> None:
    args, named = broken(case, tmp_path, data)
    proc = run_subprocess(*args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("ERROR [train] E_")
    assert dict(CASES)[case] in lines[0]
    if case == "missing-data":
        assert named in lines[0]
    assert proc.stdout.strip() == "" or all(
        json.loads(ln)["event"] for ln in proc.stdout.splitlines()
    )


def test_success_as_a_subprocess(tmp_path: Path, data: tuple[str, str]) -> None:
    cfg = write_config(tmp_path, data)
    proc = run_subprocess("--config", str(cfg), "--set", "train.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(ln)["event"] for ln in proc.stdout.splitlines()]
    assert events[0] == "start" and events[-1] == "done"
    assert (tmp_path / "model" / "metrics.json").exists()


def test_missing_config_argument_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        worker.main([])
    assert info.value.code == 2
    assert "--config" in capsys.readouterr().err


def test_bad_config_leaves_the_sigterm_handler_as_it_was(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    args, _ = broken("bad-value", tmp_path, data)
    assert worker.main(args) == 2
    assert signal.getsignal(signal.SIGTERM) == before


def test_unreachable_rendezvous_store_is_a_retryable_lost_peer(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    with socket.socket() as s:  # a port nobody listens on: rank 0's store is gone
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = write_config(tmp_path, data)
    exit_dir = tmp_path / "codes"
    exit_dir.mkdir()
    layout = {
        "RANK": "1",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": "peer-lost-test",
        "GPUPIPE_EXIT_DIR": str(exit_dir),
    }
    env = dict(os.environ, **layout)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.worker", "--config", str(cfg), "--set", "dist.timeout_s=1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a Python importing torch: seconds of CPU, 20x that on a loaded machine
        cwd=ROOT,
    )
    assert proc.returncode == EXIT_PEER_LOST, proc.stderr[-2000:]
    assert "lost a peer of this job (DistNetworkError)" in proc.stderr
    assert not error_lines(proc.stderr)  # not an E_ line: launchers would read it as bad input
    codes = sorted(p.read_text().strip() for p in exit_dir.glob("rank-*.code"))
    assert codes == [str(EXIT_PEER_LOST)]
    assert not list(exit_dir.glob("started-*"))  # it said how it ended: not "vanished"


def test_closing_the_process_group_is_waited_for_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading
    import time

    release = threading.Event()
    monkeypatch.setattr(worker.dist, "close", lambda ctx: release.wait(30))
    t0 = time.monotonic()
    assert worker._close_within(None, 0.3) is False  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 5
    release.set()
    monkeypatch.setattr(worker.dist, "close", lambda ctx: None)
    assert worker._close_within(None, 5) is True  # type: ignore[arg-type]

    def broken(ctx: object) -> None:
        raise RuntimeError("store went away")

    monkeypatch.setattr(worker.dist, "close", broken)
    with pytest.raises(RuntimeError, match="store went away"):
        worker._close_within(None, 5)  # type: ignore[arg-type]


HANGING_TEARDOWN = """
import sys, threading
from trainer import worker
from trainer.base import exitcodes
worker.CLOSE_TIMEOUT_S = 0.5
worker.dist.close = lambda ctx: threading.Event().wait()  # peers gone: never returns
worker._train = lambda cfg, ctx, stop: 143  # checkpointed after SIGTERM
recorded = []
exitcodes.record_exit_code = lambda code, rank: recorded.append(code) or print("recorded", code)
sys.exit(worker.main(sys.argv[1:]))
"""


def test_a_worker_whose_peers_are_gone_still_exits_with_its_code(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    """After a SIGTERM the other ranks and the rendezvous store may be gone, and gloo's teardown
    can then block for the whole grace period (seen: a stopped container worker killed, 137,
    instead of exiting 143): the worker leaves with its decided code once the wait is over."""
    cfg = write_config(tmp_path, data)
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", HANGING_TEARDOWN, "--config", str(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a Python importing torch: seconds of CPU, 20x that on a loaded machine
        cwd=ROOT,
    )
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "recorded 143"
    assert "the process group did not close within 0.5 s (its peers are gone); exit 143" in (
        proc.stderr
    )
