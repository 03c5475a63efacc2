"""Register against a real MLflow server that asks who is calling (its basic-auth app, as
manifests/mlflow runs it): the account comes from the environment (on KFP, the secret the
pipeline parameter registry_secret names), and a refused account is one line that says so."""

from __future__ import annotations

import base64
import json
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
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_auth_server.pipeline_username)
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
    # The pipeline's account (the Secret registry_secret names), not the admin's.
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_auth_server.pipeline_username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_auth_server.pipeline_password)
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


def _call(
    server: AuthServer, method: str, path: str, body: dict | None, user: str, password: str
) -> int:
    """The HTTP status of one REST call to ``server`` as ``user``."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.url}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_the_pipelines_account_cannot_make_users_or_grant_rights(
    cfg: RegisterConfig,
    mlflow_auth_server: AuthServer,
    make_model_dir: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 60, item 2: the steps held MLflow's admin account. The pipeline's account (made by
    manifests/mlflow's provision.py) registers as before, and can do nothing an admin does."""
    s = mlflow_auth_server
    admin = (s.username, s.password)
    pipeline = (s.pipeline_username, s.pipeline_password)
    # Another team's model, made by the admin: with default_permission NO_PERMISSIONS the
    # pipeline reads nothing of it and cannot grant itself rights on it.
    other = f"other-{uuid.uuid4().hex[:8]}"
    created = _call(s, "POST", "/api/2.0/mlflow/registered-models/create", {"name": other}, *admin)
    assert created == 200
    get = f"/api/2.0/mlflow/registered-models/get?name={other}"
    assert _call(s, "GET", get, None, *pipeline) == 403
    grant = {"name": other, "username": s.pipeline_username, "permission": "MANAGE"}
    path = "/api/2.0/mlflow/users/create"
    assert _call(s, "POST", path, {"username": "mallory", "password": "x" * 16}, *pipeline) == 403
    for method, perm in (("POST", "create"), ("PATCH", "update")):
        url = f"/api/2.0/mlflow/registered-models/permissions/{perm}"
        assert _call(s, method, url, grant, *pipeline) == 403, (method, url)
    assert _call(s, "PATCH", "/api/2.0/mlflow/users/update-admin",
                 {"username": s.pipeline_username, "is_admin": True}, *pipeline) == 403  # fmt: skip
    # What it needs it still does: its own registered model, version and champion alias.
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", s.pipeline_username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", s.pipeline_password)
    result = _register(cfg, make_model_dir())
    assert result.champion and result.version == "1"
    assert _call(s, "GET", get, None, *admin) == 200  # the admin still reads everything


# In make test-slow (32 s alone, 55 s beside CI's cluster): make test keeps its 15 minutes.
@pytest.mark.slow
def test_the_pipelines_account_registers_run_after_run_through_the_lease(
    cfg: RegisterConfig,
    mlflow_auth_server: AuthServer,
    make_model_dir: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The champion lease is a registered model each register makes and deletes: under
    # NO_PERMISSIONS the account must be able to make it again (MLflow grants MANAGE to its maker).
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_auth_server.pipeline_username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_auth_server.pipeline_password)
    for run, accuracy in (("kfp-run-1", 0.8), ("kfp-run-2", 0.9), ("kfp-run-3", 0.95)):
        result = register(
            cfg,
            model_uri=make_model_dir(name=run),
            pipeline_run_id=run,
            data_hash="sha256:1",
            params={},
            metrics={"accuracy": accuracy},
            gate_passed=True,
        )
        assert result.champion, (run, result)
    assert result.version == "3"


def test_evaluate_finds_no_champion_of_a_model_not_registered_yet(
    cfg: RegisterConfig, mlflow_auth_server: AuthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found on the test cluster: under default_permission NO_PERMISSIONS, MLflow answers the
    # pipeline's account 403 (not 404) for a model that does not exist, and a first run's
    # evaluate failed on it before anything was registered.
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_auth_server.pipeline_username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_auth_server.pipeline_password)
    assert registry.get_champion(cfg.tracking_uri, cfg.model_name) is None
