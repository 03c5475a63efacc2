"""hack/cluster-up.sh on a running cluster: a second run changes nothing.

Found on this cluster: the second run rewrote kube-proxy's config file in place, and kube-proxy,
which exits when its file changes (it read it half-written), was gone; the run then failed.
"""

from __future__ import annotations

import subprocess
import time

from tests.cluster import kube

RUN_DIR = kube.STATE / "run"


def _pids() -> dict[str, str]:
    return {p.stem: p.read_text().strip() for p in sorted(RUN_DIR.glob("*.pid"))}


def test_a_second_cluster_up_leaves_every_process_running() -> None:
    before = _pids()
    assert {"etcd", "kube-apiserver", "kubelet", "kube-proxy", "containerd"} <= before.keys()
    up = subprocess.run(
        [str(kube.ROOT / "hack" / "cluster-up.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    assert up.stdout.rstrip().endswith(f"export KUBECONFIG={kube.KUBECONFIG}")
    # Nothing was restarted: the same process under every name, each still alive.
    assert _pids() == before
    # And they outlive it: kube-proxy used to exit a moment after its file was rewritten.
    time.sleep(3)
    for name, pid in before.items():
        assert subprocess.run(["kill", "-0", pid], check=False).returncode == 0, name
