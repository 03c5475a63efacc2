"""``python -m trainer.launch``: torchrun's blanket exit code 1 mapped back to the workers' codes.

Under ``restartPolicy: ExitCode`` the operator retries 128-255 and gives up on 1-127, so a
preemption must end in 143 and bad input in 2; real torchrun runs with 2 gloo ranks.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import (
    ROOT,
    env,
    launch_cmd,
    make_config,
    mapping_lines,
    run,
    torchrun_cmd,
    wait_for_step,
    write_data,
)
from trainer.base.errors import EXIT_PEER_LOST
from trainer.base.exitcodes import (
    EXIT_DIR_ENV,
    read_exit_codes,
    read_vanished,
    record_exit_code,
    record_started,
)
from trainer.checkpoint.manager import CheckpointManager
from trainer.launch.torchrun import resolve_exit_code

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return write_data(tmp_path_factory.mktemp("data"), rows=1024)


def test_bad_config_exits_2_where_torchrun_alone_exits_1(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    cfg = make_config(tmp_path, "bad", data=data, train={"epochz": 3})
    plain = run(torchrun_cmd(cfg, 2))
    assert plain.returncode == 1  # what the operator would see without the wrapper: permanent
    proc = run(launch_cmd(cfg))
    assert proc.returncode == 2, proc.stderr[-3000:]
    # The first rank to read the config says why; torchrun may then SIGTERM the other one while
    # it is still importing, before it prints or records anything. So: at least one line and
    # one recorded 2, never "both ranks".
    errors = [ln for ln in proc.stderr.splitlines() if "ERROR [train] E_CONFIG" in ln]
    assert errors and all("unknown config key train.epochz" in ln for ln in errors), errors
    (line,) = mapping_lines(proc.stderr)
    assert line.endswith("-> 2 (permanent)") and ": 2" in line, line


def test_sigterm_checkpoints_and_exits_143(tmp_path: Path, data: tuple[str, str]) -> None:
    cfg = make_config(
        tmp_path,
        "term",
        data=data,
        train={"epochs": 400, "log_every_steps": 4},
        checkpoint={"every_steps": 100000},
    )
    err_path = tmp_path / "stderr.log"
    with err_path.open("w") as err_file:
        proc = subprocess.Popen(
            launch_cmd(cfg), env=env(), stdout=subprocess.PIPE, stderr=err_file, text=True, cwd=ROOT
        )
    wait_for_step(proc, 20)  # training is really under way
    proc.send_signal(signal.SIGTERM)  # the wrapper only, as the kubelet signals a pod's PID 1
    proc.communicate(timeout=90)
    err = err_path.read_text()
    assert proc.returncode == 143, err[-3000:]
    steps = CheckpointManager(str(cfg.parent / "ckpt"), keep_last=2).steps()
    assert steps and steps[-1] >= 20, err[-3000:]
    (line,) = mapping_lines(err)
    assert (
        line
        == "gpupipe launch: worker exit codes {0: 143, 1: 143} after SIGTERM -> 143 (retryable)"
    )


def test_success_exits_0_and_leaves_no_exit_dir(tmp_path: Path, data: tuple[str, str]) -> None:
    cfg = make_config(tmp_path, "ok", data=data, train={"epochs": 1})
    proc = run(launch_cmd(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (cfg.parent / "model" / "model.safetensors").exists()
    assert not mapping_lines(proc.stderr)


def test_training_crash_stays_exit_1(tmp_path: Path, data: tuple[str, str]) -> None:
    cfg = make_config(
        tmp_path,
        "crash",
        data=data,
        model={"name": "tests.plugins.faults:nan_always", "options": {"at": 10}},
        train={"max_nan_rollbacks": 0},
    )
    proc = run(launch_cmd(cfg))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert any(ln.startswith("ERROR [train] E_TRAIN") for ln in proc.stderr.splitlines())
    assert not mapping_lines(proc.stderr)  # nothing to map: torchrun's 1 is the right answer


LOST = EXIT_PEER_LOST


@pytest.mark.parametrize(
    ("torchrun_code", "workers", "vanished", "terminated", "expected"),
    [
        (0, {}, 0, False, 0),
        (0, {"0": 0, "1": 0}, 0, True, 0),
        (1, {"unknown-10": 2, "unknown-11": 2}, 0, False, 2),
        (1, {"0": 143, "1": 2}, 0, True, 2),
        (1, {"0": 143, "1": 143}, 0, False, 143),
        (1, {"0": 143, "1": 0}, 0, False, 143),
        (1, {}, 0, True, 143),
        (1, {"0": 143, "1": 1}, 0, False, 1),  # rank 1 crashed; torchrun then stopped rank 0
        (1, {"0": LOST, "1": 1}, 0, False, 1),  # rank 1 crashed; rank 0 then lost it
        (1, {"0": 1}, 0, False, 1),
        (1, {}, 0, False, 1),
        (-9, {}, 0, False, 137),
        (1, {"0": LOST}, 0, False, LOST),  # a survivor on another node
        (1, {}, 1, False, LOST),  # the node whose worker was SIGKILLed
        (1, {"0": LOST}, 1, False, LOST),  # one wrapper, two local ranks, rank 1 SIGKILLed
        (1, {"0": 143}, 1, False, LOST),  # ... and torchrun stopped rank 0 first
        (1, {"0": 1}, 1, False, 1),  # a crash, then the peer was killed: still permanent
        (1, {"0": 2}, 1, False, 2),
        (1, {"0": LOST}, 0, True, 143),
    ],
    ids=[
        "success",
        "success-despite-sigterm",
        "bad-input-before-rank",
        "bad-input-wins",
        "all-preempted",
        "preempted-and-finished",
        "wrapper-sigterm-no-codes",
        "crash-then-teardown-stays-permanent",
        "crash-then-peer-lost-stays-permanent",
        "crash",
        "no-codes",
        "torchrun-killed",
        "peer-lost",
        "own-worker-killed",
        "local-rank-killed",
        "local-rank-killed-peer-stopped",
        "crash-and-killed",
        "bad-input-and-killed",
        "peer-lost-while-preempted",
    ],
)
def test_resolve_exit_code(
    torchrun_code: int, workers: dict[str, int], vanished: int, terminated: bool, expected: int
) -> None:
    got = resolve_exit_code(torchrun_code, workers, terminated=terminated, vanished=vanished)
    assert got == expected


def test_record_exit_code_round_trip_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(EXIT_DIR_ENV, raising=False)
    record_started()
    record_exit_code(2, 0)  # not under the wrapper: no file, no error
    monkeypatch.setenv(EXIT_DIR_ENV, str(tmp_path))
    record_started()
    assert read_vanished(tmp_path) == [os.getpid()]  # started, no code yet
    record_exit_code(143, 1)
    assert read_vanished(tmp_path) == []  # a code recorded: it did not vanish
    record_exit_code(2, None)
    (tmp_path / "rank-3.code").write_text("garbage")
    codes = read_exit_codes(tmp_path)
    assert codes.pop("1") == 143
    ((key, value),) = codes.items()
    assert key.startswith("unknown-") and value == 2
    assert not list(tmp_path.glob("*.tmp"))
    monkeypatch.setenv(EXIT_DIR_ENV, str(tmp_path / "missing"))
    record_exit_code(1, 0)  # an unwritable directory only loses the mapping
