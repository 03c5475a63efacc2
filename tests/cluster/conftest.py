"""Fixtures of the cluster tests: the test cluster of hack/cluster-up.sh, its object store, a
namespace per module that enforces restricted Pod Security and holds our RBAC, and the demo
dataset in the store.

Every test here carries the ``cluster`` marker and skips, with the reason, where no test cluster
answers (``make test-cluster`` brings one up first; where a piece cannot run on this machine,
cluster-up says why and the tests skip with that line).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.images import CPU_IMAGE
from tests.cluster import kube

HERE = Path(__file__).parent
RBAC = kube.ROOT / "manifests" / "rbac"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test here ``cluster`` (but ``teardown`` ones, which take the cluster down and
    run on their own, last); skip them all, with the reason, without a cluster."""
    reason: str | None = None
    checked = False
    asked_for_teardown = "teardown" in (config.option.markexpr or "")
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            if item.get_closest_marker("teardown") is None:
                item.add_marker(pytest.mark.cluster)
            elif not asked_for_teardown:
                # Never as part of another selection (make test, test-all): it stops the cluster.
                item.add_marker(
                    pytest.mark.skip(reason="takes the test cluster down: run alone, last, with "
                                     "-m teardown (.ci/run does)")
                )  # fmt: skip
            if not checked:
                reason, checked = kube.unavailable(), True
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Each phase's report on the item (``item.rep_call``): the browser tests' ``page`` fixture
    saves a screenshot of a failed test (tests/cluster/ui.py)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


CI_TEST_ALLOWANCE_S = 300
"""What one cluster test may take at most here, unless its ``ci_allowance`` marker says more
(Katib's searches take about 3 min; its median-rule search, eight trials in a row, up to 10)."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip, with the reason, a cluster test that could run past CI's time budget.

    ``.ci/run`` sets ``GPUPIPE_CI_DEADLINE`` (Unix seconds) a little before its 90 minutes: on a
    machine with nothing cached the builds take most of them, and a run cut off by the budget
    would land nothing. Outside CI the variable is unset and every test runs.
    """
    deadline = os.environ.get("GPUPIPE_CI_DEADLINE")
    if not deadline or HERE not in Path(str(item.fspath)).parents:
        return
    left = int(float(deadline) - time.time())
    closest = getattr(item, "get_closest_marker", None)
    marker = closest("ci_allowance") if closest else None
    allowance = int(marker.args[0]) if marker else CI_TEST_ALLOWANCE_S
    if left < allowance:
        pytest.skip(
            f"CI's time budget: {max(left, 0)} s left before GPUPIPE_CI_DEADLINE, under the "
            f"{allowance} s this cluster test may take"
        )


@pytest.fixture(scope="session")
def image() -> str:
    """The trainer's CPU image, imported into the node under the name the pipeline uses."""
    return CPU_IMAGE


@pytest.fixture(scope="session")
def store() -> Iterator[dict[str, str]]:
    """The in-cluster object store (KFP's SeaweedFS, Service ``seaweedfs`` port 9000), reached from
    this host through its Service address; ``minio://`` URIs read and write it."""
    env = kube.store_env()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        yield env


def role(rules_without: tuple[str, str, str] | None = None) -> dict[str, Any]:
    """``manifests/rbac``'s Role as users apply it; ``rules_without=(group, resource, verb)``
    drops that one verb."""
    doc = yaml.safe_load((RBAC / "base" / "role.yaml").read_text())
    if rules_without is not None:
        group, resource, verb = rules_without
        doc = copy.deepcopy(doc)
        for rule in doc["rules"]:
            if group in rule["apiGroups"] and resource in rule["resources"]:
                assert verb in rule["verbs"], f"the Role has no {verb} on {resource}"
                rule["verbs"] = [v for v in rule["verbs"] if v != verb]
        doc["rules"] = [r for r in doc["rules"] if r["verbs"]]
    return doc


def namespace_doc(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A test Namespace, labelled ``gpupipe.dev/test: cluster`` and with ``labels``."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"gpupipe.dev/test": "cluster", **labels}},
    }


def make_namespace(
    name: str,
    role_doc: dict[str, Any],
    *,
    enforce: str = "restricted",
    labels: dict[str, str] | None = None,
) -> None:
    """A namespace that enforces ``enforce`` Pod Security (and warns of restricted), with the
    ``pipeline-runner`` account bound by our Role (``manifests/rbac``'s binding, its subject
    moved here) and the store's secret; ``labels`` are added to the namespace's.

    It carries the label Kubeflow's profile controller puts on a user's profile namespace
    (``app.kubernetes.io/part-of: kubeflow-profile``, its ``namespace-labels.yaml``), as a
    multi-user KFP's runs have it. Upstream's SeaweedFS NetworkPolicy admits every pod of such a
    namespace; manifests/kfp's, which the test cluster enforces, only the pipeline's pods
    (tests/cluster/test_networkpolicy.py)."""
    kube.apply(
        namespace_doc(
            name,
            {
                "pod-security.kubernetes.io/enforce": enforce,
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted",
                "app.kubernetes.io/part-of": "kubeflow-profile",
                **(labels or {}),
            },
        )
    )
    kube.kubectl("create", "serviceaccount", "pipeline-runner", "-n", name)
    kube.apply({**role_doc, "metadata": {**role_doc["metadata"], "namespace": name}})
    # The RoleBinding and the ClusterRoleBinding (list nodes: the GPU check before a job is
    # created), their subject moved here; the latter is cluster-scoped, so named after the
    # namespace (delete_namespace removes it).
    for binding in yaml.safe_load_all((RBAC / "rolebinding.yaml").read_text()):
        if binding["kind"] == "RoleBinding":
            binding["metadata"]["namespace"] = name
        else:
            binding["metadata"]["name"] = node_reader_binding(name)
        for subject in binding["subjects"]:
            subject["namespace"] = name
        kube.apply(binding)
    secret = kube.get_json("secret", "-n", "kubeflow", kube.STORE_SECRET)
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": kube.STORE_SECRET, "namespace": name},
            "data": secret["data"],
        }
    )


def node_reader_binding(namespace: str) -> str:
    """The ClusterRoleBinding that lets ``namespace``'s pipeline-runner list nodes."""
    return f"gpupipe-{namespace}-nodes"


def delete_namespace(name: str) -> None:
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)
    kube.kubectl(
        "delete", "clusterrolebinding", node_reader_binding(name), "--ignore-not-found",
        check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    """A fresh restricted namespace with our RBAC, deleted after the module."""
    name = kube.unique("gpupipe-t")
    make_namespace(name, role())
    yield name
    delete_namespace(name)


@pytest.fixture(scope="session")
def dataset(store: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo table, preprocessed into the object store (as the pipeline's first step does)."""
    uri = f"minio://{kube.BUCKET}/{kube.unique('gpupipe-tests')}/dataset"
    return kube.demo_dataset(uri, tmp_path_factory.mktemp("demo"))
