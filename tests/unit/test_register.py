"""Tests for the register step and registry helpers against an embedded SQLite MLflow store."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer import registry, registry_files
from trainer.base.errors import InputError
from trainer.models.export import WEIGHTS_FILE, load_model
from trainer.steps.register import RegisterConfig, flatten_params, register

pytest_plugins = ["tests.fixtures.mlflow_server"]

PARAMS = {"optim": {"lr": 0.001, "schedule": "cosine"}, "train": {"epochs": 3}, "tags": [1, 2]}
METRICS = {"accuracy": 0.91, "log_loss": 0.2}


@pytest.fixture(scope="session")
def _migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite database, migrated once: migrations take seconds, a copy none."""
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    registry.mlflow_client(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def gpupipe_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _migrated_db: Path) -> Path:
    """``$GPUPIPE_HOME`` holding a ready store; MLFLOW_TRACKING_URI unset; cwd elsewhere."""
    home = tmp_path / "home"
    (home / "mlflow").mkdir(parents=True)
    shutil.copy(_migrated_db, home / "mlflow" / "mlflow.db")
    monkeypatch.setenv("GPUPIPE_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return home


@pytest.fixture
def tracking_uri(gpupipe_home: Path) -> str:
    """An explicit SQLite tracking URI (a copy of the migrated template)."""
    return f"sqlite:///{gpupipe_home / 'mlflow' / 'mlflow.db'}"


@pytest.fixture
def cfg(tracking_uri: str) -> RegisterConfig:
    return RegisterConfig(model_name="churn", tracking_uri=tracking_uri)


def _register(cfg: RegisterConfig, model_dir: str, run: str, gate: bool, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "model_uri": model_dir,
        "pipeline_run_id": run,
        "data_hash": f"sha256:{run}",
        "params": PARAMS,
        "metrics": METRICS,
        "gate_passed": gate,
    }
    return register(cfg, **{**args, **kw})


def test_register_creates_a_version_carrying_run_data_params_and_metrics(
    cfg: RegisterConfig, make_model_dir: Callable[..., str], gpupipe_home: Path
) -> None:
    result = _register(cfg, make_model_dir(), "kfp-run-1", gate=True)

    assert result.to_dict() == {
        "model_name": "churn",
        "version": "1",
        "created": True,
        "champion": True,
        "champion_reason": "'champion' moved to version 1",
        "model_uri": "models:/churn/1",
        "run_id": result.run_id,
    }
    client = registry.mlflow_client(cfg.tracking_uri or "")
    mv = client.get_model_version("churn", "1")
    assert mv.tags[registry.TAG_PIPELINE_RUN_ID] == "kfp-run-1"
    assert mv.tags[registry.TAG_DATA_HASH] == "sha256:kfp-run-1"
    assert mv.tags[registry.TAG_GATE_PASSED] == "true"
    assert mv.tags[registry.TAG_TRAINER_VERSION]
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[registry.TAG_PIPELINE_RUN_ID] == "kfp-run-1"
    assert run.data.params == {
        "optim.lr": "0.001",
        "optim.schedule": "cosine",
        "train.epochs": "3",
        "tags": "[1, 2]",
    }
    assert run.data.metrics == METRICS
    # Artifacts live next to the database, not in ./mlruns of whatever directory we ran in.
    assert list((gpupipe_home / "mlflow" / "artifacts").rglob(WEIGHTS_FILE))
    assert not (Path.cwd() / "mlruns").exists()


def test_rerun_for_the_same_pipeline_run_returns_the_same_version(
    cfg: RegisterConfig, make_model_dir: Callable[..., str]
) -> None:
    model = make_model_dir()
    first = _register(cfg, model, "kfp-run-1", gate=False)
    again = _register(cfg, model, "kfp-run-1", gate=False)

    assert (again.version, again.created, again.run_id) == (first.version, False, first.run_id)
    assert registry.find_version_by_pipeline_run(cfg.tracking_uri, "churn", "kfp-run-1") == "1"
    assert registry.find_version_by_pipeline_run(cfg.tracking_uri, "churn", "kfp-run-9") is None
    assert len(registry.mlflow_client(cfg.tracking_uri or "").search_model_versions()) == 1


@pytest.mark.parametrize(
    ("gate", "champion"), [(True, "1"), (False, None)], ids=["gate-passed", "gate-failed"]
)
def test_alias_moves_only_when_the_gate_passed(
    cfg: RegisterConfig, make_model_dir: Callable[..., str], gate: bool, champion: str | None
) -> None:
    result = _register(cfg, make_model_dir(), "kfp-run-1", gate=gate)

    assert result.champion is gate
    client = registry.mlflow_client(cfg.tracking_uri or "")
    assert registry.alias_version(client, "churn", "champion") == champion


def test_a_later_passing_version_takes_the_alias_and_a_failing_one_does_not(
    cfg: RegisterConfig, make_model_dir: Callable[..., str]
) -> None:
    _register(cfg, make_model_dir("m1", seed=1), "kfp-run-1", gate=True)
    second = _register(cfg, make_model_dir("m2", seed=2), "kfp-run-2", gate=True)
    third = _register(cfg, make_model_dir("m3", seed=3), "kfp-run-3", gate=False)

    assert (second.version, second.champion) == ("2", True)
    assert (third.version, third.champion) == ("3", False)
    champion = registry.get_champion(cfg.tracking_uri, "churn")
    assert champion is not None and champion.version == "2"


def test_rerun_with_the_gate_passed_moves_the_alias_to_the_existing_version(
    cfg: RegisterConfig, make_model_dir: Callable[..., str]
) -> None:
    model = make_model_dir()
    _register(cfg, model, "kfp-run-1", gate=False)
    again = _register(cfg, model, "kfp-run-1", gate=True)

    assert (again.version, again.created, again.champion) == ("1", False, True)


def test_get_champion_downloads_a_model_that_loads(
    cfg: RegisterConfig, make_model_dir: Callable[..., str], tmp_path: Path
) -> None:
    model_dir = make_model_dir(seed=5)
    result = _register(cfg, model_dir, "kfp-run-1", gate=True)

    champion = registry.get_champion(cfg.tracking_uri, "churn", dst_dir=str(tmp_path / "dl"))

    assert champion is not None
    assert (champion.version, champion.run_id, champion.metrics) == ("1", result.run_id, METRICS)
    assert champion.local_model_dir.startswith(str(tmp_path / "dl"))
    loaded, original = load_model(champion.local_model_dir), load_model(model_dir)
    x = torch.randn(4, 3)
    assert torch.equal(loaded.module(x), original.module(x))


@pytest.mark.parametrize("max_bytes", [1000, 0], ids=["listing", "after-a-file"])
def test_get_champion_over_its_limit_is_one_e_model_line_and_leaves_nothing(
    cfg: RegisterConfig, make_model_dir: Callable[..., str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, max_bytes: int,
) -> None:  # fmt: skip
    # Issue 60, item 8: the champion's download is bounded. "after-a-file": the store's listing
    # says nothing of sizes, so the bound holds once a file is fetched.
    _register(cfg, make_model_dir(), "kfp-run-1", gate=True)
    if not max_bytes:
        from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

        listing = LocalArtifactRepository.list_artifacts
        monkeypatch.setattr(
            LocalArtifactRepository,
            "list_artifacts",
            lambda self, path=None: [type(f)(f.path, f.is_dir, None) for f in listing(self, path)],
        )
        max_bytes = 1000
    limit = registry_files.SizeLimit(max_bytes, "pipeline parameter max_champion_bytes")

    with pytest.raises(InputError) as caught:
        registry.get_champion(cfg.tracking_uri, "churn", dst_dir=str(tmp_path / "dl"), limit=limit)

    assert caught.value.code == "E_MODEL"
    assert "over max_champion_bytes 1000" in str(caught.value)
    assert "pipeline parameter max_champion_bytes=" in str(caught.value)
    assert not list((tmp_path / "dl").rglob("*")), "a partial download is left"


@pytest.mark.parametrize(
    ("model_name", "alias"),
    [("never-registered", "champion"), ("churn", "other-alias")],
    ids=["unknown-model", "alias-unset"],
)
def test_get_champion_is_none_without_a_champion(
    cfg: RegisterConfig, make_model_dir: Callable[..., str], model_name: str, alias: str
) -> None:
    _register(cfg, make_model_dir(), "kfp-run-1", gate=True)

    assert registry.get_champion(cfg.tracking_uri, model_name, alias) is None


def test_default_store_is_sqlite_under_gpupipe_home(
    gpupipe_home: Path, make_model_dir: Callable[..., str]
) -> None:
    result = _register(RegisterConfig(), make_model_dir(), "kfp-run-1", gate=True)

    assert result.model_uri == "models:/gpupipe-model/1"
    assert registry.get_champion(None, "gpupipe-model") is not None
    assert list((gpupipe_home / "mlflow" / "artifacts").rglob(WEIGHTS_FILE))


@pytest.mark.parametrize(
    ("given", "env", "expected"),
    [
        ("http://mlflow:5000", "http://from-env:5000", "http://mlflow:5000"),
        (None, "http://from-env:5000", "http://from-env:5000"),
        (None, None, "sqlite:///{home}/mlflow/mlflow.db"),
    ],
    ids=["explicit", "env", "embedded-default"],
)
def test_resolve_tracking_uri(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    given: str | None,
    env: str | None,
    expected: str,
) -> None:
    monkeypatch.setenv("GPUPIPE_HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    if env is None:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", env)

    assert registry.resolve_tracking_uri(given) == expected.format(home=tmp_path)


@pytest.fixture
def in_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process as a step in a Kubernetes pod told of no registry; ``$GPUPIPE_HOME`` is
    returned, to check that nothing is made there."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.127.0.1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("GPUPIPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _refused_for_registry_uri(e: pytest.ExceptionInfo[InputError]) -> None:
    assert e.value.code == "E_PARAM" and e.value.where == "registry_uri"
    assert "registry_uri is empty" in e.value.message and "die with the pod" in e.value.message
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("given", [None, "", "  "], ids=["none", "empty", "blank"])
def test_in_a_pod_no_registry_named_is_refused_not_an_embedded_store(
    in_a_pod: Path, given: str | None
) -> None:
    # Issue 60, item 0: a KFP run's register step chose ~/.gpupipe's SQLite inside its pod,
    # logged "registered ... version 1 ... champion: true", and the store died with the pod.
    with pytest.raises(InputError) as e:
        registry.resolve_tracking_uri(given)
    _refused_for_registry_uri(e)
    assert not in_a_pod.exists()


def test_in_a_pod_the_environments_tracking_server_is_used(
    in_a_pod: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.kubeflow:5000")
    assert registry.resolve_tracking_uri(None) == "http://mlflow.kubeflow:5000"
    # An explicit SQLite URI is a person's own choice (a mounted volume): it stands.
    assert registry.resolve_tracking_uri("sqlite:////data/mlflow.db") == "sqlite:////data/mlflow.db"


def test_in_a_pod_evaluate_and_register_refuse_before_any_work(
    in_a_pod: Path,
    make_model_dir: Callable[..., str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from components.fingerprint import fingerprint as fingerprint_component
    from trainer.steps.preprocess import write_demo_data

    model_dir = make_model_dir()

    # evaluate looks the champion up first: refused before it reads the model or the data.
    with pytest.raises(InputError) as e:
        registry.get_champion(None, "churn")
    _refused_for_registry_uri(e)
    with pytest.raises(InputError) as e:
        _register(RegisterConfig(model_name="churn", tracking_uri=None), model_dir, "r1", True)
    _refused_for_registry_uri(e)
    # The pipeline's first step refuses too (a run fails in seconds, not after training) ...
    table = str(tmp_path / "t.parquet")
    write_demo_data(table, rows=50, task="classification", seed=0)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        fingerprint_component.python_func(data_uri=table, registry_uri="")
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("ERROR [fingerprint] E_PARAM: registry_uri is empty"), line
    # ... and checks nothing where the pipeline registers nothing (a user's own DAG).
    assert fingerprint_component.python_func(data_uri=table).startswith("fp1:")
    assert not in_a_pod.exists()


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"model_name": "team/model"}, "register.model_name"),
        ({"model_name": "a:b"}, "register.model_name"),
        ({"model_name": "it's"}, "register.model_name"),
        ({"model_name": ""}, "register.model_name"),
        ({"model_name": ".."}, "register.model_name"),
        ({"champion_alias": "latest"}, "register.champion_alias"),
        ({"champion_alias": "v3"}, "register.champion_alias"),
        ({"champion_alias": "best model"}, "register.champion_alias"),
        ({"experiment": " "}, "register.experiment"),
        ({"tracking_uri": ""}, "register.tracking_uri"),
    ],
    ids=[
        "name-slash",
        "name-colon",
        "name-quote",
        "name-empty",
        "name-dotdot",
        "alias-latest",
        "alias-version",
        "alias-space",
        "experiment-blank",
        "uri-empty",
    ],
)
def test_bad_config_names_the_field(fields: dict[str, Any], where: str) -> None:
    with pytest.raises(InputError) as info:
        RegisterConfig(**fields)

    assert info.value.where == where
    assert repr(next(iter(fields.values()))) in str(info.value)


def test_missing_model_dir_names_it(cfg: RegisterConfig, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-model")

    with pytest.raises(InputError, match="model directory not found") as info:
        _register(cfg, missing, "kfp-run-1", gate=True)

    assert (info.value.code, info.value.where) == ("E_MODEL", missing)


def test_model_dir_without_weights_names_the_missing_file(
    cfg: RegisterConfig, make_model_dir: Callable[..., str]
) -> None:
    model_dir = make_model_dir()
    (Path(model_dir) / WEIGHTS_FILE).unlink()

    with pytest.raises(InputError, match=f"{WEIGHTS_FILE} is missing") as info:
        _register(cfg, model_dir, "kfp-run-1", gate=True)

    assert info.value.where == model_dir
    assert registry.mlflow_client(cfg.tracking_uri or "").search_model_versions() == []


@pytest.mark.parametrize(
    ("run", "extra", "where"),
    [
        ("", {}, "pipeline_run_id"),
        ("run' or '1'='1", {}, "pipeline_run_id"),
        ("kfp-run-1", {"metrics": {"accuracy": "high"}}, "metrics.accuracy"),
    ],
    ids=["run-id-empty", "run-id-quote", "metric-not-a-number"],
)
def test_bad_arguments_name_the_argument(
    cfg: RegisterConfig,
    make_model_dir: Callable[..., str],
    run: str,
    extra: dict[str, Any],
    where: str,
) -> None:
    with pytest.raises(InputError) as info:
        _register(cfg, make_model_dir(), run, gate=True, **extra)

    assert info.value.where == where


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"a": {"b": {"c": 1}}}, {"a.b.c": "1"}),
        ({"flag": True, "none": None, "s": "text"}, {"flag": "true", "none": "null", "s": "text"}),
        ({"bad key!": 1}, {"bad key_": "1"}),
        ({"long": "x" * 7000}, {"long": "x" * 6000}),
        ({"empty": {}}, {"empty": "{}"}),
    ],
    ids=["nested", "json-scalars", "bad-key-chars", "long-value", "empty-dict"],
)
def test_flatten_params(params: dict[str, Any], expected: dict[str, str]) -> None:
    assert flatten_params(params) == expected


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("sqlite:////srv/mlflow/mlflow.db", "/srv/mlflow/artifacts"),
        ("sqlite:///rel/mlflow.db", "{cwd}/rel/artifacts"),
        ("sqlite:///:memory:", None),
        ("http://mlflow:5000", None),
    ],
    ids=["sqlite-absolute", "sqlite-relative", "sqlite-memory", "server"],
)
def test_artifacts_sit_next_to_a_sqlite_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uri: str, expected: str | None
) -> None:
    monkeypatch.chdir(tmp_path)

    found = registry.artifact_location_for(uri)

    assert found == (expected.format(cwd=tmp_path) if expected else None)


def _race_cfg(tracking_uri: str, evaluated: str = "") -> RegisterConfig:
    return RegisterConfig(
        model_name="churn",
        tracking_uri=tracking_uri,
        gate_metric="accuracy",
        evaluated_champion=evaluated,
    )


@pytest.mark.parametrize("better_first", [True, False], ids=["better-first", "worse-first"])
def test_two_runs_that_both_passed_against_no_champion_leave_the_better_one_champion(
    tracking_uri: str, make_model_dir: Callable[..., str], better_first: bool
) -> None:
    """Two concurrent runs: each evaluate saw no champion, so both gates passed."""
    runs = [("run-good", {"accuracy": 0.9}), ("run-poor", {"accuracy": 0.7})]
    if not better_first:
        runs.reverse()
    results = {
        run: _register(_race_cfg(tracking_uri), make_model_dir(), run, gate=True, metrics=m)
        for run, m in runs
    }
    client = registry.mlflow_client(tracking_uri)
    champion = registry.alias_version(client, "churn", "champion")
    assert champion == results["run-good"].version
    assert results["run-good"].champion is True
    if better_first:
        poor = results["run-poor"]
        assert poor.champion is False and poor.created is True
        assert "became champion during this run" in poor.champion_reason
        assert "does not beat" in poor.champion_reason


def test_the_alias_moves_when_the_champion_is_the_one_evaluate_beat(
    tracking_uri: str, make_model_dir: Callable[..., str]
) -> None:
    first = _register(_race_cfg(tracking_uri), make_model_dir(), "r1", gate=True,
                      metrics={"accuracy": 0.9})  # fmt: skip
    # evaluate re-scored v1 on new data and the candidate won, though v1's stored score is higher
    second = _register(_race_cfg(tracking_uri, evaluated=first.version), make_model_dir(), "r2",
                       gate=True, metrics={"accuracy": 0.8})  # fmt: skip
    assert second.champion is True
    client = registry.mlflow_client(tracking_uri)
    assert registry.alias_version(client, "churn", "champion") == second.version


def test_a_lower_is_better_metric_decides_the_race(
    tracking_uri: str, make_model_dir: Callable[..., str]
) -> None:
    cfg = RegisterConfig(model_name="churn", tracking_uri=tracking_uri, gate_metric="rmse")
    a = _register(cfg, make_model_dir(), "a", gate=True, metrics={"rmse": 1.0})
    b = _register(cfg, make_model_dir(), "b", gate=True, metrics={"rmse": 0.5})
    c = _register(cfg, make_model_dir(), "c", gate=True, metrics={"rmse": 0.7})
    assert (a.champion, b.champion, c.champion) == (True, True, False)
    client = registry.mlflow_client(tracking_uri)
    assert registry.alias_version(client, "churn", "champion") == b.version


def test_a_foreign_sqlite_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER)")
    before = db.read_bytes()
    with pytest.raises(InputError, match="did not create") as e:
        registry.mlflow_client(f"sqlite:///{db}")
    assert e.value.code == "E_REGISTRY" and e.value.where == str(db)
    assert db.read_bytes() == before
    assert not (tmp_path / "app.db.lock").exists(), "refused before a lock file is made beside it"


def _create_store(uri: str) -> int:
    registry.mlflow_client(uri).search_registered_models()
    return 0


def test_two_processes_can_create_a_fresh_store_at_once(tmp_path: Path) -> None:
    from concurrent.futures import ProcessPoolExecutor

    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    with ProcessPoolExecutor(2) as pool:
        assert list(pool.map(_create_store, [uri, uri])) == [0, 0]


def test_a_store_half_made_by_another_process_is_waited_for_not_refused(
    tmp_path: Path, _migrated_db: Path
) -> None:
    """The moment the test above races on (a cold CI lost it once, 2026-12-01): one process
    holds the lock and has made some of MLflow's tables; the other must wait for the lock and
    find the store made, not refuse it as a database MLflow did not create."""
    import fcntl
    import sqlite3
    import threading

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    with open(f"{db}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with sqlite3.connect(db) as conn:  # what MLflow has made so far
            conn.execute("CREATE TABLE experiments (experiment_id INTEGER)")
        failures: list[BaseException] = []

        def prepare() -> None:
            try:
                registry.prepare_store(uri)
            except BaseException as e:  # reported by the assertion below
                failures.append(e)

        waiter = threading.Thread(target=prepare)
        waiter.start()
        waiter.join(timeout=2)
        assert waiter.is_alive() and not failures, f"did not wait for the lock: {failures}"
        shutil.copyfile(_migrated_db, db)  # the holder finishes the store
        fcntl.flock(lock, fcntl.LOCK_UN)
    waiter.join(timeout=60)
    assert not waiter.is_alive() and not failures
    registry.mlflow_client(uri).search_registered_models()


def test_a_foreign_database_is_still_refused_under_the_lock(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER)")
    (tmp_path / "app.db.lock").touch()  # left by an earlier attempt on the same path
    before = db.read_bytes()
    with pytest.raises(InputError, match="did not create"):
        registry.prepare_store(f"sqlite:///{db}")
    assert db.read_bytes() == before


def test_mlflow_telemetry_is_off_in_a_step_outside_ci(tmp_path: Path) -> None:
    """Off where MLflow would turn it on (no CI or pytest variable): its background thread races
    the step's requests on os.environ (a real KFP run's register step failed on it)."""
    import os
    import subprocess
    import sys

    markers = ("CI", "PYTEST_CURRENT_TEST", "GITHUB_ACTIONS", "MLFLOW_DISABLE_TELEMETRY")
    env = {k: v for k, v in os.environ.items() if k not in markers}
    code = (
        "from trainer import registry\n"
        f"registry.mlflow_client('sqlite:///{tmp_path / 'mlflow.db'}')\n"
        "from mlflow.telemetry.utils import is_telemetry_disabled\n"
        "print(is_telemetry_disabled())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "True", out.stdout
