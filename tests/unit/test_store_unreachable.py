"""A store that stops answering mid-training is retryable (issue 63: found on two nodes, when a
lost node took the cluster's DNS with it and a checkpoint's upload could not resolve the store):
the worker exits with the retryable code and no ``E_`` line, so the operator restarts the job
and it resumes from the last whole checkpoint. A store that answers and refuses stays final."""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest

from trainer import worker
from trainer.base import storage
from trainer.base.errors import EXIT_PEER_LOST


@pytest.fixture
def dead_store(monkeypatch: pytest.MonkeyPatch) -> str:
    """A minio:// endpoint on a port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MINIO_ENDPOINT", f"127.0.0.1:{port}")
    monkeypatch.setenv("MINIO_ACCESS_KEY", "k")
    monkeypatch.setenv("MINIO_SECRET_KEY", "s")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # 3 attempts, not 6
    return "minio://bucket/run/checkpoints/step-00000015.tmp/COMPLETE.json"


def test_a_store_that_does_not_answer_is_unreachable_naming_the_write(dead_store: str) -> None:
    with pytest.raises(storage.StoreUnreachable, match=r"^writing minio://bucket/run/.*COMPLETE"):
        storage.write_text(dead_store, "{}")


def test_an_unreachable_store_mid_training_is_a_retryable_exit_without_an_e_line(
    dead_store: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def train(*_: Any) -> None:
        try:
            storage.write_text(dead_store, "{}")
        except RuntimeError as e:  # as a caller that wraps the error would
            raise RuntimeError(f"saving checkpoint 15: {e}") from e

    monkeypatch.setattr(worker, "train", train)
    with caplog.at_level(logging.ERROR):
        code = worker._train(None, None, None)  # type: ignore[arg-type]
    assert code == EXIT_PEER_LOST
    assert "ERROR [train] E_" not in capsys.readouterr().err
    assert any("lost the object store" in r.getMessage() for r in caplog.records)


def test_a_store_that_answers_and_refuses_stays_a_final_error() -> None:
    refused = OSError("AWS Error ACCESS_DENIED during PutObject operation: Access Denied")
    with (
        pytest.raises(RuntimeError) as raised,
        storage._translate("writing minio://b/k", "minio://b/k"),
    ):
        raise refused
    assert not isinstance(raised.value, storage.StoreUnreachable)
    assert not worker._store_unreachable(raised.value)
