"""One verb less in the runner's Role (`manifests/rbac`) fails the train step, for both cluster
launchers, with one line naming the permission: the PyTorchJob and the TrainJob launcher each
in a namespace whose Role lacks one verb they need (create or get on their job, list on pods)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster import kube
from tests.cluster.conftest import delete_namespace, make_namespace, role
from tests.cluster.kube import GPUPIPE_RUNTIME, launch

JOBS = {
    "pytorchjob": ("kubeflow.org", "pytorchjobs"),
    "trainjob": ("trainer.kubeflow.org", "trainjobs"),
}


def train_config(image: str, kind: str) -> dict[str, Any]:
    """The train step's config for a 2-node CPU job of ``kind`` of the demo table."""
    cfg = kube.train_config(image, kind)
    if kind == "trainjob":
        cfg["cluster"]["runtime"] = GPUPIPE_RUNTIME
    return cfg


@pytest.mark.parametrize(
    ("kind", "group", "resource", "verb"),
    [
        (kind, *call)
        for kind, (group, plural) in JOBS.items()
        for call in ((group, plural, "create"), (group, plural, "get"), ("", "pods", "list"))
    ],
    ids=lambda v: str(v) or "core",
)
def test_one_verb_less_fails_with_a_line_naming_the_permission(
    image: str, dataset: str, kind: str, group: str, resource: str, verb: str
) -> None:
    ns = kube.unique("gpupipe-rbac")
    make_namespace(ns, role(rules_without=(group, resource, verb)))
    try:
        run = launch(ns, image, dataset, train_config(image, kind))
        done = run.done()
        log = run.log()
        assert done["exitCode"] != 0, log[-2000:]
        last = log.strip().splitlines()[-1]
        assert last.startswith("ERROR [train] E_"), last
        assert verb in last and resource in last, last
    finally:
        delete_namespace(ns)


def test_a_privileged_job_made_with_the_runners_token_runs_no_pod() -> None:
    """Issue 39: the runner's Role may create PyTorchJobs, so Pod Security on its namespace
    (manifests/pod-security: enforce baseline) is what stops a job from running a privileged
    pod: the job is created with the runner's identity, its pod is refused."""
    name = kube.unique("gpupipe-privileged")
    body = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "kubeflow"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "pytorch",
                                    "image": kube.BUSYBOX_IMAGE,
                                    "command": ["sleep", "60"],
                                    "securityContext": {"privileged": True},
                                }
                            ]
                        }
                    },
                }
            }
        },
    }
    runner = "--as=system:serviceaccount:kubeflow:pipeline-runner"
    try:
        made = kube.kubectl(runner, "create", "-f", "-", input=json.dumps(body), check=False)
        assert made.returncode == 0, made.stderr  # the Role allows the job itself

        def refused() -> str | None:
            events = kube.get_json("events", "-n", "kubeflow")["items"]
            for e in events:
                message = str(e.get("message") or "")
                if e["involvedObject"]["name"] == name and "violates PodSecurity" in message:
                    return message
            return None

        message = kube.wait_until("Pod Security's refusal of the job's pod", refused, 120, 2)
        assert 'violates PodSecurity "baseline:latest": privileged' in message, message
        assert kube.job_pods("kubeflow", name) == []
    finally:
        kube.kubectl("-n", "kubeflow", "delete", "pytorchjob", name, "--wait=false", check=False)
