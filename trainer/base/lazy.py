"""Names a package exports, loaded with their module on first use (PEP 562).

A package's face lists what other code may use; with this, importing one light submodule (the
model's file names, the metrics' directions) does not import the heavy ones beside it (torch),
so a step that needs no torch starts without it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module ``__getattr__`` and ``__dir__`` for ``exports`` (name -> submodule).

    The first use of a name imports its submodule and keeps the value on the package, so later
    uses cost nothing. A name not in ``exports`` is an ``AttributeError`` as usual (which lets
    ``from package import submodule`` import the submodule).
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
