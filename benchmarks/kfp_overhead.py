"""What KFP's machinery costs per step: the demo pipeline through the real KFP backend of the test
cluster (make cluster-up) and, in the same run, through `gpupipe run --local --runner docker` (the
same trainer image, the same steps, no KFP).

KFP runs each step as a driver pod (resolves inputs, the cache, the pod spec) and then the step's
own pod, whose launcher wraps the component (downloads inputs, uploads outputs, records ML
Metadata). Reported per step: from its driver pod's creation to the step's own first log line
(the first line the component prints, by the kubelet's timestamps), the median over steps, and
each run's wall time. Both runs train in the step's own pod (launcher=local: the docker runner
cannot start a PyTorchJob), without tuning; KFP's registers into the cluster's MLflow, docker's
into its run folder's registry. Last line: the wall-time ratio KFP / docker (goal <= 1.5).

Without a test cluster with KFP it prints why and exits 0 with no ratio.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import kfp, kube

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 2
ROWS = 2000


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _first_own_line(pod: str) -> float | None:
    """Unix time of the component's first line: not the launcher's (glog ``I1126 ...``), not
    Argo's (``time=...``), not the executor's own banner."""
    out = kube.kubectl("logs", "-n", kfp.NS, pod, "-c", "main", "--timestamps", check=False).stdout
    for line in out.splitlines():
        stamp, _, text = line.partition(" ")
        if re.match(r"^[IWEF]\d{4} ", text) or text.startswith(("time=", "+ ", "[KFP Executor")):
            continue
        if text.strip():
            return _stamp(stamp)
    return None


def step_overheads(run_id: str) -> dict[str, float]:
    """task -> seconds from its driver pod's creation to the step's own first log line."""
    drivers: dict[str, float] = {}
    executors: dict[str, str] = {}
    for pod in kfp.run_pods(run_id):
        task, role = kfp.task_of(pod)
        if role == "driver":
            created = _stamp(pod["metadata"]["creationTimestamp"])
            drivers[task] = min(created, drivers.get(task, created))
        elif role == "executor":
            executors.setdefault(task, pod["metadata"]["name"])
    out = {}
    for task, pod in executors.items():
        first = _first_own_line(pod)
        if task in drivers and first is not None:
            out[task] = first - drivers[task]
    return out


def main() -> int:
    reason = kube.unavailable()
    if reason or not (kube.STATE / "addons" / "kfp").is_dir():
        print(f"no test cluster with KFP here: {reason or 'the kfp add-on is not installed'}")
        return 0
    from components.images import CPU_IMAGE, CUDA_IMAGE
    from trainer.steps.preprocess import write_demo_data

    work = Path(tempfile.mkdtemp(prefix="gpupipe-kfp-bench-"))
    table = work / "churn.parquet"
    write_demo_data(str(table), rows=ROWS, task="classification", seed=0)
    # No GPU on this node: the train step asks for gpus_per_node (default 1), and without this
    # its pod stayed Pending (Insufficient nvidia.com/gpu) until the run's wait timed out.
    params = {"target": "churned", "epochs": EPOCHS, "tune_enabled": "false", "gpus_per_node": 0}
    flags = [x for k, v in params.items() for x in ("--param", f"{k}={v}")]
    with kfp.port_forward("ml-pipeline", 8888) as host, kfp.port_forward("seaweedfs", 9000) as s3:
        os.environ.update(
            MINIO_ENDPOINT=s3,
            MINIO_ACCESS_KEY=kube.secret_value(kfp.NS, kube.STORE_SECRET, "accesskey"),
            MINIO_SECRET_KEY=kube.secret_value(kfp.NS, kube.STORE_SECRET, "secretkey"),
        )
        uri = kfp.upload_table(table, f"{kube.unique('gpupipe-bench')}/churn.parquet")
        pipeline = kube.unique("gpupipe-bench")
        up = kfp.gpupipe("upload", "--host", host, "--pipeline", pipeline)
        if up.returncode:
            print(up.stderr)
            return 1
        t0 = time.monotonic()
        run = kfp.gpupipe(
            "run",
            "--host",
            host,
            "--pipeline",
            pipeline,
            "--wait",
            "--data",
            uri,
            *flags,
            "--param",
            "registry_uri=http://mlflow.kubeflow:5000",
        )
        kfp_wall = time.monotonic() - t0
        run_id = re.search(r"started run (\S+)", run.stdout)
        if run.returncode or not run_id:
            print(run.stdout[-2000:], run.stderr[-2000:])
            return 1
        overheads = step_overheads(run_id.group(1))
    t0 = time.monotonic()
    local = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "run",
            "--local",
            "--runner",
            "docker",
            "--image-override",
            f"{CUDA_IMAGE}={CPU_IMAGE}",
            "--root",
            str(work / "runs"),
            "--data",
            str(table),
            *flags,
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    docker_wall = time.monotonic() - t0
    if local.returncode:
        print(local.stdout[-2000:], local.stderr[-2000:])
        return 1
    print(f"{'step':<14} {'driver start -> own first line (s)':>36}")
    for task, seconds in sorted(overheads.items()):
        print(f"{task:<14} {seconds:>36.1f}")
    print(f"median per-step overhead (KFP): {statistics.median(overheads.values()):.1f} s")
    print(f"wall time: KFP {kfp_wall:.0f} s, docker {docker_wall:.0f} s")
    print(json.dumps({"kfp_s": round(kfp_wall, 1), "docker_s": round(docker_wall, 1)}))
    print(f"ratio KFP/docker wall time: {kfp_wall / docker_wall:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
