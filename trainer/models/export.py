"""The model artifact: a directory of ``model.safetensors``, ``model.json`` and ``metrics.json``."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch import nn

from trainer.base import outputs, storage
from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict, to_dict
from trainer.base.version import __version__
from trainer.config import ModelConfig
from trainer.models.layout import FORMAT, META_FILE, METRICS_FILE, MODEL_STEP, WEIGHTS_FILE
from trainer.models.losses import unwrap_model
from trainer.models.plugins import BUILTIN_MODELS, plugin_allowed, plugin_module
from trainer.models.registry import build_model
from trainer.models.spec import ModelSpec

__all__ = [
    "FORMAT",
    "META_FILE",
    "METRICS_FILE",
    "MODEL_STEP",
    "WEIGHTS_FILE",
    "LoadedModel",
    "load_model",
    "predict",
    "save_model",
]


@dataclass
class LoadedModel:
    """A model read back from its artifact, ready for inference."""

    module: nn.Module
    """The rebuilt model with the saved weights, in eval mode."""
    meta: dict[str, Any]
    """The content of ``model.json``."""
    metrics: dict[str, Any]
    """The content of ``metrics.json`` (empty if the artifact has none)."""
    spec: ModelSpec
    """Task and shapes the model was trained for."""
    model_cfg: ModelConfig
    """The architecture it was built from."""


def _state_for_safetensors(
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """CPU copies of the state dict with tied tensors stored once.

    safetensors refuses tensors that share memory. A name whose tensor is the very same view as
    an earlier name's (a tied weight, e.g. the GPT's ``lm_head.weight`` and ``wte.weight``) is
    left out and recorded as an alias ``{name: earlier_name}``; loading puts it back, and the
    rebuilt architecture restores the tying itself.

    Returns:
        The tensors to write and the aliases.
    """
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, tensor in state.items():
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
            tensor.device,
        )
        if tensor.numel() > 0 and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        # copy=True gives every tensor its own storage (partial overlaps included).
        tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()
    return tensors, aliases


def save_model(
    uri: str,
    model: nn.Module,
    *,
    model_cfg: ModelConfig,
    spec: ModelSpec,
    features: list[str] | None,
    target: str | None,
    schema: dict[str, Any] | None,
    metrics: dict[str, float],
    extra: dict[str, Any] | None = None,
    state: dict[str, torch.Tensor] | None = None,
    target_scale: list[float] | None = None,
) -> None:
    """Write the model artifact to directory ``uri``, atomically.

    The directory is built under a temporary sibling name and renamed to ``uri`` only when every
    file is written, so a failure leaves nothing at ``uri``. ``uri`` must be absent, empty or an
    earlier model (which is replaced on success): see :func:`trainer.base.outputs.atomic_dir`. DDP
    and torch.compile wrappers are unwrapped first, so the weight names are those of the plain
    model.

    Args:
        uri: Destination directory (any storage URI).
        model: The trained model, possibly wrapped.
        model_cfg: The architecture, recorded so that loading can rebuild the model.
        spec: Task and shapes of the data.
        features: Feature columns in input order (tabular), or ``None``.
        target: Target column (tabular), or ``None``.
        schema: The preprocess step's ``schema.json`` (fitted statistics) for serving.
        metrics: Final metrics, written to ``metrics.json``.
        extra: More JSON-serialisable metadata, stored under ``"extra"`` in ``model.json``.
        state: The weights to write instead of ``model.state_dict()``: the full state an FSDP
            run gathered (names that share one tensor are stored once, as tied weights).
        target_scale: Regression: ``[mean, std]`` the model's outputs are standardised with;
            recorded as ``target_scale`` and undone by :func:`predict`.

    Raises:
        InputError: ``E_OUTPUT`` if ``uri`` holds anything but an earlier model.
    """
    tensors, aliases = _state_for_safetensors(
        unwrap_model(model).state_dict() if state is None else state
    )
    meta = {
        "format": FORMAT,
        "trainer_version": __version__,
        "model": to_dict(model_cfg),
        "spec": spec.to_dict(),
        "features": features,
        "target": target,
        "schema": schema,
        "tied": aliases,
        "target_scale": (
            {"mean": target_scale[0], "std": target_scale[1]} if target_scale else None
        ),
        "extra": extra or {},
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    # Serialise everything before touching storage: a bad value fails with nothing written.
    meta_json = json.dumps(meta, indent=2, sort_keys=True) + "\n"
    metrics_json = json.dumps({k: float(v) for k, v in metrics.items()}, indent=2, sort_keys=True)
    weights = safetensors.torch.save(tensors, metadata={"format": "pt"})
    with outputs.atomic_dir(uri, step=MODEL_STEP) as tmp:
        storage.write_bytes(storage.join(tmp, WEIGHTS_FILE), weights)
        storage.write_bytes(storage.join(tmp, METRICS_FILE), (metrics_json + "\n").encode())
        storage.write_bytes(storage.join(tmp, META_FILE), meta_json.encode())


def _read_json_file(uri: str, name: str, *, required: bool) -> Any:
    """Parse ``<uri>/<name>``; errors name the model URI."""
    try:
        return json.loads(storage.read_bytes(storage.join(uri, name)))
    except FileNotFoundError as e:
        if not required:
            return None
        raise ValueError(f"model {uri}: missing {name} (is this a gpupipe model directory?)") from e
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"model {uri}: {name} is not valid JSON ({e})") from e


def _check_plugin(uri: str, model_cfg: ModelConfig, allowed: list[str]) -> None:
    """Refuse, before any import, a plugin model that the caller did not allow."""
    module = plugin_module(model_cfg.name)
    if module is None or plugin_allowed(model_cfg.name, allowed):
        return
    listed = ", ".join(allowed) if allowed else "none"
    raise InputError(
        "E_MODEL",
        f"the model names plugin {model_cfg.name!r}, and loading it would import module "
        f"{module!r}, which is not allowed (allowed plugins: {listed}; built-in models "
        f"{', '.join(BUILTIN_MODELS)} always load): add it to the step's model_plugins "
        "only if that package is installed and trusted",
        storage.join(uri, META_FILE),
    )


def load_model(
    uri: str, *, device: str | torch.device = "cpu", allowed_plugins: Iterable[str] = ()
) -> LoadedModel:
    """Read a model artifact written by :func:`save_model`.

    Nothing in the artifact is executed: weights come from safetensors (never ``torch.load`` or
    pickle) and the architecture is rebuilt from ``model.json`` by :func:`build_model`. A
    plugin model (``package.module:func``) loads only when ``allowed_plugins`` names it, and
    is then imported from the installed environment: never from the artifact's folder nor the
    working directory (where ``python -m`` would find a ``.py`` placed next to the model).

    Args:
        uri: The model directory (any storage URI).
        device: Where to put the model.
        allowed_plugins: Plugin models that may be imported: ``package.module:func``, its
            module, or a package above it. Built-in models always load.

    Returns:
        The model in eval mode with its metadata.

    Raises:
        InputError: ``E_MODEL`` if ``model.json`` names a plugin that is not allowed.
        ValueError: If ``model.json`` is missing, not JSON or of an unknown format, the
            plugin is not installed, or the weights are unreadable or do not match the
            architecture; the message names ``uri``.
    """
    allowed = list(allowed_plugins)
    meta = _read_json_file(uri, META_FILE, required=True)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"model {uri}: {META_FILE} has format {found!r}, expected {FORMAT!r}")
    try:
        # Models saved before model.linear / model.embedding existed are plain MLPs.
        model_cfg = from_dict(
            ModelConfig, {"linear": "none", "embedding": "none", "ensemble": 1, **meta["model"]}
        )
        spec = ModelSpec.from_dict(meta["spec"])
    except KeyError as e:
        raise ValueError(f"model {uri}: {META_FILE} lacks key {e.args[0]!r}") from e
    except ValueError as e:
        raise ValueError(f"model {uri}: {META_FILE} describes an invalid model: {e}") from e
    _check_plugin(uri, model_cfg, allowed)
    scale = meta.get("target_scale")
    if scale is not None and not (
        isinstance(scale, dict)
        and all(isinstance(scale.get(k), int | float) for k in ("mean", "std"))
        and math.isfinite(scale["mean"])
        and math.isfinite(scale["std"])
        and scale["std"] > 0
    ):
        raise ValueError(f"model {uri}: {META_FILE} has a bad target_scale {scale!r}")
    metrics = _read_json_file(uri, METRICS_FILE, required=False) or {}

    weights_uri = storage.join(uri, WEIGHTS_FILE)
    try:
        tensors = safetensors.torch.load(storage.read_bytes(weights_uri))
    except FileNotFoundError as e:
        raise ValueError(f"model {uri}: missing {WEIGHTS_FILE}") from e
    except safetensors.SafetensorError as e:
        raise ValueError(f"model {uri}: {WEIGHTS_FILE} is unreadable ({e})") from e
    for alias, name in (meta.get("tied") or {}).items():
        if name in tensors:  # else strict loading below reports both names missing
            tensors[alias] = tensors[name]

    # Building draws random initial weights; keep the caller's random stream untouched.
    local = storage.local_path(uri)
    with torch.random.fork_rng(devices=[]):
        try:
            module = build_model(model_cfg, spec, untrusted_dirs=[local] if local else [])
        except ValueError as e:
            raise ValueError(f"model {uri}: {e}") from e
    try:
        module.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise ValueError(f"model {uri}: weights do not match the architecture: {e}") from e
    module.to(device).eval()
    return LoadedModel(module=module, meta=meta, metrics=metrics, spec=spec, model_cfg=model_cfg)


def predict(loaded: LoadedModel, x: torch.Tensor, batch_size: int = 8192) -> torch.Tensor:
    """Run the model over ``x`` in batches, without gradients.

    Args:
        loaded: A loaded model.
        x: Float features ``[N, F]`` (tabular) or token ids ``[N, T]`` (lm), on any device.
        batch_size: Rows per forward pass.

    Returns:
        On the CPU: class logits ``[N, K]`` (classification), predictions ``[N]``
        (regression, in the target's units: a recorded ``target_scale`` is undone) or
        next-token logits ``[N, T, V]`` (lm).

    Raises:
        ValueError: If ``batch_size`` is not positive.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size}")
    module = loaded.module.eval()
    param = next(module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    if param is not None and x.is_floating_point() and param.is_floating_point():
        x = x.to(param.dtype)  # float64 features from numpy meet float32 weights
    with torch.no_grad():
        chunks = x.split(batch_size) if x.shape[0] > 0 else (x,)
        out = torch.cat([module(chunk.to(device)).cpu() for chunk in chunks])
    if loaded.spec.task == "regression" and out.dim() == 2 and out.shape[-1] == 1:
        out = out.squeeze(-1)
    scale = loaded.meta.get("target_scale")
    if loaded.spec.task == "regression" and isinstance(scale, dict):
        out = out.double() * float(scale["std"]) + float(scale["mean"])
    return out
