"""Seeding and the random states of a process: what makes a resumed run draw the same numbers.

:func:`seed_everything` seeds Python, NumPy and torch before the model is built;
:func:`capture_rng_state` and :func:`restore_rng_state` carry every generator's state through a
checkpoint (as plain values, so ``torch.load(weights_only=True)`` accepts them).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng_state() -> dict[str, Any]:
    """Capture the Python, NumPy, torch CPU and torch CUDA random states of this process.

    The result holds only lists, ints, floats, str, None and tensors, so it survives
    ``torch.load(weights_only=True)``; NumPy's key array becomes an int64 tensor.

    Returns:
        A dict for ``restore_rng_state``. ``"cuda"`` holds one state per visible device (empty
        without CUDA).
    """
    version, internal, gauss_next = random.getstate()
    algorithm, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "algorithm": str(algorithm),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore random states captured by ``capture_rng_state`` (possibly after a save and load).

    CUDA states are restored for the devices present in both; a mismatch in device count is logged
    as a WARNING, since the CUDA streams of the missing devices cannot match the original run.

    Args:
        state: A dict from ``capture_rng_state``.

    Raises:
        ValueError: If ``state`` lacks a part or has one of the wrong shape.
    """
    try:
        py, npy = state["python"], state["numpy"]
        random.setstate(
            (int(py["version"]), tuple(int(x) for x in py["internal"]), py["gauss_next"])
        )
        keys = np.asarray(npy["keys"].cpu().numpy(), dtype=np.uint32)
        np.random.set_state(
            (
                str(npy["algorithm"]),
                keys,
                int(npy["pos"]),
                int(npy["has_gauss"]),
                float(npy["cached_gaussian"]),
            )
        )
        torch.set_rng_state(state["torch"].cpu())
        cuda_states = list(state.get("cuda", []))
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"rng state is malformed: {type(e).__name__}: {e}") from e

    if not cuda_states:
        return
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices != len(cuda_states):
        logger.warning(
            "rng state has CUDA states for %d devices, this process sees %d; restoring %d",
            len(cuda_states),
            devices,
            min(devices, len(cuda_states)),
        )
    for index, cuda_state in enumerate(cuda_states[:devices]):
        torch.cuda.set_rng_state(cuda_state.cpu(), index)
