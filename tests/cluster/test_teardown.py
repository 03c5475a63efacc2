"""`make cluster-down` removes what its cluster made and nothing else (issue 39).

It used to remove every `cni-*` network namespace, every `KUBE-*`/`CNI-*` iptables chain and
every `*/kubepods` cgroup on the host. Before it runs here, a namespace, two chains and a cgroup
of the kinds it used to take are made as another tool would make them; afterwards all of them
are still there, and nothing of the cluster's is left. Marked ``teardown``, not ``cluster``: it
takes the cluster down, so .ci/run runs it last (``pytest -m teardown``).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import kube

pytestmark = [pytest.mark.teardown, pytest.mark.timeout(600)]

NETNS = "cni-foreign-0000-gpupipe-test"
CHAINS = {"nat": "KUBE-FOREIGN-TEST", "filter": "CNI-FOREIGN-TEST"}
CGROUP = Path("/sys/fs/cgroup/memory/kubepods")  # where a kubelet of the default cgroup root is
CGROUP_ROOT = "gpupipe-test-cluster"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=120)


@pytest.fixture
def foreign(tmp_path: Path) -> Iterator[Path]:
    """Another tool's network namespace, iptables chains (each with a rule) and cgroup."""
    if CGROUP.exists():
        pytest.skip(f"{CGROUP} exists already: another kubelet runs here")
    # As CNI makes one (a bind mount of the namespace on a file in /run/netns), not with
    # `ip netns add`, which first bind-mounts /run/netns over itself and so hides the pods'
    # namespace mounts beneath it (each then fails to delete with "Device or resource busy").
    path = Path("/run/netns") / NETNS
    path.parent.mkdir(exist_ok=True)
    path.touch()
    sh("unshare", f"--net={path}", "true")
    for table, chain in CHAINS.items():
        sh("iptables", "-t", table, "-N", chain)
        sh("iptables", "-t", table, "-A", chain, "-s", "198.51.100.7/32", "-j", "RETURN")
    CGROUP.mkdir()
    yield CGROUP
    sh("umount", str(path), check=False)
    path.unlink(missing_ok=True)
    for table, chain in CHAINS.items():
        sh("iptables", "-t", table, "-F", chain, check=False)
        sh("iptables", "-t", table, "-X", chain, check=False)
    if CGROUP.exists():
        CGROUP.rmdir()


def test_cluster_down_removes_only_what_its_cluster_made(foreign: Path) -> None:
    netns_before = sh("ip", "netns", "list").stdout
    ran_kube_router = (kube.STATE / "addons" / "network-policy").is_dir()
    assert "cni-" in netns_before.replace(NETNS, ""), "the cluster's pods have no namespaces?"
    down = kube.run_script("cluster-down.sh")
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]

    # Another tool's: all still there.
    assert NETNS in sh("ip", "netns", "list").stdout
    for table, chain in CHAINS.items():
        assert "198.51.100.7" in sh("iptables", "-t", table, "-S", chain).stdout, chain
    assert foreign.is_dir()
    # The cluster's: gone.
    left = [n for n in sh("ip", "netns", "list").stdout.split() if n.startswith("cni-")]
    assert left == [NETNS], left
    rules = "".join(sh(cmd, "-t", t, "-S").stdout for cmd in ("iptables",) for t in CHAINS)
    assert 'name: \\"gpupipe\\"' not in rules
    assert "KUBE-SERVICES" not in rules and "KUBE-KUBELET-CANARY" not in rules
    if ran_kube_router:  # the network-policy add-on's chains and ipsets
        for prefix in ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-"):
            assert prefix not in rules, prefix
        sets = sh("ipset", "list", "-n").stdout.split()
        assert not [s for s in sets if s.startswith(("KUBE-SRC-", "KUBE-DST-"))], sets
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{CGROUP_ROOT}"))
    assert not kube.STATE.exists()
    assert sh("ip", "link", "show", "gpupipe0", check=False).returncode != 0
    assert shutil.which("ip")
