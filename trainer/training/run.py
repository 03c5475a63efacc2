"""One training run's objects and its optimizer step: :class:`Run`.

``Run(cfg, ctx, stop)`` builds data, model, optimizer, scheduler, scaler, checkpoint manager and
telemetry once, and registers every piece of state a checkpoint holds
(:mod:`trainer.training.state`). Its methods are what :mod:`trainer.training.loop` puts in
order, and what the benchmarks time: ``train_step`` (micro-batches and one optimizer step) with
the out-of-memory fallback (halve the micro-batch, double accumulation, keep the effective
batch), ``save_checkpoint`` and ``restore_latest``.

Decisions that change control flow (OOM, stop) are agreed by all ranks over a small CPU (gloo)
collective so that no rank is left waiting inside a GPU collective, and without a device sync.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Generator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.base.typedconfig import config_hash
from trainer.checkpoint.manager import CheckpointManager
from trainer.config import WorkerConfig
from trainer.data.datasets import (
    BatchStream,
    DataPosition,
    TabularDataset,
    TokenDataset,
    load_dataset,
)
from trainer.data.prefetch import Prefetcher
from trainer.distributed import dist, sharding
from trainer.distributed.dist import DistContext
from trainer.distributed.precision import Precision, configure_backends, resolve_precision
from trainer.models import ModelSpec, TabularMLP, build_model, forward_loss
from trainer.models.linear_fit import fit_linear
from trainer.training.optim import lr_multiplier, make_optimizer
from trainer.training.prom import TrainingMetrics
from trainer.training.rng import seed_everything
from trainer.training.state import (
    META,
    BestWeights,
    DataState,
    LoopState,
    OptionalPiece,
    RngState,
    RunState,
    Stateful,
)
from trainer.training.stop import StopSignal
from trainer.training.telemetry import Telemetry

log = logging.getLogger(__name__)


def _free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
        self.data = DataState(
            BatchStream(
                self.train_ds,
                global_batch_size=t.global_batch_size,
                rank=ctx.rank,
                world_size=ctx.world_size,
                seed=t.seed,
                shuffle=d.shuffle,
            )
        )
        self.steps_per_epoch = self.stream.steps_per_epoch
        total = t.epochs * self.steps_per_epoch
        self.total_steps = min(total, t.max_steps) if t.max_steps else total

        seed_everything(t.seed)
        self.raw_model = build_model(cfg.model, self.spec).to(ctx.device)
        self._fit_embedding()
        self.linear_fitted = False
        """The model started from the closed-form linear fit (and keeps it as its anchor)."""
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
        self.state = LoopState(
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
        self.telemetry = Telemetry(
            enabled=ctx.is_main,
            job=ctx.run_id,
            total_steps=self.total_steps,
            history_uri=cfg.output.history_uri,
            metrics_stdout=cfg.train.metrics_stdout,
            sink=self._metrics_endpoint(cfg, ctx),
        )
        self.best = BestWeights(ctx)
        self.checkpointed = self._run_state(config_hash(cfg))
        self.last_checkpoint: str | None = None
        self.last_grad_norm: torch.Tensor | None = None

    @staticmethod
    def _metrics_endpoint(cfg: WorkerConfig, ctx: DistContext) -> TrainingMetrics | None:
        """Each node's first process serves ``/metrics`` when ``metrics.port`` is set."""
        if not cfg.metrics.port or ctx.local_rank != 0:
            return None
        seq = cfg.data.seq_len if cfg.data.kind == "tokens" else None
        return TrainingMetrics(cfg.metrics, ctx, tokens_per_sample=seq).start()

    def _run_state(self, cfg_hash: str) -> RunState:
        """Every piece of this run's state that a checkpoint holds, by its key in ``state.pt``,
        in the order a restore loads them (see :mod:`trainer.training.state`)."""
        pieces: dict[str, Stateful] = {META: self.state}
        if not self.sharded:  # under FSDP every rank writes its shards through DCP instead
            pieces |= {"model": self.raw_model, "optimizer": self.optimizer}
        pieces |= {
            "scheduler": self.scheduler,
            "scaler": OptionalPiece(self.scaler),
            "data": self.data,
            "best_model": self.best,
            "rng": RngState(self.ctx, seed=self.cfg.train.seed, loop=self.state),
        }
        return RunState(
            pieces,
            identity={
                "world_size": self.ctx.world_size,
                "config_hash": cfg_hash,
                "strategy": self.strategy,
            },
            shards=(self.raw_model, self.optimizer) if self.sharded else None,
        )

    @property
    def stream(self) -> BatchStream:
        """The training batches from the position of the last step taken (or restored)."""
        return self.data.stream

    def _fit_embedding(self) -> None:
        """``model.embedding: periodic+ple``: cut the piecewise-linear bins at quantiles of the
        training rows (every rank the same rows, like :meth:`_start_linear`; streamed data keeps
        the evenly spaced bins)."""
        model = self.raw_model
        if not isinstance(model, TabularMLP) or self.cfg.model.embedding != "periodic+ple":
            return
        if not isinstance(self.train_ds, TabularDataset):
            log.info("piecewise-linear bins not fitted: the training data is streamed")
            return
        if model.fit_embedding(self.train_ds.features):
            log.info("piecewise-linear bins cut at quantiles of %d rows", len(self.train_ds))

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
            self.linear_fitted = True
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

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> None:
        """Write a checkpoint of this step (every rank calls it)."""
        if self.ckpt is None:
            return
        uri = self.checkpointed.save(self.ckpt, self.ctx, self.state.step)
        if self.ctx.is_main:
            self.last_checkpoint = uri
            self.telemetry.emit("checkpoint", step=self.state.step, uri=uri)
            self.telemetry.flush()

    def restore_latest(self, *, reason: str) -> int | None:
        """Load the newest complete checkpoint on every rank; return its step or None.

        Raises:
            ValueError: The checkpoint was written under the other ``train.strategy``.
        """
        if self.ckpt is None:
            return None
        step = self.checkpointed.restore(self.ckpt, self.ctx)
        if step is None:
            return None
        s = self.state
        # A checkpoint of fewer processes may carry a micro-batch larger than this run's share.
        s.micro_batch_size = min(s.micro_batch_size, self.local_batch)
        self.telemetry.emit("restore", step=s.step, reason=reason, epoch=self.data.position.epoch)
        return step

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

    def scaled_target(self, y: torch.Tensor) -> torch.Tensor:
        """The regression target as the model learns it (``data.target_scale``); else ``y``."""
        if self.cfg.data.target_scale is None:
            return y
        return (y - self.target_mean) / self.target_std


def training_batches(
    run: Run,
) -> Prefetcher[DataPosition] | Generator[tuple[DataPosition, torch.Tensor, torch.Tensor]]:
    """The training batches from ``run.stream``'s position: prefetched unless switched off."""
    if run.cfg.train.prefetch:
        return Prefetcher(iter(run.stream), device=run.ctx.device)
    return (batch for batch in run.stream)  # a generator: closable like the prefetcher
