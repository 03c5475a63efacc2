"""Job specs for the launcher tests, from flat settings: the run's, the cluster's, a namespace."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.launch import TrainingRun
from trainer.launch.jobspec import ClusterConfig, JobSpec

NS = "team-a"
BASE: dict[str, Any] = {
    "job_name": "gpupipe-train-abc123",
    "namespace": NS,
    "image": "ghcr.io/gpupipe/trainer-cuda:0.1.0",
    "config_uri": "s3://bucket/runs/r1/worker-config.json",
    # No requests or limits unless a test sets them (the step's defaults are tested with it).
    "cpu_request": None,
    "cpu_limit": None,
    "memory_request": None,
    "memory_limit": None,
}
RUN_FIELDS = {f.name for f in dataclasses.fields(TrainingRun)}


def job_spec(**settings: Any) -> JobSpec:
    """A job spec from ``BASE`` and ``settings``, each going to the run or the cluster settings
    that has a field of its name."""
    flat = {**BASE, **settings}
    namespace = flat.pop("namespace")
    run = TrainingRun(**{k: flat.pop(k) for k in list(flat) if k in RUN_FIELDS})
    return JobSpec(namespace=namespace, run=run, cluster=ClusterConfig(**flat))
