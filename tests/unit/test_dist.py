"""torchrun environment parsing and the single-process DistContext with its no-op collectives."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest
import torch

from tests.helpers import TORCHRUN_VARS, dist_session
from trainer.distributed import dist

TORCHRUN_2x2 = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "23456",
    "TORCHELASTIC_RUN_ID": "job-abc",
    "PET_NNODES": "2",
    "PET_NODE_RANK": "1",
}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, dict(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0)),
        (
            TORCHRUN_2x2,
            dict(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1),
        ),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "LOCAL_RANK": "1"},
            dict(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0),
        ),
        (
            {"RANK": "", "WORLD_SIZE": ""},
            dict(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0),
        ),
        (
            {
                "WORLD_SIZE": "1",
                "PET_NODE_RANK": "0",
                "PET_NNODES": "1",
                "LOCAL_RANK": "0",
                "TORCHELASTIC_RUN_ID": "none",
            },
            dict(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0),
        ),
    ],
    ids=[
        "no-env-single-process",
        "torchrun-2-nodes-x-2",
        "plain-launcher",
        "empty-values",
        "torchrun-standalone-1",
    ],
)
def test_read_env_layout(env: dict[str, str], expected: dict[str, int]) -> None:
    assert dist.read_env(env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"PET_NNODES": "2", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "m"},
            "a PyTorchJob pod must run `python -m torch.distributed.run",
        ),
        (
            {"PET_NNODES": "1", "LOCAL_RANK": "0"},  # LOCAL_RANK alone is not torchrun
            "a PyTorchJob pod must run `python -m torch.distributed.run",
        ),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "m"}, "inconsistent rank layout: RANK=2"),
        ({"RANK": "-1", "WORLD_SIZE": "2", "MASTER_ADDR": "m"}, "inconsistent rank layout"),
        ({"WORLD_SIZE": "0"}, "inconsistent rank layout: RANK=0 LOCAL_RANK=0 WORLD_SIZE=0"),
        (
            {
                "RANK": "0",
                "LOCAL_RANK": "2",
                "WORLD_SIZE": "4",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "m",
            },
            "inconsistent rank layout: RANK=0 LOCAL_RANK=2",
        ),
        ({"RANK": "one"}, "environment variable RANK must be an integer, got 'one'"),
        ({"WORLD_SIZE": "2.0"}, "environment variable WORLD_SIZE must be an integer, got '2.0'"),
        ({"LOCAL_RANK": "x"}, "environment variable LOCAL_RANK must be an integer, got 'x'"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "WORLD_SIZE=2 but MASTER_ADDR is not set"),
    ],
    ids=[
        "pet-without-torchrun",
        "pet-with-local-rank-only",
        "rank-equals-world",
        "negative-rank",
        "zero-world",
        "local-rank-too-big",
        "rank-not-int",
        "world-float",
        "local-rank-not-int",
        "no-master-addr",
    ],
)
def test_read_env_rejects(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        dist.read_env(env)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "local"),
        ({"TORCHELASTIC_RUN_ID": "train-7f3"}, "train-7f3"),
        ({"TORCHELASTIC_RUN_ID": "none"}, "local"),  # torchrun --standalone
        ({"TORCHELASTIC_RUN_ID": "none", "GPUPIPE_JOB": "mine"}, "mine"),
        ({"TORCHELASTIC_RUN_ID": "pj-1", "GPUPIPE_JOB": "mine"}, "pj-1"),
    ],
    ids=["nothing", "torchrun-id", "standalone", "standalone-with-job", "torchrun-wins"],
)
def test_run_id(env: dict[str, str], expected: str) -> None:
    assert dist.run_id(env) == expected


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[dist.DistContext]:
    """``dist.init()`` as a plain ``python -m trainer.worker`` would see it."""
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)  # init() sets the level; put it back after
    ctx = dist.init("auto", timeout_s=5)
    yield ctx
    dist.close(ctx)


def test_init_single_process_has_no_process_group(single_process: dist.DistContext) -> None:
    ctx = single_process
    assert not torch.distributed.is_initialized()
    assert ctx.backend is None and not ctx.is_distributed
    assert ctx.is_main and ctx.rank == 0 and ctx.world_size == 1
    assert ctx.run_id == "local"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert ctx.device.type == expected
    assert logging.getLogger().level == logging.INFO
    dist.close(ctx)  # closing twice is safe
    assert not torch.distributed.is_initialized()


def test_init_reads_the_job_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUPIPE_JOB", "nightly-42")
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)
    with dist_session() as ctx:
        assert ctx.run_id == "nightly-42"


def test_init_refuses_a_pytorchjob_pod_without_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    for k, v in {"PET_NNODES": "2", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "m"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=r"torch\.distributed\.run"):
        dist.init()


def test_context_is_frozen(single_process: dist.DistContext) -> None:
    with pytest.raises(AttributeError):
        single_process.rank = 1  # type: ignore[misc]


@pytest.mark.parametrize("rank", [0, 1, 5], ids=["rank0", "rank1", "rank5"])
def test_only_rank_zero_is_main(rank: int) -> None:
    ctx = dist.DistContext(
        rank=rank,
        local_rank=0,
        world_size=8,
        local_world_size=8,
        node_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
    )
    assert ctx.is_main is (rank == 0) and ctx.is_distributed


def test_collectives_are_no_ops_for_one_process(single_process: dist.DistContext) -> None:
    ctx = single_process
    assert dist.control_any(ctx, True, False, True) == (True, False, True)
    assert dist.control_any(ctx) == ()
    t = torch.tensor([1.5, 2.0])
    out = dist.all_reduce_sum(ctx, t)
    assert out is t and out.tolist() == [1.5, 2.0]
    payload = {"step": 3, "rng": [1, 2]}
    assert dist.all_gather_object(ctx, payload) == [payload]
    assert dist.broadcast_object(ctx, payload) is payload
    dist.barrier(ctx)
    dist.control_barrier(ctx)


def _caused_by(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
    "peer [127.0.0.1]:29843. This is typically caused by a remote worker crashing."
)
GLOO_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:22177: Connection reset by peer."
)


@pytest.mark.parametrize(
    ("exc", "lost"),
    [
        # What a survivor really raised when its peer was SIGKILLed (gloo, torch 2.13).
        (RuntimeError(GLOO_CLOSED), True),
        (RuntimeError(GLOO_RESET), True),
        (torch.distributed.DistNetworkError("The client socket has timed out after 3000ms"), True),
        (torch.distributed.DistStoreError("Timed out after 901 seconds waiting for clients"), True),
        (torch.distributed.DistBackendError("NCCL communicator was aborted on rank 1."), True),
        (
            torch.distributed.DistBackendError(
                "NCCL error: remote process exited or there was a network error"
            ),
            True,
        ),
        (RuntimeError("[gloo] Timed out waiting 1800000ms for recv operation to complete"), True),
        (
            RuntimeError(
                "Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/"
                "transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: No route to host, "
                "remote=[10.123.0.18]:62350"
            ),
            True,
        ),
        (RuntimeError("[pair.cc:152] connect: SO_ERROR: Network is unreachable"), True),
        (_caused_by(RuntimeError("eval failed"), RuntimeError(GLOO_CLOSED)), True),
        # Bugs and bad input stay what they are.
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x8)"), False),
        (RuntimeError("loss is NaN after 2 rollbacks (train.max_nan_rollbacks=2)"), False),
        (torch.distributed.DistBackendError("NCCL error: invalid usage"), False),
        (ValueError("Connection reset by peer"), False),  # not from torch.distributed
        (ConnectionResetError(104, "Connection reset by peer"), False),  # user code's own I/O
        (TypeError("unsupported operand"), False),
    ],
    ids=[
        "gloo-closed-by-peer",
        "gloo-reset-by-peer",
        "store-unreachable",
        "store-timeout",
        "nccl-aborted",
        "nccl-remote-error",
        "gloo-recv-timeout",
        "gloo-mesh-peer-gone",
        "gloo-network-unreachable",
        "wrapped-collective-error",
        "shape-bug",
        "nan-give-up",
        "nccl-invalid-usage",
        "value-error-text",
        "user-connection-reset",
        "type-error",
    ],
)
def test_peer_lost_tells_a_lost_peer_from_a_bug(exc: BaseException, lost: bool) -> None:
    assert dist.peer_lost(exc) is lost
