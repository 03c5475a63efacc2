"""The test cluster's nodes (issue 63, hack/cluster/nodes.sh): every node cluster-up made is
Ready with an address of its own; a pod on one node reaches a pod and a Service whose pod is on
another, through the host's route to that node (a routed hop, not a shared bridge); and a
NetworkPolicy's refusal holds for a client on the other node, with its positive control (the same
client, labelled as the policy admits, reaches the same server).

Node 1 is the host; nodes 2..N live in network namespaces of their own. With one node (the
default of ``make cluster-up``), the cross-node tests skip, saying how to get two.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.cluster import kube, launchers
from tests.cluster.conftest import delete_namespace, namespace_doc

NODES_FILE = kube.STATE / "node-count"
PORT = 8080
TRIES = 5


def _nodes() -> list[dict[str, Any]]:
    return sorted(kube.get_json("nodes")["items"], key=lambda n: n["metadata"]["name"])


def _address(node: dict[str, Any]) -> str:
    return next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")


def _ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def test_every_node_cluster_up_made_is_ready_on_an_address_of_its_own() -> None:
    recorded = int(NODES_FILE.read_text().strip()) if NODES_FILE.exists() else 1
    nodes = _nodes()
    names = [n["metadata"]["name"] for n in nodes]
    assert len(nodes) == recorded, f"cluster-up made {recorded} node(s); the API lists {names}"
    assert all(_ready(n) for n in nodes), {n["metadata"]["name"]: _ready(n) for n in nodes}
    addresses = [_address(n) for n in nodes]
    assert len(set(addresses)) == len(addresses), addresses


@pytest.fixture(scope="module")
def two() -> tuple[str, str]:
    """Node 1 (the host) and node 2 (a network namespace): client side A, server side B."""
    names = [n["metadata"]["name"] for n in _nodes()]
    if len(names) < 2:
        pytest.skip(f"the test cluster has one node ({names[0]}): make cluster-up NODES=2")
    first = kube.NODE_NAME
    second = kube.node_name(2)
    assert {first, second} <= set(names), names
    return first, second


@pytest.fixture(scope="module")
def ns(two: tuple[str, str]) -> Iterator[str]:
    name = kube.unique("gpupipe-nodes")
    kube.apply(namespace_doc(name, {"pod-security.kubernetes.io/enforce": "restricted"}))
    yield name
    delete_namespace(name)


def _pod(
    name: str, ns: str, node: str, script: str, labels: dict[str, str], ready: bool = False
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": kube.BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "200m", "memory": "64Mi"},
        },
        "securityContext": kube.RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "www", "mountPath": "/www"}],
    }
    if ready:
        container["readinessProbe"] = {
            "tcpSocket": {"port": PORT},
            "periodSeconds": 1,
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "securityContext": kube.RESTRICTED_POD,
            "containers": [container],
            "volumes": [{"name": "www", "emptyDir": {}}],
        },
    }


@pytest.fixture(scope="module")
def server(ns: str, two: tuple[str, str]) -> dict[str, str]:
    """A busybox httpd on node B that answers with its own name, and a Service in front of it."""
    _, b = two
    script = f'echo "served by $(hostname)" > /www/index.html && exec httpd -f -p {PORT} -h /www'
    kube.apply(_pod("server", ns, b, script, {"app": "server"}, ready=True))
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "server", "namespace": ns},
            "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": PORT}]},
        }
    )
    kube.kubectl("wait", "-n", ns, "pod/server", "--for=condition=Ready", "--timeout=120s")
    pod = kube.get_json("pod", "-n", ns, "server")
    return {"ip": pod["status"]["podIP"], "node": pod["spec"]["nodeName"]}


def _client(
    ns: str, name: str, node: str, labels: dict[str, str], targets: list[str]
) -> dict[str, Any]:
    """A client pod on ``node`` that asks each target TRIES times, a second apart, and prints
    ``<target> <try> reached|refused <answer>`` a try; its pod and its outcomes per target."""
    script = f"""
sleep 3
for target in {" ".join(targets)}; do
  for i in $(seq {TRIES}); do
    out="$(timeout 10 wget -q -O - "http://$target/" 2>&1)" && got=reached || got=refused
    echo "$target $i $got $out"
    sleep 1
  done
done
"""
    kube.apply(_pod(name, ns, node, script, labels))
    done = kube.wait_pod_done(ns, name, timeout=180)
    log = kube.logs(ns, name)
    assert done["exitCode"] == 0, log
    found: dict[str, list[str]] = {}
    for line in log.splitlines():
        target, _, outcome, *answer = line.split(" ", 3)
        found.setdefault(target, []).append(f"{outcome} {' '.join(answer)}".strip())
    return {"pod": kube.get_json("pod", "-n", ns, name), "found": found, "log": log}


def test_a_pod_reaches_a_pod_and_a_service_on_the_other_node_through_a_routed_hop(
    ns: str, two: tuple[str, str], server: dict[str, str]
) -> None:
    a, b = two
    assert server["node"] == b
    targets = [f"{server['ip']}:{PORT}", f"server.{ns}"]
    got = _client(ns, "client", a, {"app": "client"}, targets)
    assert got["pod"]["spec"]["nodeName"] == a
    for target in targets:
        outcomes = got["found"][target]
        assert all(o == "reached served by server" for o in outcomes), got["log"]
    # Each node's pods have a range of their own, and the host routes node B's to B's address:
    # the client's packets leave its node's bridge and cross the host to B, as between machines.
    client_ip = ipaddress.ip_address(got["pod"]["status"]["podIP"])
    server_net = ipaddress.ip_network(f"{server['ip']}/24", strict=False)
    assert client_ip not in server_net, (client_ip, server_net)
    route = subprocess.run(
        ["ip", "-4", "route", "get", server["ip"]], capture_output=True, text=True, check=True
    ).stdout
    b_address = _address(next(n for n in _nodes() if n["metadata"]["name"] == b))
    assert f"via {b_address} dev gpn-2" in route, route


def test_a_network_policy_refusal_holds_for_a_client_on_the_other_node(
    ns: str, two: tuple[str, str], server: dict[str, str]
) -> None:
    a, _ = two
    kube.apply(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "server-admits-friends", "namespace": ns},
            "spec": {
                "podSelector": {"matchLabels": {"app": "server"}},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": {"friend": "yes"}}}],
                        "ports": [{"port": PORT}],
                    }
                ],
            },
        }
    )
    targets = [f"{server['ip']}:{PORT}", f"server.{ns}"]
    stranger = _client(ns, "stranger", a, {"app": "client"}, targets)
    friend = _client(ns, "friend", a, {"app": "client", "friend": "yes"}, targets)
    for target in targets:
        # kube-router applies a new policy and adds a new pod to its sets on its next sync, a
        # moment after: the first tries may still be either, the last three are the policy's.
        assert all(o.startswith("refused") for o in stranger["found"][target][-3:]), stranger["log"]
        assert friend["found"][target][-1] == "reached served by server", friend["log"]


def _configs(image: str, kind: str, a: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same 2-worker job twice: one worker per node, and both workers on node A."""
    spread = kube.train_config(image, kind, cluster__one_worker_per_node=True)
    packed = kube.train_config(image, kind, cluster__node_selector={"kubernetes.io/hostname": a})
    if kind == "trainjob":
        for cfg in (spread, packed):
            cfg["cluster"]["runtime"] = kube.GPUPIPE_RUNTIME
    return spread, packed


@pytest.mark.ci_allowance(900)
@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_one_worker_per_node_spreads_the_job_and_trains_to_the_weights_of_one_node(
    namespace: str, image: str, dataset: str, two: tuple[str, str], kind: str
) -> None:
    """one_worker_per_node: the job's two workers land on two nodes (each pod's spec.nodeName,
    read while they run), allreduce across them over gloo, and end with the weights, bit for
    bit, of the same job whose workers share node A."""
    a, _ = two
    spread_cfg, packed_cfg = _configs(image, kind, a)
    spread = kube.launch(namespace, image, dataset, spread_cfg)
    packed = kube.launch(namespace, image, dataset, packed_cfg)
    where: dict[str, dict[str, str]] = {spread.job: {}, packed.job: {}}

    def both_done() -> bool:
        for run in (spread, packed):
            for pod in kube.job_pods(namespace, run.job, kind):
                node = pod["spec"].get("nodeName")
                if node:
                    where[run.job][pod["metadata"]["name"]] = node
        return all(
            kube.pod_phase(namespace, r.pod) in ("Succeeded", "Failed") for r in (spread, packed)
        )

    kube.wait_until("both launchers to finish", both_done, kube.JOB_TIMEOUT_S, interval=2)
    launchers.finished(spread)
    launchers.finished(packed)
    assert len(where[spread.job]) >= 2 and len(set(where[spread.job].values())) == 2, where
    assert set(where[packed.job].values()) == {a}, where
    ours, theirs = kube.weights(spread.model), kube.weights(packed.model)
    assert ours.keys() == theirs.keys()
    different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not different, f"tensors that differ between two nodes and one: {different}"
