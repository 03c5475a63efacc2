"""The run-state contract: every piece of state a checkpoint holds, saved and restored alike.

A piece of run state is anything with ``state_dict()`` and ``load_state_dict(state)``: the
:class:`Stateful` protocol that torch's modules, optimizers, schedulers and scalers already
follow, and that torchtitan's checkpointer is built on. A run registers its pieces once, in a
:class:`RunState`, under the key each has in ``state.pt``; saving asks every piece for its
state, restoring hands every piece its own back, in the order they were registered. Adding a
piece of state is one entry in that registry; adding a counter of the loop is one field of
:class:`LoopState`. Neither this module nor :mod:`trainer.checkpoint` knows what a run is.

Under DDP rank 0 writes every piece into ``state.pt``, model and optimizer included; under
FSDP the model and optimizer are sharded, and every rank writes its shard through
:mod:`trainer.checkpoint.dcp` beside ``state.pt``. Both resume to the same step with the same
weights. The layout of ``state.pt`` (``meta``, ``data``, ``rng``, ``scheduler``, ``scaler``,
``best_model``, and ``model`` and ``optimizer`` under DDP) is that of earlier versions, so
their checkpoints resume too.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from trainer.checkpoint import dcp
from trainer.checkpoint.manager import CheckpointManager
from trainer.data.datasets import BatchStream, DataPosition
from trainer.distributed import dist
from trainer.distributed.dist import DistContext
from trainer.training.rng import capture_rng_state, restore_rng_state, seed_everything

log = logging.getLogger(__name__)

META = "meta"
"""The key of :class:`LoopState`, which also carries the run's identity (see :class:`RunState`)."""


@runtime_checkable
class Stateful(Protocol):
    """A piece of run state: what a checkpoint saves of it, and how it takes that back."""

    def state_dict(self) -> Any:
        """Plain values and tensors, as ``torch.load(weights_only=True)`` reads them back."""
        ...

    def load_state_dict(self, state: Any, /) -> object:
        """Become what ``state`` (an earlier ``state_dict()``) describes."""
        ...


@dataclass
class LoopState:
    """The training loop's own counters (key ``meta``): each field is saved and restored as is.

    A checkpoint written before a field existed restores that field's default.
    """

    step: int = 0
    """Optimizer steps taken."""
    micro_batch_size: int = 1
    """Samples per forward pass per rank (halved by each out-of-memory fallback)."""
    lr_scale: float = 1.0
    """Learning-rate factor left by NaN rollbacks."""
    rollbacks: int = 0
    """NaN rollbacks so far."""
    best: float | None = None
    """Best value of the early-stopping metric so far."""
    evals_without_improvement: int = 0
    """Evaluations since ``best`` last improved."""
    stopped_early: bool = False
    """Early stopping (or a tuning study) ended the run."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The latest ``train_loss`` and validation metrics."""
    best_metrics: dict[str, float] = field(default_factory=dict)
    """The validation metrics of the best weights."""

    def state_dict(self) -> dict[str, Any]:
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def load_state_dict(self, state: Mapping[str, Any], /) -> None:
        fresh = LoopState()
        for f in dataclasses.fields(self):
            setattr(self, f.name, copy.deepcopy(state.get(f.name, getattr(fresh, f.name))))


class DataState:
    """Where the training data stands (key ``data``): the position after the last step taken.

    The loop sets ``position`` after every step; loading rewinds ``stream`` to it, so the next
    batch is the one an uninterrupted run would have taken.
    """

    def __init__(self, stream: BatchStream) -> None:
        self.stream = stream
        self.position = stream.start

    def state_dict(self) -> dict[str, int]:
        return self.position.to_dict()

    def load_state_dict(self, state: Mapping[str, Any], /) -> None:
        self.position = DataPosition.from_dict(state)
        self.stream = self.stream.starting_at(self.position)


class BestWeights:
    """The best weights so far (key ``best_model``), held by the main rank only.

    Saved so that a rerun of an early-stopped run still exports the weights early stopping kept.
    """

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self.weights: dict[str, torch.Tensor] | None = None

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        return self.weights

    def load_state_dict(self, state: dict[str, torch.Tensor] | None, /) -> None:
        if self.ctx.is_main:
            self.weights = state


class RngState:
    """Every rank's random generators (key ``rng``): one entry per rank, in rank order.

    ``state_dict`` is a collective (the ranks' states are gathered). A checkpoint written by
    another number of processes cannot give each rank its own stream back: the generators are
    re-seeded from the seed and the step instead, with a warning (dropout will differ).
    """

    def __init__(self, ctx: DistContext, *, seed: int, loop: LoopState) -> None:
        self.ctx, self.seed, self.loop = ctx, seed, loop

    def state_dict(self) -> list[Any]:
        return dist.all_gather_object(self.ctx, capture_rng_state())

    def load_state_dict(self, state: list[Any], /) -> None:
        if len(state) == self.ctx.world_size:
            restore_rng_state(state[self.ctx.rank])
            return
        step = self.loop.step
        log.warning(
            "checkpoint step %d was written by %d processes, this run has %d: "
            "random streams are re-seeded, so dropout will differ",
            step,
            len(state),
            self.ctx.world_size,
        )
        seed_everything(self.seed + step)


class OptionalPiece:
    """A piece a run may lack (the gradient scaler outside fp16): saved as None when absent.

    A checkpoint that holds nothing for it leaves the piece as it is.
    """

    def __init__(self, piece: Stateful | None) -> None:
        self.piece = piece

    def state_dict(self) -> Any:
        return None if self.piece is None else self.piece.state_dict()

    def load_state_dict(self, state: Any, /) -> None:
        if self.piece is not None and state:
            self.piece.load_state_dict(state)


class RunState:
    """A run's pieces of state by checkpoint key; saves and restores them under DDP or FSDP.

    Args:
        pieces: Every piece a checkpoint holds, by key, in the order they are restored; one of
            them is :class:`LoopState` under :data:`META`. Under DDP include the model and
            the optimizer; under FSDP pass them as ``shards`` instead.
        identity: What the run is (``world_size``, ``config_hash``, ``strategy``): saved in
            ``meta`` beside the loop's counters, checked on restore, never restored.
        shards: FSDP's model and optimizer, written by every rank through DCP.
    """

    def __init__(
        self,
        pieces: Mapping[str, Stateful],
        *,
        identity: Mapping[str, Any],
        shards: tuple[nn.Module, torch.optim.Optimizer] | None = None,
    ) -> None:
        assert isinstance(pieces.get(META), LoopState), "the loop's counters live under 'meta'"
        self.pieces = dict(pieces)
        self.identity = dict(identity)
        self.shards = shards

    def state_dict(self) -> dict[str, Any]:
        """Every piece's state by key. Every rank calls it: a piece may be a collective."""
        state = {key: piece.state_dict() for key, piece in self.pieces.items()}
        state[META] = {**state[META], **self.identity}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Hand every piece its own state back; a piece the checkpoint lacks is left as is."""
        for key, piece in self.pieces.items():
            if key in state:
                piece.load_state_dict(state[key])

    def save(self, mgr: CheckpointManager, ctx: DistContext, step: int) -> str | None:
        """Write checkpoint ``step`` (every rank calls it); the step folder's URI on rank 0."""
        state = self.state_dict()
        if self.shards is not None:
            model, optimizer = self.shards
            return dcp.save_sharded(
                mgr,
                ctx,
                step,
                model=model,
                optimizer=optimizer,
                state=state if ctx.is_main else None,
            )
        uri = mgr.save(step, state) if ctx.is_main else None
        dist.control_barrier(ctx)  # nobody exits (or moves on) mid-write
        return uri

    def restore(self, mgr: CheckpointManager, ctx: DistContext) -> int | None:
        """Load the newest complete checkpoint on every rank; return its step or None.

        Raises:
            ValueError: The checkpoint was written under the other strategy (its tensors are laid
                out differently: set ``train.strategy`` to the one it names).
        """
        found = mgr.load_latest() if ctx.is_main else None
        step = dist.broadcast_object(ctx, None if found is None else found[0])
        if step is None:
            return None
        state = found[1] if found is not None else mgr.load(step)
        self._check_identity(step, state[META], mgr.root)
        if self.shards is not None:
            model, optimizer = self.shards
            dcp.load_sharded(mgr, ctx, step, state, model=model, optimizer=optimizer)
        self.load_state_dict(state)
        return step

    def _check_identity(self, step: int, meta: Mapping[str, Any], root: str) -> None:
        written_by, strategy = meta.get("strategy", "ddp"), self.identity["strategy"]
        if written_by != strategy:
            raise ValueError(
                f"checkpoint step {step} under {root} was written with train.strategy "
                f"{written_by!r}, this run uses {strategy!r}: set train.strategy to {written_by!r}"
            )
        if meta.get("config_hash") != self.identity["config_hash"]:
            log.warning("checkpoint step %d was written with a different config", step)
