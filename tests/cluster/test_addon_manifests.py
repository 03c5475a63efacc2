"""What a user applies for the Training Operator, Trainer and Katib (`manifests/`, `make kind-up`)
and what the test cluster applied (hack/cluster/addons/*.sh) differ only where named here.

Each add-on's overlay in the state folder is rendered beside the user's overlay, whose GitHub
base is pointed at the add-on's own copy of the same release's manifests (a Go module download).
Images are compared by the upstream names the local builds stand in for; every other difference
must be in :data:`CASES`'s list for that add-on, each with its reason, and every listed one must
still be there (a difference that went away is removed from the list). JobSet, which Trainer's
user path pulls as a release manifest from GitHub (no copy of it here), is checked by version:
hack/cluster/addons/jobset.sh builds the same release from its source (`config/default`, what the
release manifest is made from).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.cluster import kube
from tests.cluster.renderings import (
    ADDONS,
    Key,
    by_key,
    differences,
    image_names,
    images_pulled,
    kustomize,
    user_path,
)

pytestmark = pytest.mark.cluster


@dataclass(frozen=True)
class Addon:
    """One add-on: the user's overlay, where its base comes from, and the named differences."""

    user: str
    """The folder under manifests/."""
    remote: str
    """Regex of the user's remote base; its group is the path inside the upstream copy."""
    upstream: Path
    """The add-on's copy of that release's manifests."""
    cluster: Path
    """The add-on's overlay in the state folder."""
    only_user: dict[Key, str] = field(default_factory=dict)
    """Objects the test cluster leaves out, and why."""
    only_cluster: dict[Key, str] = field(default_factory=dict)
    """Objects only the test cluster applies, and why."""
    changed: dict[tuple[Key, str], str] = field(default_factory=dict)
    """(object, path prefix) the test cluster changes, and why."""


TRAINING_OPERATOR = ("Deployment", "kubeflow", "training-operator")
INIT_TEMPLATE = (
    "the PyTorch init container waits until nslookup prints an answer, not until it exits 0: "
    "Debian's busybox (the node's image, standing in for upstream's alpine) exits 1 whenever "
    "a search domain answers NXDOMAIN (training-operator.sh init_container_template)"
)
CASES: dict[str, Addon] = {
    "training-operator": Addon(
        user="training-operator",
        remote=r"github\.com/kubeflow/training-operator\.git/manifests/(\S*)\?ref=[0-9a-f]{40}",
        upstream=ADDONS / "training-operator" / "upstream",
        cluster=ADDONS / "training-operator",
        only_cluster={
            ("ConfigMap", "kubeflow", "training-operator-pytorch-init"): INIT_TEMPLATE,
        },
        changed={
            (TRAINING_OPERATOR, "/spec/template/spec/containers[0]/args"): INIT_TEMPLATE,
            (TRAINING_OPERATOR, "/spec/template/spec/containers[0]/volumeMounts"): INIT_TEMPLATE,
            (TRAINING_OPERATOR, "/spec/template/spec/volumes"): INIT_TEMPLATE,
        },
    ),
    "trainer": Addon(
        user="trainer/manager",
        remote=r"github\.com/kubeflow/trainer\.git/manifests/(\S*)\?ref=[0-9a-f]{40}",
        upstream=ADDONS / "trainer" / "upstream",
        cluster=ADDONS / "trainer",
    ),
    "trainer-runtimes": Addon(
        user="trainer/runtimes",
        remote=r"github\.com/kubeflow/trainer\.git/manifests/(\S*)\?ref=[0-9a-f]{40}",
        upstream=ADDONS / "trainer" / "upstream",
        cluster=ADDONS / "trainer" / "runtime",
        only_user={
            ("ClusterTrainingRuntime", "", name): "gpupipe runs torch-distributed only; the "
            "other runtimes' images (DeepSpeed, JAX, MLX, torchtune, XGBoost) are not built here"
            for name in (
                "deepspeed-distributed",
                "jax-distributed",
                "mlx-distributed",
                "torchtune-llama3.2-1b",
                "torchtune-llama3.2-3b",
                "torchtune-qwen2.5-1.5b",
                "xgboost-distributed",
            )
        },
        only_cluster={
            ("ClusterTrainingRuntime", "", "gpupipe-torch-distributed"): "gpupipe's own "
            "runtime, tested on the test cluster; a user opts in (README: trainer_runtime)",
        },
    ),
    "katib": Addon(
        user="katib",
        remote=r"github\.com/kubeflow/katib\.git/manifests/v1beta1/(\S*)\?ref=[0-9a-f]{40}",
        upstream=ADDONS / "katib" / "upstream",
        cluster=ADDONS / "katib",
        only_user={
            (kind, ns, "katib-ui"): "the test cluster runs no Katib UI (nothing of gpupipe's "
            "needs it, and its image is not built here)"
            for kind, ns in (
                ("ClusterRole", ""),
                ("ClusterRoleBinding", ""),
                ("Deployment", "kubeflow"),
                ("Service", "kubeflow"),
                ("ServiceAccount", "kubeflow"),
            )
        },
        changed={
            (("ConfigMap", "kubeflow", "katib-config"), "/data/katib-config.yaml"): "the "
            "KatibConfig names only the suggestion, metrics-collector and early-stopping images "
            "built here (with small requests), and injects a security context so that trials run "
            "in restricted namespaces (katib.sh)",
        },
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_test_cluster_applies_the_user_path_with_only_the_named_changes(
    name: str, tmp_path: Path
) -> None:
    addon = CASES[name]
    kube.need_addon(
        name, (addon.cluster / "kustomization.yaml").is_file() and addon.upstream.is_dir()
    )
    local = image_names(addon.cluster / "kustomization.yaml")
    user = by_key(user_path(addon.user, addon.remote, addon.upstream, tmp_path), local)
    cluster = by_key(kustomize(addon.cluster), local)
    # A generated ConfigMap's name ends in a hash of its content.
    cluster = {
        (k, ns, re.sub(r"-[a-z0-9]{10}$", "", n) if k == "ConfigMap" else n): v
        for (k, ns, n), v in cluster.items()
    }

    assert sorted(set(user) - set(cluster)) == sorted(addon.only_user)
    assert sorted(set(cluster) - set(user)) == sorted(addon.only_cluster)
    found = {
        (key, path)
        for key in sorted(set(user) & set(cluster))
        for path in differences(user[key], cluster[key])
    }
    allowed = set(addon.changed)
    unnamed = sorted(
        (key, path) for key, path in found if not any(
            key == k and path.startswith(prefix) for k, prefix in allowed
        )
    )  # fmt: skip
    assert unnamed == [], f"differences no one named: {unnamed}"
    stale = sorted(
        (k, prefix) for k, prefix in allowed
        if not any(
            key == k and path.startswith(prefix) for key, path in found
        )
    )  # fmt: skip
    assert stale == [], f"named differences that are gone: {stale}"
    # Every image the test cluster runs is a local build (nothing would be pulled).
    assert images_pulled(cluster, local) == set()


def test_jobset_is_the_release_trainers_user_path_installs() -> None:
    third_party = ADDONS / "trainer" / "upstream" / "third-party" / "jobset" / "kustomization.yaml"
    kube.need_addon("trainer", third_party.is_file())
    kube.need_addon("jobset", (ADDONS / "jobset" / "upstream.version").is_file())
    (release,) = yaml.safe_load(third_party.read_text())["resources"]
    built = (ADDONS / "jobset" / "upstream.version").read_text().strip()
    assert release.endswith(f"/releases/download/v{built}/manifests.yaml"), (release, built)
    assert built == kube.VERSIONS["JOBSET_VERSION"]
    # JobSet's default overlay is what its release manifest is built from.
    assert "upstream/default" in (ADDONS / "jobset" / "kustomization.yaml").read_text()
