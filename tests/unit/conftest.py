"""Fixtures shared by the unit tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.fakes.kfp_api import FakeKfp, serve
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


@pytest.fixture
def kfp(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKfp]:
    """A fake KFP v2beta1 API server on 127.0.0.1, the client's backoffs short, no token file."""
    from pipelines import cluster, cluster_auth

    monkeypatch.setattr(cluster, "BACKOFF_S", 0.01)
    monkeypatch.setattr(cluster, "MAX_POLL_S", 0.02)
    monkeypatch.delenv(cluster_auth.TOKEN_PATH_ENV, raising=False)
    yield from serve()
