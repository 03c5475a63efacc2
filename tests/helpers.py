"""Helpers shared by the test modules (unit and integration); test files import from here only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from trainer import dist


@contextmanager
def dist_session(backend: str = "auto", timeout_s: int = 1800) -> Iterator[dist.DistContext]:
    """``with dist_session() as ctx:``: ``dist.init``, run the body, and always ``dist.close``."""
    ctx = dist.init(backend, timeout_s)
    try:
        yield ctx
    finally:
        dist.close(ctx)
