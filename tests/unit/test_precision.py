"""Tests for resolving train.precision per device, autocast and the TF32 backend switches."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from trainer.config import ModelConfig
from trainer.distributed.precision import Precision, configure_backends, resolve_precision
from trainer.models import ModelSpec, build_model

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
V100 = ("Tesla V100-SXM2-16GB", (7, 0))


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    """Make the CUDA queries answer as if ``gpu`` (name, capability) were installed."""

    def install(gpu: tuple[str, tuple[int, int]] | None) -> None:
        name, cc = gpu or ("", (0, 0))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu is not None)
        monkeypatch.setattr(
            torch.cuda,
            "is_bf16_supported",
            # Like the real one: with emulation allowed, older GPUs answer True too.
            lambda including_emulation=True: (
                gpu is not None and (cc >= (8, 0) or including_emulation)
            ),
        )
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)

    return install


@pytest.mark.parametrize(
    ("name", "device", "gpu", "expected"),
    [
        ("auto", CPU, None, ("fp32", None)),
        ("auto", CPU, H100, ("fp32", None)),
        ("auto", CUDA, H100, ("bf16", torch.bfloat16)),
        ("auto", CUDA, V100, ("fp32", None)),
        ("fp32", CUDA, H100, ("fp32", None)),
        ("fp32", CPU, None, ("fp32", None)),
        ("bf16", CUDA, H100, ("bf16", torch.bfloat16)),
        ("bf16", CPU, None, ("bf16", torch.bfloat16)),
        ("fp16", CUDA, H100, ("fp16", torch.float16)),
        ("fp16", CUDA, V100, ("fp16", torch.float16)),
    ],
    ids=[
        "auto-cpu",
        "auto-cpu-with-gpu-present",
        "auto-ampere+",
        "auto-pre-ampere",
        "fp32-cuda",
        "fp32-cpu",
        "bf16-ampere+",
        "bf16-cpu-autocast",
        "fp16-ampere+",
        "fp16-pre-ampere",
    ],
)
def test_resolve_precision(fake_gpu, name, device, gpu, expected) -> None:
    fake_gpu(gpu)
    precision = resolve_precision(name, device)
    assert (precision.name, precision.autocast_dtype) == expected
    assert precision.device_type == device.type


@pytest.mark.parametrize(
    ("name", "device", "gpu", "message"),
    [
        (
            "bf16",
            CUDA,
            V100,
            r"train.precision 'bf16' needs a GPU with bfloat16 support \(compute capability "
            r">= 8.0\); Tesla V100-SXM2-16GB has 7.0",
        ),
        ("fp16", CPU, None, r"train.precision 'fp16' needs a CUDA device"),
        ("fp16", CPU, H100, r"train.precision 'fp16' needs a CUDA device"),
        ("auto", CUDA, None, r"train.precision 'auto': device cuda:0 is not available"),
        ("fp8", CPU, None, r"train.precision must be one of \['auto', 'fp32', 'bf16', 'fp16'\]"),
    ],
    ids=["bf16-pre-ampere", "fp16-cpu", "fp16-cpu-with-gpu-present", "cuda-missing", "unknown"],
)
def test_resolve_precision_errors(fake_gpu, name, device, gpu, message) -> None:
    fake_gpu(gpu)
    with pytest.raises(ValueError, match=message):
        resolve_precision(name, device)


@pytest.mark.parametrize(
    ("precision", "scaler"),
    [
        (Precision("fp32", None, "cuda"), False),
        (Precision("bf16", torch.bfloat16, "cuda"), False),
        (Precision("fp16", torch.float16, "cuda"), True),
    ],
    ids=["fp32", "bf16", "fp16"],
)
def test_only_fp16_gets_a_grad_scaler(fake_gpu, precision: Precision, scaler: bool) -> None:
    fake_gpu(H100)
    made = precision.make_scaler()
    assert (made is not None) == scaler
    if made is not None:
        assert isinstance(made, torch.amp.GradScaler) and made.is_enabled()


def test_fp32_autocast_is_a_no_op() -> None:
    ctx = resolve_precision("fp32", CPU).autocast()
    assert isinstance(ctx, contextlib.nullcontext)


def test_cpu_bf16_autocast_runs_the_mlp_in_bf16() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp"), ModelSpec(task="regression", in_features=4))
    x = torch.randn(8, 4)
    seen: list[torch.dtype] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, o: seen.append(o.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    with resolve_precision("bf16", CPU).autocast():
        out = model(x)
    # Every Linear layer (the members' shared body) ran in bf16; the ensemble's heads add their
    # fp32 biases, so the averaged output itself may be fp32.
    assert seen and set(seen) == {torch.bfloat16}, seen
    assert torch.isfinite(out.float()).all()
    seen.clear()
    assert model(x).dtype == torch.float32  # outside autocast again
    assert set(seen) == {torch.float32}, seen
    for h in hooks:
        h.remove()
    assert next(model.parameters()).dtype == torch.float32  # weights stay fp32


@pytest.fixture
def backend_flags(monkeypatch: pytest.MonkeyPatch) -> tuple[SimpleNamespace, SimpleNamespace]:
    """Stand-ins for the cuBLAS and cuDNN settings, so tests never change the real ones."""
    matmul = SimpleNamespace(fp32_precision="none")
    conv = SimpleNamespace(fp32_precision="none")
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends.cudnn, "conv", conv)
    return matmul, conv


def test_configure_backends_leaves_cpu_alone(backend_flags) -> None:
    configure_backends(CPU, tf32=True)
    assert [flag.fp32_precision for flag in backend_flags] == ["none", "none"]


@pytest.mark.parametrize(("tf32", "mode"), [(True, "tf32"), (False, "ieee")], ids=["on", "off"])
def test_configure_backends_sets_tf32_on_cuda(backend_flags, tf32: bool, mode: str) -> None:
    configure_backends(CUDA, tf32=tf32)
    assert [flag.fp32_precision for flag in backend_flags] == [mode, mode]
