"""Tests for trainer.checkpoint: atomic saves, verified resume, quarantine and RNG round trips."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from trainer.base.outputs import OUTPUT_MARKER
from trainer.checkpoint import files
from trainer.checkpoint.manager import ATTEMPTS_DIR, CheckpointManager
from trainer.training.rng import capture_rng_state, restore_rng_state

TrainObjects = tuple[nn.Linear, torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR, Any]


def _train_objects(seed: int) -> TrainObjects:
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    return model, opt, sched, scaler


def _train_step(objs: TrainObjects, x: torch.Tensor) -> None:
    model, opt, sched, scaler = objs
    loss = model(x).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    sched.step()
    opt.zero_grad()


def _loop_state(objs: TrainObjects, step: int) -> dict[str, Any]:
    """A state shaped like the one the training loop saves."""
    model, opt, sched, scaler = objs
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": [capture_rng_state()],
        "data": {"epoch": 1, "step": step},
        "meta": {
            "step": step,
            "micro_batch_size": 32,
            "lr_scale": 0.5,
            "rollbacks": 1,
            "config_hash": "abc123",
        },
    }


def _small_state(value: float) -> dict[str, Any]:
    return {"w": torch.full((3,), value), "meta": {"value": value}}


def _dirs(root: Path) -> list[str]:
    """The entries of ``root`` besides the manager's ownership marker and its attempt records
    (there after a save)."""
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if p.name not in (OUTPUT_MARKER, ATTEMPTS_DIR))


@pytest.mark.parametrize(
    "root_style", [pytest.param("path", id="plain-path"), pytest.param("file", id="file-uri")]
)
@pytest.mark.parametrize(
    "io_mode", [pytest.param("local", id="local-files"), pytest.param("buffer", id="object-store")]
)
def test_round_trip_resumes_training_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root_style: str, io_mode: str
) -> None:
    if io_mode == "buffer":
        monkeypatch.setattr(files, "local_file", lambda uri: None)
    root = str(tmp_path / "ckpt") if root_style == "path" else f"file://{tmp_path}/ckpt"
    original = _train_objects(seed=0)
    for _ in range(2):
        _train_step(original, torch.randn(8, 4))
    saved = _loop_state(original, step=2)

    uri = CheckpointManager(root).save(2, saved)
    result = CheckpointManager(root).load_latest()

    assert uri.endswith("step-00000002")
    assert result is not None
    step, loaded = result
    assert step == 2
    for name, tensor in saved["model"].items():
        assert torch.equal(loaded["model"][name], tensor)
    assert loaded["scheduler"] == saved["scheduler"]
    assert loaded["scaler"] == saved["scaler"]
    assert loaded["data"] == saved["data"]
    assert loaded["meta"] == saved["meta"]

    restored = _train_objects(seed=123)
    restored[0].load_state_dict(loaded["model"])
    restored[1].load_state_dict(loaded["optimizer"])
    restored[2].load_state_dict(loaded["scheduler"])
    restored[3].load_state_dict(loaded["scaler"])
    x = torch.randn(8, 4)
    _train_step(original, x)
    _train_step(restored, x)
    for a, b in zip(original[0].parameters(), restored[0].parameters(), strict=True):
        assert torch.equal(a, b)
    assert original[2].get_last_lr() == restored[2].get_last_lr()
    assert original[3].get_scale() == restored[3].get_scale()


def _draw() -> list[Any]:
    return [
        random.random(),
        random.gauss(0.0, 1.0),
        np.random.rand(3).tolist(),
        np.random.normal(size=1).tolist(),  # odd count: leaves numpy's cached gaussian set
        torch.rand(3).tolist(),
        torch.randn(2).tolist(),
    ]


@pytest.mark.parametrize(
    "through_checkpoint", [pytest.param(False, id="in-memory"), pytest.param(True, id="saved")]
)
def test_rng_round_trip_repeats_streams(tmp_path: Path, through_checkpoint: bool) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0.0, 1.0)  # leaves python's gauss_next cached
    np.random.normal(size=1)
    rng = capture_rng_state()
    first = _draw()
    if through_checkpoint:
        manager = CheckpointManager(str(tmp_path))
        manager.save(1, {"rng": [rng]})
        rng = manager.load(1)["rng"][0]

    restore_rng_state(rng)

    assert _draw() == first


@pytest.mark.parametrize(
    "drop",
    [
        pytest.param("python", id="no-python"),
        pytest.param("numpy", id="no-numpy"),
        pytest.param("torch", id="no-torch"),
    ],
)
def test_restore_rng_state_rejects_malformed(drop: str) -> None:
    rng = capture_rng_state()
    del rng[drop]

    with pytest.raises(ValueError, match="rng state is malformed"):
        restore_rng_state(rng)


@pytest.mark.parametrize("keep_last", [1, 2, 3], ids=lambda k: f"keep-{k}")
def test_keep_last_prunes_oldest(tmp_path: Path, keep_last: int) -> None:
    manager = CheckpointManager(str(tmp_path), keep_last=keep_last)
    for step in (50, 100, 150, 200, 250):
        manager.save(step, _small_state(float(step)))

    expected = [50, 100, 150, 200, 250][-keep_last:]
    assert manager.steps() == expected
    assert _dirs(tmp_path) == [f"step-{s:08d}" for s in expected]


class _Smuggled:
    """Unpickling this runs os.mkdir(path): proof of code execution if it ever happens."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _rewrite_marker(step_dir: Path, **changes: Any) -> None:
    """Recompute the checksums of state.pt so only the intended defect remains."""
    data = (step_dir / "state.pt").read_bytes()
    marker = json.loads((step_dir / "COMPLETE.json").read_text())
    marker["files"]["state.pt"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    marker.update(changes)
    (step_dir / "COMPLETE.json").write_text(json.dumps(marker))


def _truncate(root: Path) -> str:
    path = root / "step-00000002" / "state.pt"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return "step-00000002"


def _flip_byte(root: Path) -> str:
    path = root / "step-00000002" / "state.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return "step-00000002"


def _drop_marker(root: Path) -> str:
    (root / "step-00000002" / "COMPLETE.json").unlink()
    return "step-00000002"


def _garbage_marker(root: Path) -> str:
    (root / "step-00000002" / "COMPLETE.json").write_bytes(b"\xff{not json")
    return "step-00000002"


def _marker_for_other_step(root: Path) -> str:
    _rewrite_marker(root / "step-00000002", step=7)
    return "step-00000002"


def _leftover_tmp(root: Path) -> str:
    tmp = root / "step-00000003.tmp"
    tmp.mkdir()
    (tmp / "state.pt").write_bytes(b"PK\x03\x04 half a zip")
    return "step-00000003.tmp"


def _smuggle_object(root: Path) -> str:
    step_dir = root / "step-00000002"
    torch.save({"model": _Smuggled(str(root.parent / "pwned"))}, step_dir / "state.pt")
    _rewrite_marker(step_dir)
    return "step-00000002"


CORRUPTIONS = [
    pytest.param(_truncate, 1, "bytes", id="truncated-state"),
    pytest.param(_flip_byte, 1, "sha256", id="flipped-byte"),
    pytest.param(_drop_marker, 1, "incomplete", id="missing-marker"),
    pytest.param(_garbage_marker, 1, "not valid JSON", id="garbage-marker"),
    pytest.param(_marker_for_other_step, 1, "step 7", id="marker-wrong-step"),
    pytest.param(_leftover_tmp, 2, "interrupted save", id="leftover-tmp"),
    pytest.param(_smuggle_object, 1, "GLOBAL posix.mkdir", id="smuggled-object"),
]


@pytest.mark.parametrize(("corrupt", "good_step", "reason"), CORRUPTIONS)
def test_load_latest_skips_and_quarantines_bad_checkpoint(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    corrupt: Callable[[Path], str],
    good_step: int,
    reason: str,
) -> None:
    root = tmp_path / "ckpt"
    manager = CheckpointManager(str(root))
    manager.save(1, _small_state(1.0))
    manager.save(2, _small_state(2.0))
    bad_name = corrupt(root)
    bad_step = int(bad_name.split("-")[1].split(".")[0])
    caplog.set_level(logging.WARNING, logger="trainer.checkpoint")

    result = manager.load_latest()

    assert result is not None
    assert result[0] == good_step
    assert result[1]["meta"] == {"value": float(good_step)}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(root / bad_name) in w and reason in w for w in warnings), warnings
    assert bad_name not in _dirs(root)
    assert not (tmp_path / "pwned").exists()
    assert manager.save(bad_step, _small_state(9.0)).endswith(f"step-{bad_step:08d}")
    latest = manager.load_latest()
    assert latest is not None
    assert latest[0] == bad_step
    assert latest[1]["meta"] == {"value": 9.0}


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        pytest.param(_flip_byte, "sha256", id="flipped-byte"),
        pytest.param(_drop_marker, "incomplete", id="missing-marker"),
        pytest.param(_smuggle_object, "GLOBAL posix.mkdir", id="smuggled-object"),
    ],
)
def test_load_refuses_bad_checkpoint_without_moving_it(
    tmp_path: Path, corrupt: Callable[[Path], str], reason: str
) -> None:
    root = tmp_path / "ckpt"
    manager = CheckpointManager(str(root))
    manager.save(2, _small_state(2.0))
    corrupt(root)

    with pytest.raises(ValueError, match=reason) as info:
        manager.load(2)

    assert str(root / "step-00000002") in str(info.value)
    assert "step-00000002" in _dirs(root)
    assert not (tmp_path / "pwned").exists()


def test_quarantine_keeps_earlier_quarantined_copies(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path))
    for _ in range(2):
        manager.save(1, _small_state(1.0))
        _flip_byte_in(tmp_path / "step-00000001")
        assert manager.load_latest() is None

    assert _dirs(tmp_path) == ["step-00000001.corrupt-0", "step-00000001.corrupt-1"]


def _flip_byte_in(step_dir: Path) -> None:
    path = step_dir / "state.pt"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_load_latest_without_repair_leaves_files(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, _small_state(1.0))
    manager.save(2, _small_state(2.0))
    _flip_byte(tmp_path)
    _leftover_tmp(tmp_path)
    before = _dirs(tmp_path)

    result = manager.load_latest(repair=False)

    assert result is not None and result[0] == 1
    assert _dirs(tmp_path) == before


def test_resave_replaces_existing_step(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path))
    manager.save(5, _small_state(1.0))

    manager.save(5, _small_state(2.0))

    assert manager.steps() == [5]
    assert _dirs(tmp_path) == ["step-00000005"]
    assert torch.equal(manager.load(5)["w"], torch.full((3,), 2.0))


def test_save_after_rollback_drops_newer_checkpoints(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), keep_last=5)
    for step in (1, 2, 3):
        manager.save(step, _small_state(float(step)))

    manager.save(2, _small_state(20.0))

    assert manager.steps() == [1, 2]
    latest = manager.load_latest()
    assert latest is not None
    assert latest[0] == 2
    assert torch.equal(latest[1]["w"], torch.full((3,), 20.0))


def test_interrupted_replace_restores_old_copy(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, _small_state(1.0))
    manager.save(2, _small_state(2.0))
    # Simulate a crash between "move old step-2 aside" and "rename the new one in".
    (tmp_path / "step-00000002").rename(tmp_path / "step-00000002.replaced")
    (tmp_path / "step-00000002.tmp").mkdir()

    result = manager.load_latest()

    assert result is not None and result[0] == 2
    assert _dirs(tmp_path) == ["step-00000001", "step-00000002"]


@pytest.mark.parametrize(
    ("value", "path_fragment"),
    [
        pytest.param(np.float64(0.5), "state['meta']['lr']", id="numpy-scalar"),
        pytest.param(np.zeros(2), "state['meta']['lr']", id="numpy-array"),
        pytest.param(_Smuggled("/nonexistent"), "state['meta']['lr']", id="custom-object"),
        pytest.param(collections.defaultdict(int), "state['meta']['lr']", id="defaultdict"),
        pytest.param({frozenset([1]): 1}, "state['meta']['lr'] key", id="frozenset-key"),
    ],
)
def test_save_refuses_state_that_weights_only_cannot_load(
    tmp_path: Path, value: Any, path_fragment: str
) -> None:
    manager = CheckpointManager(str(tmp_path / "ckpt"))

    with pytest.raises(ValueError, match="weights_only") as info:
        manager.save(1, {"meta": {"lr": value}})

    assert path_fragment in str(info.value)
    assert not (tmp_path / "ckpt").exists()


def test_load_missing_step_names_directory(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, _small_state(1.0))

    with pytest.raises(ValueError, match=r"step-00000004 does not exist \(complete steps: \[1\]\)"):
        manager.load(4)


def test_load_latest_on_missing_root_is_none(tmp_path: Path) -> None:
    assert CheckpointManager(str(tmp_path / "nothing")).load_latest() is None


@pytest.mark.parametrize("keep_last", [0, -1, True, 1.5], ids=["zero", "negative", "bool", "float"])
def test_keep_last_must_be_positive_int(tmp_path: Path, keep_last: Any) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(str(tmp_path), keep_last=keep_last)


@pytest.mark.parametrize("step", [-1, True, 2.0], ids=["negative", "bool", "float"])
def test_save_rejects_bad_step(tmp_path: Path, step: Any) -> None:
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        CheckpointManager(str(tmp_path)).save(step, {})


# Fencing: a writer of an older attempt never touches the newer attempt's checkpoints.


def _state(value: float) -> dict[str, Any]:
    return {"w": torch.full((3,), value)}


def test_a_stale_attempt_is_fenced_out_before_it_writes_prunes_or_deletes(tmp_path: Path) -> None:
    from trainer.base.errors import StepFailure, error_line

    old = CheckpointManager(str(tmp_path), keep_last=2)
    # A new root: the first save enters it (the other ranks may still be looking at it).
    assert old.load_latest() is None and old.generation is None
    old.save(10, _state(1.0))
    assert old.generation == 1
    # The job restarts elsewhere while the old process lives on (a node cut off, then back).
    new = CheckpointManager(str(tmp_path), keep_last=2)
    step, _ = new.load_latest()  # type: ignore[misc]
    assert (step, new.generation) == (10, 2)
    new.save(20, _state(2.0))
    new.save(30, _state(3.0))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    # Each of the old writer's moves would have hurt: a step between (pruning step 20), an
    # older step (deleting 20 and 30 as an abandoned timeline), the same step (replacing it).
    for step in (25, 5, 30):
        with pytest.raises(StepFailure) as e:
            old.save(step, _state(9.0))
        line = error_line("train", e.value)
        assert line.startswith("ERROR [train] E_STALE_ATTEMPT: a newer attempt (generation 2"), line
        assert "generation 1) is stale" in line and "\n" not in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert new.steps() == [20, 30]
    assert torch.equal(new.load(30)["w"], torch.full((3,), 3.0))
    new.save(40, _state(4.0))  # the newest attempt goes on


def test_a_save_begun_before_the_newer_attempt_entered_is_refused_at_its_commit(
    tmp_path: Path,
) -> None:
    from trainer.base.errors import StepFailure

    old = CheckpointManager(str(tmp_path))
    old.save(10, _state(1.0))
    old.begin(20)  # its shards would go in now
    new = CheckpointManager(str(tmp_path))
    new.load_latest()
    with pytest.raises(StepFailure, match="stops before it would commit checkpoint step 20"):
        old.commit(20, _state(2.0))
    assert new.steps() == [10]
    new.save(20, _state(5.0))  # the new attempt's own save of that step lands whole
    assert torch.equal(new.load(20)["w"], torch.full((3,), 5.0))


def test_attempts_that_pick_the_same_generation_end_with_different_ones(tmp_path: Path) -> None:
    first = CheckpointManager(str(tmp_path))
    assert first.enter() == 1
    # Another attempt wrote generation 2 between this one's look and its write.
    (tmp_path / ATTEMPTS_DIR / "00000002.json").write_text(json.dumps({"token": "theirs"}))
    second = CheckpointManager(str(tmp_path))
    assert second.enter() == 3
    assert json.loads((tmp_path / ATTEMPTS_DIR / "00000003.json").read_text())["generation"] == 3
    # A read-only look (the other ranks) takes no generation.
    look = CheckpointManager(str(tmp_path))
    look.load_latest(repair=False)
    assert look.generation is None
    assert sorted(p.name for p in (tmp_path / ATTEMPTS_DIR).iterdir())[-1] == "00000003.json"


def test_only_the_newest_attempt_records_are_kept(tmp_path: Path) -> None:
    for _ in range(25):
        CheckpointManager(str(tmp_path)).enter()
    names = sorted(p.name for p in (tmp_path / ATTEMPTS_DIR).iterdir())
    assert len(names) == 20 and names[-1] == "00000025.json" and names[0] == "00000006.json"
