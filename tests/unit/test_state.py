"""The run-state contract: every piece of a run's state saved and restored through one protocol."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.checkpoint.manager import CheckpointManager
from trainer.data.datasets import BatchStream, DataPosition, TabularDataset
from trainer.distributed.dist import DistContext
from trainer.training.rng import seed_everything
from trainer.training.state import (
    META,
    DataState,
    LoopState,
    OptionalPiece,
    RngState,
    RunState,
    Stateful,
)

ONE = DistContext(
    rank=0,
    local_rank=0,
    world_size=1,
    local_world_size=1,
    node_rank=0,
    device=torch.device("cpu"),
    backend=None,
)
IDENTITY = {"world_size": 1, "config_hash": "abc", "strategy": "ddp"}


class Counter:
    """A piece of state a new feature might bring: registering it is all it takes."""

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, int], /) -> None:
        self.n = state["n"]


def run_state(loop: LoopState, identity: dict[str, Any] = IDENTITY, **pieces: Stateful) -> RunState:
    return RunState({META: loop, **pieces}, identity=identity)


def test_a_registered_piece_is_saved_and_restored(tmp_path: Path) -> None:
    mgr = CheckpointManager(str(tmp_path / "ckpt"))
    uri = run_state(LoopState(step=3), counter=Counter(5)).save(mgr, ONE, 3)
    assert uri is not None and uri.endswith("step-00000003")
    loop, counter = LoopState(), Counter()
    assert run_state(loop, counter=counter).restore(mgr, ONE) == 3
    assert (loop.step, counter.n) == (3, 5)


def test_no_checkpoint_restores_nothing(tmp_path: Path) -> None:
    loop = LoopState(step=2)
    assert run_state(loop).restore(CheckpointManager(str(tmp_path / "ckpt")), ONE) is None
    assert loop.step == 2


def test_meta_holds_the_loop_and_the_run_identity(tmp_path: Path) -> None:
    mgr = CheckpointManager(str(tmp_path / "ckpt"))
    run_state(LoopState(step=1, lr_scale=0.5)).save(mgr, ONE, 1)
    meta = mgr.load(1)[META]
    assert meta["step"] == 1 and meta["lr_scale"] == 0.5
    assert {k: meta[k] for k in IDENTITY} == IDENTITY


def test_a_checkpoint_of_the_other_strategy_is_refused(tmp_path: Path) -> None:
    mgr = CheckpointManager(str(tmp_path / "ckpt"))
    run_state(LoopState(step=1)).save(mgr, ONE, 1)
    fsdp = {**IDENTITY, "strategy": "fsdp"}
    with pytest.raises(ValueError, match=r"set train\.strategy to 'ddp'"):
        run_state(LoopState(), fsdp).restore(mgr, ONE)


def test_another_config_is_resumed_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = CheckpointManager(str(tmp_path / "ckpt"))
    run_state(LoopState(step=1)).save(mgr, ONE, 1)
    loop = LoopState()
    with caplog.at_level(logging.WARNING, logger="trainer.training.state"):
        run_state(loop, {**IDENTITY, "config_hash": "other"}).restore(mgr, ONE)
    assert loop.step == 1 and "different config" in caplog.text


def test_loop_state_round_trips_every_field() -> None:
    saved = LoopState(
        step=7, micro_batch_size=4, best=0.25, stopped_early=True, metrics={"val_loss": 0.25}
    )
    loaded = LoopState(rollbacks=2)
    loaded.load_state_dict(saved.state_dict())
    assert loaded == saved


def test_a_field_an_older_checkpoint_lacks_gets_its_default() -> None:
    old = LoopState(step=7, stopped_early=True).state_dict()
    del old["stopped_early"], old["best_metrics"]
    loaded = LoopState(stopped_early=True, best_metrics={"val_loss": 1.0})
    loaded.load_state_dict(old)
    assert loaded.step == 7 and not loaded.stopped_early and loaded.best_metrics == {}


def test_an_absent_piece_saves_none_and_ignores_what_it_is_given() -> None:
    absent = OptionalPiece(None)
    assert absent.state_dict() is None
    absent.load_state_dict({"scale": 1.0})
    present = OptionalPiece(Counter(3))
    assert present.state_dict() == {"n": 3}
    present.load_state_dict(None)  # a checkpoint written without it: left as is
    assert present.state_dict() == {"n": 3}


def test_rng_state_gives_this_rank_its_streams_back() -> None:
    piece = RngState(ONE, seed=0, loop=LoopState())
    saved = piece.state_dict()
    assert len(saved) == 1
    first = torch.rand(4)
    piece.load_state_dict(saved)
    assert torch.equal(torch.rand(4), first)


def test_rng_state_of_another_world_size_reseeds_from_the_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    piece = RngState(ONE, seed=5, loop=LoopState(step=40))
    two_ranks = piece.state_dict() * 2
    seed_everything(45)
    expected = torch.rand(4)
    with caplog.at_level(logging.WARNING, logger="trainer.training.state"):
        piece.load_state_dict(two_ranks)
    assert torch.equal(torch.rand(4), expected)
    assert "written by 2 processes, this run has 1" in caplog.text


def test_data_state_rewinds_the_stream_to_the_saved_position() -> None:
    n = 64
    ds = TabularDataset(
        torch.arange(n, dtype=torch.float32)[:, None],
        torch.arange(n) % 2,
        ["x"],
        task="classification",
    )
    stream = BatchStream(ds, global_batch_size=8, rank=0, world_size=1, seed=3)
    uninterrupted = list(itertools.islice(iter(stream), 12))
    data = DataState(stream)
    data.position = uninterrupted[9][0]  # the loop took ten steps (one epoch and two)
    resumed = DataState(BatchStream(ds, global_batch_size=8, rank=0, world_size=1, seed=3))
    resumed.load_state_dict(data.state_dict())
    assert resumed.position == DataPosition(epoch=1, step=2)
    for (p1, x1, y1), (p2, x2, y2) in zip(uninterrupted[10:], iter(resumed.stream), strict=False):
        assert p1 == p2 and torch.equal(x1, x2) and torch.equal(y1, y2)
