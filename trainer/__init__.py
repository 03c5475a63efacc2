"""gpupipe's library, baked into the training image; it never imports kfp.

Layers, each importing only those below it (``tests/unit/test_layers.py`` enforces it):
``base`` (torch-free: errors, storage, outputs, typed configs), the worker's config schema
(``config``), the engine (``data``, ``distributed``, ``checkpoint``, ``models``, then
``training``), the worker (``worker``), ``launch`` (how a run is started and watched: it uses
only ``base``), then ``steps`` and ``tune``.
"""

from __future__ import annotations

from types import ModuleType


def __getattr__(name: str) -> ModuleType:
    # Compiled component bodies (the golden pipeline YAML, and pipelines already uploaded to
    # KFP) run ``from trainer import storage``: the name stays, loaded only when asked for.
    if name == "storage":
        from trainer.base import storage

        return storage
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
