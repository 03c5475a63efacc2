"""Register against a real MLflow tracking server on 127.0.0.1 (REST API, proxied artifacts)."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainer import registry, registry_files
from trainer.base.errors import InputError
from trainer.models.export import load_model
from trainer.steps.register import RegisterConfig, register

pytest_plugins = ["tests.fixtures.mlflow_server"]

pytestmark = pytest.mark.integration

METRICS = {"accuracy": 0.91, "log_loss": 0.2}
UNREACHABLE_BUDGET_S = 30.0


@pytest.fixture
def cfg(mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> RegisterConfig:
    """A config pointing at the server, with a model name no other test uses."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return RegisterConfig(
        model_name=f"model-{uuid.uuid4().hex[:8]}",
        tracking_uri=mlflow_server,
        experiment=f"exp-{uuid.uuid4().hex[:8]}",
    )


def test_register_is_idempotent_and_the_champion_downloads_through_the_server(
    cfg: RegisterConfig, make_model_dir: Callable[..., str], tmp_path: Path
) -> None:
    first_dir, second_dir = make_model_dir("m1", seed=1), make_model_dir("m2", seed=2)

    first = register(
        cfg,
        model_uri=first_dir,
        pipeline_run_id="kfp-run-1",
        data_hash="sha256:1",
        params={"optim": {"lr": 0.001}},
        metrics=METRICS,
        gate_passed=False,
    )
    again = register(
        cfg,
        model_uri=first_dir,
        pipeline_run_id="kfp-run-1",
        data_hash="sha256:1",
        params={"optim": {"lr": 0.001}},
        metrics=METRICS,
        gate_passed=False,
    )
    assert (first.version, first.created, first.champion) == ("1", True, False)
    assert (again.version, again.created, again.run_id) == ("1", False, first.run_id)
    assert registry.get_champion(cfg.tracking_uri, cfg.model_name) is None

    second = register(
        cfg,
        model_uri=second_dir,
        pipeline_run_id="kfp-run-2",
        data_hash="sha256:2",
        params={"optim": {"lr": 0.002}},
        metrics={"accuracy": 0.95},
        gate_passed=True,
    )
    assert (second.version, second.created, second.champion) == ("2", True, True)
    assert (
        registry.find_version_by_pipeline_run(cfg.tracking_uri, cfg.model_name, "kfp-run-2") == "2"
    )

    client = registry.mlflow_client(cfg.tracking_uri or "")
    mv = client.get_model_version(cfg.model_name, "2")
    assert mv.tags[registry.TAG_PIPELINE_RUN_ID] == "kfp-run-2"
    assert mv.tags[registry.TAG_DATA_HASH] == "sha256:2"
    assert mv.source.startswith("mlflow-artifacts:/"), "artifacts should go through the proxy"
    assert client.get_run(second.run_id).data.params == {"optim.lr": "0.002"}

    champion = registry.get_champion(
        cfg.tracking_uri, cfg.model_name, dst_dir=str(tmp_path / "champion")
    )
    assert champion is not None
    assert (champion.version, champion.metrics) == ("2", {"accuracy": 0.95})
    x = torch.randn(4, 3)
    expected = load_model(second_dir).module(x)
    assert torch.equal(load_model(champion.local_model_dir).module(x), expected)


def test_a_champion_over_max_champion_bytes_is_one_e_model_line_and_leaves_nothing(
    cfg: RegisterConfig, make_model_dir: Callable[..., str], tmp_path: Path
) -> None:
    # Issue 60, item 8: through the real server's artifact proxy, the version's listing is over
    # the limit: refused before any file is fetched; within it, the same call downloads.
    register(
        cfg,
        model_uri=make_model_dir(),
        pipeline_run_id="kfp-run-1",
        data_hash="sha256:1",
        params={},
        metrics=METRICS,
        gate_passed=True,
    )
    small = registry_files.SizeLimit(1000, "pipeline parameter max_champion_bytes")

    with pytest.raises(InputError) as caught:
        registry.get_champion(
            cfg.tracking_uri, cfg.model_name, dst_dir=str(tmp_path / "small"), limit=small
        )

    assert caught.value.code == "E_MODEL" and "\n" not in str(caught.value)
    assert "over max_champion_bytes 1000" in str(caught.value)
    assert not list((tmp_path / "small").rglob("*"))
    champion = registry.get_champion(cfg.tracking_uri, cfg.model_name, dst_dir=str(tmp_path / "ok"))
    assert champion is not None
    load_model(champion.local_model_dir)


def test_unreachable_tracking_uri_fails_fast_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, make_model_dir: Callable[..., str]
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    model_dir = make_model_dir()
    # Imported before the clock starts: on a loaded machine MLflow's import alone (1.7 s unloaded
    # here) could use up the budget, which is for what register does with an unreachable server.
    import mlflow.tracking  # noqa: F401

    # Bound but never listening: the port stays ours, and every connection is refused.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{sock.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(RuntimeError) as info:
            register(
                RegisterConfig(tracking_uri=uri),
                model_uri=model_dir,
                pipeline_run_id="kfp-run-1",
                data_hash="sha256:1",
                params={},
                metrics=METRICS,
                gate_passed=True,
            )
        elapsed = time.monotonic() - started

    assert elapsed < UNREACHABLE_BUDGET_S
    message = str(info.value)
    assert uri in message and "\n" not in message
    assert info.value.__cause__ is not None
