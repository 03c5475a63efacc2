"""`make cluster-down` removes what its cluster made and nothing else (issues 39 and 60).

It used to remove every `cni-*` network namespace, every `KUBE-*`/`CNI-*` iptables chain and
every `*/kubepods` cgroup on the host; then still every IPVS service (`kube-proxy --cleanup`),
another Kubernetes' `KUBE-*` chains whenever no process was named exactly `kubelet`, and anything
on podman's 10.88.0.0/16 (the cluster's pod range then); and a neighbour's `ip netns add` while
the cluster ran left 17 of the pods' own namespaces mounted. Before it runs here, the things of
those kinds are made as other tools make them, while the cluster runs; afterwards all of them are
still there, and nothing of the cluster's is left. cluster-up, run again beside a process named as
k3s names its own, refuses in one line and leaves the running cluster alone. Marked ``teardown``,
not ``cluster``: it takes the cluster down, so .ci/run runs it last (``pytest -m teardown``).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster import kube

pytestmark = [pytest.mark.teardown, pytest.mark.timeout(600)]

NETNS = "cni-foreign-0000-gpupipe-test"
PODMAN_NETNS = "netns-gpupipe-test-podman"  # podman names its namespaces netns-<uuid>
PODMAN_ADDR = "10.88.0.7"  # podman's default network: the cluster's pod range before issue 60
PODMAN_RULE = ("CNI-FORWARD", "-s", f"{PODMAN_ADDR}/32", "-j", "ACCEPT")  # its firewall plugin's
IP_NETNS = "gpupipe-test-ip-netns"  # made with `ip netns add` while the cluster runs
IPVS_SERVICE = "198.51.100.10:80"
CHAINS = {"nat": "KUBE-FOREIGN-TEST", "filter": "CNI-FOREIGN-TEST"}
CGROUP = Path("/sys/fs/cgroup/memory/kubepods")  # where a kubelet of the default cgroup root is
CGROUP_ROOT = "gpupipe-test-cluster"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=120)


def ipvs_unavailable() -> str | None:
    """Why no IPVS service can be made here (None when one can)."""
    if not shutil.which("ipvsadm"):
        return "no ipvsadm (hack/cluster-up.sh installs it)"
    probe = sh("ipvsadm", "-Ln", check=False)
    if probe.returncode != 0:
        first = (probe.stderr.strip().splitlines() or [""])[0][:120]
        return f"the kernel has no IPVS (CONFIG_IP_VS): ipvsadm -Ln: {first}"
    return None


@dataclass
class Teardown:
    refused: subprocess.CompletedProcess[str]  # cluster-up beside a process named k3s-server
    answered_after_refusal: bool
    down: subprocess.CompletedProcess[str]
    ours_before: list[str]  # the pods' namespaces while the cluster ran
    ran_kube_router: bool
    ipvs: bool  # a foreign IPVS service was made


@pytest.fixture(scope="module")
def teardown(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Teardown]:
    """Other tools' namespaces, iptables chains, cgroup and IPVS service, made while the cluster
    runs; then cluster-down."""
    if CGROUP.exists():
        pytest.skip(f"{CGROUP} exists already: another kubelet runs here")
    ours_before = [n for n in netns_names() if n.startswith("cni-")]
    refused, answered = start_beside_k3s(tmp_path_factory.mktemp("k3s"))
    path = Path("/run/netns") / NETNS
    podman = Path("/run/netns") / PODMAN_NETNS
    ipvs = False
    try:
        # As CNI makes one (a bind mount of the namespace on a file in /run/netns).
        path.parent.mkdir(exist_ok=True)
        path.touch()
        sh("unshare", f"--net={path}", "true")
        # As podman makes one on its default network: an address on 10.88.0.0/16, and its firewall
        # plugin's rule for that address in the shared CNI-FORWARD chain.
        podman.touch()
        sh("unshare", f"--net={podman}", "true")
        sh("ip", "-n", PODMAN_NETNS, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
        sh("ip", "-n", PODMAN_NETNS, "addr", "add", f"{PODMAN_ADDR}/16", "dev", "eth0")
        sh("iptables", "-t", "filter", "-N", "CNI-FORWARD", check=False)
        sh("iptables", "-A", *PODMAN_RULE)
        # iproute2's: the first `ip netns add` bind-mounts /run/netns over itself (when it is no
        # mount point yet), over the pods' namespace mounts.
        sh("ip", "netns", "add", IP_NETNS)
        for table, chain in CHAINS.items():
            sh("iptables", "-t", table, "-N", chain)
            sh("iptables", "-t", table, "-A", chain, "-s", "198.51.100.7/32", "-j", "RETURN")
        ipvs = ipvs_unavailable() is None
        if ipvs:  # as keepalived, kube-router's proxy or k3s make one
            sh("ipvsadm", "-A", "-t", IPVS_SERVICE, "-s", "rr")
        CGROUP.mkdir()
        ran_kube_router = (kube.STATE / "addons" / "network-policy").is_dir()
        down = kube.run_script("cluster-down.sh")
        yield Teardown(refused, answered, down, ours_before, ran_kube_router, ipvs)
    finally:
        sh("umount", str(path), check=False)
        path.unlink(missing_ok=True)
        sh("umount", str(podman), check=False)
        podman.unlink(missing_ok=True)
        sh("ip", "netns", "delete", IP_NETNS, check=False)
        sh("iptables", "-D", *PODMAN_RULE, check=False)
        left_shared_cni_chains()
        for table, chain in CHAINS.items():
            sh("iptables", "-t", table, "-F", chain, check=False)
            sh("iptables", "-t", table, "-X", chain, check=False)
        if ipvs:
            sh("ipvsadm", "-D", "-t", IPVS_SERVICE, check=False)
        if CGROUP.exists():
            CGROUP.rmdir()


def start_beside_k3s(tmp: Path) -> tuple[subprocess.CompletedProcess[str], bool]:
    """cluster-up, run again while a process named as k3s names its server runs here; whether
    the cluster still answers afterwards."""
    k3s = tmp / "k3s-server"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", k3s)
    marker = kube.CACHE / "cluster.unavailable"
    had_marker = marker.exists()
    proc = subprocess.Popen([str(k3s), "300"])
    try:
        refused = kube.run_script("cluster-up.sh", timeout=300)
    finally:
        proc.kill()
        proc.wait()
    if not had_marker:  # its line would make later cluster tests skip while no cluster answers
        marker.unlink(missing_ok=True)
    return refused, kube.unavailable() is None


def left_shared_cni_chains() -> None:
    """As podman would when its last container goes: the firewall plugin's shared CNI-FORWARD and
    CNI-ADMIN chains, which cluster-down left because podman's rule was in CNI-FORWARD."""
    rules = sh("iptables", "-S", "CNI-FORWARD", check=False).stdout.splitlines()
    if [r for r in rules if r.startswith("-A") and not r.endswith("-j CNI-ADMIN")]:
        return
    if sh("iptables", "-S", "CNI-ADMIN", check=False).stdout.count("-A "):
        return
    for rule in sh("iptables", "-S", "FORWARD").stdout.splitlines():
        if rule.endswith("-j CNI-FORWARD"):  # -A FORWARD ... as argv (its comment quoted)
            sh("iptables", "-D", *shlex.split(rule)[1:], check=False)
    for chain in ("CNI-FORWARD", "CNI-ADMIN"):
        sh("iptables", "-F", chain, check=False)
        sh("iptables", "-X", chain, check=False)


def netns_names() -> list[str]:
    return [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line]


def test_cluster_down_succeeds(teardown: Teardown) -> None:
    assert teardown.ours_before, "the cluster's pods have no namespaces?"
    down = teardown.down
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]


def test_cluster_up_refuses_to_start_beside_another_kubernetes(teardown: Teardown) -> None:
    refused = teardown.refused
    assert refused.returncode == 3, refused.stdout[-2000:] + refused.stderr[-2000:]
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert "another Kubernetes runs in this network namespace: k3s-server (pid" in line, line
    assert "refusing to start beside it" in line
    assert teardown.answered_after_refusal, "the running cluster was touched"


def test_another_tools_namespaces_chains_and_cgroup_stay(teardown: Teardown) -> None:
    names = netns_names()
    for ns in (NETNS, PODMAN_NETNS, IP_NETNS):
        assert ns in names, names
        assert sh("ip", "netns", "exec", ns, "true", check=False).returncode == 0, ns
    assert PODMAN_ADDR in sh("ip", "-n", PODMAN_NETNS, "-4", "addr", "show", "eth0").stdout
    assert (
        f"-A CNI-FORWARD -s {PODMAN_ADDR}/32 -j ACCEPT"
        in sh("iptables", "-S", "CNI-FORWARD").stdout
    )
    for table, chain in CHAINS.items():
        assert "198.51.100.7" in sh("iptables", "-t", table, "-S", chain).stdout, chain
    assert CGROUP.is_dir()


def test_another_tools_ipvs_service_stays(teardown: Teardown) -> None:
    if not teardown.ipvs:
        pytest.skip(f"no IPVS service could be made here: {ipvs_unavailable()}")
    assert IPVS_SERVICE in sh("ipvsadm", "-Ln").stdout


def test_none_of_the_clusters_namespaces_is_left_even_after_ip_netns_add(
    teardown: Teardown,
) -> None:
    left = [n for n in netns_names() if n.startswith("cni-")]
    assert left == [NETNS], left
    mounted = [
        line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if "/run/netns/cni-" in line.split()[4] and NETNS not in line
    ]  # fmt: skip
    assert mounted == [], mounted
    assert not [n for n in teardown.ours_before if (Path("/run/netns") / n).exists()]


def test_nothing_of_the_clusters_networking_or_state_is_left(teardown: Teardown) -> None:
    rules = "".join(sh("iptables", "-t", t, "-S").stdout for t in ("nat", "filter", "mangle"))
    assert 'name: \\"gpupipe\\"' not in rules
    assert "KUBE-SERVICES" not in rules and "KUBE-KUBELET-CANARY" not in rules
    assert "10.123." not in rules  # the pod range (hack/cluster/versions.env)
    if teardown.ran_kube_router:  # the network-policy add-on's chains and ipsets
        for prefix in ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-"):
            assert prefix not in rules, prefix
        sets = sh("ipset", "list", "-n").stdout.split()
        assert not [s for s in sets if s.startswith(("KUBE-SRC-", "KUBE-DST-"))], sets
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{CGROUP_ROOT}"))
    assert not kube.STATE.exists()
    assert sh("ip", "link", "show", "gpupipe0", check=False).returncode != 0
    # Nodes 2..N (make cluster-up NODES=N): their namespaces, the host's ends of their links
    # and the routes to their pods (the FORWARD rules carry the CNI comment, checked above).
    assert not [n for n in netns_names() if n.startswith("gpupipe-node-")]
    links = sh("ip", "-o", "link", "show").stdout
    assert " gpn-" not in links, links
    routes = sh("ip", "-4", "route", "show").stdout
    assert "10.123." not in routes and "10.125." not in routes, routes
