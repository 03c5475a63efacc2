"""A real 2-process torchrun whose Prometheus endpoint is scraped while it trains, and parsed by
``prometheus_client``'s own text parser: every metric there, with its type and labels, and
values that move."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import ROOT, env, make_config, torchrun_cmd, write_data

pytestmark = pytest.mark.integration

EXPECTED_TYPES = {
    "training_step": "gauge",
    "training_epoch": "gauge",
    "training_loss": "gauge",
    "learning_rate": "gauge",
    "training_samples_per_second": "gauge",
    "training_elapsed_seconds": "gauge",
    "training_restarts": "gauge",
    "training_resumed_from_step": "gauge",
    "training_duration_seconds": "histogram",
    "checkpoint_size_mb": "histogram",
    "gpu_hours": "counter",
    "cost_usd": "counter",
}
GPU_ONLY = ("gpu_utilization", "gpu_memory_used_bytes", "gpu_memory_total_bytes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(url: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {f.name: f for f in text_string_to_metric_families(text)}


def _has_sample(families: dict[str, object], name: str) -> bool:
    family = families.get(name)
    return family is not None and any(s.name == name for s in family.samples)  # type: ignore[attr-defined]


def _value(families: dict[str, object], name: str, sample_name: str | None = None) -> float:
    samples = families[name].samples  # type: ignore[attr-defined]
    (sample,) = [s for s in samples if s.name == (sample_name or name)]
    return float(sample.value)


def test_two_ranks_serve_metrics_that_move_while_training(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    data = write_data(tmp_path / "data")
    port = _free_port()
    cfg = make_config(
        tmp_path,
        "run",
        data=data,
        train={"epochs": 400, "max_steps": 400, "log_every_steps": 4},
        checkpoint={"every_steps": 100},
        metrics={"port": port, "host": "127.0.0.1", "gpu_hour_usd": 3.6, "gpus": 2},
    )
    url = f"http://127.0.0.1:{port}/metrics"
    proc = subprocess.Popen(
        torchrun_cmd(cfg, 2), env=env(), cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    scrapes: list[dict[str, object]] = []
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            families = _scrape(url)
            # rank 0 sets the training values from its first log line on
            if families is not None and _has_sample(families, "training_loss"):
                scrapes.append(families)
            time.sleep(0.25)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert len(scrapes) >= 3, f"scraped {len(scrapes)} times while training\n{err[-2000:]}"

    first, last = scrapes[0], scrapes[-1]
    for name, kind in EXPECTED_TYPES.items():
        assert name in last, f"{name} missing"
        assert last[name].type == kind, (name, last[name].type)  # type: ignore[attr-defined]
    for name in GPU_ONLY:  # CPU: absent, not zero
        assert name not in last
    buckets = {
        s.labels["le"]
        for s in last["training_duration_seconds"].samples  # type: ignore[attr-defined]
        if s.name.endswith("_bucket")
    }
    assert buckets == {"600.0", "3600.0", "14400.0", "86400.0", "+Inf"}
    assert _value(last, "training_step") > _value(first, "training_step")
    losses = {_value(s, "training_loss") for s in scrapes}
    assert len(losses) > 1
    assert _value(last, "checkpoint_size_mb", "checkpoint_size_mb_count") >= 2
    # Two CPU processes: however many GPUs the config says the job holds, none was driven, so
    # no GPU-hour is counted or priced (a laptop's run once reported GPU-hours it never used).
    assert _value(last, "gpu_hours", "gpu_hours_total") == 0
    assert _value(last, "cost_usd", "cost_usd_total") == 0

    lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    start = next(r for r in lines if r["event"] == "start")
    assert start["metrics_url"] == url
    # The final values outlive the endpoint: the model's metadata has them.
    meta = json.loads((cfg.parent / "model" / "model.json").read_text())
    run = meta["extra"]["run"]
    assert (run["device"], run["processes"], run["gpus"]) == ("cpu", 2, 0), run
    assert run["gpu_hour_usd"] == 3.6 and run["gpu_hours"] == 0 and run["cost_usd"] == 0
    assert run["training_duration_seconds"] > 0
    assert _scrape(url) is None  # the endpoint is gone with the job
