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

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import kube

ADDONS = kube.STATE / "addons"
SRC = kube.CACHE / "src" / f"kubeflow-pipelines-{kube.VERSIONS['KFP_VERSION']}"
NOT_RUN = {("Deployment", "ml-pipeline-ui"), ("Deployment", "metadata-envoy-deployment")}
ROLL_ANNOTATION = "gpupipe.dev/images"

pytestmark = pytest.mark.skipif(
    not (ADDONS / "kfp" / "install").is_dir() or not SRC.is_dir(),
    reason="the KFP add-on is not installed in this cluster (GPUPIPE_CLUSTER_ADDONS)",
)


def kustomize(folder: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(kube.KUBECTL), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def user_path(part: str, tmp: Path) -> list[dict[str, Any]]:
    """manifests/kfp/PART with its remote base read from the extracted tarball instead."""
    text = (kube.ROOT / "manifests" / "kfp" / part / "kustomization.yaml").read_text()
    folder = tmp / part
    folder.mkdir(parents=True)
    local = os.path.relpath(SRC / "manifests" / "kustomize", folder)  # kustomize wants relative
    tag = re.escape(kube.VERSIONS["KFP_VERSION"])
    pattern = rf"github\.com/kubeflow/pipelines/manifests/kustomize/([^?\s]*)\?ref={tag}"
    localized, n = re.subn(pattern, rf"{local}/\1", text)
    assert n == 1, f"manifests/kfp/{part} should name KFP's manifests once, at the release tag"
    (folder / "kustomization.yaml").write_text(localized)
    return kustomize(folder)


def image_map() -> dict[str, str]:
    """Local image name -> the upstream name it stands in for (the overlay's images block)."""
    spec = yaml.safe_load((ADDONS / "kfp" / "install" / "kustomization.yaml").read_text())
    return {i["newName"]: i["name"] for i in spec["images"]}


def canonical(obj: Any, local_to_upstream: dict[str, str]) -> Any:
    """``obj`` with every image reference replaced by its upstream name (tags dropped)."""
    upstream = set(local_to_upstream.values())
    if isinstance(obj, dict):
        return {k: canonical(v, local_to_upstream) for k, v in obj.items()}
    if isinstance(obj, list):
        return [canonical(v, local_to_upstream) for v in obj]
    if isinstance(obj, str) and re.match(r"^[\w./-]+:[\w.-]+$", obj):  # NAME:TAG only
        name = obj.rsplit(":", 1)[0]
        if name in local_to_upstream:
            return f"IMAGE<{local_to_upstream[name]}>"
        if name in upstream:
            return f"IMAGE<{name}>"
    return obj


def by_key(objects: list[dict[str, Any]], images: dict[str, str]) -> dict[tuple[str, str], Any]:
    out = {}
    for obj in objects:
        obj = canonical(obj, images)
        template = obj.get("spec", {}).get("template", {})
        meta = template.get("metadata", {})
        (meta.get("annotations") or {}).pop(ROLL_ANNOTATION, None)
        if meta.get("annotations") == {}:
            del meta["annotations"]
        # A strategic-merge patch of two variables moves them to the front of the list: env is
        # compared by name (nothing here refers to another variable with $(NAME)).
        for container in template.get("spec", {}).get("containers", []):
            if "env" in container:
                container["env"] = sorted(container["env"], key=lambda e: e["name"])
        out[(obj["kind"], obj["metadata"]["name"])] = obj
    return out


@pytest.mark.parametrize("part", ["cluster-scoped-resources", "platform-agnostic"])
def test_the_test_cluster_applies_the_user_path_with_local_images_only(
    part: str, tmp_path: Path
) -> None:
    images = image_map()
    user = by_key(user_path(part, tmp_path), images)
    folder = ADDONS / "kfp" / ("install" if part == "platform-agnostic" else part)
    cluster = by_key(kustomize(folder), images)
    if part == "platform-agnostic":
        assert set(user) >= NOT_RUN, "the user path has the Deployments the test cluster leaves out"
        for key in NOT_RUN:
            del user[key]
    assert sorted(user) == sorted(cluster)
    differing = [key for key in user if user[key] != cluster[key]]
    assert differing == [], differing
    # Every image the cluster runs is a local build (nothing left that would be pulled).
    pulled = set(re.findall(r"IMAGE<([^>]+)>", str(cluster)))
    assert pulled <= set(images.values()), pulled - set(images.values())


def test_the_object_store_addon_applies_the_same_objects_as_kfp() -> None:
    images = image_map()
    store = by_key(kustomize(ADDONS / "object-store"), images)
    kfp = by_key(kustomize(ADDONS / "kfp" / "install"), images)
    assert store, "the object store add-on renders nothing"
    assert {k: kfp.get(k) for k in store} == store
