"""Render a user's overlay in `manifests/` and the test cluster's overlay side by side.

What a user applies (`manifests/<piece>`, `make kind-up`) names an upstream base by its GitHub
URL at its release's commit; the test cluster applies the same upstream files from a local copy (a
Go module download, KFP's tarball) under an overlay of its own in the state folder. Both are
rendered with the cluster's own kubectl (kustomize built in), the user's with its remote base
pointed at that local copy, and compared object by object with image references reduced to their
upstream names. Used by tests/cluster/test_kfp_manifests.py and test_addon_manifests.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import kube

ADDONS = kube.STATE / "addons"
ROLL_ANNOTATION = "gpupipe.dev/images"
"""The test cluster's roll-out annotation on pod templates: the ids of its local images."""
Key = tuple[str, str, str]
"""(kind, namespace, name) of a rendered object."""


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize folder`` renders."""
    out = subprocess.run(
        [str(kube.KUBECTL), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def user_path(part: str, remote: str, local: Path, tmp: Path) -> list[dict[str, Any]]:
    """``manifests/PART`` rendered with its one remote base (regex ``remote``, whose group is
    the path inside the upstream manifests) read from ``local`` instead."""
    text = (kube.ROOT / "manifests" / part / "kustomization.yaml").read_text()
    folder = tmp / part
    folder.mkdir(parents=True)
    for own in (kube.ROOT / "manifests" / part).glob("*.yaml"):  # the files it lists
        if own.name != "kustomization.yaml":
            shutil.copy(own, folder / own.name)
    relative = os.path.relpath(local, folder)  # kustomize wants a relative path
    localized, n = re.subn(remote, rf"{relative}/\1", text)
    assert n == 1, f"manifests/{part} should name its upstream base once, at its release's commit"
    (folder / "kustomization.yaml").write_text(localized)
    return kustomize(folder)


def image_names(*kustomizations: Path) -> dict[str, frozenset[str]]:
    """Local image name -> the upstream names it stands in for (the overlays' images blocks)."""
    out: dict[str, set[str]] = {}
    for path in kustomizations:
        for image in yaml.safe_load(path.read_text()).get("images") or []:
            if "newName" in image:
                out.setdefault(image["newName"], set()).add(image["name"])
    return {k: frozenset(v) for k, v in out.items()}


@dataclass(frozen=True)
class Image:
    """An image reference by the upstream names it may stand for (one for an upstream name)."""

    names: frozenset[str]

    def matches(self, other: object) -> bool:
        return isinstance(other, Image) and bool(self.names & other.names)


def canonical(obj: Any, local: dict[str, frozenset[str]]) -> Any:
    """``obj`` with every image reference (``NAME:TAG``) of an image the overlays name replaced
    by :class:`Image`: a local build by the upstream names it stands in for."""
    upstream = {n for names in local.values() for n in names}
    if isinstance(obj, dict):
        return {k: canonical(v, local) for k, v in obj.items()}
    if isinstance(obj, list):
        return [canonical(v, local) for v in obj]
    if isinstance(obj, str) and re.match(r"^[\w./-]+:[\w.-]+$", obj):
        name = obj.rsplit(":", 1)[0]
        if name in local:
            return Image(local[name])
        if name in upstream:
            return Image(frozenset({name}))
    return obj


def by_key(objects: list[dict[str, Any]], local: dict[str, frozenset[str]]) -> dict[Key, Any]:
    """The objects by (kind, namespace, name), images canonical, without the roll annotation and
    with env lists in name order (a strategic-merge patch moves patched variables first)."""
    out = {}
    for obj in objects:
        obj = canonical(obj, local)
        template = obj.get("spec", {}).get("template", {})
        meta = template.get("metadata", {})
        (meta.get("annotations") or {}).pop(ROLL_ANNOTATION, None)
        if meta.get("annotations") == {}:
            del meta["annotations"]
        for container in template.get("spec", {}).get("containers", []):
            if "env" in container:
                container["env"] = sorted(container["env"], key=lambda e: e["name"])
        m = obj["metadata"]
        out[(obj["kind"], m.get("namespace", ""), m["name"])] = obj
    return out


def differences(user: Any, cluster: Any, path: str = "") -> list[str]:
    """The paths (``/spec/template/...``, ``[i]`` for list items) where the two differ."""
    if isinstance(user, Image) or isinstance(cluster, Image):
        return [] if isinstance(user, Image) and user.matches(cluster) else [path]
    if isinstance(user, dict) and isinstance(cluster, dict):
        return [
            d
            for k in sorted(set(user) | set(cluster), key=str)
            for d in (
                differences(user[k], cluster[k], f"{path}/{k}")
                if k in user and k in cluster
                else [f"{path}/{k}"]
            )
        ]
    if isinstance(user, list) and isinstance(cluster, list) and len(user) == len(cluster):
        return [
            d for i, (u, c) in enumerate(zip(user, cluster, strict=True))
            for d in differences(u, c, f"{path}[{i}]")
        ]  # fmt: skip
    return [] if user == cluster else [path]


def images_pulled(objects: dict[Key, Any], local: dict[str, frozenset[str]]) -> set[str]:
    """Upstream images the rendering still names without a local build standing in."""
    found: set[str] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, Image) and not any(obj.names <= v for v in local.values()):
            found.update(obj.names)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(objects)
    return found
