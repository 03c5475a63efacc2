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


def _listening() -> dict[int, set[str]]:
    """TCP port -> the addresses something listens on there (from ``ss``)."""
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    found: dict[int, set[str]] = {}
    for line in out.splitlines():
        local = line.split()[3]
        address, port = local.rsplit(":", 1)
        found.setdefault(int(port), set()).add(address.strip("[]"))
    return found


def test_the_api_server_and_kubelet_listen_on_the_node_address_only() -> None:
    # Issue 39: both bound every interface (*:6443, *:10250), docker's and the pods' bridges too.
    server = kube.kubectl(
        "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
    )
    node = server.stdout.strip().split("//", 1)[1].rsplit(":", 1)[0]
    listening = _listening()
    assert listening.get(6443) == {node}, listening.get(6443)
    assert listening.get(10250) == {node}, listening.get(10250)
    assert 10255 not in listening  # the kubelet's unauthenticated read-only port
    # Every other cluster process: loopback only (etcd, the controllers' and proxy's health).
    for port in (2379, 2380, 10248, 10256, 10257, 10259):
        assert listening.get(port, {"127.0.0.1"}) <= {"127.0.0.1"}, (port, listening.get(port))


def test_a_second_cluster_up_leaves_every_process_running() -> None:
    before = _pids()
    assert {"etcd", "kube-apiserver", "kubelet", "kube-proxy", "containerd"} <= before.keys()
    up = kube.run_script("cluster-up.sh")
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    # Its last lines: the KUBECONFIG line, then (with KFP) the README's block for this cluster.
    lines = up.stdout.splitlines()
    at = lines.index(f"export KUBECONFIG={kube.KUBECONFIG}")
    assert lines[at - 1].startswith("==> cluster ready in "), lines[at - 1 :]
    assert all(line.startswith(("The pipeline on this cluster", "  ")) for line in lines[at + 1 :])
    # Nothing was restarted: the same process under every name, each still alive.
    assert _pids() == before
    # And they outlive it: kube-proxy used to exit a moment after its file was rewritten.
    time.sleep(3)
    for name, pid in before.items():
        assert subprocess.run(["kill", "-0", pid], check=False).returncode == 0, name
