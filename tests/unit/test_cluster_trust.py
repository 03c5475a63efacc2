"""Issue 60, the command line: where ``gpupipe``'s requests and token go, how long it waits for
KFP, what of the server's text reaches a terminal, and what KFP is never given to store."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from pipelines import cluster, cluster_auth
from tests.fakes.kfp_api import FakeKfp, RunScript, private_ca, serve
from tests.helpers import gpupipe_cli
from trainer.base.errors import InputError

TOKEN = "s3cr3t-token-value"


_gp = gpupipe_cli


# -- item 4: the token goes only where --host says, as the transport reads it ---------------------

_CONFUSING_HOSTS = {
    "backslash-at": "http://evil.example\\@localhost:8080",
    "hash-at": "http://evil.example#@localhost:8080",
    "encoded-slash-at": "http://evil.example%2f@localhost:8080",
    "port-then-at": "http://localhost:8080@evil.example",
    "user-password": "http://user:pw@kfp.example.com",
    "query": "https://kfp.example.com/?next=http://evil.example",
    "space": "http://localhost:8080 /x",
    "control-character": "http://localhost:8080\x1b[2J",
    "not-a-port": "http://localhost:80a80",
    "percent-in-host": "http://local%68ost:8080",
}


@pytest.mark.parametrize("host", list(_CONFUSING_HOSTS.values()), ids=list(_CONFUSING_HOSTS))
def test_a_host_two_parsers_could_read_differently_is_refused_before_any_request(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    """``urlsplit`` reads ``http://evil.example\\@localhost:8080`` as localhost (so the plain-http
    guard let the token through) while urllib3 connected to evil.example."""
    sent: list[str] = []

    def record(self: object, method: str, url: str, *args: object, **kwargs: object) -> None:
        sent.append(url)
        raise AssertionError(f"a request was sent to {url}")

    monkeypatch.setattr(urllib3.PoolManager, "urlopen", record)
    monkeypatch.delenv(cluster_auth.TOKEN_PATH_ENV, raising=False)
    code, out, err = _gp(capsys, "upload", "--host", host, "--token", TOKEN)
    assert (code, sent) == (2, [])
    (line,) = err.strip().splitlines()
    assert line.startswith("ERROR [gpupipe upload] E_PARAM: --host must be http(s)://host")
    assert line.endswith("(--host)")
    assert "\x1b" not in line and TOKEN not in out + err
    assert "pw" not in line.replace("http(s)", "")  # user info is never repeated


@pytest.mark.parametrize(
    ("host", "base"),
    [
        ("http://localhost:8080/", "http://localhost:8080"),
        ("https://KFP.example.com/pipeline/", "https://kfp.example.com/pipeline"),
        ("http://[::1]:8888", "http://[::1]:8888"),
        ("http://127.0.0.1", "http://127.0.0.1"),
    ],
    ids=["trailing-slash", "path-and-case", "ipv6", "no-port"],
)
def test_the_base_url_is_built_from_the_parts_the_transport_reads(host: str, base: str) -> None:
    token = cluster_auth.Auth(source="--token", token=TOKEN)
    assert cluster.KfpCluster(host, auth=token).host == base


def test_a_host_without_http_is_still_e_host() -> None:
    with pytest.raises(InputError) as e:
        cluster_auth.base_url("ftp://user:pw@kfp.example.com")
    assert e.value.code == "E_HOST" and "pw" not in str(e.value)


# -- item 5: every request has a timeout, every listing an end ------------------------------------


@pytest.fixture
def uploaded(kfp: FakeKfp, capsys: pytest.CaptureFixture[str]) -> FakeKfp:
    """Uploaded as a platform team does: with the cluster's registry as the version's default."""
    argv = ["upload", "--host", kfp.url, "--set", "registry_uri=http://mlflow.kubeflow:5000"]
    assert _gp(capsys, *argv)[0] == 0
    return kfp


def test_run_wait_is_bounded_by_its_timeout_when_kfp_stops_answering(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stalled port-forward held ``run --wait --timeout N`` past N: each poll now gets no
    more than the time left (the read timeout alone is a minute)."""
    uploaded.stall("GET", r"/runs/", seconds=30)
    started = time.monotonic()
    code, _, err = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=x", "--wait", "--timeout", "1"
    )
    took = time.monotonic() - started
    assert code == 1 and took < 10, (took, err)
    (line,) = err.strip().splitlines()
    (run_id,) = uploaded.runs
    assert line.startswith(f"ERROR [gpupipe run] E_TIMEOUT: run {run_id} was never read: KFP")
    assert "within the 1 s of --timeout" in line and f"/#/runs/details/{run_id}" in line


def test_a_stalled_request_is_one_line_after_the_read_timeout(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "READ_TIMEOUT_S", 0.5)
    kfp.stall("GET", r"/pipelines$", seconds=30)
    started = time.monotonic()
    code, _, err = _gp(capsys, "upload", "--host", kfp.url)
    assert code == 1 and time.monotonic() - started < 10
    assert err.strip() == (
        f"ERROR [gpupipe upload] E_UNREACHABLE: KFP at {kfp.url} did not answer within 0.5 s "
        f"when asked to list pipelines named 'gpupipe-training' ({cluster.PORT_FORWARD_HINT})"
    )


@pytest.mark.parametrize(
    "command", ["upload --version v2", "run --version v2 --param data_uri=x", "schedule --list"]
)
def test_a_server_repeating_its_page_token_stops_with_one_line(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """The old loop asked for the same page for as long as the server answered that token (a
    version looked up by name reads every page of the pipeline's versions)."""
    uploaded.page_tokens = ["again"] * 300
    argv = [*command.split(), "--host", uploaded.url]
    code, _, err = _gp(capsys, *argv)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith(f"ERROR [gpupipe {command.split()[0]}] E_SERVER: KFP at {uploaded.url}")
    assert "answered a page token it had already given" in line
    assert len(uploaded.calls("GET")) < 10
    assert uploaded.runs == {}


def test_a_listing_stops_after_max_pages(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "MAX_PAGES", 5)
    uploaded.page_tokens = [f"p{i}" for i in range(300)]
    code, _, err = _gp(capsys, "schedule", "--list", "--host", uploaded.url)
    assert code == 1
    assert "E_SERVER: KFP at" in err and "still had more pages after 5 pages of 100" in err
    assert len(uploaded.calls("GET", "/apis/v2beta1/recurringruns")) == 5


# -- item 6: a token out of ps, a private CA, server text through our filter, ids of their shape --


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_token_file_sends_the_token_without_it_on_the_command_line(
    kfp: FakeKfp,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    how: str,
) -> None:
    kfp.token = TOKEN
    if how == "file":
        path = tmp_path / "token"
        path.write_text(TOKEN + "\n")
        flag = str(path)
    else:
        monkeypatch.setattr("sys.stdin", io.StringIO(TOKEN + "\n"))
        flag = "-"
    argv = ["upload", "--host", kfp.url, "--token-file", flag]
    code, out, err = _gp(capsys, *argv)
    assert code == 0, err
    assert TOKEN not in " ".join(argv) + out + err
    assert {r.headers.get("authorization") for r in kfp.requests} == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("extra", "code", "start"),
    [
        (["--token", TOKEN, "--token-file", "-"], "E_PARAM", "pass one of --token and"),
        (["--token-file", "/nonexistent/token"], "E_AUTH", "cannot read the token file"),
    ],
    ids=["both", "missing-file"],
)
def test_a_token_file_that_cannot_be_used_is_one_line_before_any_request(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], extra: list[str], code: str, start: str
) -> None:
    rc, _, err = _gp(capsys, "upload", "--host", kfp.url, *extra)
    assert rc == 2 and kfp.requests == []
    (line,) = err.strip().splitlines()
    assert line.startswith(f"ERROR [gpupipe upload] {code}: {start}")


@pytest.fixture
def tls_kfp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[FakeKfp, Path]]:
    monkeypatch.setattr(cluster, "BACKOFF_S", 0.01)
    monkeypatch.delenv(cluster_auth.TOKEN_PATH_ENV, raising=False)
    ca, cert, key = private_ca(tmp_path)
    for fake in serve(tls=(cert, key)):
        yield fake, ca


def test_ca_cert_trusts_a_kfp_behind_a_private_ca(
    tls_kfp: tuple[FakeKfp, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kfp, ca = tls_kfp
    kfp.token = TOKEN
    token = tmp_path / "token"
    token.write_text(TOKEN)
    argv = ["upload", "--host", kfp.url, "--token-file", str(token)]
    code, _, err = _gp(capsys, *argv)
    assert code == 1 and kfp.requests == []
    (line,) = err.strip().splitlines()
    assert line.startswith(f"ERROR [gpupipe upload] E_UNREACHABLE: cannot reach KFP at {kfp.url}")
    assert "cannot be verified (a private CA? pass its certificate with --ca-cert FILE)" in line
    code, out, err = _gp(capsys, *argv, "--ca-cert", str(ca))
    assert code == 0, err
    assert "created pipeline and version" in out
    assert {r.headers.get("authorization") for r in kfp.requests} == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("host", "pem", "message"),
    [
        ("http://localhost:8888", "ca", "--ca-cert applies to https:// hosts only"),
        ("https://localhost:8888", "not-pem", "--ca-cert cannot be read as PEM CA certificates"),
        ("https://localhost:8888", "missing", "--ca-cert cannot be read as PEM CA certificates"),
    ],
    ids=["http", "not-pem", "missing"],
)
def test_a_ca_cert_that_cannot_be_used_is_one_e_param_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, host: str, pem: str, message: str
) -> None:
    path = tmp_path / "ca.pem"
    if pem == "ca":
        path = private_ca(tmp_path)[0]
    elif pem == "not-pem":
        path.write_text("not a certificate\n")
    code, _, err = _gp(capsys, "upload", "--host", host, "--ca-cert", str(path))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith(f"ERROR [gpupipe upload] E_PARAM: {message}")
    assert line.endswith(f"({path})")


_ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m"


def test_server_text_reaches_the_terminal_only_through_the_printable_filter(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task's error and a pod's reason are the server's words: their control sequences
    (retitle the terminal, clear it) are escaped as in our own error lines."""
    uploaded.run_script = RunScript(
        states=["PENDING", "RUNNING", "RUNNING", "FAILED"],
        failed_task="train",
        error=f"OOM{_ESCAPES}",
        pending={"exit-handler-1.train(0).executor(0)": f"Unschedulable:{_ESCAPES} no GPU"},
    )
    code, out, err = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=x", "--wait", "--timeout", "30"
    )
    assert code == 1
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "step train waits: Unschedulable:\\x1b]0;owned\\x07\\x1b[2J" in out
    assert err.startswith("ERROR [gpupipe run] E_RUN_FAILED:")
    assert "failed task: train: OOM\\x1b]0;owned\\x07" in err


def test_a_run_id_that_is_not_a_uuid_is_not_followed(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    uploaded.next_run_id = "../../../../etc"
    code, out, err = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=x", "--wait", "--timeout", "30"
    )
    assert code == 1 and "started run" not in out
    (line,) = err.strip().splitlines()
    assert line.startswith(
        f"ERROR [gpupipe run] E_SERVER: KFP at {uploaded.url} answered the new run's id as "
        "'../../../../etc', not a UUID"
    )
    assert uploaded.calls("GET", "/apis/v2beta1/runs/") == []


@pytest.mark.parametrize(
    ("root", "run_id", "why"),
    [
        ("{tmp}", "0b5e8a52-8d4e-4c1a-9f3e-2a7c1d9e6b10", "a pipeline root of '{tmp}'"),
        ("file://{tmp}", "0b5e8a52-8d4e-4c1a-9f3e-2a7c1d9e6b10", "a pipeline root of 'file://"),
        ("minio://mlpipeline/v2", "../../{tmp}/gpupipe-training/x", "a run id of '../../"),
    ],
    ids=["local-path", "file-uri", "run-id-path"],
)
def test_a_pipeline_root_or_run_id_from_the_server_never_reads_local_files(
    tmp_path: Path, root: str, run_id: str, why: str
) -> None:
    import kfp_server_api as kapi

    from pipelines.cluster_summary import run_summary

    planted = tmp_path / "gpupipe-training" / "0b5e8a52-8d4e-4c1a-9f3e-2a7c1d9e6b10"
    (planted / "evaluate" / "1").mkdir(parents=True)
    (planted / "evaluate" / "1" / "metrics").write_text('{"accuracy": 0.99}')
    run = kapi.V2beta1Run(
        run_id=run_id.format(tmp=tmp_path),
        state="SUCCEEDED",
        runtime_config=kapi.V2beta1RuntimeConfig(pipeline_root=root.format(tmp=tmp_path)),
    )
    summary = run_summary(run, pipeline_name="gpupipe-training", link="l")
    assert "metrics" not in summary
    assert summary["artifacts_error"].startswith("not read: KFP answered ")
    assert why.format(tmp=tmp_path) in summary["artifacts_error"]


# -- item 7: no secret reaches KFP's stored parameters --------------------------------------------

SECRET = "hunter2-supersecret"


@pytest.mark.parametrize("command", ["run", "schedule"])
@pytest.mark.parametrize(
    ("param", "owner", "start"),
    [
        (
            f"data_uri=s3://AKIAEXAMPLE:{SECRET}@bucket/churn.parquet",
            "data_uri",
            "data_uri must not hold the store's keys (KEY:SECRET@ in 's3://***:***@bucket/",
        ),
        (
            f'job_env={{"NCCL_DEBUG": "INFO", "HF_TOKEN": "{SECRET}"}}',
            "job_env",
            "job_env must not carry a secret as a plain value",
        ),
        (
            f'train_config_json={{"cluster.env": {{"WANDB_API_KEY": "{SECRET}"}}}}',
            "train_config_json",
            "train_config_json: train.cluster.env must not carry a secret as a plain value",
        ),
        (
            f'train_config_json={{"cluster.env.DB_PASSWORD": "{SECRET}"}}',
            "train_config_json",
            "train_config_json: train.cluster.env must not carry a secret as a plain value",
        ),
        (
            f'hyperparams_json={{"cluster.env": {{"GITHUB_TOKEN": "{SECRET}"}}}}',
            "hyperparams_json",
            "hyperparams_json: train.cluster.env must not carry a secret as a plain value",
        ),
        (
            f'job_annotations={{"password": "{SECRET}"}}',
            "job_annotations",
            'job_annotations holds a credential (\'{"password": "***"}\')',
        ),
    ],
    ids=[
        "data-uri-keys",
        "job-env",
        "train-config-env",
        "train-config-env-key",
        "hyperparams",
        "json-password",
    ],
)
def test_a_secret_in_a_parameter_is_refused_before_any_request(
    kfp: FakeKfp,
    capsys: pytest.CaptureFixture[str],
    command: str,
    param: str,
    owner: str,
    start: str,
) -> None:
    """KFP stores parameters with the run and shows them in pod arguments; ``cluster.env`` lands
    as a plain ``value:`` in the job's pod spec. Refused in one line naming the parameter and
    how a secret goes in instead, never repeating it."""
    argv = [command, "--host", kfp.url, "--param", param]
    if not param.startswith("data_uri="):
        argv += ["--param", "data_uri=s3://bucket/churn.parquet"]
    if command == "schedule":
        argv += ["--cron", "0 0 3 * * *", "--name", "nightly"]
    code, out, err = _gp(capsys, *argv)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith(f"ERROR [gpupipe {command}] E_PARAM: {start}"), line
    assert "secretKeyRef" in line and line.endswith(f"({owner})")
    assert SECRET not in out + err
    assert kfp.requests == []


def test_job_env_without_secret_names_is_sent(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"NCCL_DEBUG": "INFO", "TOKENIZERS_PARALLELISM": "false", "NCCL_SOCKET_IFNAME": "eth0"}
    code, _, err = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=s3://b/d.parquet",
        "--param", f"job_env={json.dumps(env)}",
    )  # fmt: skip
    assert code == 0, err
    body = json.loads(uploaded.calls("POST", "/apis/v2beta1/runs")[-1].body)
    assert body["runtime_config"]["parameters"]["job_env"] == env
