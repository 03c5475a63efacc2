"""Each cluster add-on's own `verify`: the installed piece exercised from inside the cluster, as a
pipeline step would use it (a busybox PyTorchJob through the operator and its webhook, an S3
round trip with KFP's secret, MLflow's REST API). An add-on that is not installed is skipped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cluster import kube

ADDONS = kube.ROOT / "hack" / "cluster" / "addons"


def _with_verify() -> list[str]:
    return sorted(p.stem for p in ADDONS.glob("*.sh") if "verify) addon_verify" in p.read_text())


def _installed(addon: str) -> bool:
    return (kube.STATE / "addons" / addon).is_dir()


@pytest.mark.parametrize("addon", _with_verify())
def test_addon_verifies_from_inside_the_cluster(addon: str) -> None:
    kube.need_addon(addon)
    out = subprocess.run(
        [str(Path(ADDONS, f"{addon}.sh")), "verify"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, (
        f"{addon} verify failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )


def _runs_as(pod: dict, claim: str) -> set[str]:
    """``uid:gid`` of each container of ``pod`` that mounts ``claim``."""
    spec = pod["spec"]
    names = {
        v["name"]
        for v in spec.get("volumes", [])
        if v.get("persistentVolumeClaim", {}).get("claimName") == claim
    }
    owners = set()
    for c in spec.get("initContainers", []) + spec["containers"]:
        if any(m["name"] in names for m in c.get("volumeMounts", [])):
            sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
            owners.add(f"{sc.get('runAsUser')}:{sc.get('runAsGroup')}")
    return owners


def test_each_volume_is_owned_by_its_pods_uid_and_no_one_elses() -> None:
    """Issue 60, item 10: the hostPath folders (MLflow's databases and models, the store's
    objects, the MariaDB data) were 0777 without the sticky bit; each is now owned by the uid
    its pods run as, mode 0700 (hack/cluster/addons/common.sh, hostpath_pv)."""
    pvs = kube.get_json("pv", "-l", "app.kubernetes.io/part-of=gpupipe")["items"]
    if not pvs:
        pytest.skip("no add-on with a volume is installed in this cluster")
    for pv in pvs:
        folder = Path(pv["spec"]["hostPath"]["path"])
        ns, claim = pv["spec"]["claimRef"]["namespace"], pv["spec"]["claimRef"]["name"]
        pods = kube.get_json("pods", "-n", ns, "--field-selector", "status.phase=Running")
        owners = set().union(*(_runs_as(p, claim) for p in pods["items"]))
        assert len(owners) == 1, f"{ns}/{claim}: its running pods run as {owners or 'none'}"
        info = folder.stat()
        assert {f"{info.st_uid}:{info.st_gid}"} == owners, f"{folder} is not its pod's"
        assert info.st_mode & 0o777 == 0o700, f"{folder} is {oct(info.st_mode & 0o7777)}"
    assert (kube.STATE / "volumes").stat().st_mode & 0o777 == 0o700
