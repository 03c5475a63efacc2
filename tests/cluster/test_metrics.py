"""The training job's Prometheus endpoint on the real cluster (issue 29's cluster half): the train
step's pods carry the scrape annotations, the PyTorchJob's containers declare the port, and rank
0 serves ``/metrics`` on its pod IP while it trains, parsed by prometheus_client's own parser, for
both launchers. (No Prometheus server runs here: the node reaches pod IPs directly, as a
Prometheus in the cluster would.)"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster import kube
from tests.cluster.kube import GPUPIPE_RUNTIME, JOB_TIMEOUT_S, launch
from trainer.launch.jobspec import METRICS_PORT


def scrape(ip: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://{ip}:{METRICS_PORT}/metrics", timeout=3) as r:
            text = r.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict[str, Any], name: str) -> float:
    return float(families[name].samples[0].value)


def rank0_pod(namespace: str, job: str, kind: str) -> dict[str, Any] | None:
    for pod in kube.job_pods(namespace, job, kind):
        labels, annotations = pod["metadata"]["labels"], pod["metadata"].get("annotations") or {}
        first = (
            labels.get("training.kubeflow.org/job-role") == "master"
            if kind == "pytorchjob"
            else annotations.get("batch.kubernetes.io/job-completion-index") == "0"
        )
        if first and pod["status"].get("phase") == "Running" and pod["status"].get("podIP"):
            return pod
    return None


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_rank0_serves_its_metrics_on_its_pod_ip_while_it_trains(
    namespace: str, image: str, dataset: str, kind: str
) -> None:
    cfg = kube.train_config(image, kind, train__epochs=16)
    if kind == "trainjob":
        crd = kube.kubectl("get", "crd", "trainjobs.trainer.kubeflow.org", check=False)
        kube.need_addon("trainer", crd.returncode == 0, "Kubeflow Trainer's TrainJob CRD")
        cfg["cluster"]["runtime"] = GPUPIPE_RUNTIME
    run = launch(namespace, image, dataset, cfg)
    pod = kube.wait_until(
        "rank 0 to run", lambda: rank0_pod(namespace, run.job, kind), JOB_TIMEOUT_S, 1
    )
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"
    if kind == "pytorchjob":
        main = next(c for c in pod["spec"]["containers"] if c["name"] == "pytorch")
        assert {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"} in main[
            "ports"
        ]
    ip = pod["status"]["podIP"]

    def training(at_least: float) -> dict[str, Any] | None:
        got = scrape(ip)
        if got and "training_step" in got and value(got, "training_step") > at_least:
            return got
        return None

    first = kube.wait_until("a step on the endpoint", lambda: training(0), 300, 0.5)
    later = kube.wait_until(
        "the step to grow", lambda: training(value(first, "training_step")), 120, 0.5
    )
    assert first["training_duration_seconds"].type == "histogram"
    assert first["training_loss"].type == "gauge"
    assert value(later, "training_loss") != value(first, "training_loss")
    assert "gpu_utilization" not in later  # a CPU job: absent, not zero
    done = run.done()
    assert done["exitCode"] == 0, run.log()[-3000:]
