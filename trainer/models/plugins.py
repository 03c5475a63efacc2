"""Models from other packages (``package.module:func``): the allow-list, and an import that
never reaches the working directory or a downloaded model's folder. Torch is imported only to
check what a plugin built."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from trainer.config import ModelConfig
from trainer.models.spec import ModelSpec

if TYPE_CHECKING:
    from torch import nn

BUILTIN_MODELS = ("mlp", "gpt")
"""Model names that need no import: always loadable from an artifact."""
_PLUGIN_ENTRY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?$")

__all__ = [
    "BUILTIN_MODELS",
    "build_plugin",
    "plugin_allowed",
    "plugin_module",
    "validate_plugin_entries",
]


def plugin_module(name: str) -> str | None:
    """The module a model name imports (``pkg.mod`` of ``pkg.mod:build``); None for built-ins."""
    if name in BUILTIN_MODELS:
        return None
    return name.partition(":")[0]


def plugin_allowed(name: str, allowed: Iterable[str]) -> bool:
    """Whether the model ``name`` may be built under the allow-list ``allowed``.

    Built-in models always may. A plugin ``pkg.mod:build`` may when the list holds
    ``pkg.mod:build`` itself, its module ``pkg.mod``, or a package above it (``pkg``).
    """
    module = plugin_module(name)
    if module is None:
        return True
    return any(entry in (name, module) or module.startswith(entry + ".") for entry in allowed)


def validate_plugin_entries(entries: Sequence[str], where: str) -> None:
    """Check an allow-list of plugins: each entry ``package.module`` or ``package.module:func``.

    Raises:
        ValueError: Naming ``where`` and the first malformed entry.
    """
    if isinstance(entries, str):
        raise ValueError(f"{where} must be a list of module names, got the string {entries!r}")
    for entry in entries:
        if not isinstance(entry, str) or not _PLUGIN_ENTRY.match(entry):
            raise ValueError(
                f"{where} entries must look like 'package.module' or 'package.module:build', "
                f"got {entry!r}"
            )


def _inside(path: str, directory: str) -> bool:
    try:
        return os.path.commonpath([path, directory]) == directory
    except ValueError:  # different drives
        return False


def _search_root(module: ModuleType | Any) -> str | None:
    """The sys.path folder a top-level module (or module spec) was found in, if it has one."""
    locations = getattr(module, "submodule_search_locations", None)
    if locations is None:
        locations = getattr(module, "__path__", None)
    origin = getattr(module, "origin", None) or getattr(module, "__file__", None)
    first = next(iter(locations), None) if locations is not None else None
    if first is not None:  # a package: its folder's parent
        return os.path.dirname(os.path.realpath(first))
    if origin and os.path.isabs(origin):
        return os.path.dirname(os.path.realpath(origin))
    return None  # built-in, frozen, or a namespace package without portions


@contextmanager
def _installed_only(untrusted: Sequence[str]) -> Iterator[None]:
    """Hide the working directory and ``untrusted`` folders from imports while the block runs.

    ``python -m`` puts the working directory on sys.path, so a ``.py`` next to a downloaded
    model would otherwise shadow (or be) the plugin a ``model.json`` names.
    """
    cwd = os.path.realpath(os.getcwd())
    bad = [os.path.realpath(d) for d in untrusted]

    def hidden(entry: str) -> bool:
        if entry in ("", "."):
            return True
        real = os.path.realpath(entry)
        return real == cwd or any(_inside(real, d) for d in bad)

    saved = list(sys.path)
    sys.path[:] = [p for p in saved if not hidden(p)]
    try:
        yield
    finally:
        sys.path[:] = saved


class _Guard:
    """Where a plugin's code may not come from: the working directory and untrusted folders."""

    def __init__(self, name: str, module_name: str, untrusted: Sequence[str]) -> None:
        self.name = name
        self.module_name = module_name
        self.top = module_name.split(".", 1)[0]
        self.cwd = os.path.realpath(os.getcwd())
        self.untrusted = [os.path.realpath(d) for d in untrusted]

    def _refuse(self, where: str) -> None:
        raise ValueError(
            f"model.name {self.name!r}: module {self.module_name} would be imported from "
            f"{where}, the working directory or the model's own folder; plugins load only "
            "from the installed environment (pip install the package)"
        )

    def root(self, root: str | None) -> None:
        """Refuse a top-level module found in the working directory or an untrusted folder."""
        if root is not None and (root == self.cwd or any(_inside(root, d) for d in self.untrusted)):
            self._refuse(root)

    def path(self, path: str | None) -> None:
        """Refuse a package folder or file of the plugin inside an untrusted folder, or inside
        ``<cwd>/<top>`` (a package ``__path__`` extended while the working dir was searched)."""
        if path is None or not os.path.isabs(path):
            return
        real = os.path.realpath(path)
        in_cwd_package = _inside(real, os.path.join(self.cwd, self.top))
        if in_cwd_package or any(_inside(real, d) for d in self.untrusted):
            self._refuse(real)


def _import_installed(name: str, module_name: str, untrusted: Sequence[str]) -> ModuleType:
    """Import ``module_name`` from the installed environment, never from CWD or ``untrusted``.

    The top-level package is located first without running it (``find_spec`` of a top-level
    name executes nothing) and refused if it lives in the working directory or an untrusted
    folder; then each level is imported only after its parent's search path was checked, with
    those folders hidden from sys.path throughout.
    """
    guard = _Guard(name, module_name, untrusted)
    parts = module_name.split(".")
    with _installed_only(untrusted):
        loaded = sys.modules.get(guard.top)
        if loaded is not None:
            guard.root(_search_root(loaded))
        else:
            found = importlib.util.find_spec(guard.top)
            if found is None:
                raise ImportError(f"No module named {guard.top!r} in the installed environment")
            guard.root(_search_root(found))
        module = importlib.import_module(guard.top)
        for i in range(1, len(parts)):
            for entry in getattr(module, "__path__", None) or []:
                guard.path(entry)
            module = importlib.import_module(".".join(parts[: i + 1]))
    guard.path(getattr(module, "__file__", None))
    return module


def build_plugin(
    cfg: ModelConfig, spec: ModelSpec, untrusted_dirs: Sequence[str] | None
) -> nn.Module:
    """Import ``package.module:func`` from the environment and call ``func(cfg, spec)``."""
    module_name, _, attr = cfg.name.partition(":")
    try:
        if untrusted_dirs is None:
            module = importlib.import_module(module_name)
        else:
            module = _import_installed(cfg.name, module_name, untrusted_dirs)
    except ImportError as e:
        raise ValueError(f"model.name {cfg.name!r}: cannot import {module_name} ({e})") from e
    try:
        factory = getattr(module, attr)
    except AttributeError as e:
        raise ValueError(
            f"model.name {cfg.name!r}: module {module_name} has no attribute {attr!r}"
        ) from e
    if not callable(factory):
        raise ValueError(f"model.name {cfg.name!r}: {module_name}.{attr} is not callable")
    from torch import nn

    model = factory(cfg, spec)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model.name {cfg.name!r}: {module_name}.{attr}(cfg, spec) must return a "
            f"torch.nn.Module, got {type(model).__name__}"
        )
    return model
