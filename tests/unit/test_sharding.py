"""Sharding and sharded checkpoints: the strategy decision, shard units, FSDP2 in one process.

The FSDP parts run in a real one-rank gloo process group in this process (FSDP2 runs on CPU
with gloo in torch 2.13); the multi-rank behaviour is in tests/integration/test_fsdp.py.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as tdist
from torch import nn

from trainer.base.errors import InputError
from trainer.checkpoint import dcp
from trainer.checkpoint.files import MARKER_FILE, CorruptCheckpointError, file_entry
from trainer.checkpoint.manager import CheckpointManager
from trainer.config import ModelConfig, TrainConfig
from trainer.distributed import dist, sharding
from trainer.distributed.precision import resolve_precision
from trainer.models import ModelSpec, build_model

GIB = 2**30


@pytest.mark.parametrize(
    ("requested", "device", "world", "params", "memory", "expected", "reason"),
    [
        ("ddp", "cuda", 8, 10**10, 80 * GIB, "ddp", "train.strategy is 'ddp'"),
        ("fsdp", "cpu", 2, 10, None, "fsdp", "train.strategy is 'fsdp'"),
        ("auto", "cpu", 2, 10**10, None, "ddp", "auto on a cpu device: ddp unless 'fsdp'"),
        # 124M params: 1.9 GiB of state, far below a fifth of 80 GiB
        ("auto", "cuda", 8, 124 * 10**6, 80 * GIB, "ddp", "fits one device's 16.0 GiB budget"),
        ("auto", "cuda", 8, 10**9, 80 * GIB, "ddp", "14.9 GiB of parameter"),
        # 1.3B: 19.4 GiB of state; measured to need the OOM fallback on an 80 GB H100
        ("auto", "cuda", 8, 1_300_000_000, 80 * GIB, "fsdp", "over 8 ranks (2.4 GiB each)"),
        ("auto", "cuda", 8, 7 * 10**9, 80 * GIB, "fsdp", "sharding over 8 ranks (13.0 GiB each)"),
        # the edge: exactly the budget (a fifth of 5 GiB) still fits, one parameter more does not
        ("auto", "cuda", 2, GIB // 16, 5 * GIB, "ddp", "1.0 GiB of parameter"),
        ("auto", "cuda", 2, GIB // 16 + 1, 5 * GIB, "fsdp", "exceeds one device's 1.0 GiB"),
        ("auto", "cuda", 1, 7 * 10**9, 80 * GIB, "ddp", "one process has no peers to shard"),
    ],
    ids=["ddp", "fsdp-cpu", "auto-cpu", "124m", "1b", "1.3b", "7b", "edge", "edge+1", "7b-1gpu"],
)
def test_choose_strategy(
    requested: str,
    device: str,
    world: int,
    params: int,
    memory: int | None,
    expected: str,
    reason: str,
) -> None:
    choice = sharding.choose_strategy(
        requested,
        device_type=device,
        world_size=world,
        param_count=params,
        device_memory_bytes=memory,
    )
    assert choice.strategy == expected
    assert reason in choice.reason


def test_choose_strategy_rejects_an_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"train\.strategy must be one of .* got 'zero'"):
        sharding.choose_strategy(
            "zero", device_type="cuda", world_size=2, param_count=1, device_memory_bytes=1
        )


def test_cpu_offload_needs_fsdp_or_auto() -> None:
    with pytest.raises(InputError, match=r"train\.fsdp_cpu_offload needs train\.strategy"):
        TrainConfig(strategy="ddp", fsdp_cpu_offload=True)
    assert TrainConfig(strategy="auto", fsdp_cpu_offload=True).fsdp_cpu_offload


class _Declared(nn.Module):
    _shard_modules = (nn.Linear, "GELU")

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2))


def gpt() -> nn.Module:
    cfg = ModelConfig(name="gpt", n_layer=3, n_head=2, d_model=16, vocab_size=32)
    return build_model(cfg, ModelSpec(task="lm", seq_len=8))


def mlp() -> nn.Module:
    return build_model(
        ModelConfig(), ModelSpec(task="classification", in_features=4, num_classes=3)
    )


def test_shard_units_found_without_knowing_the_model() -> None:
    model = gpt()
    assert sharding.shard_units(model) == list(model.blocks)  # type: ignore[arg-type]
    assert sharding.shard_units(mlp()) == []  # no blocks: the root only
    declared = _Declared()
    assert [type(m).__name__ for m in sharding.shard_units(declared)] == [
        "Linear",
        "GELU",
        "Linear",
    ]


def test_mixed_precision_policy_follows_the_precision() -> None:
    bf16 = sharding.mixed_precision(resolve_precision("bf16", torch.device("cpu")))
    assert bf16.param_dtype == torch.bfloat16 and bf16.reduce_dtype == torch.float32
    fp32 = sharding.mixed_precision(resolve_precision("fp32", torch.device("cpu")))
    assert fp32.param_dtype is None and fp32.reduce_dtype is None


# ---------------------------------------------------------------- FSDP2 in a one-rank group


@pytest.fixture
def group(tmp_path: Path) -> Iterator[dist.DistContext]:
    """A real one-rank gloo process group; the context says distributed, as under torchrun."""
    store = tdist.FileStore(str(tmp_path / "store"), 1)
    tdist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.DistContext(
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            node_rank=0,
            device=torch.device("cpu"),
            backend="gloo",
        )
    finally:
        tdist.destroy_process_group()


def shard(model: nn.Module) -> nn.Module:
    return sharding.apply_fsdp(
        model,
        precision=resolve_precision("fp32", torch.device("cpu")),
        cpu_offload=False,
        compile_units=False,
    )


def test_full_state_of_a_sharded_gpt_keeps_tied_weights_once(group: dist.DistContext) -> None:
    torch.manual_seed(0)
    plain = gpt()
    expected = {k: v.clone() for k, v in plain.state_dict().items()}
    torch.manual_seed(0)
    model = shard(gpt())
    assert sharding.is_sharded(model) and all(sharding.is_sharded(b) for b in model.blocks)
    full = sharding.full_state(model, is_main=True)
    assert full.keys() == expected.keys()
    assert full["lm_head.weight"] is full["wte.weight"]  # the exporter stores it once
    for k, v in expected.items():
        torch.testing.assert_close(full[k], v, msg=k)

    other = shard(gpt())  # different init (the generator moved on)
    sharding.load_full_state(other, full)
    for k, v in sharding.full_state(other, is_main=True).items():
        torch.testing.assert_close(v, expected[k], msg=k)


def test_a_cpu_model_is_sharded_on_the_cpu_where_a_gpu_is_visible(
    group: dist.DistContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FSDP2's default mesh is CUDA's whenever CUDA is available: on an H100 machine the CPU
    # ranks of benchmarks/fsdp_memory.py found their shards on cuda:0. The mesh must follow the
    # model's device. Here the accelerator FSDP would default to is faked (its default mesh
    # fails to reach the GPU this machine lacks).
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    model = shard(gpt())
    params = list(model.parameters())
    assert params and all(p.device.type == "cpu" for p in params)
    assert {p.device_mesh.device_type for p in params} == {"cpu"}  # type: ignore[attr-defined]


def train_a_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    idx = torch.arange(16).remainder(32).view(2, 8)
    model(idx).float().square().mean().backward()
    opt.step()
    opt.zero_grad()


def test_sharded_checkpoint_round_trips_model_and_optimizer(
    group: dist.DistContext, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = shard(gpt())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mgr = CheckpointManager(str(tmp_path / "ckpt"))
    # Before any step the optimizer is left out, and stays untouched (no zero-gradient step).
    dcp.save_sharded(mgr, group, 0, model=model, optimizer=opt, state={"meta": {}})
    assert not opt.state
    train_a_step(model, opt)
    uri = dcp.save_sharded(mgr, group, 1, model=model, optimizer=opt, state={"meta": {"x": 1}})
    assert uri is not None and uri.endswith("step-00000001")
    saved = sharding.full_state(model, is_main=True)
    marker = json.loads((Path(uri) / MARKER_FILE).read_text())
    assert {".metadata", "__0_0.distcp", "state.pt"} <= set(marker["files"])

    train_a_step(model, opt)  # move away, then come back
    step, payload = mgr.load_latest() or (None, {})
    assert step == 1 and payload["sharded_optimizer"] is True and payload["meta"] == {"x": 1}
    dcp.load_sharded(mgr, group, 1, payload, model=model, optimizer=opt)
    for k, v in sharding.full_state(model, is_main=True).items():
        torch.testing.assert_close(v, saved[k], msg=k)
    steps = {int(s["step"]) for s in opt.state_dict()["state"].values()}
    assert steps == {1}

    dcp.load_sharded(mgr, group, 0, mgr.load(0), model=model, optimizer=opt)
    assert not opt.state  # step 0's optimizer had not stepped: cleared again
    plain = dcp.read_model_state(str(tmp_path / "ckpt" / "step-00000001"), gpt())
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(v, saved[k], msg=k)


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("this ran",))


def test_dcp_metadata_naming_a_foreign_global_is_refused(
    group: dist.DistContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = shard(gpt())
    opt = torch.optim.AdamW(model.parameters())
    mgr = CheckpointManager(str(tmp_path / "ckpt"))
    uri = dcp.save_sharded(mgr, group, 3, model=model, optimizer=opt, state={"meta": {}})
    assert uri is not None
    meta_file = Path(uri) / ".metadata"
    meta_file.write_bytes(pickle.dumps(_Boom()))
    # Even with a marker that vouches for the altered file, nothing in it runs.
    marker_path = Path(uri) / MARKER_FILE
    marker = json.loads(marker_path.read_text())
    marker["files"][".metadata"] = file_entry(str(meta_file))
    marker_path.write_text(json.dumps(marker))
    with pytest.raises(CorruptCheckpointError, match=r"refused global builtins\.print") as info:
        dcp.load_sharded(mgr, group, 3, mgr.load(3), model=model, optimizer=opt)
    assert info.value.uri == uri and str(info.value).count("\n") == 0
    assert "this ran" not in capsys.readouterr().out
