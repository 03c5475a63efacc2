"""Data-parallel strategies: choose DDP or FSDP2, shard a model, gather it back for export.

FSDP2 (``torch.distributed.fsdp.fully_shard``) shards every parameter over the ranks as a
``DTensor``: each rank keeps 1/world of the parameters, gradients and AdamW moments, and
all-gathers a block's parameters just for its forward and backward. This module applies it per
shard unit (transformer block) and at the root, with the mixed-precision policy the run's
precision implies, and holds the few helpers the rest of the trainer needs so that nothing else
has to know about DTensors: the full (gathered) state for export and early stopping, the local
value of a clipped gradient norm, and the clean-up after an out-of-memory error.

Which modules are shard units is found without knowing the model: a model may name its unit
classes in ``_shard_modules`` (class objects or class names); otherwise the children of a
``blocks`` ``nn.ModuleList`` (the built-in GPT's transformer blocks) are the units; otherwise only
the root is sharded (every parameter is still sharded, just gathered all at once).

A limit of sharding: the forward pass itself is a sequence of collectives (one all-gather per
unit), so an out-of-memory error on *some* ranks mid-forward leaves the others waiting in the
next all-gather, where no agreement can reach them; the run then fails after
``dist.timeout_s``. The OOM fallback works when the error strikes every rank at the same point,
which is the usual case (every rank runs the same shapes); on one rank only, set
``train.micro_batch_size`` lower.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from trainer.distributed.precision import Precision

log = logging.getLogger(__name__)

STATE_BYTES_PER_PARAM = 16
"""fp32 parameter + fp32 gradient + AdamW's two fp32 moments: what one parameter costs at rest."""
ACTIVATION_MARGIN = 0.8
"""Share of device memory ``auto`` leaves for activations, the CUDA context and fragmentation.

Measured on an 80 GB H100: the 1.3B GPT's 19.4 GiB of state peaked at 83 GB with activations
and needed the OOM fallback, so the state may take a fifth of the device at most; that puts the
switch at about a billion parameters on 80 GB, the usual DDP/FSDP line."""


@dataclass(frozen=True, slots=True)
class StrategyChoice:
    """The data-parallel strategy a run uses, and why (logged at the start of a run)."""

    strategy: str
    """``ddp`` or ``fsdp``."""
    reason: str
    """One human-readable sentence."""


def choose_strategy(
    requested: str,
    *,
    device_type: str,
    world_size: int,
    param_count: int,
    device_memory_bytes: int | None,
    margin: float = ACTIVATION_MARGIN,
) -> StrategyChoice:
    """Resolve ``train.strategy`` (a pure function: sizes in, decision out).

    ``auto`` picks FSDP when the unsharded training state (:data:`STATE_BYTES_PER_PARAM` per
    parameter) exceeds ``(1 - margin)`` of one device's memory and there is more than one rank
    to shard over; DDP otherwise, and always on CPU devices, where a process has no memory wall
    of its own that sharding would move (FSDP on CPU stays available by asking for ``fsdp``).

    Args:
        requested: ``ddp``, ``fsdp`` or ``auto``.
        device_type: ``cuda`` or ``cpu``.
        world_size: Number of ranks.
        param_count: Parameters of the model.
        device_memory_bytes: Total memory of one device; ``None`` when unknown (CPU).
        margin: Share of the device kept free for activations.

    Returns:
        The choice and its reason.

    Raises:
        ValueError: An unknown ``requested`` value or a margin outside [0, 1).
    """
    if requested not in ("ddp", "fsdp", "auto"):
        raise ValueError(
            f"train.strategy must be one of ['auto', 'ddp', 'fsdp'], got {requested!r}"
        )
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    if requested != "auto":
        return StrategyChoice(requested, f"train.strategy is {requested!r}")
    need = param_count * STATE_BYTES_PER_PARAM
    gib = 2**30
    if device_type != "cuda" or device_memory_bytes is None:
        return StrategyChoice("ddp", f"auto on a {device_type} device: ddp unless 'fsdp' is set")
    budget = round(device_memory_bytes * (1 - margin))
    sizes = f"{need / gib:.1f} GiB of parameter, gradient and optimizer state"
    if need <= budget:
        return StrategyChoice(
            "ddp", f"auto: {sizes} fits one device's {budget / gib:.1f} GiB budget"
        )
    if world_size < 2:
        return StrategyChoice(
            "ddp",
            f"auto: {sizes} exceeds one device's {budget / gib:.1f} GiB budget, but one process "
            f"has no peers to shard over",
        )
    return StrategyChoice(
        "fsdp",
        f"auto: {sizes} exceeds one device's {budget / gib:.1f} GiB budget: sharding over "
        f"{world_size} ranks ({need / world_size / gib:.1f} GiB each)",
    )


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The submodules that get their own ``fully_shard`` (see the module docstring)."""
    declared: Iterable[Any] | None = getattr(model, "_shard_modules", None)
    if declared is not None:
        kinds = set(declared)
        return [
            m
            for m in model.modules()
            if m is not model and (type(m) in kinds or type(m).__name__ in kinds)
        ]
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        return list(blocks)
    return []


def mixed_precision(precision: Precision) -> MixedPrecisionPolicy:
    """Compute in the run's low precision, reduce gradients and keep the master weights in fp32."""
    dtype = precision.autocast_dtype
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def apply_fsdp(
    model: nn.Module,
    *,
    precision: Precision,
    cpu_offload: bool,
    compile_units: bool,
) -> nn.Module:
    """Shard ``model`` in place with FSDP2: each shard unit, then the root.

    Args:
        model: The model, already on its device (a process group must be up).
        precision: The run's precision; bf16/fp16 become the all-gathered parameter dtype.
        cpu_offload: Keep shards, gradients and optimizer state on the CPU (CUDA only: on a CPU
            device they are there already, and FSDP refuses the policy, so it is skipped).
        compile_units: ``torch.compile`` each unit's forward.

    Returns:
        The same module object (its class is now an ``FSDPModule`` subclass).
    """
    device_type = next(model.parameters()).device.type
    on_cuda = device_type == "cuda"
    # The mesh names the model's device: FSDP2's default mesh is CUDA's whenever a GPU is
    # visible, which moved a CPU model's shards to cuda:0 (seen on an H100 machine, torch 2.11).
    mesh = init_device_mesh(device_type, (torch.distributed.get_world_size(),))
    kwargs: dict[str, Any] = {"mp_policy": mixed_precision(precision), "mesh": mesh}
    if cpu_offload and on_cuda:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    elif cpu_offload:
        log.warning("train.fsdp_cpu_offload ignored: the model already lives in CPU memory")
    units = shard_units(model)
    for unit in units:
        if compile_units:
            # The forward only: FSDP's all-gather and reshard hooks stay eager around it, and
            # parameter names do not change (no ``_orig_mod.`` wrapper).
            unit.forward = torch.compile(unit.forward)
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    log.info(
        "FSDP: %d shard units + root, parameter dtype %s, cpu offload %s, compiled units %s",
        len(units),
        precision.name,
        "offload_policy" in kwargs,
        compile_units and bool(units),
    )
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` was sharded by :func:`apply_fsdp`."""
    return isinstance(model, FSDPModule)


@contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """FSDP's ``no_sync``: backward passes inside skip the reduce-scatter (accumulation
    micro-batches); the next one outside reduces the accumulated sum."""
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def local_value(t: torch.Tensor | None) -> torch.Tensor | None:
    """A plain tensor for a DTensor result (the clipped total norm); others unchanged."""
    if isinstance(t, DTensor):
        return t.full_tensor()
    return t


def reset_after_error(model: nn.Module) -> None:
    """Reshard every FSDP unit after a step abandoned mid-way (an agreed out-of-memory error).

    Parameters all-gathered by the failed forward stay unsharded otherwise, holding the very
    memory the retry needs.
    """
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def full_state(model: nn.Module, *, is_main: bool) -> dict[str, torch.Tensor]:
    """The whole model's state as CPU tensors on the main rank (empty elsewhere).

    A collective for a sharded model: every rank must call it. Tensors are gathered one at a
    time, so no rank holds more than one full tensor on its device; names that share a parameter
    (tied weights) share one CPU tensor, which the exporter stores once.
    """
    out: dict[str, torch.Tensor] = {}
    first_name: dict[int, str] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) in first_name:
            if is_main:
                out[name] = out[first_name[id(value)]]
            continue
        first_name[id(value)] = name
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if is_main:
            out[name] = full.detach().to("cpu", copy=True)
        del full
    return out


def load_full_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state (given on the main rank, empty elsewhere) into a sharded model.

    A collective: rank 0 broadcasts each tensor and every rank keeps its shard.
    """
    values: dict[str, Any] = dict(state)
    set_model_state_dict(
        model,
        values,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
