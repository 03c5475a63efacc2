"""Fixtures shared by the unit tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.helpers import TORCHRUN_VARS
from trainer.distributed import dist


@pytest.fixture
def ctx(monkeypatch: pytest.MonkeyPatch) -> Iterator[dist.DistContext]:
    """A single-process context, as a plain ``python -m trainer.worker`` gets."""
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)
    c = dist.init("auto", timeout_s=30)
    yield c
    dist.close(c)
