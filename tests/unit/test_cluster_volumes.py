"""The test cluster's volumes are their pods' alone (issue 60, item 10): each hostPath folder
under the state folder (MLflow's databases and models, the object store's objects, the two
MariaDB data folders) is owned by the uid and gid its pod runs as and is mode 0700, never 0777.

Each ``hostpath_pv`` call in hack/cluster/addons/ names an owner; here it is held to the
securityContext of the pod that claims the volume, as the user path renders it over upstream's
objects (KFP's source tarball, Katib's Go module download: skipped, naming them, where absent;
MLflow's is manifests/mlflow's own). ``hostpath_pv`` itself runs with a stub kubectl. The live
folders are checked on the cluster (tests/cluster/test_addons.py).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_cluster_credentials import (
    KATIB_PATCHED,
    KFP_PATCHED,
    _katib_objects,
    _kfp_objects,
    _user_path,
)
from tests.unit.test_manifests import render

ROOT = Path(__file__).resolve().parents[2]
ADDONS = ROOT / "hack" / "cluster" / "addons"
CALL = re.compile(r'^\s*hostpath_pv "\$PIECE" "\$NS" (\S+) (\S+) ?(\S*)$', re.M)


def _calls() -> dict[tuple[str, str], str]:
    """(script, claim) -> the owner each ``hostpath_pv`` call names."""
    found = {}
    for script in sorted(ADDONS.glob("*.sh")):
        for claim, _, owner in CALL.findall(script.read_text()):
            found[(script.name, claim)] = owner
    return found


def _claimants() -> dict[str, list[dict[str, Any]]]:
    """Each claim's pod templates, as the user path renders them."""
    kfp = _user_path("kfp/platform-agnostic", _kfp_objects(*KFP_PATCHED))
    katib = _user_path(
        "katib",
        _katib_objects(*KATIB_PATCHED),
    )
    mlflow = {
        (o["kind"], o["metadata"]["name"]): o for o in render(ROOT / "manifests/mlflow").objects
    }
    claims: dict[str, list[dict[str, Any]]] = {}
    for obj in [*kfp.values(), *katib.values(), *mlflow.values()]:
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = obj["spec"]["template"]["spec"]
        for volume in spec.get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim:
                claims.setdefault(claim, []).append({"pod": spec, "volume": volume["name"]})
    return claims


def _runs_as(pod: dict[str, Any], volume: str) -> set[str]:
    """``uid:gid`` of each container that mounts ``volume`` (its securityContext over the pod's)."""
    owners = set()
    for c in pod.get("initContainers", []) + pod["containers"]:
        if not any(m["name"] == volume for m in c.get("volumeMounts", [])):
            continue
        sc = {**pod.get("securityContext", {}), **c.get("securityContext", {})}
        assert "runAsUser" in sc and "runAsGroup" in sc, f"{c['name']} runs as the image's user"
        owners.add(f"{sc['runAsUser']}:{sc['runAsGroup']}")
    return owners


def test_every_volume_is_owned_by_the_uid_its_pod_runs_as() -> None:
    calls = _calls()
    assert {claim for _, claim in calls} == {
        "mlflow", "seaweedfs-pvc", "mysql-pv-claim", "katib-mysql",
    }, calls  # fmt: skip
    claimants = _claimants()
    for (script, claim), owner in calls.items():
        assert claim in claimants, f"{script}: no pod of the user path claims {claim}"
        for c in claimants[claim]:
            assert _runs_as(c["pod"], c["volume"]) == {owner}, (script, claim)


def _hostpath_pv(state: Path, owner: str) -> subprocess.CompletedProcess[str]:
    """Run common.sh's ``hostpath_pv`` with ``kubectl_`` stubbed (the PV is "there")."""
    text = (ADDONS / "common.sh").read_text()
    (function,) = re.findall(r"^hostpath_pv\(\) \{\n.*?\n\}\n", text, re.M | re.S)
    script = (
        'die() { echo "$*" >&2; exit 1; }\nkubectl_() { return 0; }\n'
        f'{function}hostpath_pv piece kubeflow "$1" 1Gi "$2"'
    )
    return subprocess.run(
        ["bash", "-c", script, "_", "claim", owner],
        env={**os.environ, "STATE": str(state)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_hostpath_pv_makes_a_folder_of_its_owner_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    owner = "999:999" if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"
    for _ in range(2):  # a second install keeps it so (and fixes an older 0777 one)
        done = _hostpath_pv(state, owner)
        assert done.returncode == 0, done.stderr
        folder = state / "volumes" / "kubeflow-claim"
        info = folder.stat()
        assert f"{info.st_uid}:{info.st_gid}" == owner
        assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
        assert stat.S_IMODE((state / "volumes").stat().st_mode) == 0o700
        folder.chmod(0o777)


@pytest.mark.parametrize("owner", ["", "mysql", "999", "999:"], ids=["none", "name", "uid", "gid"])
def test_hostpath_pv_without_a_numeric_owner_is_refused(tmp_path: Path, owner: str) -> None:
    done = _hostpath_pv(tmp_path, owner)
    assert done.returncode == 1
    assert "needs its pod's UID:GID" in done.stderr and "kubeflow/claim" in done.stderr
    assert not (tmp_path / "volumes" / "kubeflow-claim").exists()
