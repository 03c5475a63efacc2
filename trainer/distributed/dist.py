"""The one place that reads torchrun's environment and owns the process group.

Everything else gets a frozen :class:`DistContext` and the small collective helpers below, so
there is no ``os.environ["RANK"]`` and no scattered ``if rank == 0`` elsewhere in the package.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

log = logging.getLogger(__name__)

# Control decisions (OOM, stop) travel over a CPU group: agreeing on them never syncs the GPU.
_control_group: Any = None
# Set when ensure_group() started a one-process group, so that close() ends it.
_own_single_group = False


@dataclass(frozen=True, slots=True)
class DistContext:
    """Who this process is in the job and which device it drives."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str | None
    """``nccl`` or ``gloo`` when a process group is up; ``None`` for a single process."""
    run_id: str = "local"
    """torchrun's run id (the PyTorchJob name on a cluster); tags every log line."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, models and log lines."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None


def _env_int(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def read_env(env: dict[str, str] | None = None) -> dict[str, int]:
    """Rank layout from torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` ...).

    A PyTorchJob pod started *without* torchrun has ``RANK`` set to the node index and
    ``WORLD_SIZE`` to the process count, which would silently mis-shard the data; that case is
    refused with an explanation.

    Raises:
        ValueError: inconsistent or non-integer variables, or a PyTorchJob pod without torchrun.
    """
    env = dict(os.environ if env is None else env)
    under_torchrun = "LOCAL_RANK" in env and "TORCHELASTIC_RUN_ID" in env
    if "PET_NNODES" in env and not under_torchrun:
        raise ValueError(
            "PET_NNODES is set but torchrun's LOCAL_RANK/TORCHELASTIC_RUN_ID are not: a "
            "PyTorchJob pod must run "
            "`python -m torch.distributed.run ... -m trainer.worker`, not trainer.worker directly"
        )
    world = _env_int(env, "WORLD_SIZE", 1)
    rank = _env_int(env, "RANK", 0)
    local_rank = _env_int(env, "LOCAL_RANK", 0)
    local_world = _env_int(env, "LOCAL_WORLD_SIZE", 1 if world == 1 else world)
    node_rank = _env_int(env, "GROUP_RANK", _env_int(env, "PET_NODE_RANK", 0))
    if world < 1 or not 0 <= rank < world or not 0 <= local_rank < max(local_world, 1):
        raise ValueError(
            f"inconsistent rank layout: RANK={rank} LOCAL_RANK={local_rank} WORLD_SIZE={world} "
            f"LOCAL_WORLD_SIZE={local_world}"
        )
    if world > 1 and "MASTER_ADDR" not in env:
        raise ValueError(f"WORLD_SIZE={world} but MASTER_ADDR is not set: start with torchrun")
    return {
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world,
        "local_world_size": local_world,
        "node_rank": node_rank,
    }


def run_id(env: dict[str, str] | None = None) -> str:
    """torchrun's ``TORCHELASTIC_RUN_ID`` (``none`` under --standalone), else ``local``."""
    env = dict(os.environ if env is None else env)
    rid = env.get("TORCHELASTIC_RUN_ID", "")
    return rid if rid and rid != "none" else env.get("GPUPIPE_JOB", "local")


def restart_count(env: dict[str, str] | None = None) -> int:
    """How many times torchrun restarted this node's workers (``TORCHELASTIC_RESTART_COUNT``)."""
    env = dict(os.environ if env is None else env)
    return max(_env_int(env, "TORCHELASTIC_RESTART_COUNT", 0), 0)


GPUS_ENV = "GPUPIPE_GPUS_PER_NODE"
"""The GPUs the pod holds (its GPU limit): trainer.launch.jobspec.GPUS_ENV, which the launchers
set in the job's pods (the downward API exposes no extended resource)."""
ALLOW_NO_CUDA_ENV = "GPUPIPE_ALLOW_NO_CUDA"
"""``1``: a pod holding GPUs trains on the CPU when torch finds no CUDA device (the test
cluster's GPU nodes, whose GPUs are a device plugin's alone); anything else refuses to."""


def check_gpus_found(env: dict[str, str] | None = None) -> None:
    """Refuse to train on the CPU in a pod that holds GPUs.

    Raises:
        InputError: ``E_NO_CUDA``, the pod's limit and what torch found, unless
            ``GPUPIPE_ALLOW_NO_CUDA=1``.
    """
    env = dict(os.environ if env is None else env)
    held = _env_int(env, GPUS_ENV, 0)
    if held <= 0 or torch.cuda.is_available():
        return
    if env.get(ALLOW_NO_CUDA_ENV) == "1":
        log.warning(
            "this pod holds %d GPU(s) but torch finds no CUDA device: training on the CPU, "
            "as %s=1 allows",
            held,
            ALLOW_NO_CUDA_ENV,
        )
        return
    from trainer.base.errors import InputError

    visible = env.get("NVIDIA_VISIBLE_DEVICES", "unset")
    raise InputError(
        "E_NO_CUDA",
        f"this pod holds {held} GPU(s) but torch {torch.__version__} finds no CUDA device "
        f"(NVIDIA_VISIBLE_DEVICES={visible}): a CPU-only image or a node without its GPU "
        f"driver; it would train on the CPU unnoticed (set {ALLOW_NO_CUDA_ENV}=1 in the job's "
        "env, job_env, to allow that)",
        f"{GPUS_ENV}={held}",
    )


def init(backend: str = "auto", timeout_s: int = 1800) -> DistContext:
    """Pick the device, start the process group (if more than one process) and quiet non-main ranks.

    Args:
        backend: ``auto`` (NCCL with CUDA, gloo without), ``nccl`` or ``gloo``.
        timeout_s: collective timeout, so a dead peer fails the job instead of hanging it.

    Returns:
        The frozen context handed to the rest of the trainer.

    Raises:
        ValueError: bad environment, NCCL asked for without CUDA, or a pod that holds GPUs
            finds none (:func:`check_gpus_found`).
    """
    layout = read_env()
    check_gpus_found()
    if torch.cuda.is_available():
        device = torch.device("cuda", layout["local_rank"] % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    chosen: str | None = None
    if layout["world_size"] > 1:
        chosen = ("nccl" if device.type == "cuda" else "gloo") if backend == "auto" else backend
        if chosen == "nccl" and device.type != "cuda":
            raise ValueError("dist.backend is 'nccl' but no CUDA device is visible")
        if not tdist.is_initialized():
            kwargs: dict[str, Any] = {
                "backend": chosen,
                "timeout": datetime.timedelta(seconds=timeout_s),
            }
            if chosen == "nccl":
                kwargs["device_id"] = device
            tdist.init_process_group(**kwargs)
        global _control_group
        _control_group = tdist.new_group(backend="gloo") if chosen == "nccl" else None
    ctx = DistContext(device=device, backend=chosen, run_id=run_id(), **layout)
    _quiet_non_main(ctx)
    return ctx


# What a rank sees when another process of the job dies (kill -9 of a rank or of its whole node,
# observed with gloo on CPU, torch 2.13): a plain RuntimeError from the next collective, e.g.
# "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:29843" or
# "[.../pair.cc:537] Read error [127.0.0.1]:22177: Connection reset by peer". The store and the
# rendezvous raise DistNetworkError / DistStoreError (a subclass of RuntimeError); NCCL raises
# DistBackendError with the texts below. A message is only trusted from a RuntimeError: an
# OSError from user code (an HTTP download, say) is not the job losing a member. A peer can also
# vanish inside the rendezvous: a force-deleted pod's container still runs for a moment, joins the
# restarted master's round, and is gone when gloo connects its mesh ("Gloo connectFullMesh failed
# with [...pair.cc:152] timed out connecting: SO_ERROR: No route to host", CI a504495): retryable.
_PEER_LOST_TYPES: tuple[type[BaseException], ...] = (tdist.DistNetworkError, tdist.DistStoreError)
_PEER_LOST_TEXT = re.compile(
    r"connection (closed|reset) by peer|broken pipe|connection refused"
    r"|timed out waiting .* for (recv|send)|socket timeout|failed to recv"
    r"|remote process exited or there was a network error"
    r"|no route to host|host is unreachable|network is unreachable|timed out connecting"
    r"|communicator was aborted|watchdog caught collective operation timeout"
    r"|rendezvous(closed|timeout|connection)error|rendezvous is closed",
    re.IGNORECASE,
)


def peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means another process of the job (or the store) went away.

    A lost peer is not this rank's fault and the rerun resumes from the last checkpoint, so the
    worker exits with the retryable :data:`trainer.base.errors.EXIT_PEER_LOST` instead of 1. The
    explicit cause chain (``raise ... from e``) is followed, so a wrapped collective error counts.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _PEER_LOST_TYPES):
            return True
        if isinstance(current, RuntimeError) and _PEER_LOST_TEXT.search(str(current)):
            return True
        current = current.__cause__
    return False


def _quiet_non_main(ctx: DistContext) -> None:
    """Only rank 0 logs at INFO; other ranks keep warnings and errors (prefixed with the rank)."""
    level = logging.INFO if ctx.is_main else logging.WARNING
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s [rank{ctx.rank}] %(levelname)s %(name)s: %(message)s")
        )
        root.addHandler(handler)
    root.setLevel(level)


def ensure_group(ctx: DistContext) -> None:
    """Start a one-process group where a single process needs one (FSDP shards over a group).

    The context keeps saying "not distributed", so the trainer's collectives stay no-ops; only
    code that asks torch.distributed for its default group (``fully_shard``, DCP) sees it. The
    store lives in memory: there is no peer to rendezvous with.
    """
    global _own_single_group
    if tdist.is_initialized():
        return
    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"device_id": ctx.device} if backend == "nccl" else {}
    tdist.init_process_group(backend, store=tdist.HashStore(), rank=0, world_size=1, **kwargs)
    _own_single_group = True


def close(ctx: DistContext) -> None:
    """Tear the process group down (safe to call twice or after a failure)."""
    global _control_group, _own_single_group
    if (ctx.is_distributed or _own_single_group) and tdist.is_initialized():
        tdist.destroy_process_group()
    _control_group = None
    _own_single_group = False


def control_any(ctx: DistContext, *flags: bool) -> tuple[bool, ...]:
    """Element-wise "any rank says so" for host-side flags, over the CPU control group.

    Every rank must call this the same number of times; it is the one rendezvous per step that
    lets a rank that hit an OOM (or saw SIGTERM) tell the others before any gradient collective.
    """
    if not ctx.is_distributed:
        return tuple(flags)
    t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=_control_group)
    return tuple(bool(v) for v in t.tolist())


def control_barrier(ctx: DistContext) -> None:
    """Barrier over the CPU control group (waits for rank 0's checkpoint write, for instance)."""
    if ctx.is_distributed:
        tdist.barrier(group=_control_group)


FINAL_BARRIER_S = 60
"""How long rank 0 waits at the end for ranks that have nothing left to do but arrive."""


def final_barrier(ctx: DistContext, timeout_s: float = FINAL_BARRIER_S) -> str | None:
    """The job's last rendezvous, after rank 0 has written the model; why it failed, or None.

    The other ranks wait here for rank 0 (for as long as the collective timeout allows: the
    model write may be long). Rank 0 comes last, so it waits only ``timeout_s`` for them: a
    peer lost now (its pod deleted, its node gone) cannot change the written model, and must
    not hold a finished job for the whole collective timeout. Rank 0 then gets the reason back
    (the ranks that did not arrive) instead of an error; the other ranks raise as any
    collective does.
    """
    if not ctx.is_distributed:
        return None
    if not ctx.is_main:
        tdist.monitored_barrier(group=_control_group)
        return None
    try:
        tdist.monitored_barrier(group=_control_group, timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:
        return " ".join(str(e).split())
    return None


def all_reduce_sum(ctx: DistContext, t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place and return it (no-op for one process)."""
    if ctx.is_distributed:
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def all_gather_object(ctx: DistContext, obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (picklable objects; used for small metadata only)."""
    if not ctx.is_distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    tdist.all_gather_object(out, obj)
    return out


def broadcast_object(ctx: DistContext, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not ctx.is_distributed:
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def gather_object(ctx: DistContext, obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0, in rank order; None on the other ranks."""
    if not ctx.is_distributed:
        return [obj]
    out: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    tdist.gather_object(obj, out, dst=0)
    return out


def scatter_object(ctx: DistContext, objs: list[Any] | None) -> Any:
    """Item ``rank`` of rank 0's ``objs`` (one per rank; ignored elsewhere) on each rank."""
    if not ctx.is_distributed:
        assert objs is not None
        return objs[0]
    box: list[Any] = [None]
    tdist.scatter_object_list(box, objs if ctx.is_main else None, src=0)
    return box[0]


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op for one process)."""
    if ctx.is_distributed:
        tdist.barrier()
