"""The training loop, ``train(cfg, ctx)``: read top to bottom in one sitting.

It builds a :class:`trainer.training.run.Run`, resumes from the newest complete checkpoint, then
runs global steps (:func:`loop_step`), evaluating, checkpointing and logging as they fall due.
Each step splits this rank's share of the global batch into micro-batches, so the effective
batch is the same whatever the world size or micro-batch. Failure handling:

- out of memory: halve the micro-batch and retry the step (in :class:`trainer.training.run.Run`);
- NaN/Inf loss: roll back to the last good checkpoint with a lower learning rate, a bounded
  number of times (:func:`_rollback`, here);
- SIGTERM: finish the step, write a checkpoint, raise :class:`trainer.training.stop.Preempted`
  (exit 143, so the operator may retry).

Loss values stay on the device in a :class:`LossWindow` and are synced only when a log line,
an evaluation or a checkpoint is due.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.base import cost, storage
from trainer.base.typedconfig import to_dict
from trainer.config import WorkerConfig
from trainer.data.datasets import DataPosition
from trainer.data.streaming import StreamingParquetDataset
from trainer.distributed import dist
from trainer.distributed.dist import DistContext
from trainer.models import export
from trainer.training import calibration, evaluation
from trainer.training.run import Run, training_batches
from trainer.training.stop import Preempted, StopSignal
from trainer.training.telemetry import gpu_memory_gb

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a finished run reports (also written to the model's ``metrics.json``)."""

    steps: int
    epochs: float
    metrics: dict[str, float]
    stopped_early: bool
    rollbacks: int
    micro_batch_size: int
    resumed_from: int | None
    model_uri: str


class LossWindow:
    """The step losses between two log lines, kept on the device: no per-step host sync.

    ``add`` is a few tiny device ops; ``sync`` is the one place loss values leave the device
    (summed over ranks), which is also where a non-finite loss or gradient norm shows up.
    """

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self.sums = torch.zeros(3, device=ctx.device)  # loss sum, non-finite count, steps
        self.start, self.samples = time.perf_counter(), 0

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor | None, samples: int) -> None:
        """Record one step; ``grad_norm`` (unscaled runs only) is checked for Inf/NaN too."""
        self.sums[0] += torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0)
        self.sums[1] += (~torch.isfinite(loss)).float()
        if grad_norm is not None:
            # An Inf gradient with a finite loss poisons the weights: catch it before a save.
            self.sums[1] += (~torch.isfinite(grad_norm)).float()
        self.sums[2] += 1
        self.samples += samples

    def sync(self) -> tuple[float, float, float]:
        """(mean loss per step, non-finite count, samples/s) over all ranks since the reset."""
        loss_total, bad, n = dist.all_reduce_sum(self.ctx, self.sums.clone()).tolist()
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return loss_total / self.ctx.world_size / max(n, 1.0), bad, self.samples / elapsed

    def reset(self) -> None:
        self.sums.zero_()
        self.start, self.samples = time.perf_counter(), 0


@dataclass(slots=True)
class StepOutcome:
    """What one iteration of the training loop did and what the loop must do next."""

    loss: torch.Tensor
    """This step's loss, still on the device."""
    stop_now: bool
    """SIGTERM arrived: checkpoint and stop."""
    checkpoint: bool
    """A checkpoint is due after this step."""
    evaluate: bool
    """An evaluation is due after this step."""
    mean_loss: float | None = None
    """Mean loss since the last log line, where this step synced (logged or evaluates)."""
    diverged: bool = False
    """The synced window held a non-finite loss or gradient norm: roll back."""


def train(
    cfg: WorkerConfig,
    ctx: DistContext,
    stop: StopSignal | None = None,
    *,
    on_eval: Callable[[int, dict[str, float]], bool] | None = None,
) -> TrainResult:
    """Train according to ``cfg`` on this rank; rank 0 writes the model to ``output.model_uri``.

    Args:
        cfg: The worker config.
        ctx: This process's distributed context.
        stop: SIGTERM flag (a fresh one when omitted).
        on_eval: Called on the main rank after each evaluation with the optimizer step and the
            metrics so far (``val_*`` and ``train_loss``); returning True stops the run the way
            early stopping does (a tuning study pruning a trial). Under DDP pass it on every
            rank: rank 0's answer is broadcast, so all ranks stop at the same step.

    Raises:
        ValueError: bad data or config (before any step runs).
        RuntimeError: NaN rollbacks or OOM fallbacks exhausted.
        Preempted: SIGTERM arrived; a checkpoint was written.
    """
    stop = stop or StopSignal()
    began = time.monotonic()
    run = Run(cfg, ctx, stop)
    t, s, tel = cfg.train, run.state, run.telemetry
    resumed = run.restore_latest(reason="resume") if cfg.checkpoint.resume else None
    if resumed is not None:
        tel.resume(resumed)
    tel.emit(
        "start",
        step=s.step,
        total_steps=run.total_steps,
        world_size=ctx.world_size,
        steps_per_epoch=run.steps_per_epoch,
        precision=run.precision.name,
        micro_batch=s.micro_batch_size,
        device=str(ctx.device),
        strategy=run.strategy,
        params=sum(p.numel() for p in run.raw_model.parameters()),
        resumed_from=resumed,
        # Parquet over data.max_memory_mb is read row group by row group: say so.
        streaming=isinstance(run.train_ds, StreamingParquetDataset),
        metrics_url=tel.sink.url if tel.sink is not None else None,
    )
    metrics = s.metrics  # restored from the checkpoint on resume, so a re-export keeps them
    if resumed is None and t.early_stopping is not None and run.val_ds is not None:
        # The starting weights are a candidate too: a model that starts from the linear fit
        # (model.linear) may never improve on it, and then it is what gets exported.
        _evaluate(run, metrics)
    if resumed is None and run.ckpt is not None:
        run.save_checkpoint()  # step 0: a NaN before the first periodic save can still roll back

    window = LossWindow(ctx)
    it = training_batches(run)
    try:
        while s.step < run.total_steps and not s.stopped_early:
            position, x, y = next(it)
            step = loop_step(run, position, x, y, window)
            if step.diverged:
                it.close()
                _rollback(run, at_step=s.step)
                it = training_batches(run)  # from the restored position
                window.reset()
                continue
            if step.mean_loss is None:  # nothing logged, evaluated or saved after this step
                continue
            metrics["train_loss"] = step.mean_loss

            if step.evaluate:
                s.stopped_early = _evaluate(run, metrics)
                if on_eval is not None and _ask_to_stop(ctx, on_eval, s.step, metrics):
                    s.stopped_early = True
                    tel.emit("stop_requested", step=s.step)
            if step.checkpoint or (s.stopped_early and run.ckpt is not None):
                run.save_checkpoint()
            if step.stop_now:
                tel.close()
                raise Preempted(s.step, run.last_checkpoint)
            if s.stopped_early:
                tel.emit(
                    "early_stop",
                    step=s.step,
                    best=s.best,
                    metric=t.early_stopping.metric if t.early_stopping else None,
                )
                break
    finally:
        it.close()  # stops the prefetch thread, whatever ended the loop

    weights = (
        run.best.weights
    )  # the main rank's copy of the best weights, if early stopping kept any
    if weights is not None:
        # Early stopping exports the best weights, with the validation metrics they scored.
        metrics.update(s.best_metrics)
    if run.sharded:
        if dist.broadcast_object(ctx, weights is None):
            weights = run.full_state()  # a collective: rank 0 gathers the shards
    elif weights is not None:
        run.raw_model.load_state_dict(weights)
    # Classification: a temperature fitted on the validation rows (main rank; the export's).
    metrics.update(calibration.calibrate(run, weights if run.sharded else None))
    result = TrainResult(
        steps=s.step,
        epochs=round(s.step / run.steps_per_epoch, 4),
        metrics=metrics,
        stopped_early=s.stopped_early,
        rollbacks=s.rollbacks,
        micro_batch_size=s.micro_batch_size,
        resumed_from=resumed,
        model_uri=cfg.output.model_uri,
    )
    if ctx.is_main:
        if run.ckpt is not None:  # a stale attempt's model never replaces the newer one's
            run.ckpt.fence("export the model")
        run_record = _run_record(cfg, ctx, time.monotonic() - began, s.step - (resumed or 0))
        schema = storage.read_json(cfg.data.schema_uri) if cfg.data.schema_uri else None
        export.save_model(
            cfg.output.model_uri,
            run.raw_model,
            state=weights if run.sharded else None,
            model_cfg=cfg.model,
            spec=run.spec,
            features=run.features,
            target=cfg.data.target if cfg.data.kind == "tabular" else None,
            schema=schema,
            metrics=metrics,
            target_scale=cfg.data.target_scale,
            extra={
                "train": {
                    "steps": s.step,
                    "epochs": result.epochs,
                    "rollbacks": s.rollbacks,
                    "stopped_early": s.stopped_early,
                    "world_size": ctx.world_size,
                    "config": to_dict(cfg),
                },
                "run": run_record,
            },
        )
        tel.emit("done", step=s.step, model_uri=cfg.output.model_uri, **metrics, **run_record)
    tel.close()
    if why := dist.final_barrier(ctx):
        log.warning(
            "a peer did not reach the end of the job (%s); the model is written, so the job stands",
            why,
        )
    return result


def _run_record(cfg: WorkerConfig, ctx: DistContext, seconds: float, steps: int) -> dict[str, Any]:
    """What the run took and cost, for the model's metadata (``model.json``'s ``extra.run``):
    the values a pod that lived too short to be scraped would have served. What ran: the device
    type, the processes, the GPUs really used (none on the CPU) and their hours."""
    gpus = cost.gpus_used(cfg.metrics.gpus, ctx.device.type, ctx.world_size)
    record = cost.actual(seconds, gpus, cfg.metrics.gpu_hour_usd)
    return {
        "training_duration_seconds": round(seconds, 3),
        "device": ctx.device.type,
        "processes": ctx.world_size,
        "gpus": gpus,
        "gpu_hours": record["gpu_hours"],
        "gpu_hour_usd": cfg.metrics.gpu_hour_usd,
        "cost_usd": record["cost_usd"],
        "samples_per_second": round(steps * cfg.train.global_batch_size / max(seconds, 1e-9), 1),
        "restarts": dist.restart_count(),
    }


def loop_step(
    run: Run, position: DataPosition, x: torch.Tensor, y: torch.Tensor, window: LossWindow
) -> StepOutcome:
    """One iteration of :func:`train`'s loop on batch ``(x, y)`` (the benchmarks time it).

    Steps the optimizer (with the OOM fallback), advances the state to ``position``, adds
    the loss to ``window`` and, where a log line or an evaluation is due, syncs the window
    and logs the step. A non-finite window is reported (``diverged``), not logged: the
    caller rolls back. Evaluation and checkpoints are the caller's, as the outcome says.
    """
    s, t, tel = run.state, run.cfg.train, run.telemetry
    loss, stop_now = run.step_with_oom_fallback(x, y)
    s.step += 1
    run.data.position = position
    window.add(loss, run.last_grad_norm if run.scaler is None else None, t.global_batch_size)
    tel.advance(s.step)
    want_ckpt, want_log, want_eval = _due(run, stop_now)
    outcome = StepOutcome(loss=loss, stop_now=stop_now, checkpoint=want_ckpt, evaluate=want_eval)
    if not (want_log or want_eval):
        return outcome
    # Sync point: the only place loss values leave the device.
    mean_loss, bad, samples_per_s = window.sync()
    if bad > 0:
        outcome.diverged = True
        return outcome
    norm = run.last_grad_norm
    tel.emit(
        "step",
        step=s.step,
        epoch=round(s.step / run.steps_per_epoch, 4),
        loss=mean_loss,
        lr=run.scheduler.get_last_lr()[0],
        grad_norm=float(norm) if norm is not None else None,
        samples_per_s=round(samples_per_s, 1),
        micro_batch=s.micro_batch_size,
        gpu_mem_gb=gpu_memory_gb(run.ctx.device),
    )
    window.reset()
    outcome.mean_loss = mean_loss
    return outcome


def _due(run: Run, stop_now: bool) -> tuple[bool, bool, bool]:
    """After the current step: (checkpoint, log, evaluate) due? A checkpoint implies a log
    line, because the loss sync before it is what keeps non-finite weights out of saves."""
    t, s = run.cfg.train, run.state
    end_of_epoch = run.data.position.step == 0 and s.step > 0
    last = s.step == run.total_steps
    ckpt = run.ckpt is not None and (
        s.step % run.cfg.checkpoint.every_steps == 0 or end_of_epoch or stop_now
    )
    log_line = s.step % t.log_every_steps == 0 or last or ckpt or stop_now
    evaluate = run.val_ds is not None and (
        (t.eval_every_steps is not None and s.step % t.eval_every_steps == 0)
        or (t.eval_every_steps is None and end_of_epoch)
        or last
    )
    return ckpt, log_line, evaluate


def _evaluate(run: Run, metrics: dict[str, float]) -> bool:
    """Score the validation rows into ``metrics``, log them, and return whether to stop early."""
    step = run.state.step
    metrics.update(evaluation.evaluate(run))
    run.telemetry.emit(
        "eval",
        step=step,
        epoch=round(step / run.steps_per_epoch, 4),
        **{k: v for k, v in metrics.items() if k.startswith("val_")},
    )
    return evaluation.early_stop_update(run, metrics)


def _ask_to_stop(
    ctx: DistContext,
    on_eval: Callable[[int, dict[str, float]], bool],
    step: int,
    metrics: dict[str, float],
) -> bool:
    """Rank 0 asks ``on_eval``; every rank gets its answer (or learns that it failed).

    A callback that raises on rank 0 must not leave the other ranks waiting in the broadcast,
    so its failure travels as an answer too and every rank raises.
    """
    answer, error = "go", None
    if ctx.is_main:
        try:
            answer = "stop" if on_eval(step, dict(metrics)) else "go"
        except Exception as e:  # re-raised below, after the other ranks are told
            answer, error = "error", e
    answer = dist.broadcast_object(ctx, answer)
    if error is not None:
        raise error
    if answer == "error":
        raise RuntimeError(f"the on_eval callback failed on rank 0 at step {step}")
    return bool(answer == "stop")


def _rollback(run: Run, *, at_step: int) -> None:
    """Non-finite loss: restore the last good checkpoint with a lower learning rate."""
    s, t = run.state, run.cfg.train
    if run.ckpt is None:
        raise RuntimeError(
            f"loss became NaN/Inf by step {at_step} and checkpoint.uri is not "
            f"set, so there is nothing to roll back to: lower optim.lr or enable "
            f"checkpoints"
        )
    if s.rollbacks >= t.max_nan_rollbacks:
        raise RuntimeError(
            f"loss became NaN/Inf by step {at_step} after {s.rollbacks} rollbacks "
            f"(train.max_nan_rollbacks={t.max_nan_rollbacks}); last learning-rate "
            f"scale {s.lr_scale:g}: lower optim.lr or check the data"
        )
    rollbacks, lr_scale = s.rollbacks + 1, s.lr_scale * t.nan_lr_factor
    step = run.restore_latest(reason="nan")
    if step is None:
        raise RuntimeError(
            f"loss became NaN/Inf by step {at_step} and no complete checkpoint "
            f"exists under {run.cfg.checkpoint.uri}"
        )
    s.rollbacks, s.lr_scale = rollbacks, min(s.lr_scale, lr_scale)
    # LambdaLR applies lr_scale lazily: recompute the current lr for the restored step.
    for group, base in zip(run.optimizer.param_groups, run.scheduler.base_lrs, strict=True):
        group["lr"] = base * run.scheduler.lr_lambdas[0](run.scheduler.last_epoch)
    log.warning(
        "loss became NaN/Inf by step %d: rolled back to step %d (rollback %d of %d), "
        "learning-rate scale now %g",
        at_step,
        step,
        s.rollbacks,
        t.max_nan_rollbacks,
        s.lr_scale,
    )
    run.telemetry.emit(
        "rollback", step=step, from_step=at_step, rollbacks=s.rollbacks, lr_scale=s.lr_scale
    )
