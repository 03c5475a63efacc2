"""Our PyTorchJob launcher vs a plain create-and-watch, on the test cluster (make cluster-up).

The same small 2-replica PyTorchJob (the demo table, gloo on CPU) runs through
:class:`trainer.launch.pytorchjob.PyTorchJobLauncher` (create or adopt, stream the master's log,
watch conditions, deadline) and through the least a user could write with the ``kubernetes``
client: create the custom object from the same :func:`build_pytorchjob` dict and poll its
conditions every 2 s (our launcher's period). Runs alternate, ours first, so a load change on the
shared node hits both. Reported per run: wall time from the call to the job's success, and the
time from the call to the master's first training step (its first JSON log line with a loss,
by the kubelet's timestamp on the same clock). Last line: the median wall-time ratio ours / plain
(goal <= 1.05).

Without a test cluster it prints why and exits 0 with no ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import kube

# Before anything imports the kubernetes package (kfp does): it reads KUBECONFIG at import time.
os.environ["KUBECONFIG"] = str(kube.KUBECONFIG)

from tests.cluster.conftest import delete_namespace, make_namespace, role


def _first_step_at(namespace: str, job: str) -> float | None:
    """Unix time of the master's first training-step log line (kubelet timestamps)."""
    out = kube.kubectl(
        "logs", "-n", namespace, f"{job}-master-0", "-c", "pytorch", "--timestamps", check=False
    ).stdout
    for line in out.splitlines():
        stamp, _, text = line.partition(" ")
        if '"loss"' in text and '"step"' in text:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


def _plain(api: Any, job: dict[str, Any], namespace: str, timeout_s: float) -> None:
    """Create the PyTorchJob and poll it until a Succeeded or Failed condition."""
    group, version = job["apiVersion"].split("/")
    api.create_namespaced_custom_object(group, version, namespace, "pytorchjobs", job)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        obj = api.get_namespaced_custom_object(
            group, version, namespace, "pytorchjobs", job["metadata"]["name"]
        )
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c["status"] == "True" and c["type"] in ("Succeeded", "Failed"):
                if c["type"] == "Failed":
                    raise RuntimeError(f"plain job failed: {c.get('message')}")
                return
        time.sleep(2.0)
    raise TimeoutError("plain job did not finish")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="runs of each, interleaved")
    p.add_argument("--rows", type=int, default=3000, help="rows of the demo table")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args(argv)

    if reason := kube.unavailable():
        print(f"cluster_launch: skipped: {reason}")
        return 0

    import tempfile

    from kubernetes import client, config

    from components.images import CPU_IMAGE
    from trainer.base import storage
    from trainer.base.typedconfig import from_dict, to_json
    from trainer.launch.jobspec import JobSpec
    from trainer.launch.pytorchjob import PyTorchJobLauncher, build_pytorchjob
    from trainer.steps.train import TrainStepConfig, plan_worker_config, record_fixed

    os.environ.update(kube.store_env())
    config.load_kube_config(str(kube.KUBECONFIG))
    api = client.CustomObjectsApi()

    ns = kube.unique("gpupipe-bench")
    make_namespace(ns, role())
    base = f"minio://{kube.BUCKET}/{ns}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            dataset = kube.demo_dataset(f"{base}/dataset", Path(tmp), rows=args.rows)
        settings = {
            "launcher": "pytorchjob",
            "nnodes": 2,
            "gpus_per_node": 0,
            "train": {"epochs": args.epochs, "seed": 0, "global_batch_size": 64},
            "cluster": {
                "image": CPU_IMAGE,
                "namespace": ns,
                **kube.JOB_POD_SETTINGS,
            },
        }
        cfg = from_dict(TrainStepConfig, record_fixed(settings))
        rows: dict[str, list[tuple[float, float | None]]] = {"ours": [], "plain": []}
        for i in range(args.repeats):
            for kind in ("ours", "plain"):
                name = f"bench-{kind}-{i}-{ns[-8:]}"
                work, model = f"{base}/{name}/work", f"{base}/{name}/model"
                worker_cfg, _ = plan_worker_config(
                    cfg, dataset_uri=dataset, model_uri=model, work_uri=work
                )
                config_uri = f"{work}/worker-config.json"
                storage.write_text(config_uri, to_json(worker_cfg))
                run = cfg.training_run(job_name=name, config_uri=config_uri)
                start = time.time()
                if kind == "ours":
                    launcher = PyTorchJobLauncher(namespace=ns, cluster=cfg.cluster)
                    launcher.launch(dataclasses.replace(run, timeout_s=900))
                else:
                    spec = JobSpec(namespace=ns, run=run, cluster=cfg.cluster)
                    _plain(api, build_pytorchjob(spec), ns, 900)
                wall = time.time() - start
                first = _first_step_at(ns, name)
                to_step = None if first is None else first - start
                rows[kind].append((wall, to_step))
                print(
                    json.dumps(
                        {"run": i, "kind": kind, "wall_s": round(wall, 2), "first_step_s": to_step}
                    ),
                    flush=True,
                )
                kube.kubectl("delete", "pytorchjob", "-n", ns, name, "--wait=true", check=False)
    finally:
        delete_namespace(ns)
    for kind, vals in rows.items():
        steps = [s for _, s in vals if s is not None]
        print(
            f"{kind}: median wall {statistics.median(w for w, _ in vals):.1f} s, median launch to"
            f" first step {statistics.median(steps):.1f} s"
            if steps
            else f"{kind}: no step seen"
        )
    ratios = [o[0] / p[0] for o, p in zip(rows["ours"], rows["plain"], strict=True)]
    print(f"cluster launch wall time ours/plain: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
