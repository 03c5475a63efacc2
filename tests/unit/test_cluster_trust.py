"""Issue 60, the command line: where ``gpupipe``'s requests and token go, how long it waits for
KFP, what of the server's text reaches a terminal, and what KFP is never given to store."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import urllib3

from pipelines import cluster, cluster_auth
from pipelines.cli import main
from tests.fakes.kfp_api import FakeKfp, serve
from trainer.base.errors import InputError

TOKEN = "s3cr3t-token-value"


@pytest.fixture
def kfp(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKfp]:
    monkeypatch.setattr(cluster, "BACKOFF_S", 0.01)
    monkeypatch.setattr(cluster, "MAX_POLL_S", 0.02)
    monkeypatch.delenv(cluster_auth.TOKEN_PATH_ENV, raising=False)
    yield from serve()


def _gp(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


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
    assert _gp(capsys, "upload", "--host", kfp.url)[0] == 0
    return kfp


def test_run_wait_is_bounded_by_its_timeout_when_kfp_stops_answering(
    uploaded: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stalled port-forward held ``run --wait --timeout N`` past N: each poll now gets no
    more than the time left (the read timeout alone is a minute)."""
    uploaded.stall("GET", r"/runs/", seconds=20)
    started = time.monotonic()
    code, out, err = _gp(
        capsys, "run", "--host", uploaded.url, "--param", "data_uri=x", "--wait", "--timeout", "1"
    )
    took = time.monotonic() - started
    assert code == 1 and took < 5, (took, err)
    (line,) = err.strip().splitlines()
    (run_id,) = uploaded.runs
    assert line.startswith(f"ERROR [gpupipe run] E_TIMEOUT: run {run_id} was never read: KFP")
    assert "within the 1 s of --timeout" in line and f"/#/runs/details/{run_id}" in line


def test_a_stalled_request_is_one_line_after_the_read_timeout(
    kfp: FakeKfp, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "READ_TIMEOUT_S", 0.5)
    kfp.stall("GET", r"/pipelines$", seconds=20)
    started = time.monotonic()
    code, _, err = _gp(capsys, "upload", "--host", kfp.url)
    assert code == 1 and time.monotonic() - started < 5
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
