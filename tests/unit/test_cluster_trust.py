"""Issue 60, the command line: where ``gpupipe``'s requests and token go, how long it waits for
KFP, what of the server's text reaches a terminal, and what KFP is never given to store."""

from __future__ import annotations

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
