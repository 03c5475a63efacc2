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
    if not _installed(addon):
        pytest.skip(f"add-on {addon} is not installed in this cluster (GPUPIPE_CLUSTER_ADDONS)")
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
