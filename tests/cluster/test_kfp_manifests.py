"""What a user applies for KFP (manifests/kfp) and what the test cluster applied (hack/cluster/
addons/kfp.sh) differ only in where the upstream base comes from and in image names.

Both are rendered here with the cluster's own kubectl (kustomize built in): the user path with
its remote base pointed at the same tarball the cluster was built from, the test cluster's
overlay as kfp.sh wrote it into the state folder. Image references (in `image:` fields, in the
API server's driver and launcher variables, in Argo's executor argument) are compared by their
upstream name; the rest must be equal, object by object. The only other difference allowed is
the test cluster's roll-out annotation (the ids of its locally built images). Two Deployments of
the user path (the UI and ML Metadata's grpc-web proxy, KFP_UI_DEPLOYMENTS in hack/cluster/addons/
common.sh) are applied by the UI's add-on (kfp-ui.sh) instead of kfp.sh: the test cluster's side is
the two overlays together, or without them where that add-on is not installed.
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
UI = {
    ("Deployment", "kubeflow", "ml-pipeline-ui"),
    ("Deployment", "kubeflow", "metadata-envoy-deployment"),
}
"""What the UI's add-on applies (its own overlay) and kfp.sh leaves out."""
UI_ADDON = ADDONS / "kfp-ui"
REMOTE = (
    r"github\.com/kubeflow/pipelines/manifests/kustomize/([^?\s]*)\?ref="
    + kube.VERSIONS["KFP_COMMIT"]
)

pytestmark = pytest.mark.skipif(
    not (ADDONS / "kfp" / "install").is_dir() or not SRC.is_dir(),
    reason="the KFP add-on is not installed in this cluster (GPUPIPE_CLUSTER_ADDONS)",
)


def ui_installed() -> bool:
    return (UI_ADDON / "kustomization.yaml").is_file()


def image_map() -> dict[str, frozenset[str]]:
    """Local image name -> the upstream names it stands in for (the overlays' images blocks)."""
    overlays = [ADDONS / "kfp" / "install" / "kustomization.yaml"]
    if ui_installed():
        overlays.append(UI_ADDON / "kustomization.yaml")
    return image_names(*overlays)


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
        assert set(user) >= UI, "the user path has the UI's Deployments"
        assert not set(cluster) & UI, "kfp.sh leaves the UI's Deployments to the UI's add-on"
        if ui_installed():
            ui = by_key(kustomize(UI_ADDON), images)
            assert set(ui) == UI, sorted(ui)
            cluster.update(ui)
        else:
            for key in UI:
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
