"""One training run's objects and the steps of its loop: :class:`Run`.

``Run(cfg, ctx, stop)`` builds data, model, optimizer, scheduler, scaler, checkpoint manager and
telemetry once. Its methods are the pieces :func:`trainer.loop.train` puts in order, and that the
benchmarks time: ``loop_step`` (one iteration), ``train_step`` (micro-batches and one optimizer
step) with the out-of-memory fallback (halve the micro-batch, double accumulation, keep the
effective batch), ``evaluate``, ``early_stop_update``, ``save_checkpoint`` and
``restore_latest``.

Decisions that change control flow (OOM, stop) are agreed by all ranks over a small CPU (gloo)
collective so that no rank is left waiting inside a GPU collective, and without a device sync.
Loss values stay on the device in a :class:`LossWindow` and are synced only when a log line,
an evaluation or a checkpoint is due.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Generator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import dist, resume, sharding
from trainer.checkpoint import CheckpointManager, seed_everything
from trainer.config import WorkerConfig, config_hash
from trainer.data import (
    BatchStream,
    DataPosition,
    TabularDataset,
    TokenDataset,
    eval_batches,
    load_dataset,
)
from trainer.dist import DistContext
from trainer.models import ModelSpec, TabularMLP, build_model, compute_loss, forward_loss
from trainer.models.linear_fit import fit_linear
from trainer.optim import lr_multiplier, make_optimizer
from trainer.precision import Precision, configure_backends, resolve_precision
from trainer.prefetch import Prefetcher
from trainer.stop import StopSignal
from trainer.telemetry import Telemetry, gpu_memory_gb

log = logging.getLogger(__name__)


@dataclass
class _State:
    """Mutable loop state that a checkpoint captures (besides model/optimizer tensors)."""

    step: int = 0
    position: DataPosition = field(default_factory=DataPosition)
    micro_batch_size: int = 1
    lr_scale: float = 1.0
    rollbacks: int = 0
    best: float | None = None
    evals_without_improvement: int = 0
    stopped_early: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    best_metrics: dict[str, float] = field(default_factory=dict)


def _free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


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


class Run:
    """One training run's objects, built once; methods are the loop's steps."""

    def __init__(self, cfg: WorkerConfig, ctx: DistContext, stop: StopSignal) -> None:
        self.cfg, self.ctx, self.stop = cfg, ctx, stop
        t = cfg.train
        self.precision: Precision = resolve_precision(t.precision, ctx.device)
        configure_backends(ctx.device, tf32=t.tf32)
        d = cfg.data

        def load(uri: str) -> Any:
            return load_dataset(
                uri,
                kind=d.kind,
                target=d.target if d.kind == "tabular" else d.token_column,
                features=d.features,
                task=d.task,
                seq_len=d.seq_len,
                max_memory_bytes=d.max_memory_mb * 2**20,
            )

        self.train_ds = load(d.train_uri)
        self.val_ds = load(d.val_uri) if d.val_uri else None
        self.features: list[str] | None = None
        if isinstance(self.train_ds, TokenDataset):
            self.spec = ModelSpec(task="lm", seq_len=d.seq_len)
        else:
            self.features = list(self.train_ds.feature_names)
            self.spec = ModelSpec(
                task=d.task, in_features=len(self.features), num_classes=self.train_ds.num_classes
            )
            val_features = getattr(self.val_ds, "feature_names", self.features)
            if list(val_features) != self.features:
                raise ValueError(
                    f"data.val_uri {d.val_uri} has features {val_features}, "
                    f"training data has {self.features}"
                )

        if t.global_batch_size % ctx.world_size:
            raise ValueError(
                f"train.global_batch_size {t.global_batch_size} must divide by the "
                f"number of processes ({ctx.world_size})"
            )
        self.local_batch = t.global_batch_size // ctx.world_size
        # Regression learns the standardised target; its scale converts RMSE back to target units.
        self.target_mean, self.target_std = d.target_scale or (0.0, 1.0)
        self.stream = BatchStream(
            self.train_ds,
            global_batch_size=t.global_batch_size,
            rank=ctx.rank,
            world_size=ctx.world_size,
            seed=t.seed,
            shuffle=d.shuffle,
        )
        self.steps_per_epoch = self.stream.steps_per_epoch
        total = t.epochs * self.steps_per_epoch
        self.total_steps = min(total, t.max_steps) if t.max_steps else total

        seed_everything(t.seed)
        self.raw_model = build_model(cfg.model, self.spec).to(ctx.device)
        self._start_linear()
        choice = sharding.choose_strategy(
            t.strategy,
            device_type=ctx.device.type,
            world_size=ctx.world_size,
            param_count=sum(p.numel() for p in self.raw_model.parameters()),
            device_memory_bytes=(
                torch.cuda.get_device_properties(ctx.device).total_memory
                if ctx.device.type == "cuda"
                else None
            ),
        )
        log.info("data parallel strategy %s (%s)", choice.strategy, choice.reason)
        self.strategy = choice.strategy
        self.sharded = choice.strategy == "fsdp"
        self.ddp: DDP | None = None
        self.fwd_model: Any = None
        self._wrap_model()
        self.optimizer = make_optimizer(self.raw_model, cfg, ctx.device)
        self.state = _State(
            micro_batch_size=min(t.micro_batch_size or self.local_batch, self.local_batch)
        )
        o = cfg.optim
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: (
                self.state.lr_scale
                * lr_multiplier(
                    s,
                    total=self.total_steps,
                    warmup=o.warmup_steps,
                    schedule=o.schedule,
                    min_ratio=o.min_lr_ratio,
                )
            ),
        )
        self.scaler = self.precision.make_scaler()
        c = cfg.checkpoint
        self.ckpt = CheckpointManager(c.uri, keep_last=c.keep_last) if c.uri else None
        self.cfg_hash = config_hash(cfg)
        self.telemetry = Telemetry(
            enabled=ctx.is_main,
            job=ctx.run_id,
            total_steps=self.total_steps,
            history_uri=cfg.output.history_uri,
            metrics_stdout=cfg.train.metrics_stdout,
        )
        self.best_state: dict[str, torch.Tensor] | None = None
        self.last_checkpoint: str | None = None
        self.last_grad_norm: torch.Tensor | None = None

    def _start_linear(self) -> None:
        """``model.linear: fit``: start the MLP from the linear model fitted to the training rows.

        Every rank fits the same rows the same way (DDP would broadcast rank 0's weights anyway;
        FSDP shards what each rank holds). Streamed data, too large to hold, starts unfitted.
        """
        model = self.raw_model
        if not isinstance(model, TabularMLP) or self.cfg.model.linear != "fit":
            return
        if not isinstance(self.train_ds, TabularDataset):
            log.info("linear path not fitted: the training data is streamed")
            return
        ds = self.train_ds
        fit = fit_linear(
            ds.features,
            self.scaled_target(ds.target),
            task=self.spec.task,
            num_classes=self.spec.num_classes,
        )
        if fit is not None:
            model.start_from_linear(fit)
            log.info("model starts from the linear fit to %d training rows", fit.rows)

    def _wrap_model(self) -> None:
        """(Re)build the DDP wrapper and the compiled forward around ``raw_model``.

        Rebuilt after an agreed OOM: a rank whose peer failed mid-step may have finished a
        gradient-syncing forward that the peer abandoned, which leaves DDP's reducer out of step
        across ranks. A fresh wrapper (its construction is itself a collective) realigns them.
        FSDP shards ``raw_model`` in place, once, compiling block by block where asked to.
        """
        if self.sharded:
            if not sharding.is_sharded(self.raw_model):
                dist.ensure_group(self.ctx)  # one process still shards over a (1-rank) group
                sharding.apply_fsdp(
                    self.raw_model,
                    precision=self.precision,
                    cpu_offload=self.cfg.train.fsdp_cpu_offload,
                    compile_units=self.cfg.train.compile,
                )
            self.fwd_model = self.raw_model
            return
        if self.ctx.is_distributed:
            device_ids = [self.ctx.device] if self.ctx.device.type == "cuda" else None
            self.ddp = DDP(self.raw_model, device_ids=device_ids)
        model: torch.nn.Module = self.ddp if self.ddp is not None else self.raw_model
        self.fwd_model = torch.compile(model) if self.cfg.train.compile else model

    def loop_step(
        self, position: DataPosition, x: torch.Tensor, y: torch.Tensor, window: LossWindow
    ) -> StepOutcome:
        """One iteration of :func:`train`'s loop on batch ``(x, y)`` (the benchmarks time it).

        Steps the optimizer (with the OOM fallback), advances the state to ``position``, adds
        the loss to ``window`` and, where a log line or an evaluation is due, syncs the window
        and logs the step. A non-finite window is reported (``diverged``), not logged: the
        caller rolls back. Evaluation and checkpoints are the caller's, as the outcome says.
        """
        s, t, tel = self.state, self.cfg.train, self.telemetry
        loss, stop_now = self.step_with_oom_fallback(x, y)
        s.step += 1
        s.position = position
        window.add(loss, self.last_grad_norm if self.scaler is None else None, t.global_batch_size)
        tel.advance(s.step)
        want_ckpt, want_log, want_eval = self.due(stop_now)
        outcome = StepOutcome(
            loss=loss, stop_now=stop_now, checkpoint=want_ckpt, evaluate=want_eval
        )
        if not (want_log or want_eval):
            return outcome
        # Sync point: the only place loss values leave the device.
        mean_loss, bad, samples_per_s = window.sync()
        if bad > 0:
            outcome.diverged = True
            return outcome
        norm = self.last_grad_norm
        tel.emit(
            "step",
            step=s.step,
            epoch=round(s.step / self.steps_per_epoch, 4),
            loss=mean_loss,
            lr=self.scheduler.get_last_lr()[0],
            grad_norm=float(norm) if norm is not None else None,
            samples_per_s=round(samples_per_s, 1),
            micro_batch=s.micro_batch_size,
            gpu_mem_gb=gpu_memory_gb(self.ctx.device),
        )
        window.reset()
        outcome.mean_loss = mean_loss
        return outcome

    def due(self, stop_now: bool) -> tuple[bool, bool, bool]:
        """After the current step: (checkpoint, log, evaluate) due? A checkpoint implies a log
        line, because the loss sync before it is what keeps non-finite weights out of saves."""
        t, s = self.cfg.train, self.state
        end_of_epoch = s.position.step == 0 and s.step > 0
        last = s.step == self.total_steps
        ckpt = self.ckpt is not None and (
            s.step % self.cfg.checkpoint.every_steps == 0 or end_of_epoch or stop_now
        )
        log_line = s.step % t.log_every_steps == 0 or last or ckpt or stop_now
        evaluate = self.val_ds is not None and (
            (t.eval_every_steps is not None and s.step % t.eval_every_steps == 0)
            or (t.eval_every_steps is None and end_of_epoch)
            or last
        )
        return ckpt, log_line, evaluate

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> None:
        """Write a checkpoint of this step (every rank calls it; see :mod:`trainer.resume`)."""
        resume.save(self)

    def restore_latest(self, *, reason: str) -> int | None:
        """Load the newest complete checkpoint on every rank; return its step or None."""
        return resume.restore(self, reason=reason)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model's weights as CPU tensors on the main rank (all ranks call it)."""
        if self.sharded:
            return sharding.full_state(self.raw_model, is_main=self.ctx.is_main)
        if not self.ctx.is_main:
            return {}
        return {k: v.detach().to("cpu", copy=True) for k, v in self.raw_model.state_dict().items()}

    # ---------------------------------------------------------------- one step

    def _micro_batches(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        m = self.state.micro_batch_size
        return list(zip(x.split(m), y.split(m), strict=True))

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Forward/backward over micro-batches and one optimizer step.

        Returns the step's mean loss (a device tensor, not synced) and whether the ranks agreed
        to stop after this step. Raises ``torch.OutOfMemoryError`` (on every rank alike) when the
        micro-batch did not fit, leaving gradients cleared so the caller can retry smaller.
        """
        ctx = self.ctx
        if x.device != ctx.device or y.device != ctx.device:  # not prefetched to the device
            non_blocking = ctx.device.type == "cuda"
            x = x.to(ctx.device, non_blocking=non_blocking)
            y = y.to(ctx.device, non_blocking=non_blocking)
        micro = self._micro_batches(x, self.scaled_target(y))
        n_total = x.shape[0]
        loss_sum = torch.zeros((), device=ctx.device)
        oom = False
        pending: torch.Tensor | None = None
        for i, (mx, my) in enumerate(micro):
            last = i == len(micro) - 1
            # Gradients sync in the last micro-batch's backward only. DDP's no_sync must cover
            # the forward too: DDP decides there whether the backward all-reduces.
            sync = self._no_sync() if not last else nullcontext()
            try:
                with sync:
                    loss = forward_loss(
                        self.fwd_model, self.spec.task, mx, my, self.precision.autocast
                    ) * (mx.shape[0] / n_total)
                    if last:
                        pending = loss  # backward only after the ranks agree (below)
                    else:
                        self._backward(loss)
                loss_sum += loss.detach()
            except torch.OutOfMemoryError:
                oom = True
                break
        # Every rank reaches this point exactly once per step, whatever happened above.
        oom, stop = self._agree(oom)
        if oom:
            del pending
            self.optimizer.zero_grad(set_to_none=True)
            if self.ddp is not None:
                self.ddp = None
                self._wrap_model()
            if self.sharded:
                sharding.reset_after_error(self.raw_model)
            _free_memory(ctx.device)
            raise torch.OutOfMemoryError("micro-batch did not fit")
        assert pending is not None
        try:
            self._backward(pending)
        except torch.OutOfMemoryError as e:
            if ctx.is_distributed:
                raise RuntimeError(
                    f"out of memory in the gradient-synchronising backward pass at micro-batch "
                    f"{self.state.micro_batch_size}; multi-process runs cannot recover from this "
                    f"in place: set train.micro_batch_size lower"
                ) from e
            self.optimizer.zero_grad(set_to_none=True)
            _free_memory(ctx.device)
            raise
        self.last_grad_norm = self._optimizer_step()
        return loss_sum, stop

    def _agree(self, oom: bool) -> tuple[bool, bool]:
        """(any rank out of memory, any rank asked to stop), agreed by every rank.

        Under FSDP the forward is a chain of collectives, so a rank that ran out of memory
        alone waits here while its peers wait in their next all-gather, until the collective
        timeout. That failure is this rank's, not a lost peer's: say so, permanently.
        """
        try:
            any_oom, stop = dist.control_any(self.ctx, oom, self.stop.requested.is_set())
            return any_oom, stop
        except RuntimeError as e:
            if not (oom and self.sharded):
                raise
            # The collective's own text would read as a lost peer (retryable): leave it out.
            log.warning("agreeing on an out-of-memory error failed: %s", e)
            raise RuntimeError(
                f"out of memory at micro-batch {self.state.micro_batch_size} on rank "
                f"{self.ctx.rank} while the other ranks went on; under FSDP an out-of-memory "
                f"error on some ranks only cannot be recovered in place: set "
                f"train.micro_batch_size lower"
            ) from None

    def _no_sync(self) -> AbstractContextManager[object]:
        """Accumulate gradients locally: DDP's ``no_sync``, FSDP's gradient-sync switch."""
        if self.ddp is not None:
            return self.ddp.no_sync()
        if self.sharded:
            return sharding.no_sync(self.raw_model)
        return nullcontext()

    def _backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def _optimizer_step(self) -> torch.Tensor | None:
        clip = self.cfg.optim.grad_clip
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = None
        if clip is not None:
            # Under FSDP the norm is a DTensor: the total over every rank's shards.
            norm = sharding.local_value(
                torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), clip)
            )
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def step_with_oom_fallback(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Run a step; on OOM halve the micro-batch (down to the configured floor) and retry."""
        while True:
            try:
                return self.train_step(x, y)
            except torch.OutOfMemoryError:
                s, floor = self.state, self.cfg.train.min_micro_batch_size
                if s.micro_batch_size <= floor:
                    raise RuntimeError(
                        f"out of memory at micro-batch {s.micro_batch_size}, which is already "
                        f"train.min_micro_batch_size={floor}: use a smaller model or more "
                        f"devices"
                    ) from None
                old = s.micro_batch_size
                s.micro_batch_size = max(floor, old // 2)
                accum = math.ceil(self.local_batch / s.micro_batch_size)
                log.warning(
                    "out of memory at micro-batch %d: retrying step %d with micro-batch "
                    "%d and %d accumulation steps (effective batch %d kept)",
                    old,
                    s.step + 1,
                    s.micro_batch_size,
                    accum,
                    self.cfg.train.global_batch_size,
                )
                self.telemetry.emit(
                    "oom",
                    step=s.step + 1,
                    old_micro_batch=old,
                    micro_batch=s.micro_batch_size,
                    accumulation=accum,
                )

    # ---------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss (and accuracy or RMSE) over every validation row, summed over ranks."""
        if self.val_ds is None:
            return {}
        self.raw_model.eval()
        ctx = self.ctx
        totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss, correct, n
        for x, y, n_valid in eval_batches(
            self.val_ds,
            batch_size=self.cfg.data.eval_batch_size,
            rank=ctx.rank,
            world_size=ctx.world_size,
        ):
            # Every rank runs every (padded) batch: an FSDP forward is a collective.
            with self.precision.autocast():
                out = self.raw_model(x.to(ctx.device))
            if n_valid == 0:
                continue
            out = out[:n_valid].float()
            y = self.scaled_target(y[:n_valid].to(ctx.device))
            task = self.spec.task
            per = compute_loss(task, out, y) * n_valid
            totals[0] += per.double()
            if task == "classification":
                totals[1] += (out.argmax(-1) == y).sum().double()
            elif task == "regression":
                totals[1] += ((out.squeeze(-1) - y) ** 2).sum().double()
            totals[2] += n_valid
        self.raw_model.train()
        loss_sum, extra, n = dist.all_reduce_sum(ctx, totals).tolist()
        n = max(n, 1.0)
        metrics = {"val_loss": loss_sum / n}
        if self.spec.task == "classification":
            metrics["val_accuracy"] = extra / n
        elif self.spec.task == "regression":
            metrics["val_rmse"] = math.sqrt(extra / n) * self.target_std
        else:
            metrics["val_perplexity"] = math.exp(min(loss_sum / n, 50.0))
        return metrics

    def scaled_target(self, y: torch.Tensor) -> torch.Tensor:
        """The regression target as the model learns it (``data.target_scale``); else ``y``."""
        if self.cfg.data.target_scale is None:
            return y
        return (y - self.target_mean) / self.target_std

    def early_stop_update(self, metrics: dict[str, float]) -> bool:
        """Track the best value; keep the best weights; return True when patience is used up."""
        es = self.cfg.train.early_stopping
        if es is None:
            return False
        if es.metric not in metrics:
            raise ValueError(
                f"train.early_stopping.metric {es.metric!r} is not produced for this "
                f"task; available: {sorted(metrics)}"
            )
        value, s = metrics[es.metric], self.state
        better = s.best is None or (
            value < s.best - es.min_delta if es.mode == "min" else value > s.best + es.min_delta
        )
        if better:
            s.best, s.evals_without_improvement = value, 0
            s.best_metrics = {k: v for k, v in metrics.items() if k.startswith("val_")}
            best = self.full_state()  # a collective under FSDP
            if self.ctx.is_main:
                self.best_state = best
            return False
        s.evals_without_improvement += 1
        return s.evals_without_improvement >= es.patience


def training_batches(
    run: Run,
) -> Prefetcher[DataPosition] | Generator[tuple[DataPosition, torch.Tensor, torch.Tensor]]:
    """The training batches from ``run.stream``'s position: prefetched unless switched off."""
    if run.cfg.train.prefetch:
        return Prefetcher(iter(run.stream), device=run.ctx.device)
    return (batch for batch in run.stream)  # a generator: closable like the prefetcher
