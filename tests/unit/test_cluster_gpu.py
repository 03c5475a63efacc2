"""The test cluster's GPU add-on (hack/cluster/addons/gpu.sh, issue 64): our device plugin
(hack/cluster/gomod/fake-gpu) pinned to the cluster's kubelet release, the GPU node each setting
picks, a bad setting refused in one line before anything is started, the plugin's own Go tests
(real gRPC over unix sockets, a fake kubelet's plugin watcher), and, as a slow test, the plugin
against the kubelet's own plugin manager and device-manager code.

The cluster itself is checked by tests/cluster/test_gpu_nodes.py; these run without one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "hack" / "cluster"
SCRIPT = CLUSTER / "addons" / "gpu.sh"
GOMOD = CLUSTER / "gomod" / "fake-gpu"
VERSIONS = dict(re.findall(r"^([A-Z0-9_]+)=(\S+)$", (CLUSTER / "versions.env").read_text(), re.M))


def _gpu_sh(
    tmp_path: Path, verb: str, nodes: str = "3", settings: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """gpu.sh VERB on a state folder recording NODES nodes (and SETTINGS, as install records
    them), its cache under tmp_path; GPUPIPE_CLUSTER_GPU* only as given."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "node-count").write_text(f"{nodes}\n")
    if settings is not None:
        (state / "addons" / "gpu").mkdir(parents=True, exist_ok=True)
        (state / "addons" / "gpu" / "settings").write_text(settings)
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPIPE_CLUSTER")}
    return subprocess.run(
        [str(SCRIPT), verb],
        env={
            **base,
            "GPUPIPE_CLUSTER_DIR": str(state),
            "GPUPIPE_CLUSTER_CACHE": str(tmp_path / "cache"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _flags(tmp_path: Path, **kw: str) -> dict[str, str]:
    proc = _gpu_sh(tmp_path, "flags", **kw)
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    binary = next(a for a in args if a.endswith("/fake-gpu"))
    options = args[args.index(binary) + 1 :]
    found = dict(zip(options[::2], options[1::2], strict=True))
    return {"binary": binary, "prefix": " ".join(args[: args.index(binary)]), **found}


def test_the_plugin_is_built_against_the_clusters_kubelet_release() -> None:
    major_minor_patch = VERSIONS["K8S_VERSION"].split(".")
    kubelet = f"v0.{major_minor_patch[1]}.{major_minor_patch[2]}"
    required = re.findall(r"^\s*k8s.io/kubelet (v\S+)$", (GOMOD / "go.mod").read_text(), re.M)
    assert required == [kubelet]
    # The kubelet check's wrapper: the same Kubernetes, with gomod/kubernetes's replace lines.
    check = (GOMOD / "kubeletcheck" / "go.mod").read_text()
    required = re.findall(r"^\s*k8s.io/(kubernetes|kubelet) (v\S+)$", check, re.M)
    assert dict(required) == {"kubernetes": f"v{VERSIONS['K8S_VERSION']}", "kubelet": kubelet}
    replaces = re.compile(r"^\s+(k8s.io/\S+ => .*)$", re.M)
    wrapper = (CLUSTER / "gomod" / "kubernetes" / "go.mod").read_text()
    assert set(replaces.findall(check)) == set(replaces.findall(wrapper)) != set()


def test_the_gpu_node_is_the_last_node_with_two_devices_by_default(tmp_path: Path) -> None:
    flags = _flags(tmp_path, nodes="3")
    assert flags["--node"] == "gpupipe-node-3"
    # The node's kubelet's --root-dir: the plugin registers in its plugins_registry folder (the
    # kubelet's plugin watcher), not in a device-plugins folder (the kubelet's is compiled in,
    # /var/lib/kubelet/device-plugins, one for every kubelet of the host).
    assert flags["--kubelet-root-dir"] == str(tmp_path / "state/nodes/3/kubelet")
    assert "--device-plugins-dir" not in flags
    assert flags["--count"] == "2" and flags["--resource"] == "nvidia.com/gpu"
    assert flags["--product"] == "gpupipe-fake-gpu"
    # In the node's network namespace, as its kubelet; the binary in the cache, by source hash.
    assert flags["prefix"] == "nsenter --net=/run/netns/gpupipe-node-3"
    binary = Path(flags["binary"])
    assert binary.is_relative_to(tmp_path / "cache" / "bin")
    assert re.fullmatch(r"fake-gpu-[0-9a-f]{12}", binary.parent.name), binary


def test_the_environment_picks_the_node_count_and_product(tmp_path: Path) -> None:
    flags = _flags(
        tmp_path,
        nodes="3",
        GPUPIPE_CLUSTER_GPU_NODE="2",
        GPUPIPE_CLUSTER_GPUS="4",
        GPUPIPE_CLUSTER_GPU_PRODUCT="NVIDIA-H200",
    )
    assert (flags["--node"], flags["--count"], flags["--product"]) == (
        "gpupipe-node-2",
        "4",
        "NVIDIA-H200",
    )


def test_what_install_recorded_is_kept_unless_the_environment_says_otherwise(
    tmp_path: Path,
) -> None:
    """hack/cluster-node.sh start and the tests call gpu.sh without the settings install had."""
    recorded = "node=2\ngpus=3\nproduct=NVIDIA-A100\n"
    flags = _flags(tmp_path, nodes="3", settings=recorded)
    assert (flags["--node"], flags["--count"], flags["--product"]) == (
        "gpupipe-node-2",
        "3",
        "NVIDIA-A100",
    )
    flags = _flags(tmp_path, nodes="3", settings=recorded, GPUPIPE_CLUSTER_GPUS="1")
    assert (flags["--node"], flags["--count"]) == ("gpupipe-node-2", "1")


def test_gpu_sh_names_the_sockets_the_plugin_makes() -> None:
    """A GPU node moved elsewhere loses a killed plugin's stale sockets (gpu.sh's
    unmake_gpu_node): the paths under the kubelet's --root-dir that main.go makes."""
    main = (GOMOD / "main.go").read_text()
    go = dict(re.findall(r'^\s*(\w+)\s*=\s*"([^"]*)"$', main, re.M))
    assert re.search(r'^\s*RegistrationSocketName\s*=\s*PluginName \+ "-reg.sock"$', main, re.M)
    name = go["PluginName"]
    registration = f"{go['RegistryDir']}/{name}-reg.sock"
    device = f"{go['PluginsDir']}/{name}/{go['DeviceSocketName']}"
    assert (registration, device) == (
        "plugins_registry/gpupipe-fake-gpu-reg.sock",
        "plugins/gpupipe-fake-gpu/dp.sock",
    )
    script = SCRIPT.read_text()
    assert f'REG_SOCKET="{registration}"' in script
    assert f'DEVICE_SOCKET="{device}"' in script


@pytest.mark.parametrize(
    ("nodes", "env", "says"),
    [
        ("3", {"GPUPIPE_CLUSTER_GPU_NODE": "4"}, "GPUPIPE_CLUSTER_GPU_NODE=4: the GPU node must be "
         "one of the cluster's nodes 2..3"),
        ("3", {"GPUPIPE_CLUSTER_GPU_NODE": "1"}, "GPUPIPE_CLUSTER_GPU_NODE=1: the GPU node must be "
         "one of the cluster's nodes 2..3 (node 1 is the host"),
        ("3", {"GPUPIPE_CLUSTER_GPU_NODE": "two"}, "GPUPIPE_CLUSTER_GPU_NODE=two: the GPU node"),
        ("3", {"GPUPIPE_CLUSTER_GPU_NODE": "-2"}, "GPUPIPE_CLUSTER_GPU_NODE=-2: the GPU node"),
        ("3", {"GPUPIPE_CLUSTER_GPU_NODE": "02"}, "GPUPIPE_CLUSTER_GPU_NODE=02: the GPU node"),
        ("1", {}, "the cluster has one node, the host"),
        ("2", {"GPUPIPE_CLUSTER_GPUS": "two"}, "GPUPIPE_CLUSTER_GPUS=two: the number of GPUs must "
         "be a whole number from 1 to 64"),
        ("2", {"GPUPIPE_CLUSTER_GPUS": "0"}, "GPUPIPE_CLUSTER_GPUS=0: the number of GPUs"),
        ("2", {"GPUPIPE_CLUSTER_GPUS": "1.5"}, "GPUPIPE_CLUSTER_GPUS=1.5: the number of GPUs"),
        ("2", {"GPUPIPE_CLUSTER_GPUS": "65"}, "GPUPIPE_CLUSTER_GPUS=65: the number of GPUs"),
        ("2", {"GPUPIPE_CLUSTER_GPUS": "99999999999999999999"}, "the number of GPUs must be"),
        ("2", {"GPUPIPE_CLUSTER_GPU_PRODUCT": "H100 80GB"}, "GPUPIPE_CLUSTER_GPU_PRODUCT=H100 "
         "80GB: the product must be a label value"),
    ],
    ids=[
        "node-past-the-last",
        "node-1-the-host",
        "node-not-a-number",
        "node-negative",
        "node-leading-zero",
        "one-node-cluster",
        "gpus-not-a-number",
        "gpus-zero",
        "gpus-fraction",
        "gpus-too-many",
        "gpus-huge",
        "product-not-a-label-value",
    ],
)  # fmt: skip
def test_install_refuses_a_bad_setting_in_one_line_before_it_starts_anything(
    tmp_path: Path, nodes: str, env: dict[str, str], says: str
) -> None:
    proc = _gpu_sh(tmp_path, "install", nodes=nodes, **env)
    assert proc.returncode != 0, proc
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: cluster: gpu: "), (
        proc.stderr
    )
    assert says in proc.stderr, proc.stderr
    # Nothing started, recorded or built: the state folder holds what the test put there.
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["node-count"]
    assert not (tmp_path / "cache").exists()


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed: the device plugin's Go tests need it")
    return go


def _go_test(folder: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    go = _go()
    # Its modules first: without the Go module proxy (and nothing cached) there is nothing to test.
    download = subprocess.run(
        [go, "mod", "download"], cwd=folder, capture_output=True, text=True, timeout=timeout
    )
    if download.returncode != 0:
        pytest.skip(f"cannot download {folder.name}'s Go modules: {download.stderr.strip()[:300]}")
    # -count=1: the kubelet check builds the plugin from outside its own package, which Go's
    # test cache does not see.
    return subprocess.run(
        [go, "test", "-count=1", "./..."],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_plugins_go_tests_pass() -> None:
    """Over real unix sockets through the kubelet API's generated gRPC clients: a fake kubelet's
    plugin watcher finds its socket in <root-dir>/plugins_registry, GetInfo names a DevicePlugin
    for nvidia.com/gpu at the absolute path of its device-plugin socket, which lists N healthy
    GPU-<uuid> devices; Allocate sets NVIDIA_VISIBLE_DEVICES and GPUPIPE_FAKE_GPU=1 and nothing
    else; a kubelet that starts again finds it where it was; while no kubelet lists the devices
    it makes its registration socket anew; SIGTERM ends it with its sockets removed
    (hack/cluster/gomod/fake-gpu/plugin_test.go)."""
    proc = _go_test(GOMOD, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_the_plugin_with_the_kubelets_own_plugin_manager_and_device_manager() -> None:
    """The plugin's binary against Kubernetes v1.34.4's plugin manager (the watcher of a
    temporary plugins_registry) with the device manager's plugin handler
    (hack/cluster/gomod/fake-gpu/kubeletcheck): registered, listed and allocated; N allocatable
    again, and for 3 s on end, after a kubelet's restarts (one 17 s away), after the plugin is
    killed and started again, and after a power loss (the kubelet first, a stale socket); 0 after
    SIGTERM. Slow: about a minute of running, and it compiles part of the kubelet (about a minute
    where the cluster's kubelet was built on this machine, several where nothing is cached)."""
    proc = _go_test(GOMOD / "kubeletcheck", timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("script", "loop"),
    [
        ("cluster-down.sh", r"for p in ([a-z -]+); do stop"),
        ("cluster-node.sh", r"for p in ([a-z -]+); do\n\s+pid="),
    ],
)
def test_cluster_down_and_a_nodes_power_loss_stop_the_plugin(script: str, loop: str) -> None:
    """The plugin is a node's process like its kube-proxy: stopped by cluster-down, killed with
    the node by hack/cluster-node.sh stop (and started again by start, through gpu.sh install)."""
    text = (ROOT / "hack" / script).read_text()
    (names,) = re.findall(loop, text)
    assert {"fake-gpu", "kube-proxy", "kubelet"} <= set(names.split()), names
    if script == "cluster-node.sh":
        assert 'GPUPIPE_CLUSTER_GPU_NODE="$k" "${CLUSTER_HACK}/addons/gpu.sh" install' in text
