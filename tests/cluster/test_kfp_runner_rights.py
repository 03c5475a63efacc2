"""What a KFP run's pods may do with the API (issue 60, item 1): the `pipeline-runner` account
that every run pod uses holds only what KFP's driver and launcher, Argo's executor and gpupipe's
launchers call. Upstream's Role let any run read every Secret of `kubeflow` (the database's root
password, MLflow's and Katib's accounts), exec into pods and edit Deployments and Services; with
standalone KFP's unauthenticated API, any pod could start such a run. Asked of the real API
server (`kubectl auth can-i --as`), after KFP and manifests/rbac are installed; every other KFP
test (the pipeline, the UI's runs, a plain KFP SDK pipeline) runs under these rights."""

from __future__ import annotations

import pytest

from tests.cluster import kube

RUNNER = "system:serviceaccount:kubeflow:pipeline-runner"

ALLOWED = [
    # KFP's driver and launcher: the step's own pod, the launcher's ConfigMap, the store's keys.
    ("get", "pods"),
    ("get", "configmaps/kfp-launcher"),
    ("get", "secrets/mlpipeline-minio-artifact"),
    # Argo's executor: the step's outputs.
    ("create", "workflowtaskresults.argoproj.io"),
    # gpupipe's launchers and tune step (manifests/rbac).
    ("create", "pytorchjobs.kubeflow.org"),
    ("create", "trainjobs.trainer.kubeflow.org"),
    ("create", "experiments.kubeflow.org"),
    ("list", "trials.kubeflow.org"),
    ("get", "pods/log"),
    # Their one cluster-scoped call: the nodes' allocatable GPUs, read before a GPU job is made.
    ("list", "nodes"),
]

REFUSED = [
    ("get", "secrets/mysql-secret"),
    ("get", "secrets/mlflow-auth"),
    ("get", "secrets/katib-mysql-secrets"),
    ("list", "secrets"),
    ("create", "pods/exec"),
    ("create", "pods"),
    ("get", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("delete", "services"),
    ("create", "services"),
    ("get", "configmaps/pipeline-install-config"),
    ("create", "persistentvolumeclaims"),
    ("create", "jobs.batch"),
    ("update", "workflows.argoproj.io"),
    ("create", "notebooks.kubeflow.org"),
    ("create", "tfjobs.kubeflow.org"),
    ("create", "trials.kubeflow.org"),
    ("create", "suggestions.kubeflow.org"),
    ("patch", "nodes"),
    ("delete", "nodes"),
]


def _can(verb: str, what: str) -> str:
    out = kube.kubectl("auth", "can-i", verb, what, "-n", "kubeflow", "--as", RUNNER, check=False)
    return out.stdout.strip()


@pytest.mark.parametrize(("verb", "what"), ALLOWED, ids=[f"{v}-{w}" for v, w in ALLOWED])
def test_kfp_runner_may_do_what_a_run_needs(verb: str, what: str) -> None:
    assert _can(verb, what) == "yes", (verb, what)


@pytest.mark.parametrize(("verb", "what"), REFUSED, ids=[f"{v}-{w}" for v, w in REFUSED])
def test_kfp_runner_may_not_read_secrets_exec_or_edit_workloads(verb: str, what: str) -> None:
    # Before the fix: "yes" to every Secret, pods/exec, Deployments and deleting Services.
    assert _can(verb, what) == "no", (verb, what)
