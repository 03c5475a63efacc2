"""The test cluster's NetworkPolicy add-on (hack/cluster/addons/network-policy.sh): kube-router's
policy controller alone, built from a wrapper module whose dependencies are raised past what
govulncheck flags in v2.1.0's, and a cluster-down that removes its chains and nothing else.

The cluster itself is checked by tests/cluster/test_networkpolicy.py; these run without one.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "hack" / "cluster"
SCRIPT = CLUSTER / "addons" / "network-policy.sh"
GOMOD = (CLUSTER / "gomod" / "kube-router" / "go.mod").read_text()
MODULE = "github.com/cloudnativelabs/kube-router/v2"


def _versions() -> dict[str, str]:
    return dict(re.findall(r"^([A-Z0-9_]+)=(\S+)$", (CLUSTER / "versions.env").read_text(), re.M))


VERSIONS = _versions()


def _required() -> dict[str, str]:
    """module -> version, of every requirement in the wrapper's go.mod."""
    return dict(re.findall(r"^(?:require )?\s*(\S+) (v\S+)(?: // indirect)?$", GOMOD, re.M))


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version.split("-")[0].split("+")[0]))


def test_the_wrapper_module_builds_the_release_versions_env_names() -> None:
    assert f"require {MODULE} v{VERSIONS['KUBE_ROUTER_VERSION']}\n" in GOMOD
    assert f"tool {MODULE}/cmd/kube-router\n" in GOMOD
    assert VERSIONS["KUBE_ROUTER_GOTOOLCHAIN"].startswith("go1.")


# What govulncheck (golang.org/x/vuln v1.9.0, the vulnerability database of golang.org/x/vulndb
# as of 2026-11-05) reports against kube-router v2.1.0's own requirements, and the release that
# fixes the last of each module's findings. Findings with no fixed release are named in
# docs/test-cluster.md.
FIXED_IN = {
    "golang.org/x/net": "v0.62.0",
    "golang.org/x/text": "v0.41.0",
    "golang.org/x/oauth2": "v0.27.0",
    "golang.org/x/sys": "v0.44.0",
    "google.golang.org/grpc": "v1.83.1",
    "google.golang.org/protobuf": "v1.33.0",
    "github.com/osrg/gobgp/v3": "v3.35.0",
    "github.com/docker/docker": "v25.0.13+incompatible",
}


@pytest.mark.parametrize("module", sorted(FIXED_IN), ids=sorted(FIXED_IN))
def test_the_wrapper_module_raises_each_flagged_dependency_to_its_fix(module: str) -> None:
    have = _required()[module]
    assert _release(have) >= _release(FIXED_IN[module]), f"{module} {have} < {FIXED_IN[module]}"


def _flags(tmp_path: Path) -> list[str]:
    env = {
        **os.environ,
        "GPUPIPE_CLUSTER_DIR": str(tmp_path / "state"),
        "GPUPIPE_CLUSTER_CACHE": str(tmp_path / "cache"),
    }
    out = subprocess.run(
        [str(SCRIPT), "flags"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def _options(args: list[str]) -> dict[str, str]:
    """--name=value and --name value pairs (a flag followed by another flag has no value)."""
    found: dict[str, str] = {}
    i = 0
    while i < len(args):
        name, _, value = args[i].partition("=")
        if not value and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 1
        found[name] = value
        i += 1
    return found


def test_kube_router_runs_its_policy_controller_alone(tmp_path: Path) -> None:
    args = _flags(tmp_path)
    binary = Path(args[0])
    assert binary.name == "kube-router"
    assert binary.parent.name.startswith(f"kube-router-{VERSIONS['KUBE_ROUTER_VERSION']}-")
    assert binary.is_relative_to(tmp_path / "cache" / "bin")
    options = _options(args[1:])
    # The firewall only: the CNI bridge plugin gives pods their addresses, kube-proxy serves
    # Services; no BGP server (whose admin port an advisory against v2.1.0 is about) and no
    # service proxy (the other advisory's subject).
    assert options["--run-firewall"] == "true"
    for off in ("--run-router", "--run-service-proxy", "--run-loadbalancer", "--enable-cni"):
        assert options[off] == "false", off
    # Nothing listens: upstream's health port binds every interface, so it is off, as metrics are.
    assert options["--health-port"] == "0" and options["--metrics-port"] == "0"
    assert options["--service-cluster-ip-range"] == VERSIONS["SERVICE_CIDR"]
    assert options["--hostname-override"] == "gpupipe-node"
    assert options["--kubeconfig"] == str(tmp_path / "state" / "pki" / "kube-router.kubeconfig")


def _module_dir() -> Path:
    """kube-router's module download in Go's module cache (skips where it is not there)."""
    try:
        cache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no Go here to find kube-router's module download: {e}")
    found = Path(cache) / f"{MODULE}@v{VERSIONS['KUBE_ROUTER_VERSION']}"
    if not found.is_dir():
        pytest.skip(f"kube-router's module is not downloaded here: {found}")
    return found


def test_every_flag_is_one_kube_router_has(tmp_path: Path) -> None:
    source = (_module_dir() / "pkg" / "options" / "options.go").read_text()
    known = set(re.findall(r'fs\.\w+VarP?\(&s\.\w+, "([a-z0-9-]+)"', source))
    assert {"run-firewall", "run-router", "health-port"} <= known, "options.go's layout changed?"
    used = {name.removeprefix("--") for name in _options(_flags(tmp_path)[1:])}
    assert used <= known, sorted(used - known)


def _kube_router_chain(name: str) -> bool:
    text = (ROOT / "hack" / "cluster" / "host.sh").read_text()  # cluster-down.sh sources it
    (function,) = re.findall(r"^kube_router_chain\(\) \{\n.*?\n\}\n", text, re.M | re.S)
    out = subprocess.run(
        ["bash", "-c", f'{function}kube_router_chain "$1"', "_", name], timeout=10, check=False
    )
    return out.returncode == 0


@pytest.mark.parametrize(
    ("chain", "ours"),
    [
        ("KUBE-ROUTER-INPUT", True),
        ("KUBE-ROUTER-FORWARD", True),
        ("KUBE-ROUTER-OUTPUT", True),
        ("KUBE-NWPLCY-DEFAULT", True),
        ("KUBE-NWPLCY-ABCDEFGHIJKLMN23", True),
        ("KUBE-POD-FW-ABCDEFGHIJKLMN23", True),
        ("KUBE-ROUTER-SERVICES", False),  # not a chain the policy controller makes
        ("KUBE-FOREIGN-TEST", False),  # tests/cluster/test_teardown.py's
        ("KUBE-SERVICES", False),  # kube-proxy's: its own rule decides
        ("CNI-FORWARD", False),
    ],
)
def test_cluster_down_takes_kube_routers_policy_chains_only(chain: str, ours: bool) -> None:
    assert _kube_router_chain(chain) is ours


def test_cluster_down_knows_the_chain_and_ipset_names_kube_router_makes() -> None:
    netpol = _module_dir() / "pkg" / "controllers" / "netpol"
    source = (netpol / "network_policy_controller.go").read_text()
    names = r'^\s+(kube\w+(?:Prefix|ChainName|Chain))\s+= "([A-Z-]+)"$'
    prefixes = dict(re.findall(names, source, re.M))
    assert prefixes["kubePodFirewallChainPrefix"] == "KUBE-POD-FW-"
    assert prefixes["kubeNetworkPolicyChainPrefix"] == "KUBE-NWPLCY-"
    for name in ("kubeInputChainName", "kubeForwardChainName", "kubeOutputChainName"):
        assert _kube_router_chain(prefixes[name]), prefixes[name]
    down = (ROOT / "hack" / "cluster-down.sh").read_text()
    assert prefixes["kubeSourceIPSetPrefix"] == "KUBE-SRC-"
    assert prefixes["kubeDestinationIPSetPrefix"] == "KUBE-DST-"
    assert "grep -E '^KUBE-(SRC|DST)-[A-Z0-9]+$'" in down


def test_network_policy_is_enforced_by_default_and_in_ci_before_the_tests_it_guards() -> None:
    """The first add-on of cluster-up's default list (every later pod starts under the
    policies); in .ci/run, the first of the group installed before stage 2, whose tests (the
    NetworkPolicy tests among them) and stage 3's beside them (KFP's runs) run under it."""
    text = (ROOT / "hack" / "cluster-up.sh").read_text()
    (found,) = re.findall(r'^addons="\$\{GPUPIPE_CLUSTER_ADDONS-([^}]*)\}"$', text, re.M)
    assert found.split()[0] == "network-policy", found
    ci = (ROOT / ".ci" / "run").read_text()
    (mid,) = re.findall(r'mid="([^"]*)"', ci)
    assert mid.split()[0] == "network-policy", mid


def test_the_database_policy_test_runs_where_kfps_database_is() -> None:
    """KFP's MySQL comes with the kfp add-on, installed in .ci/run once built, after stage 2's
    tests started: a NetworkPolicy test that probes it must be one of KFP's (``-k kfp``, stage 3
    and the KFP stream), or stage 2 skips it for want of the database and no stage runs it (as
    3001b61's CI did)."""
    source = (ROOT / "tests" / "cluster" / "test_networkpolicy.py").read_text()
    tree = ast.parse(source)
    needs_kfp = [
        f.name
        for f in tree.body
        if isinstance(f, ast.FunctionDef)
        and f.name.startswith("test_")
        and "KFP_DB" in (ast.get_source_segment(source, f) or "")
    ]
    assert needs_kfp, "no NetworkPolicy test probes KFP's database"
    assert all("kfp" in name for name in needs_kfp), needs_kfp
    assert '-k "not kfp and not pytorchjob"' in (ROOT / ".ci" / "run").read_text()
    assert "tests/cluster -k kfp " in (ROOT / "hack" / "cluster-tests.sh").read_text()
