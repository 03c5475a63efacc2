"""Credentials never appear: the redaction function, and the steps' output when a URI holds one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.base import storage
from trainer.base.errors import InputError, error_line
from trainer.base.redact import has_userinfo, redact, redact_uri
from trainer.config import ModelConfig
from trainer.launch import TrainingRun
from trainer.launch.local import LocalLauncher
from trainer.models import ModelSpec, build_model
from trainer.models.export import save_model
from trainer.training.telemetry import Telemetry

REPO = str(Path(__file__).resolve().parents[2])
SECRETS = ("supersecret", "hunter2", "AKIAEXAMPLE", "s3cr3t/Key+x", "sig-value-123", "tok-456")

CASES = [
    # (text, expected)
    ("http://user:hunter2@127.0.0.1:1/api", "http://user:***@127.0.0.1:1/api"),
    ("https://bob:pa%40ss@mlflow.example.com", "https://bob:***@mlflow.example.com"),
    ("postgresql://mlflow:hunter2@db:5432/mlflow", "postgresql://mlflow:***@db:5432/mlflow"),
    ("mysql+pymysql://u:hunter2@db/m", "mysql+pymysql://u:***@db/m"),
    ("s3://AKIAEXAMPLE:supersecret@bucket/x", "s3://***:***@bucket/x"),
    ("minio://AKIAEXAMPLE@bucket/p", "minio://***@bucket/p"),
    ("gs://key@bucket/a", "gs://***@bucket/a"),
    ("s3://AKIAEXAMPLE:s3cr3t/Key+x@bucket/k.parquet", "s3://***:***@bucket/k.parquet"),
    ("http://user:p@ss@host/path", "http://user:***@host/path"),
    ("https://ghp_token123@github.com/org/repo", "https://***@github.com/org/repo"),
    ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
    ("http://host:8080/path/me@example.com", "http://host:8080/path/me@example.com"),
    ("s3://bucket/data@v2/x.parquet", "s3://bucket/data@v2/x.parquet"),
    ("write to me@example.com", "write to me@example.com"),
    (
        "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIAEXAMPLE%2F2024"
        "&X-Amz-Signature=sig-value-123&X-Amz-Expires=60",
        "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=***"
        "&X-Amz-Signature=***&X-Amz-Expires=60",
    ),
    ("http://h/x?token=tok-456&page=2", "http://h/x?token=***&page=2"),
    (
        "http://h/x?access_key=a&secret_key=b&password=c",
        "http://h/x?access_key=***&secret_key=***&password=***",
    ),
    ("https://maps.googleapis.com/x?key=tok-456", "https://maps.googleapis.com/x?key=***"),
    ("AWS_SECRET_ACCESS_KEY=supersecret python -m x", "AWS_SECRET_ACCESS_KEY=*** python -m x"),
    ("Authorization: Bearer tok-456-abcdef", "Authorization: Bearer ***"),
    ("a key=value line and a basic training setup", "a key=value line and a basic training setup"),
    ("val_loss=0.31 accuracy=0.9", "val_loss=0.31 accuracy=0.9"),
    ("models at s3://a/x,s3://k:supersecret@b/y", "models at s3://a/x,s3://***:***@b/y"),
    ("http://h/?next=http://u:hunter2@x/y", "http://h/?next=http://u:***@x/y"),
    ("got 'http://user:hunter2@h:1/'", "got 'http://user:***@h:1/'"),
    ("<dd>http://user:hunter2@h</dd>", "<dd>http://user:***@h</dd>"),
    (
        "line one\nMLflow at http://u:hunter2@h/: failed",
        "line one\nMLflow at http://u:***@h/: failed",
    ),
    ('{"password": "hunter2"}', '{"password": "***"}'),
    ("{'token': 'tok-456', 'epochs': 3}", "{'token': '***', 'epochs': 3}"),
    ('{"registry.password":"hun\\"ter2", "lr": 0.1}', '{"registry.password":"***", "lr": 0.1}'),
    (
        '{"object_store_secret": "mlpipeline-minio-artifact"}',
        '{"object_store_secret": "mlpipeline-minio-artifact"}',
    ),
    ("", ""),
]
CASE_IDS = [
    "http-password",
    "percent-encoded-password",
    "postgresql",
    "driver-scheme",
    "s3-key-and-secret",
    "minio-bare-key",
    "gs-bare-key",
    "secret-with-slash",
    "raw-at-in-password",
    "bare-token",
    "sqlite-path-untouched",
    "port-then-at-in-path-untouched",
    "at-in-object-key-untouched",
    "email-untouched",
    "presigned-url",
    "token-param",
    "several-params",
    "api-key-param",
    "env-assignment",
    "bearer",
    "plain-words-untouched",
    "katib-metrics-untouched",
    "second-uri-in-a-list",
    "uri-inside-query",
    "repr-quotes",
    "html",
    "multiline",
    "json-password",
    "repr-token",
    "json-dotted-key-escaped-quote",
    "json-secret-name-untouched",
    "empty",
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=CASE_IDS)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact(expected) == expected  # idempotent: a redacted text stays as it is


def test_redact_uri_keeps_none() -> None:
    assert redact_uri(None) is None
    assert redact_uri("s3://k:supersecret@b/x") == "s3://***:***@b/x"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://AKIAEXAMPLE:supersecret@bucket/x", True),
        ("minio://key@bucket/x", True),
        ("s3://bucket/x@v2", False),
        ("s3://bucket/x", False),
        ("/local/path@x", False),
        ("http://host:8080/a@b", False),
    ],
    ids=["key-secret", "bare-key", "at-in-key", "plain", "local-path", "port"],
)
def test_has_userinfo(uri: str, expected: bool) -> None:
    assert has_userinfo(uri) is expected


def test_error_line_redacts_message_and_location() -> None:
    err = InputError("E_DATA", "cannot read http://u:hunter2@h/d.csv", "s3://k:supersecret@b/d")
    assert error_line("preprocess", err) == (
        "ERROR [preprocess] E_DATA: cannot read http://u:***@h/d.csv (s3://***:***@b/d)"
    )
    line = error_line("register", RuntimeError("MLflow at http://u:hunter2@h:5000 failed"))
    assert line == "ERROR [register] E_INVALID: MLflow at http://u:***@h:5000 failed"


def test_telemetry_lines_and_history_carry_no_credentials(tmp_path: Path) -> None:
    out = tmp_path / "stdout.txt"
    history = tmp_path / "history.jsonl"
    with out.open("w") as stream:
        tele = Telemetry(
            enabled=True, job="j", total_steps=1, history_uri=str(history), stream=stream
        )
        tele.emit("checkpoint", uri="s3://AKIAEXAMPLE:supersecret@bucket/ckpt", step=3)
        tele.close()
    for text in (out.read_text(), history.read_text()):
        assert "supersecret" not in text and "AKIAEXAMPLE" not in text
        assert json.loads(text.splitlines()[0])["uri"] == "s3://***:***@bucket/ckpt"


@pytest.mark.parametrize(
    "call",
    [storage.exists, storage.read_bytes, storage.list_dir, lambda u: storage.write_text(u, "x")],
    ids=["exists", "read", "list", "write"],
)
def test_storage_refuses_credentials_in_a_uri_without_sending_them(call) -> None:
    with pytest.raises(InputError) as info:
        call("s3://AKIAEXAMPLE:supersecret@bucket/x")
    assert info.value.code == "E_URI"
    assert info.value.where == "s3://***:***@bucket/x"  # still names the bucket and key
    assert "AWS_SECRET_ACCESS_KEY" in info.value.message
    assert "supersecret" not in str(info.value) and "AKIAEXAMPLE" not in str(info.value)


def test_registry_errors_redact_the_tracking_uri_and_mlflow_text() -> None:
    from mlflow.exceptions import MlflowException

    from trainer import registry

    uri = "http://user:hunter2@127.0.0.1:1/"
    with pytest.raises(RuntimeError) as info, registry.mlflow_errors("searching", uri):
        raise MlflowException(f"API request to {uri}api/2.0/x failed " + "x" * 400)
    text = str(info.value)
    assert "hunter2" not in text
    assert text.startswith("MLflow at http://user:***@127.0.0.1:1/: searching failed: ")


def test_report_shows_locations_without_credentials() -> None:
    from trainer.steps.evaluate import EvaluateResult
    from trainer.steps.evaluate.report import render_report

    result = EvaluateResult(
        task="regression",
        metrics={"rmse": 1.0},
        gate_passed=False,
        gate_reason="rmse 1 (no threshold) and does not beat champion s3://k:supersecret@b/c",
        champion_metrics={"rmse": 0.5},
        confusion_matrix=None,
        labels=None,
        roc=None,
        gate_metric="rmse",
        num_rows=3,
    )
    html = render_report(
        result,
        model_uri="minio://AKIAEXAMPLE:supersecret@bucket/model",
        dataset_uri="https://h/d?X-Amz-Signature=sig-value-123",
        split="test",
        champion_uri="s3://k:supersecret@b/c",
        champion_rescored=True,
        history=None,
    )
    assert not any(s in html for s in SECRETS)
    assert "minio://***:***@bucket/model" in html
    assert "X-Amz-Signature=***" in html


# --- Whole processes: stdout, stderr and every file written ---------------------------------------


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **env}
    full_env["PYTHONPATH"] = os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _assert_no_secret(proc: subprocess.CompletedProcess[str], folder: Path) -> None:
    for secret in SECRETS:
        assert secret not in proc.stdout, proc.stdout
        assert secret not in proc.stderr, proc.stderr
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(s.encode() in data for s in SECRETS), path


def _model(folder: Path) -> str:
    cfg = ModelConfig(name="mlp", hidden_dim=4, num_layers=1)
    spec = ModelSpec(task="classification", in_features=2, num_classes=2)
    uri = str(folder / "model")
    save_model(
        uri,
        build_model(cfg, spec),
        model_cfg=cfg,
        spec=spec,
        features=["a", "b"],
        target="y",
        schema=None,
        metrics={"accuracy": 0.5},
    )
    return uri


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (
            [
                "evaluate",
                "--model",
                "s3://AKIAEXAMPLE:supersecret@bucket/x",
                "--dataset",
                "s3://bucket/d",
                "--report",
                "report.html",
            ],
            "(s3://***:***@bucket/x)",
        ),
        (
            [
                "preprocess",
                "--data",
                "http://user:hunter2@127.0.0.1:1/data.csv",
                "--output",
                "o",
                "--set",
                "target=y",
            ],
            "'http://user:***@127.0.0.1:1/data.csv'",
        ),
        (
            ["train", "--dataset", "minio://AKIAEXAMPLE@bucket/d", "--model", "m"],
            "(minio://***@bucket/d/schema.json)",
        ),
    ],
    ids=["evaluate-s3-model", "preprocess-http-data", "train-minio-dataset"],
)
def test_a_failing_step_never_shows_the_credentials_in_its_uri(
    tmp_path: Path, args: list[str], where: str
) -> None:
    proc = _run(["-m", "trainer", *args], tmp_path)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ERROR [{args[0]}] E_")
    assert where in last  # the location is still named, for a person to act on
    _assert_no_secret(proc, tmp_path)


def test_register_with_an_unreachable_registry_never_shows_its_password(tmp_path: Path) -> None:
    model = _model(tmp_path)
    proc = _run(
        [
            *("-m", "trainer", "register", "--model", model, "--run-id", "r1"),
            *("--data-hash", "h", "--set", "tracking_uri=http://user:hunter2@127.0.0.1:1/"),
        ],
        tmp_path,
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
        MLFLOW_HTTP_REQUEST_TIMEOUT="5",
        GPUPIPE_HOME=str(tmp_path / "home"),
    )
    assert proc.returncode == 1  # an external system failed: retryable
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ERROR [register] E_EXTERNAL: MLflow at http://user:***@127.0.0.1:1/: ")
    _assert_no_secret(proc, tmp_path)


def test_logs_and_uncaught_tracebacks_are_redacted_once_installed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import logging
        from trainer.base import redact
        redact.install()
        log = logging.getLogger("third.party")
        log.warning("connecting to %s", "http://user:hunter2@db:5432/x")
        try:
            raise OSError("s3://AKIAEXAMPLE:supersecret@bucket/x refused")
        except OSError:
            log.exception("upload failed")
        try:
            raise OSError("token=tok-456 refused")
        except OSError as e:
            raise RuntimeError("MLflow at http://user:hunter2@127.0.0.1:1/ failed") from e
        """
    )
    proc = _run(["-c", script], tmp_path)
    assert proc.returncode == 1
    assert "connecting to http://user:***@db:5432/x" in proc.stderr
    assert "s3://***:***@bucket/x refused" in proc.stderr
    assert "token=*** refused" in proc.stderr
    assert "RuntimeError: MLflow at http://user:***@127.0.0.1:1/ failed" in proc.stderr
    _assert_no_secret(proc, tmp_path)


def test_local_launcher_output_and_error_carry_no_credentials(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job started with a config URI holding a secret: torchrun, worker and launcher quiet."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    with pytest.raises(InputError) as info:
        LocalLauncher().launch(
            TrainingRun(
                job_name="j",
                config_uri="s3://AKIAEXAMPLE:supersecret@bucket/cfg.json",
                timeout_s=120,
            )
        )
    out, err = capfd.readouterr()
    assert info.value.code == "E_URI"
    assert "s3://***:***@bucket/cfg.json" in str(info.value)
    for text in (out, err, str(info.value)):
        assert not any(s in text for s in SECRETS), text
