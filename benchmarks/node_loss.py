"""What a lost node costs a training job, on the test cluster with two nodes (make cluster-up
NODES=2).

The same 2-worker PyTorchJob (the demo table, gloo on CPU, a checkpoint every 5 steps, one
worker per node) runs twice through the train step's launcher pod: once uninterrupted, once with
node 2's power taken away (hack/cluster-node.sh stop) after a few checkpoints and given back once
its pod is evicted. Printed for the interrupted run, in seconds after the power went: the node
NotReady, its pod evicted, the node back, the replacement pod placed, training resumed (the
replacement attempt's first step, by the kubelet's clock), the job done; and the steps lost (the
step the job had reached when the node went, less the checkpoint it resumed from). Last line:
the wall-time ratio interrupted / uninterrupted.

Without a test cluster of two nodes it prints why and exits 0 with no ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import kube

# Before anything imports the kubernetes package (kfp does): it reads KUBECONFIG at import time.
os.environ["KUBECONFIG"] = str(kube.KUBECONFIG)

from tests.cluster.conftest import delete_namespace, make_namespace, role

NODE_SCRIPT = kube.ROOT / "hack" / "cluster-node.sh"
LOST = f"{kube.NODE_NAME}-2"


def _ready(name: str) -> bool:
    node = kube.get_json("node", name)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def _steps(ns: str, job: str) -> int:
    return kube.pod_steps(ns, f"{job}-master-0", "pytorch")


def _on_lost_node(ns: str, job: str) -> dict | None:
    pods = kube.job_pods(ns, job)
    return next((p for p in pods if p["spec"].get("nodeName") == LOST), None)


def _run(ns: str, image: str, dataset: str, *, lose: bool) -> tuple[float, dict[str, float]]:
    cfg = kube.train_config(image, "pytorchjob", cluster__one_worker_per_node=True)
    start = time.monotonic()
    # The launcher (the train step's pod) on node 1, which stays.
    run = kube.launch(ns, image, dataset, cfg, node=kube.NODE_NAME)
    stages: dict[str, float] = {}
    if lose:
        kube.wait_until(
            "a checkpoint passed with a pod on node 2",
            lambda: _on_lost_node(ns, run.job) is not None and _steps(ns, run.job) >= 12,
            kube.JOB_TIMEOUT_S,
            interval=1,
        )
        lost = _on_lost_node(ns, run.job)
        assert lost is not None
        at_loss = _steps(ns, run.job)
        t0 = time.monotonic()
        subprocess.run([str(NODE_SCRIPT), "stop", "2"], check=True, timeout=120)
        kube.wait_until("NotReady", lambda: not _ready(LOST), 180, interval=1)
        stages["NotReady"] = time.monotonic() - t0
        name = lost["metadata"]["name"]
        kube.wait_until(
            "eviction",
            lambda: bool(kube.get_json("pod", "-n", ns, name)["metadata"].get("deletionTimestamp")),
            180,
            interval=1,
        )
        stages["evicted"] = time.monotonic() - t0
        subprocess.run([str(NODE_SCRIPT), "start", "2"], check=True, timeout=300)
        stages["node back"] = time.monotonic() - t0
        uid = lost["metadata"]["uid"]
        kube.wait_until(
            "a replacement placed",
            lambda: any(
                p["metadata"]["name"] == name
                and p["metadata"]["uid"] != uid
                and p["spec"].get("nodeName") == LOST
                for p in kube.job_pods(ns, run.job)
            ),
            kube.JOB_TIMEOUT_S,
            interval=1,
        )
        stages["replaced"] = time.monotonic() - t0
    done = run.done()
    wall = time.monotonic() - start
    if done.get("exitCode") != 0:
        raise SystemExit(f"node_loss: the launcher failed:\n{run.log()[-3000:]}")
    if lose:
        stages["done"] = time.monotonic() - t0
        log = run.log()
        resumed = [int(m) for m in re.findall(r'"resumed_from": (\d+)', log)]
        stages["steps lost"] = float(at_loss - max(resumed)) if resumed else float("nan")
    return wall, stages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=3000, help="rows of the demo table")
    args = p.parse_args(argv)
    if reason := kube.unavailable():
        print(f"node_loss: skipped: {reason}")
        return 0
    nodes = [n["metadata"]["name"] for n in kube.get_json("nodes")["items"]]
    if LOST not in nodes:
        print(f"node_loss: skipped: the test cluster has no {LOST} (make cluster-up NODES=2)")
        return 0

    import tempfile

    from components.images import CPU_IMAGE

    os.environ.update(kube.store_env())
    ns = kube.unique("gpupipe-bench")
    make_namespace(ns, role())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            dataset = kube.demo_dataset(f"minio://{kube.BUCKET}/{ns}/dataset", Path(tmp), args.rows)
        plain, _ = _run(ns, CPU_IMAGE, dataset, lose=False)
        lost, stages = _run(ns, CPU_IMAGE, dataset, lose=True)
    finally:
        subprocess.run([str(NODE_SCRIPT), "start", "2"], check=False, timeout=300)
        delete_namespace(ns)
    print(f"uninterrupted: {plain:.0f} s; with node 2 lost and back: {lost:.0f} s")
    print("after the power went: " + json.dumps({k: round(v, 1) for k, v in stages.items()}))
    print(f"node-loss ratio (interrupted / uninterrupted wall time): {lost / plain:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
