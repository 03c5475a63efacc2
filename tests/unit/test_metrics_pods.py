"""The job's metrics endpoint as its pods declare it (checked against the upstream CRDs), and
the GPU collector's samples (NVML faked: this machine has no GPU)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers import assert_valid_job, assert_valid_trainjob, needs_crd, needs_trainjob_crd
from tests.unit.specs import job_spec
from trainer.launch.jobspec import METRICS_PORT, ClusterConfig
from trainer.launch.pytorchjob import build_pytorchjob
from trainer.launch.trainjob import build_trainjob
from trainer.steps.train import TrainStepConfig
from trainer.training.gpu_stats import GpuCollector

SCRAPE = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(METRICS_PORT),
    "prometheus.io/path": "/metrics",
}


def _pytorchjob_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]


@needs_crd
def test_every_pytorchjob_pod_declares_the_port_and_carries_the_annotations() -> None:
    job = build_pytorchjob(job_spec(metrics_port=METRICS_PORT, nnodes=3, gpus_per_node=8))
    assert_valid_job(job)
    pods = _pytorchjob_pods(job)
    assert len(pods) == 2  # Master and Worker
    for pod in pods:
        assert SCRAPE.items() <= pod["metadata"]["annotations"].items()
        (container,) = pod["spec"]["containers"]
        assert {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"} in container[
            "ports"
        ]
        assert container["ports"][0]["name"] == "pytorchjob-port"  # the operator's, still first


@needs_trainjob_crd
def test_every_trainjob_pod_carries_the_annotations() -> None:
    job = build_trainjob(job_spec(metrics_port=METRICS_PORT, nnodes=2, gpus_per_node=4))
    assert_valid_trainjob(job)
    (patch,) = job["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    template = rjob["template"]["spec"]["template"]
    assert SCRAPE.items() <= template["metadata"]["annotations"].items()


def test_without_an_endpoint_no_pod_claims_one() -> None:
    job = build_pytorchjob(job_spec())
    for pod in _pytorchjob_pods(job):
        assert "prometheus.io/scrape" not in pod["metadata"]["annotations"]
        assert [p["name"] for p in pod["spec"]["containers"][0]["ports"]] == ["pytorchjob-port"]


def test_gpupipes_scrape_annotations_win_over_the_users() -> None:
    job = build_pytorchjob(
        job_spec(metrics_port=9100, annotations={"prometheus.io/port": "1", "team": "a"})
    )
    annotations = _pytorchjob_pods(job)[0]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9100" and annotations["team"] == "a"


@pytest.mark.parametrize(
    ("launcher", "port"),
    [("pytorchjob", METRICS_PORT), ("trainjob", METRICS_PORT), ("local", None)],
)
def test_the_train_step_gives_cluster_jobs_an_endpoint(launcher: str, port: int | None) -> None:
    cfg = TrainStepConfig(launcher=launcher, cluster=ClusterConfig(image="img:1"))  # type: ignore[arg-type]
    assert cfg.training_run(job_name="j", config_uri="s3://b/c.json").metrics_port == port


class _FakeNvml:
    class NVMLError(Exception):
        pass

    def __init__(self, broken: set[str]) -> None:
        self.broken = broken

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        if handle in self.broken:
            raise self.NVMLError("GPU is lost")
        return SimpleNamespace(gpu={"h0": 97, "h1": 12}[handle])

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(used=2**30, total=80 * 2**30)

    def nvmlShutdown(self) -> None:
        pass


def test_gpu_values_are_labelled_by_rank_and_a_lost_gpu_is_left_out() -> None:
    collector = GpuCollector(_FakeNvml(broken={"h1"}), {8: "h0", 9: "h1"})  # node 1 of 8 GPUs
    families = {f.name: f for f in collector.collect()}
    assert set(families) == {"gpu_utilization", "gpu_memory_used_bytes", "gpu_memory_total_bytes"}
    util = families["gpu_utilization"]
    assert util.type == "gauge"
    assert [(s.labels, s.value) for s in util.samples] == [({"rank": "8"}, 97.0)]
    assert families["gpu_memory_total_bytes"].samples[0].value == 80 * 2**30


def test_no_gpu_no_collector() -> None:
    assert GpuCollector.for_node(node_rank=0, local_world_size=2) is None  # CPU: absent
