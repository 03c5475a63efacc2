"""The train step's launcher tests that hold for either job kind, written once.

tests/cluster/test_pytorchjob.py and test_trainjob.py each name their kind's facts in a
:class:`JobKind` (the resource, the replica whose log counts the steps) and call these helpers
for what the two launchers must do alike: train and store the model, fail once on bad input,
honour the deadline, clean up on SIGTERM, re-attach after a restart, run under restricted Pod
Security. What only one kind has (PyTorchJob's restart events, the TrainJob's conditions, JobSet's
restarts, the runtime patch) stays in its own test module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tests.cluster import kube
from tests.cluster.kube import JOB_TIMEOUT_S, Launch, kill_container, launch, weights
from trainer.base import storage
from trainer.models.export import load_model


@dataclass(frozen=True)
class JobKind:
    """What a launcher's tests need to know of its job kind."""

    kind: str
    """The job's resource (``pytorchjob``, ``trainjob``): kubectl's name and kube.JOB_KINDS' key."""
    title: str
    """How a wait names the job (``TrainJob <name> and its pods to be deleted``)."""
    lead: str
    """How a wait names the replica that logs the steps (``the master``, ``node 0``)."""
    lead_steps: Callable[[str, str], int]
    """``(namespace, job)``: the highest training step the lead replica's log reports."""
    config: Callable[..., dict[str, Any]]
    """``(image, **over)``: the train step's config for a 2-node CPU job of this kind
    (kube.train_config's ``section__field=value`` overrides)."""

    def get(self, namespace: str, job: str) -> dict[str, Any]:
        return kube.get_json(self.kind, "-n", namespace, job)

    def delete(self, namespace: str, job: str) -> None:
        kube.kubectl("delete", self.kind, "-n", namespace, job)

    def wait_gone(self, run: Launch) -> None:
        """Wait until the run's job and its pods are deleted."""
        kube.wait_until(
            f"{self.title} {run.job} and its pods to be deleted",
            lambda: kube.job_gone(run.namespace, run.job, self.kind),
            120,
        )

    def wait_training(self, run: Launch) -> None:
        """Wait until the lead replica logs its first training step."""
        kube.wait_until(
            f"{self.lead} to train",
            lambda: self.lead_steps(run.namespace, run.job) >= 1,
            JOB_TIMEOUT_S,
            interval=2,
        )


def run_to_the_end(namespace: str, image: str, dataset: str, cfg: dict[str, Any]) -> Launch:
    """A launcher run to the end, uninterrupted, its container's exit kept (``Launch.exit``)."""
    run = launch(namespace, image, dataset, cfg)
    run.exit = run.done()
    return run


def finished(run: Launch) -> str:
    """Wait for the launcher; it must exit 0. Its log."""
    done = run.done()
    log = run.log()
    assert done["exitCode"] == 0, log[-3000:]
    return log


def check_trained_and_stored(reference: Launch) -> None:
    """The uninterrupted run: the launcher exited 0, the lead replica's JSON log lines (loss per
    step) reached the launcher's own log, and the model is stored with its metrics."""
    log = reference.log()
    assert reference.exit is not None
    assert reference.exit["exitCode"] == 0, f"launcher failed:\n{log[-3000:]}"
    assert re.search(r'"step": \d+.*"loss"', log), log[-3000:]
    loaded = load_model(reference.model)
    assert sum(p.numel() for p in loaded.module.parameters()) > 0
    assert storage.exists(storage.join(reference.model, "metrics.json"))


def launch_on_bad_input(
    kind: JobKind, namespace: str, image: str, dataset: str
) -> tuple[Launch, str]:
    """Launch (the job kept) on a dataset whose record is fine (the launcher accepts it) but
    whose training split is not Parquet: the workers refuse it with exit 2, which must not be
    retried; the step ends with the workers' error line. The run and the launcher's log."""
    bad = f"minio://{kube.BUCKET}/{namespace}/bad-dataset"
    for name in ("schema.json", "stats.json", "val.parquet", "test.parquet"):
        storage.write_bytes(f"{bad}/{name}", storage.read_bytes(f"{dataset}/{name}"))
    storage.write_bytes(f"{bad}/train.parquet", b"not parquet")
    cfg = kind.config(image)
    cfg["cluster"]["on_exit"] = "keep"
    run = launch(namespace, image, bad, cfg)
    done = run.done()
    log = run.log()
    assert done["exitCode"] == 2, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith("ERROR [train] E_"), last
    assert "train.parquet" in log
    return run, log


def check_failed_once_and_delete(kind: JobKind, run: Launch) -> None:
    """Every container of the failed job exited 2 and was never restarted; then the kept job
    is deleted."""
    for pod in kube.job_pods(run.namespace, run.job, kind.kind):
        for cs in pod["status"].get("containerStatuses", []):
            assert cs["restartCount"] == 0, f"{pod['metadata']['name']} was restarted"
            assert cs["state"]["terminated"]["exitCode"] == 2
    kind.delete(run.namespace, run.job)


def force_delete_pod(namespace: str, pod: str) -> None:
    """A replica's pod lost at once, as with a node gone."""
    kube.kubectl("delete", "pod", "-n", namespace, pod, "--grace-period=0", "--force")


def check_resumed_to_the_reference(run: Launch, log: str, reference: Launch) -> None:
    """The run resumed from a checkpoint (not from step 0), to the uninterrupted run's weights."""
    assert re.search(r"resum", log, re.IGNORECASE), log[-3000:]
    ours, theirs = weights(run.model), weights(reference.model)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), f"{name} differs from the uninterrupted run"


def check_deadline_deletes_the_job(kind: JobKind, namespace: str, image: str, dataset: str) -> None:
    """A run (500 epochs) past its ``timeout_s`` (45 s): the step fails naming the deadline; the
    job and its pods go."""
    cfg = kind.config(image, train__epochs=500)
    cfg["timeout_s"] = 45
    run = launch(namespace, image, dataset, cfg)
    done = run.done()
    log = run.log()
    assert done["exitCode"] != 0, log[-3000:]
    assert re.search(r"deadline|timed out|timeout", log.strip().splitlines()[-1], re.I), log[-2000:]
    kind.wait_gone(run)


def sigterm_while_training(kind: JobKind, run: Launch) -> None:
    """Once the lead replica trains, delete the launcher's pod: the kubelet's SIGTERM."""
    kind.wait_training(run)
    kube.kubectl("delete", "pod", "-n", run.namespace, run.pod, "--wait=false")  # SIGTERM


def check_a_restarted_launcher_adopts_its_job(
    kind: JobKind, namespace: str, image: str, dataset: str
) -> None:
    """The launcher (of a 12-epoch job) killed while its job trains (exit 137, the pod and so the
    job stay); a new launcher of the same job name and base adopts the job (same uid, no second
    job) and ends with the model stored."""
    cfg = kind.config(image, train__epochs=12)
    first = launch(namespace, image, dataset, cfg)
    kind.wait_training(first)
    uid = kind.get(namespace, first.job)["metadata"]["uid"]
    kill_container(namespace, first.pod)
    assert first.done(60)["exitCode"] == 137
    second = launch(namespace, image, dataset, cfg, job=first.job, base=first.base)
    finished(second)
    assert kind.get(namespace, first.job)["metadata"]["uid"] == uid
    assert [j["metadata"]["name"] for j in kube.jobs(namespace, kind.kind)].count(first.job) == 1
    assert storage.exists(storage.join(second.model, "model.safetensors"))


def check_restricted_is_enforced_and_admitted(namespace: str, reference: Launch) -> None:
    """The namespace really refuses what restricted Pod Security forbids (a privileged pod), and
    admitted the reference run's launcher and both replicas as they are (it ended with exit 0)."""
    bad = kube.launcher_pod("privileged-probe", namespace, kube.BUSYBOX_IMAGE, [])
    bad["spec"]["securityContext"] = {}
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    proc = kube.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert proc.returncode != 0 and "violates PodSecurity" in proc.stderr, proc.stderr
    assert reference.exit is not None and reference.exit["exitCode"] == 0
