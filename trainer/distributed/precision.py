"""Mixed precision: pick fp32, bf16 or fp16 for a device, and set the matmul backends."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

_NAMES = ("auto", "fp32", "bf16", "fp16")
_DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class Precision:
    """A resolved precision policy: what autocast runs in, and whether gradients need scaling."""

    name: str
    """``fp32``, ``bf16`` or ``fp16`` (never ``auto``)."""
    autocast_dtype: torch.dtype | None
    """The autocast dtype; ``None`` for plain fp32."""
    device_type: str
    """``cuda`` or ``cpu``: the autocast device type."""

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """A context for the forward pass and loss: autocast, or nothing for fp32."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        """A gradient scaler for fp16 (whose small range underflows gradients), else ``None``.

        bf16 has fp32's exponent range and needs no scaling.
        """
        if self.name != "fp16":
            return None
        return torch.amp.GradScaler(self.device_type, enabled=True)


def _capability(device: torch.device) -> tuple[str, str]:
    """The CUDA device's name and compute capability as text (``"Tesla V100", "7.0"``)."""
    major, minor = torch.cuda.get_device_capability(device)
    return torch.cuda.get_device_name(device), f"{major}.{minor}"


def resolve_precision(name: str, device: torch.device) -> Precision:
    """Turn ``train.precision`` into a concrete policy for ``device``.

    ``auto`` is bf16 on CUDA devices with native bfloat16 (compute capability >= 8.0) and fp32
    everywhere else, including the CPU: CPU autocast slows training down more often than not.
    An explicit ``bf16`` on the CPU is allowed (CPU autocast to bfloat16: useful for tests and
    for CPUs with AMX/AVX512-BF16). ``fp16`` needs CUDA, because its gradient scaler does.

    Args:
        name: ``auto``, ``fp32``, ``bf16`` or ``fp16``.
        device: The device the model trains on.

    Returns:
        The resolved precision.

    Raises:
        ValueError: On an unknown name, a CUDA device that is not available, bf16 on a GPU
            without native bfloat16, or fp16 off CUDA.
    """
    if name not in _NAMES:
        raise ValueError(f"train.precision must be one of {list(_NAMES)}, got {name!r}")
    on_cuda = device.type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        raise ValueError(f"train.precision {name!r}: device {device} is not available")
    # including_emulation=False: a V100 or T4 "supports" bf16 only by emulation, far slower.
    bf16_native = on_cuda and torch.cuda.is_bf16_supported(including_emulation=False)
    if name == "auto":
        name = "bf16" if bf16_native else "fp32"
    elif name == "bf16" and on_cuda and not bf16_native:
        gpu, cc = _capability(device)
        raise ValueError(
            "train.precision 'bf16' needs a GPU with bfloat16 support "
            f"(compute capability >= 8.0); {gpu} has {cc}"
        )
    elif name == "fp16" and not on_cuda:
        raise ValueError(
            f"train.precision 'fp16' needs a CUDA device (fp16 autocast and its gradient scaler "
            f"run on GPUs), got device {device}; use 'bf16' or 'fp32'"
        )
    return Precision(name=name, autocast_dtype=_DTYPES[name], device_type=device.type)


def configure_backends(device: torch.device, *, tf32: bool) -> None:
    """Allow (or forbid) TF32 tensor cores for fp32 matmuls and convolutions on CUDA.

    TF32 keeps fp32's range with a 10-bit mantissa and runs fp32 matmuls several times faster on
    Ampere and newer. This uses the per-backend ``fp32_precision`` settings of PyTorch >= 2.9
    (the project pins >= 2.10): PyTorch refuses to mix them with the legacy ``allow_tf32`` flags
    and ``set_float32_matmul_precision``, so neither is touched. On the CPU this does nothing.

    Args:
        device: The training device.
        tf32: ``train.tf32``.
    """
    if device.type != "cuda":
        return
    mode = "tf32" if tf32 else "ieee"
    torch.backends.cuda.matmul.fp32_precision = mode
    torch.backends.cudnn.conv.fp32_precision = mode  # type: ignore[attr-defined]
