"""Where the Prometheus endpoint listens (issue 39, item 5): this machine only by default, every
interface of a pod in Kubernetes, and the URL the run prints is where it really listens."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest
import torch

from trainer.config import MetricsConfig
from trainer.distributed.dist import DistContext
from trainer.training.prom import TrainingMetrics

CTX = DistContext(
    rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
    device=torch.device("cpu"), backend=None,
)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _other_address() -> str | None:
    """An address of this machine other than loopback, if it has one."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if address.startswith("127.") else address


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status == 200 and b"training_restarts" in resp.read()
    except OSError:
        return False


@pytest.fixture
def endpoint(request: pytest.FixtureRequest) -> Iterator[TrainingMetrics]:
    metrics = TrainingMetrics(MetricsConfig(port=_free_port(), **request.param), CTX).start()
    try:
        yield metrics
    finally:
        metrics._server.shutdown()
        metrics._server.server_close()


@pytest.mark.parametrize("endpoint", [{}], indirect=True, ids=["default"])
def test_locally_the_endpoint_listens_on_loopback_only_and_says_so(
    endpoint: TrainingMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert endpoint._server.server_address[0] == "127.0.0.1"
    assert endpoint.url == f"http://127.0.0.1:{endpoint.cfg.port}/metrics"
    assert _answers(endpoint.url)
    other = _other_address()
    if other is not None:
        assert not _answers(f"http://{other}:{endpoint.cfg.port}/metrics")


@pytest.fixture
def in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.127.0.1")


@pytest.mark.parametrize("endpoint", [{}], indirect=True, ids=["default"])
def test_in_a_pod_the_endpoint_listens_where_a_scrape_reaches_it(
    in_a_pod: None, endpoint: TrainingMetrics
) -> None:
    assert endpoint._server.server_address[0] == "0.0.0.0"
    other = _other_address()
    shown = other or "0.0.0.0"
    assert endpoint.url == f"http://{shown}:{endpoint.cfg.port}/metrics"
    if other is not None:
        assert _answers(endpoint.url)  # the printed URL is the pod's address, and it answers


@pytest.mark.parametrize("endpoint", [{"host": "127.0.0.1"}], indirect=True, ids=["loopback"])
def test_an_explicit_host_wins_in_a_pod_too(in_a_pod: None, endpoint: TrainingMetrics) -> None:
    assert endpoint._server.server_address[0] == "127.0.0.1"
    assert endpoint.url == f"http://127.0.0.1:{endpoint.cfg.port}/metrics"


@pytest.mark.parametrize(
    ("device", "hours_per_hour"), [("cuda", 2.0), ("cpu", 0.0)], ids=["cuda", "cpu"]
)
def test_gpu_hours_count_only_while_gpus_are_driven(
    device: str, hours_per_hour: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Item 13 of issue 60: a CPU run of a config that holds 2 GPUs counted 2 GPU-hours an hour.
    ctx = DistContext(
        rank=0, local_rank=0, world_size=2, local_world_size=2, node_rank=0,
        device=torch.device(device), backend=None,
    )  # fmt: skip
    metrics = TrainingMetrics(MetricsConfig(gpu_hour_usd=3.0, gpus=2), ctx)
    now = [1000.0]
    monkeypatch.setattr("trainer.training.prom.time.monotonic", lambda: now[0])
    metrics._last = now[0]
    now[0] += 3600.0
    metrics._tick()
    assert metrics.gpu_hours._value.get() == pytest.approx(hours_per_hour)
    assert metrics.cost is not None
    assert metrics.cost._value.get() == pytest.approx(3.0 * hours_per_hour)
