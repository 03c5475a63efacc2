"""What a user applies for KFP (manifests/kfp) and what the test cluster applied (hack/cluster/
addons/kfp.sh) differ only in where the upstream base comes from and in image names.

Both are rendered here with the cluster's own kubectl (kustomize built in): the user path with
its remote base pointed at the same tarball the cluster was built from, the test cluster's
overlay as kfp.sh wrote it into the state folder. Image references (in `image:` fields, in the
API server's driver and launcher variables, in Argo's executor argument) are compared by their
upstream name; the rest must be equal, object by object. The only other differences allowed are
named here: the test cluster's roll-out annotation (the ids of its locally built images) and the
two Deployments it does not run yet (the UI and ML Metadata's grpc-web proxy, kfp.sh NOT_RUN).
The object store's add-on, which applies KFP's SeaweedFS base earlier, must render the same
objects as the KFP install does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import kube
from tests.cluster.renderings import (
    ADDONS,
    by_key,
    differences,
    image_names,
    images_pulled,
    kustomize,
    user_path,
)

SRC = kube.CACHE / "src" / f"kubeflow-pipelines-{kube.VERSIONS['KFP_VERSION']}"
NOT_RUN = {
    ("Deployment", "kubeflow", "ml-pipeline-ui"),
    ("Deployment", "kubeflow", "metadata-envoy-deployment"),
}
REMOTE = r"github\.com/kubeflow/pipelines/manifests/kustomize/([^?\s]*)\?ref=" + kube.VERSIONS[
    "KFP_VERSION"
].replace(".", r"\.")

pytestmark = pytest.mark.skipif(
    not (ADDONS / "kfp" / "install").is_dir() or not SRC.is_dir(),
    reason="the KFP add-on is not installed in this cluster (GPUPIPE_CLUSTER_ADDONS)",
)


def image_map() -> dict[str, frozenset[str]]:
    """Local image name -> the upstream names it stands in for (the install's images block)."""
    return image_names(ADDONS / "kfp" / "install" / "kustomization.yaml")


@pytest.mark.parametrize("part", ["cluster-scoped-resources", "platform-agnostic"])
def test_the_test_cluster_applies_the_user_path_with_local_images_only(
    part: str, tmp_path: Path
) -> None:
    images = image_map()
    local = SRC / "manifests" / "kustomize"
    user = by_key(user_path(f"kfp/{part}", REMOTE, local, tmp_path), images)
    folder = ADDONS / "kfp" / ("install" if part == "platform-agnostic" else part)
    cluster = by_key(kustomize(folder), images)
    if part == "platform-agnostic":
        assert set(user) >= NOT_RUN, "the user path has the Deployments the test cluster leaves out"
        for key in NOT_RUN:
            del user[key]
    assert sorted(user) == sorted(cluster)
    differing = {key: d for key in user if (d := differences(user[key], cluster[key]))}
    assert differing == {}, differing
    # Every image the cluster runs is a local build (nothing left that would be pulled).
    assert images_pulled(cluster, images) == set()


def test_the_object_store_addon_applies_the_same_objects_as_kfp() -> None:
    images = image_map()
    store = by_key(kustomize(ADDONS / "object-store"), images)
    kfp = by_key(kustomize(ADDONS / "kfp" / "install"), images)
    assert store, "the object store add-on renders nothing"
    assert {k: kfp.get(k) for k in store} == store
