"""Saving a :class:`trainer.run.Run` to a checkpoint and restoring it, for DDP and FSDP alike.

Under DDP rank 0 writes the whole state into ``state.pt``; under FSDP every rank writes its
shard through :mod:`trainer.dcp` and ``state.pt`` keeps the rest (loop state, scheduler, scaler,
RNG states, data position, best weights). Both resume to the same step with the same weights.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trainer import dcp, dist
from trainer.checkpoint import capture_rng_state, restore_rng_state, seed_everything
from trainer.data import BatchStream, DataPosition

if TYPE_CHECKING:
    from trainer.run import Run

log = logging.getLogger(__name__)


def _meta(run: Run) -> dict[str, Any]:
    s = run.state
    return {
        "step": s.step,
        "micro_batch_size": s.micro_batch_size,
        "lr_scale": s.lr_scale,
        "rollbacks": s.rollbacks,
        "best": s.best,
        "evals_without_improvement": s.evals_without_improvement,
        "stopped_early": s.stopped_early,
        "metrics": dict(s.metrics),
        "best_metrics": dict(s.best_metrics),
        "world_size": run.ctx.world_size,
        "config_hash": run.cfg_hash,
        "strategy": run.strategy,
    }


def save(run: Run) -> None:
    """Write a checkpoint of ``run``'s current step (every rank calls it)."""
    if run.ckpt is None:
        return
    ctx, s = run.ctx, run.state
    rng = dist.all_gather_object(ctx, capture_rng_state())
    payload: dict[str, Any] | None = None
    if ctx.is_main:
        payload = {
            "scheduler": run.scheduler.state_dict(),
            "scaler": run.scaler.state_dict() if run.scaler is not None else None,
            "rng": rng,
            "data": s.position.to_dict(),
            # The best weights so far, so a rerun of an early-stopped run exports them.
            "best_model": run.best_state,
            "meta": _meta(run),
        }
    if run.sharded:
        uri = dcp.save_sharded(
            run.ckpt, ctx, s.step, model=run.raw_model, optimizer=run.optimizer, state=payload
        )
    else:
        uri = None
        if payload is not None:
            payload["model"] = run.raw_model.state_dict()
            payload["optimizer"] = run.optimizer.state_dict()
            uri = run.ckpt.save(s.step, payload)
        dist.control_barrier(ctx)  # nobody exits (or moves on) mid-write
    if ctx.is_main:
        run.last_checkpoint = uri
        run.telemetry.emit("checkpoint", step=s.step, uri=uri)
        run.telemetry.flush()


def restore(run: Run, *, reason: str) -> int | None:
    """Load the newest complete checkpoint on every rank; return its step or None.

    Raises:
        ValueError: The checkpoint was written under the other strategy (its tensors are laid
            out differently: set ``train.strategy`` to the one it names).
    """
    if run.ckpt is None:
        return None
    ctx = run.ctx
    found = run.ckpt.load_latest() if ctx.is_main else None
    step = dist.broadcast_object(ctx, None if found is None else found[0])
    if step is None:
        return None
    payload = found[1] if found is not None else run.ckpt.load(step)
    meta = payload["meta"]
    written_by = meta.get("strategy", "ddp")
    if written_by != run.strategy:
        raise ValueError(
            f"checkpoint step {step} under {run.ckpt.root} was written with train.strategy "
            f"{written_by!r}, this run uses {run.strategy!r}: set train.strategy to {written_by!r}"
        )
    if run.sharded:
        dcp.load_sharded(run.ckpt, ctx, step, payload, model=run.raw_model, optimizer=run.optimizer)
    else:
        run.raw_model.load_state_dict(payload["model"])
        run.optimizer.load_state_dict(payload["optimizer"])
    run.scheduler.load_state_dict(payload["scheduler"])
    if run.scaler is not None and payload.get("scaler"):
        run.scaler.load_state_dict(payload["scaler"])
    _restore_loop_state(run, meta, payload)
    _restore_rng(run, step, payload["rng"])
    if meta.get("config_hash") != run.cfg_hash:
        log.warning("checkpoint step %d was written with a different config", step)
    run.stream = BatchStream(
        run.train_ds,
        global_batch_size=run.cfg.train.global_batch_size,
        rank=ctx.rank,
        world_size=ctx.world_size,
        seed=run.cfg.train.seed,
        shuffle=run.cfg.data.shuffle,
        start=run.state.position,
    )
    run.telemetry.emit(
        "restore", step=run.state.step, reason=reason, epoch=run.state.position.epoch
    )
    return step


def _restore_loop_state(run: Run, meta: dict[str, Any], payload: dict[str, Any]) -> None:
    s = run.state
    s.step = int(meta["step"])
    s.position = DataPosition.from_dict(payload["data"])
    s.micro_batch_size = min(int(meta["micro_batch_size"]), run.local_batch)
    s.lr_scale = float(meta["lr_scale"])
    s.rollbacks = max(s.rollbacks, int(meta["rollbacks"]))
    s.best = meta.get("best")
    s.evals_without_improvement = int(meta.get("evals_without_improvement", 0))
    s.stopped_early = bool(meta.get("stopped_early", False))
    s.metrics = {k: float(v) for k, v in meta.get("metrics", {}).items()}
    s.best_metrics = {k: float(v) for k, v in meta.get("best_metrics", {}).items()}
    if run.ctx.is_main:
        run.best_state = payload.get("best_model")


def _restore_rng(run: Run, step: int, rngs: list[Any]) -> None:
    if len(rngs) == run.ctx.world_size:
        restore_rng_state(rngs[run.ctx.rank])
        return
    log.warning(
        "checkpoint step %d was written by %d processes, this run has %d: "
        "random streams are re-seeded, so dropout will differ",
        step,
        len(rngs),
        run.ctx.world_size,
    )

    seed_everything(run.cfg.train.seed + step)
