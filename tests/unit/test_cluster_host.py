"""The test cluster as a neighbour on its host (hack/cluster/host.sh, issue 60 item 9).

cluster-down ran `kube-proxy --cleanup` (it flushes every IPVS service on the host), took every
`KUBE-*` chain whenever no process was named exactly `kubelet`, matched namespaces and
`CNI-FORWARD` rules by address alone on podman's default range, and deleted rules with `eval` of
`iptables -S` output. Now cluster-up refuses to start beside another Kubernetes or on a route's
range and records the host first; cluster-down removes what came after, by names, bridge and
comments, through iptables-restore. Fake iptables tools, real processes and (as root) real mount
namespaces: no cluster needed.
"""

from __future__ import annotations

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
POD_CIDR = VERSIONS["POD_CIDR"]
POD_NET = POD_CIDR.rsplit(".", 2)[0]  # e.g. 10.123


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/bash\n" + body)
    (bin_dir / name).chmod(0o755)


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("10.88.0.0/16", POD_CIDR, False),
        (POD_CIDR, POD_CIDR, True),
        (f"{POD_NET}.7.0/24", POD_CIDR, True),
        (f"{POD_NET}.7.9", POD_CIDR, True),
        ("10.0.0.0/8", POD_CIDR, True),
        ("172.17.0.0/16", VERSIONS["SERVICE_CIDR"], False),
        ("0.0.0.0/0", "192.0.2.0/24", True),
    ],
    ids=["podman", "same", "inside", "address", "wider", "docker-vs-services", "everything"],
)
def test_ranges_overlap_by_address_and_length(
    tmp_path: Path, a: str, b: str, overlap: bool
) -> None:
    out = _bash(tmp_path, f"cidrs_overlap {a} {b}")
    assert (out.returncode == 0) == overlap, out.stderr


def test_the_pod_and_service_ranges_are_none_of_the_usual_defaults(tmp_path: Path) -> None:
    """podman/containerd's sample, CRI-O, Docker, kubeadm/kind/minikube, k3s, MicroK8s, kubespray,
    Weave, Calico, OpenShift: a host that runs any of them keeps its networking."""
    defaults = [
        "10.88.0.0/16", "10.85.0.0/16", "172.17.0.0/16", "10.244.0.0/16", "10.96.0.0/12",
        "10.42.0.0/16", "10.43.0.0/16", "10.1.0.0/16", "10.152.183.0/24", "10.233.0.0/18",
        "10.233.64.0/18", "10.32.0.0/12", "192.168.0.0/16", "10.128.0.0/14", "172.30.0.0/16",
        "100.64.0.0/10",
    ]  # fmt: skip
    for ours in (VERSIONS["POD_CIDR"], VERSIONS["SERVICE_CIDR"]):
        for theirs in defaults:
            out = _bash(tmp_path, f"cidrs_overlap {ours} {theirs}")
            assert out.returncode != 0, f"{ours} overlaps {theirs}"
    assert (
        _bash(
            tmp_path, f"cidrs_overlap {VERSIONS['CLUSTER_DNS']} {VERSIONS['SERVICE_CIDR']}"
        ).returncode
        == 0
    )


ROUTES = f"""default via 192.0.2.1 dev eth0
10.88.0.0/16 dev podman0 proto kernel scope link src 10.88.0.1
{POD_CIDR} dev gpupipe0 proto kernel scope link src {POD_NET}.0.1
local 192.0.2.2 dev eth0 table local proto kernel scope host src 192.0.2.2
"""


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        ("", ""),
        (
            f"{POD_NET}.64.0/18 via 192.0.2.9 dev eth0\n",
            f"{POD_NET}.64.0/18 via 192.0.2.9 dev eth0",
        ),
        (
            f"local {POD_NET}.3.4 dev wg0 table local scope host\n",
            f"local {POD_NET}.3.4 dev wg0 table local scope host",
        ),
        ("unreachable 10.0.0.0/8 metric 9\n", "unreachable 10.0.0.0/8 metric 9"),
    ],
    ids=["none-but-ours-and-podman", "a-vpn-route", "a-local-address", "a-wide-unreachable"],
)
def test_a_route_on_the_pod_range_is_found_but_the_clusters_own_bridge(
    tmp_path: Path, extra: str, expect: str
) -> None:
    bin_dir = tmp_path / "bin"
    (tmp_path / "routes").write_text(ROUTES + extra)
    _fake(bin_dir, "ip", f"cat {tmp_path / 'routes'}\n")
    out = _bash(tmp_path, f"overlapping_route {POD_CIDR}", bin_dir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expect


def test_cluster_up_refuses_a_pod_range_a_route_has_in_one_line(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    (tmp_path / "routes").write_text(ROUTES + f"{POD_NET}.0.0/20 dev tun0\n")
    _fake(bin_dir, "ip", f'[[ "$*" == *route* ]] || exit 1; cat {tmp_path / "routes"}\n')
    _fake(bin_dir, "pgrep", "exit 1\n")
    _fake(bin_dir, "iptables", "exit 1\n")
    out = _bash(tmp_path, "refuse_neighbour_network; echo started", bin_dir)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "started" not in out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert (
        f"POD_CIDR {POD_CIDR} overlaps a route of this host ({POD_NET}.0.0/20 dev tun0)" in lines[0]
    )
    assert not (tmp_path / "state").exists()


def test_cluster_up_refuses_another_kubernetes_service_chain(tmp_path: Path) -> None:
    """k3s and MicroK8s run no process named kubelet, but their kube-proxy's chains are there."""
    bin_dir = tmp_path / "bin"
    _fake(bin_dir, "ip", '[[ "$*" == *route* ]]\n')  # no routes, no kube-ipvs0
    _fake(bin_dir, "pgrep", "exit 1\n")
    _fake(bin_dir, "iptables", '[[ "$*" == *"-S KUBE-SERVICES"* ]]\n')
    out = _bash(tmp_path, "refuse_neighbour_network; echo started", bin_dir)
    assert out.returncode == 3, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "KUBE-SERVICES" in line and "refusing to start beside it" in line, line
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("name", ["kubelet", "k3s-server", "kube-proxy"])
def test_cluster_up_refuses_another_kubernetes_process_in_its_network_namespace(
    tmp_path: Path, name: str
) -> None:
    """A real process of that name, not started by the cluster (not under its binary folder)."""
    theirs = tmp_path / "elsewhere" / name
    theirs.parent.mkdir()
    shutil.copy(shutil.which("sleep") or "/bin/sleep", theirs)
    proc = subprocess.Popen([str(theirs), "60"])
    try:
        out = _bash(tmp_path, "refuse_neighbour_network; echo started")
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 3, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "another Kubernetes runs in this network namespace:" in line, line
    assert not (tmp_path / "state").exists()


# iptables-save of a host where the cluster ran beside podman, k3s-like chains recorded at
# cluster-up, and a rule whose comment would run a command if it were ever evaluated by a shell.
SAVE_NAT = f"""# Generated by iptables-save
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-NEIGHBOUR-OWN - [0:0]
:CNI-0123456789abcdef01234567 - [0:0]
:CNI-fedcba9876543210fedcba98 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -s {POD_NET}.0.5/32 -m comment --comment "name: \\"gpupipe\\" id: \\"abc\\"" -j CNI-0123456789abcdef01234567
-A POSTROUTING -s 10.88.0.5/32 -m comment --comment "name: \\"podman\\" id: \\"def\\"" -j CNI-fedcba9876543210fedcba98
-A POSTROUTING -m comment --comment "$(touch {{pwned}}) name: \\"gpupipe\\"" -j MASQUERADE
-A KUBE-SERVICES -d 10.127.0.1/32 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A CNI-0123456789abcdef01234567 -d {POD_NET}.0.0/16 -j ACCEPT
-A CNI-fedcba9876543210fedcba98 -d 10.88.0.0/16 -j ACCEPT
COMMIT
"""  # noqa: E501
SAVE_FILTER = f"""*filter
:FORWARD ACCEPT [0:0]
:CNI-FORWARD - [0:0]
:CNI-ADMIN - [0:0]
:KUBE-ROUTER-FORWARD - [0:0]
-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
-A FORWARD -j KUBE-ROUTER-FORWARD
-A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN
-A CNI-FORWARD -d {POD_NET}.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A CNI-FORWARD -s {POD_NET}.0.5/32 -j ACCEPT
-A CNI-FORWARD -s 10.88.0.5/32 -j ACCEPT
-A CNI-FORWARD -d {POD_NET}.1.77/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-ROUTER-FORWARD -j ACCEPT
COMMIT
"""


def _iptables_host(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    (tmp_path / "nat").write_text(SAVE_NAT.replace("{pwned}", str(tmp_path / "pwned")))
    (tmp_path / "filter").write_text(SAVE_FILTER)
    tables = f'nat|filter) cat {tmp_path}/"$2" ;;'
    _fake(
        bin_dir,
        "iptables-save",
        f'case "$2" in {tables} *) printf "*%s\\nCOMMIT\\n" "$2" ;; esac\n',
    )
    _fake(bin_dir, "iptables-restore", f"cat >>{tmp_path}/restored\n")
    _fake(bin_dir, "pgrep", "exit 1\n")
    record = tmp_path / "state" / "host-before"
    record.mkdir(parents=True)
    (record / "chains.iptables.nat").write_text("PREROUTING\nPOSTROUTING\nKUBE-NEIGHBOUR-OWN\n")
    (record / "chains.iptables.filter").write_text("FORWARD\n")
    (record / "netns").write_text("")
    return bin_dir


def test_cluster_down_removes_its_rules_by_comment_record_and_bridge_never_by_eval(
    tmp_path: Path,
) -> None:
    bin_dir = _iptables_host(tmp_path)
    out = _bash(tmp_path, "RAN_KUBE_ROUTER=1 remove_our_iptables", bin_dir)
    assert out.returncode == 0, out.stderr
    restored = (tmp_path / "restored").read_text()
    nat, filt = restored.split("COMMIT\n")[:2]
    # Ours: the CNI network's rules and chain, kube-proxy's chains and their jumps.
    assert f"-D POSTROUTING -s {POD_NET}.0.5/32" in nat
    assert "-X CNI-0123456789abcdef01234567" in nat
    assert "-D PREROUTING -m comment" in nat and "-X KUBE-SERVICES" in nat
    assert "-X KUBE-SVC-AAAAAAAAAAAAAAAA" in nat
    # The comment is handed to iptables-restore as text: never run.
    assert "$(touch" in nat and not (tmp_path / "pwned").exists()
    # Theirs: podman's rules and chain, a chain recorded before cluster-up.
    assert "10.88.0.5" not in restored and "fedcba98" not in restored
    assert "KUBE-NEIGHBOUR-OWN" not in restored
    # The firewall plugin's: our pods' rules, also one whose address the IPAM released already
    # (its pod's CNI DEL found no cached result; CI found 32 such); the shared chains stay while
    # podman's rule is there.
    assert (
        f"-D CNI-FORWARD -d {POD_NET}.0.5/32" in filt
        and f"-D CNI-FORWARD -s {POD_NET}.0.5/32" in filt
        and f"-D CNI-FORWARD -d {POD_NET}.1.77/32" in filt
    )
    assert "-X CNI-FORWARD" not in filt and "-X CNI-ADMIN" not in filt
    assert "-D FORWARD -j KUBE-ROUTER-FORWARD" in filt and "-X KUBE-ROUTER-FORWARD" in filt


def test_the_firewall_plugins_shared_chains_go_with_their_jump_once_nothing_else_is_in_them(
    tmp_path: Path,
) -> None:
    bin_dir = _iptables_host(tmp_path)
    filt = tmp_path / "filter"
    filt.write_text(filt.read_text().replace("-A CNI-FORWARD -s 10.88.0.5/32 -j ACCEPT\n", ""))
    out = _bash(tmp_path, "RAN_KUBE_ROUTER=1 remove_our_iptables", bin_dir)
    assert out.returncode == 0, out.stderr
    restored = (tmp_path / "restored").read_text()
    jump = '-D FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD'
    assert jump in restored
    assert "-X CNI-FORWARD" in restored and "-X CNI-ADMIN" in restored


def test_kubernetes_chains_stay_while_another_kubernetes_runs(tmp_path: Path) -> None:
    bin_dir = _iptables_host(tmp_path)
    theirs = tmp_path / "elsewhere" / "k3s-server"
    theirs.parent.mkdir()
    shutil.copy(shutil.which("sleep") or "/bin/sleep", theirs)
    proc = subprocess.Popen([str(theirs), "60"])
    try:
        path = f"{tmp_path / 'bin'}:{os.environ['PATH']}"
        (bin_dir / "pgrep").unlink()  # the real one: it finds k3s-server
        out = _bash(tmp_path, "RAN_KUBE_ROUTER=0 remove_our_iptables", None, PATH=path)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 0, out.stderr
    # k3s-server, or a kubelet found first: a test cluster running beside the tests (.ci/run runs
    # make test while its cluster is up), which this fake host's records do not know as ours.
    assert "another Kubernetes runs here (k3s-server" in out.stdout or (
        "another Kubernetes runs here (kubelet" in out.stdout
        and subprocess.run(["pgrep", "-x", "kubelet"], capture_output=True).returncode == 0
    ), out.stdout
    restored = (tmp_path / "restored").read_text()
    assert "KUBE-SERVICES" not in restored and "KUBE-SVC-" not in restored
    assert "KUBE-ROUTER-FORWARD" not in restored  # not ran by this cluster
    assert "-X CNI-0123456789abcdef01234567" in restored  # its own network's still go


def test_the_teardown_has_no_eval_and_no_global_cleanup() -> None:
    down = (ROOT / "hack/cluster-down.sh").read_text() + (ROOT / "hack/cluster/host.sh").read_text()
    code = "\n".join(line for line in down.splitlines() if not line.lstrip().startswith("#"))
    assert "eval " not in code
    assert "--cleanup" not in code and "ipvsadm -C" not in code and "ipvsadm --clear" not in code


NETNS_SCRIPT = r"""
mount -t tmpfs none /run
{prepare}
mkdir -p "$NETNS_DIR"
touch "$NETNS_DIR/cni-ours-1" "$NETNS_DIR/cni-ours-2"
unshare --net="$NETNS_DIR/cni-ours-1" true
unshare --net="$NETNS_DIR/cni-ours-2" true
# iproute2 bind-mounts /run/netns over itself when it is no mount point yet
ip netns add neighbour
touch "$NETNS_DIR/cni-ours-3" && unshare --net="$NETNS_DIR/cni-ours-3" true
remove_netns cni-ours-1 cni-ours-2 cni-ours-3
release_netns_dir
echo "left: $(ls "$NETNS_DIR" | tr '\n' ' ')"
# ours only: mountinfo also lists a running test cluster's pods' mounts, beneath the tmpfs
echo "mounted: $(awk '$5 ~ /^\/run\/netns\/cni-ours-/ {print $5}' /proc/self/mountinfo |
  tr '\n' ' ')"
ip netns exec neighbour true && echo "neighbour works"
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
    reason="needs root, unshare and iproute2 (a mount namespace of its own)",
)
@pytest.mark.parametrize(
    "prepare",
    ["shared_netns_dir", ":"],
    ids=["cluster-up-made-it-shared", "stacked-by-the-neighbour"],
)
def test_a_neighbours_ip_netns_add_leaves_none_of_the_pods_namespaces(
    tmp_path: Path, prepare: str
) -> None:
    """Reproduced first: without either fix, `ip netns add` beside the pods left each of the
    namespaces made before it mounted and undeletable ("Device or resource busy")."""
    script = NETNS_SCRIPT.replace("{prepare}", prepare)
    out = _bash(
        tmp_path,
        f"unshare -m --propagation private bash -c {_quote(_prelude() + script)}",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "left: neighbour \n" in out.stdout, out.stdout
    assert "mounted: \n" in out.stdout, out.stdout
    assert "neighbour works" in out.stdout


def _prelude() -> str:
    return (
        "set -euo pipefail\n"
        f"source {ROOT}/hack/cluster/lib.sh\n"
        f"source {ROOT}/hack/cluster/procs.sh\n"
        f"source {ROOT}/hack/cluster/host.sh\n"
        'mkdir -p "$STATE"\n'
    )


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"
