"""The champion's download is bounded (issue 60, item 8): a listing, a Content-Length or the
bytes as they stream past ``max_champion_bytes`` end in one E_MODEL line, with nothing left.

The server is a real HTTP server on 127.0.0.1 that answers as MLflow's artifact proxy does
(``/api/2.0/mlflow-artifacts/artifacts``): a listing, then each file, and it can lie.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from trainer.base.errors import InputError
from trainer.registry_files import SizeLimit, download_bounded

ROOT = "/api/2.0/mlflow-artifacts/artifacts"
RUN = "1/abc/artifacts/model"
SETTING = "pipeline parameter max_champion_bytes"


@dataclass
class Served:
    """What the fake artifact proxy serves and how."""

    files: dict[str, bytes]
    listed: dict[str, int] = field(default_factory=dict)
    """A size to list instead of the real one (a listing that lies)."""
    declared: str = "honest"
    """``honest``: Content-Length is the body's; ``none``: chunked, no length; ``gzip``: the
    body gzip-encoded (Content-Length the compressed size)."""
    repeat: int = 1
    """Send a ``.bin`` file's bytes this many times (a body longer than listed)."""
    file_gets: list[str] = field(default_factory=list)
    sent: int = 0


def _handler(served: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == ROOT:
                prefix = parse_qs(url.query)["path"][0].rstrip("/") + "/"
                rel = [p for p in served.files if (RUN + "/" + p).startswith(prefix)]
                sizes = {p: served.listed.get(p, len(served.files[p])) for p in rel}
                listing = [{"path": p, "is_dir": False, "file_size": n} for p, n in sizes.items()]
                self._json({"files": listing})
                return
            rel = url.path.removeprefix(f"{ROOT}/{RUN}/")
            served.file_gets.append(rel)
            body = served.files[rel]
            repeat = served.repeat if rel.endswith(".bin") else 1
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            if served.declared == "gzip":
                body = gzip.compress(body * repeat)
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                chunks = [body]
            elif served.declared == "honest":
                self.send_header("Content-Length", str(len(body) * repeat))
                self.end_headers()
                chunks = [body] * repeat
            else:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunks = [b"%x\r\n%s\r\n" % (len(body), body)] * repeat + [b"0\r\n\r\n"]
            try:
                for chunk in chunks:
                    self.wfile.write(chunk)
                    served.sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading: what a bounded download does

    return Handler


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Served]]:
    """A fake MLflow artifact proxy on 127.0.0.1; its tracking URI and what it serves (set
    ``served.files`` and the rest in the test)."""
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    served = Served(files={})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


def _download(uri: str, dst: Path, max_bytes: int) -> str:
    limit = SizeLimit(max_bytes, SETTING)
    return download_bounded(f"mlflow-artifacts:/{RUN}", str(dst), uri, limit)


def test_a_model_within_the_limit_downloads_whole(
    proxy: tuple[str, Served], tmp_path: Path
) -> None:
    uri, served = proxy
    served.files = {"model.json": b"{}", "sub/model.safetensors": b"w" * 5000}

    local = _download(uri, tmp_path, max_bytes=5002)

    assert local == str(tmp_path / "model")
    assert (tmp_path / "model" / "sub" / "model.safetensors").read_bytes() == b"w" * 5000
    assert (tmp_path / "model" / "model.json").read_bytes() == b"{}"


@pytest.mark.parametrize(
    ("listed", "declared", "repeat", "limit", "fetched", "verb"),
    [
        ({}, "honest", 1, 4096, False, "take 8002 bytes"),
        ({"big.bin": 10}, "honest", 1, 4096, True, "take 8002 bytes"),
        ({"big.bin": 10}, "none", 50_000, 4096, True, "reached"),
        # 80 MB of one byte, gzip-encoded: 78 KB on the wire, under the limit by its length.
        ({"big.bin": 10}, "gzip", 10_000, 1 << 20, True, "reached"),
        ({"big.bin": 10}, "honest", 50_000, 4096, True, "take 400000002 bytes"),
    ],
    ids=[
        "listing-over",
        "listing-lies-content-length-over",
        "chunked-stream-over",
        "gzip-bomb-stream-over",
        "content-length-over",
    ],
)
def test_a_model_over_the_limit_is_one_line_naming_the_limit_and_nothing_is_left(
    proxy: tuple[str, Served], tmp_path: Path,
    listed: dict[str, int], declared: str, repeat: int, limit: int, fetched: bool, verb: str,
) -> None:  # fmt: skip
    uri, served = proxy
    served.files = {"a.json": b"{}", "big.bin": b"x" * 8000}
    served.listed, served.declared, served.repeat = listed, declared, repeat

    with pytest.raises(InputError) as caught:
        _download(uri, tmp_path, max_bytes=limit)

    err = caught.value
    assert err.code == "E_MODEL"
    assert "\n" not in str(err)
    assert f"over max_champion_bytes {limit}" in err.message and verb in err.message, err.message
    assert f"({SETTING}=" in err.message
    assert not (tmp_path / "model").exists(), "a partial download is left"
    assert ("big.bin" in served.file_gets) == fetched
    # The client stopped reading: far less than the 400 MB the server would send.
    assert served.sent < 50 << 20, served.sent


def test_a_listing_of_a_path_outside_the_folder_is_refused(
    proxy: tuple[str, Served], tmp_path: Path
) -> None:
    uri, served = proxy
    served.files = {"../../escape": b"x"}

    with pytest.raises(Exception, match=r"escape|outside|Invalid path"):
        _download(uri, tmp_path / "dst", max_bytes=4096)

    assert not (tmp_path / "escape").exists()


def test_the_pipeline_and_the_component_default_to_the_library_bound() -> None:
    from components.evaluate import evaluate
    from pipelines.params import pipeline_parameters
    from trainer.registry_files import MAX_CHAMPION_BYTES

    assert pipeline_parameters()["max_champion_bytes"] == MAX_CHAMPION_BYTES
    assert evaluate.component_spec.inputs["max_champion_bytes"].default == MAX_CHAMPION_BYTES
