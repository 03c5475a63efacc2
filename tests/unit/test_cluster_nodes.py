"""The test cluster's nodes (hack/cluster/nodes.sh, issue 63): names, addresses and pod ranges
per node, the count cluster-up takes, and each node's network namespace joined to the host by a
routed veth link, made for real in namespaces of the test's own (no cluster needed)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import cluster_bash as _bash

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = dict(
    line.split("=", 1)
    for line in (ROOT / "hack/cluster/versions.env").read_text().splitlines()
    if "=" in line and not line.startswith("#")
)


def _lines(tmp_path: Path, script: str, **env: str) -> list[str]:
    proc = _bash(tmp_path, script, **env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_one_node_is_the_cluster_it_always_was(tmp_path: Path) -> None:
    out = _lines(
        tmp_path,
        'echo "$(cluster_nodes) $(node_name 1) $(node_pod_cidr 1) $(node_sock 1) [$(node_exec 1)]"',
        GPUPIPE_CLUSTER_NODES="1",
    )
    count, name, cidr, sock, exec_words = out[0].split(" ")
    assert (count, name, cidr) == ("1", "gpupipe-node", VERSIONS["POD_CIDR"])
    assert sock == str(tmp_path / "state/run/containerd.sock")
    assert exec_words == "[]"


def test_each_node_has_its_own_name_address_pod_range_and_namespace(tmp_path: Path) -> None:
    script = (
        'for k in 1 2 3; do echo "$(node_name $k) $(node_pod_cidr $k) $(node_proc kubelet $k)"\n'
        "done\n"
        'for k in 2 3; do echo "$(node_addr $k) $(node_gateway $k)" \\\n'
        '  "$(node_link $k) $(node_exec $k)"\n'
        "done"
    )
    out = _lines(tmp_path, script, GPUPIPE_CLUSTER_NODES="3")
    names = [line.split()[0] for line in out[:3]]
    assert names == ["gpupipe-node", "gpupipe-node-2", "gpupipe-node-3"]
    assert [line.split()[2] for line in out[:3]] == ["kubelet", "kubelet-2", "kubelet-3"]
    pods = ipaddress.ip_network(VERSIONS["POD_CIDR"])
    links = ipaddress.ip_network(VERSIONS["NODE_LINK_CIDR"])
    ranges = [ipaddress.ip_network(line.split()[1]) for line in out[:3]]
    assert all(r.subnet_of(pods) and r.prefixlen == 24 for r in ranges), ranges
    assert len({r for r in ranges}) == 3
    for k, line in zip((2, 3), out[3:], strict=True):
        addr, gateway, link, *exec_words = line.split()
        assert ipaddress.ip_address(addr) in links and ipaddress.ip_address(gateway) in links
        assert link == f"gpn-{k}"
        assert exec_words == ["nsenter", f"--net=/run/netns/gpupipe-node-{k}"]


def test_two_nodes_unless_told_otherwise(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPIPE_CLUSTER_NODES")}
    script = f"source {ROOT}/hack/cluster/lib.sh; cluster_nodes; echo"
    run = {"GPUPIPE_CLUSTER_DIR": str(tmp_path / "state"), "GPUPIPE_CLUSTER_CACHE": str(tmp_path)}
    plain = subprocess.run(
        ["bash", "-c", script], env={**env, **run}, capture_output=True, text=True
    )
    assert plain.stdout.splitlines() == ["2"], plain.stderr
    test_default = {**env, **run, "GPUPIPE_CLUSTER_NODES_DEFAULT": "3"}
    out = subprocess.run(["bash", "-c", script], env=test_default, capture_output=True, text=True)
    assert out.stdout.splitlines() == ["3"], out.stderr


def test_the_count_recorded_by_cluster_up_wins_over_the_environment(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state/node-count").write_text("2\n")
    assert _lines(tmp_path, "cluster_nodes; echo", GPUPIPE_CLUSTER_NODES="5") == ["2"]


@pytest.mark.parametrize("nodes", ["0", "10", "two", "-1"])
def test_cluster_up_refuses_a_node_count_it_cannot_make_before_it_makes_anything(
    tmp_path: Path, nodes: str
) -> None:
    state, cache = tmp_path / "state", tmp_path / "cache"
    proc = subprocess.run(
        [str(ROOT / "hack/cluster-up.sh")],
        env={
            **os.environ,
            "GPUPIPE_CLUSTER_DIR": str(state),
            "GPUPIPE_CLUSTER_CACHE": str(cache),
            "GPUPIPE_CLUSTER_NODES": nodes,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: cluster: GPUPIPE_CLUSTER_NODES={nodes}: the number of nodes must be a whole "
        "number from 1 to 9"
    ], proc.stderr
    assert not state.exists() and not cache.exists()


def test_make_passes_nodes_to_cluster_up() -> None:
    # Not as a sub-make of `make test` (MAKEFLAGS, MAKELEVEL): what a person's `make` prints.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    make = ["make", "--no-print-directory", "-n", "cluster-up"]
    out = subprocess.run([*make, "NODES=3"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "GPUPIPE_CLUSTER_NODES=3 hack/cluster-up.sh" in out.stdout, out
    plain = subprocess.run(make, cwd=ROOT, env=env, capture_output=True, text=True)
    assert plain.stdout.strip() == "hack/cluster-up.sh", plain
    # make test-cluster: three nodes unless told (or the running cluster has its own count).
    tests = ["make", "--no-print-directory", "-n", "test-cluster"]
    out = subprocess.run(tests, cwd=ROOT, env=env, capture_output=True, text=True)
    assert "GPUPIPE_CLUSTER_NODES_DEFAULT=3 hack/cluster-up.sh" in out.stdout, out
    out = subprocess.run([*tests, "NODES=2"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "GPUPIPE_CLUSTER_NODES=2 hack/cluster-up.sh" in out.stdout, out


SERVE = """
import socket, sys
s = socket.create_server((sys.argv[1], 8099))
s.settimeout(20)
c, peer = s.accept()
c.sendall(f"hello {peer[0]}".encode())
c.close()
"""
"""A one-connection TCP server on the node's address: it greets its client by its address."""
ASK = """
import socket, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((sys.argv[1], 8099), timeout=5)
        break
    except OSError:
        time.sleep(0.1)
print(c.recv(100).decode())
"""

NEED_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
    reason="needs root, unshare and ip (network and mount namespaces)",
)


@NEED_ROOT
def test_two_nodes_reach_each_other_through_the_hosts_routes_and_nothing_else(
    tmp_path: Path,
) -> None:
    """node_network for nodes 2 and 3 in a network and mount namespace of the test's own (a
    tmpfs on /run/netns: the machine's namespaces and routes are not touched): each node's
    address answers from the other node, through the host (the route to it names its link) and
    with the client's own address, and each node's namespace has its own routes only."""
    Path("/run/netns").mkdir(parents=True, exist_ok=True)  # what `ip netns add` makes
    script = f"""
set -euo pipefail
mount -t tmpfs tmpfs /run/netns
ip link set lo up
sysctl -qw net.ipv4.ip_forward=1
source {ROOT}/hack/cluster/lib.sh
source {ROOT}/hack/cluster/procs.sh
source {ROOT}/hack/cluster/host.sh
node_network 2
node_network 3
node_network 2   # again: nothing changes, nothing fails
echo "route $(ip -4 route get "$(node_pod_cidr 3 | sed 's|0/24|9|')" | head -n 1)"
for pair in "2 3" "3 2"; do
  read -r from to <<<"$pair"
  on_node "$to" python3 -c "$SERVE" "$(node_addr "$to")" &
  on_node "$from" python3 -c "$ASK" "$(node_addr "$to")" && echo "${{from}}->${{to}} reached"
  wait
done
echo "node2 routes: $(on_node 2 ip -4 route | tr '\\n' ';')"
ls /run/netns
"""
    proc = subprocess.run(
        ["unshare", "--net", "--mount", "--propagation", "private", "bash", "-c", script],
        env={
            "SERVE": SERVE,
            "ASK": ASK,
            **os.environ,
            "GPUPIPE_CLUSTER_DIR": str(tmp_path / "state"),
            "GPUPIPE_CLUSTER_CACHE": str(tmp_path / "cache"),
            "GPUPIPE_CLUSTER_NODES": "3",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "bridge-nf-call-iptables cannot be set" in proc.stderr:
        pytest.skip("br_netfilter is not loaded here (cluster-up loads it)")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    link = VERSIONS["NODE_LINK_CIDR"].rsplit(".", 2)[0]
    assert out[0].startswith("route ") and f"via {link}.3.2 dev gpn-3" in out[0], out
    assert "2->3 reached" in out and "3->2 reached" in out, out
    # Each server saw its client's own address: the hop through the host routes, it does not NAT.
    assert f"hello {link}.2.2" in out and f"hello {link}.3.2" in out, out
    node2_routes = next(line for line in out if line.startswith("node2 routes:"))
    assert f"default via {link}.2.1 dev eth0" in node2_routes, node2_routes
    assert f"{link}.3." not in node2_routes, node2_routes  # no direct way to node 3
    assert sorted(out[-2:]) == ["gpupipe-node-2", "gpupipe-node-3"], out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["reboot", "2"], "unknown verb 'reboot'"),
        (["stop", "1"], "node '1' is not one of the cluster's nodes 2..2 (node 1 is the host"),
        (["stop", "3"], "node '3' is not one of the cluster's nodes 2..2"),
        (["cut", "b"], "node 'b' is not one of the cluster's nodes 2..2"),
    ],
)
def test_cluster_node_refuses_a_verb_or_node_it_cannot_act_on_in_one_line(
    tmp_path: Path, args: list[str], says: str
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "node-count").write_text("2\n")
    (state / "kubeconfig").write_text("")
    proc = subprocess.run(
        [str(ROOT / "hack/cluster-node.sh"), *args],
        env={
            **os.environ,
            "GPUPIPE_CLUSTER_DIR": str(state),
            "GPUPIPE_CLUSTER_CACHE": str(tmp_path / "c"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: cluster-node: "), (
        proc.stderr
    )
    assert says in proc.stderr, proc.stderr


def test_cluster_node_without_a_cluster_says_so(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(ROOT / "hack/cluster-node.sh"), "stop", "2"],
        env={
            **os.environ,
            "GPUPIPE_CLUSTER_DIR": str(tmp_path / "none"),
            "GPUPIPE_CLUSTER_CACHE": str(tmp_path / "c"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "no test cluster here" in proc.stderr, proc
