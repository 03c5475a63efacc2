"""Register against a real MLflow server that asks who is calling (its basic-auth app, as
manifests/mlflow runs it): the account comes from the environment (on KFP, the secret the
pipeline parameter registry_secret names), and a refused account is one line that says so."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from trainer import registry
from trainer.models.export import load_model
from trainer.steps.register import RegisterConfig, RegisterResult, register

if TYPE_CHECKING:
    from tests.fixtures.mlflow_server import AuthServer

pytest_plugins = ["tests.fixtures.mlflow_server"]

pytestmark = pytest.mark.integration


@pytest.fixture
def cfg(mlflow_auth_server: AuthServer, monkeypatch: pytest.MonkeyPatch) -> RegisterConfig:
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    return RegisterConfig(
        model_name=f"model-{uuid.uuid4().hex[:8]}",
        tracking_uri=mlflow_auth_server.url,
        experiment=f"exp-{uuid.uuid4().hex[:8]}",
    )


def _register(cfg: RegisterConfig, model_dir: str) -> RegisterResult:
    return register(
        cfg,
        model_uri=model_dir,
        pipeline_run_id="kfp-run-1",
        data_hash="sha256:1",
        params={},
        metrics={"accuracy": 0.9},
        gate_passed=True,
    )


def test_the_server_refuses_a_request_without_an_account(mlflow_auth_server: AuthServer) -> None:
    url = f"{mlflow_auth_server.url}/api/2.0/mlflow/registered-models/search"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=10)
    assert info.value.code == 401


@pytest.mark.parametrize("password", [None, "not-the-password"], ids=["none", "wrong"])
def test_a_refused_account_is_one_line_saying_where_the_account_goes(
    cfg: RegisterConfig,
    mlflow_auth_server: AuthServer,
    make_model_dir: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    password: str | None,
) -> None:
    if password is not None:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_auth_server.username)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    with pytest.raises(RuntimeError) as info:
        _register(cfg, make_model_dir())
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"MLflow at {mlflow_auth_server.url}: ")
    assert "401" in message and message.endswith(registry.ACCOUNT_HINT)
    assert password is None or password not in message


def test_with_the_account_from_the_environment_the_champion_is_registered_and_loads(
    cfg: RegisterConfig,
    mlflow_auth_server: AuthServer,
    make_model_dir: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_auth_server.username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_auth_server.password)
    model_dir = make_model_dir()
    result = _register(cfg, model_dir)
    assert (result.version, result.created, result.champion) == ("1", True, True)
    champion = registry.get_champion(
        cfg.tracking_uri, cfg.model_name, dst_dir=str(tmp_path / "champion")
    )
    assert champion is not None and champion.version == "1"
    x = torch.randn(4, 3)
    expected = load_model(model_dir).module(x)
    assert torch.equal(load_model(champion.local_model_dir).module(x), expected)
