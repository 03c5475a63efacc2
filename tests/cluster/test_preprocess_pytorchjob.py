"""Preprocess by the pods of a PyTorchJob on a real cluster (issue 61, item 4): the step's
launcher pod (``python -m trainer preprocess`` under ``pipeline-runner`` and our Role, restricted
Pod Security) chooses 3 pods, the Training Operator runs them (gloo on CPU, one process a pod),
they read a 3-file table from the in-cluster store and publish the splits straight into it, and
the result equals one process's, bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.cluster import kube
from tests.cluster.kube import JOB_POD_SETTINGS, JOB_TIMEOUT_S, launcher_pod
from trainer.base import storage
from trainer.base.typedconfig import from_dict
from trainer.steps.preprocess import PreprocessConfig, data_fingerprint, make_demo_table
from trainer.steps.preprocess.stream import preprocess_streaming

SPLITS = ("train", "val", "test")
PODS = 3


def _table_in_the_store(base: str, tmp_path: Path) -> str:
    """The demo table in 3 Parquet files of different sizes under ``base``/data/."""
    table = make_demo_table(9000, task="classification", seed=5)
    at = 0
    for i, rows in enumerate((4000, 2000, 3000)):
        local = tmp_path / f"part-{i}.parquet"
        pq.write_table(table.slice(at, rows), local, row_group_size=700)
        storage.write_bytes(f"{base}/data/part-{i}.parquet", local.read_bytes())
        at += rows
    return f"{base}/data/"


def test_three_pods_preprocess_a_table_as_one_process_does(
    namespace: str, image: str, store: dict[str, str], tmp_path: Path
) -> None:
    job = kube.unique("gpupipe-preprocess")
    base = f"minio://{kube.BUCKET}/{namespace}/{job}"
    data = _table_in_the_store(base, tmp_path)
    # The pods' own settings: a tenth of this 2-core node each, and 1 GiB (the budget half).
    pods = {**JOB_POD_SETTINGS, "image": image, "cpu_request": "100m", "memory_limit": "1Gi"}
    pods.pop("shm_size")  # the preprocess pods' default (64Mi)
    cfg = {"target": "churned", "launcher": "pytorchjob", "workers": PODS, "cluster": pods}
    storage.write_json(f"{base}/config.json", cfg)
    pod = kube.unique("preprocess")
    args = ["--config", f"{base}/config.json", "--data", data, "--output", f"{base}/out"]
    kube.apply(launcher_pod(pod, namespace, image, [*args, "--job-name", job], step="preprocess"))

    # The job and its pods, seen while they run (finished pods may be cleaned up).
    seen: dict[str, str] = {}
    specs: list[dict[str, Any]] = []

    def finished() -> bool:
        for p in kube.job_pods(namespace, job):
            seen[p["metadata"]["name"]] = p["spec"]["containers"][0]["image"]
        specs.extend(j["spec"] for j in kube.jobs(namespace) if j["metadata"]["name"] == job)
        return kube.pod_phase(namespace, pod) in ("Succeeded", "Failed")

    kube.wait_until(f"preprocess launcher {pod} to finish", finished, JOB_TIMEOUT_S, interval=2)
    state = kube.wait_pod_done(namespace, pod, 60)
    log = kube.logs(namespace, pod)
    assert state["exitCode"] == 0, log[-3000:]
    assert f"preprocess: {PODS} pods (PyTorchJob {namespace}/{job})" in log, log[-3000:]
    assert sorted(seen) == [f"{job}-master-0", f"{job}-worker-0", f"{job}-worker-1"], seen
    assert set(seen.values()) == {image}
    assert specs, "the job was never seen"
    (c,) = specs[-1]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["memory"] == "1Gi" and "nvidia.com/gpu" not in json.dumps(c)
    # The step's result line (stdout) is main's, with the splits' sizes: its last JSON line. (The
    # pod's log merges stdout and stderr as they arrive: a note on stderr printed before it came
    # after it once, on three nodes.)
    result = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
    assert result["train_rows"] + result["val_rows"] + result["test_rows"] == 9000

    # One process over the same store files, on this host: the same bytes.
    one = from_dict(PreprocessConfig, {"target": "churned"})
    want = preprocess_streaming(
        one,
        data_uri=data,
        output_uri=str(tmp_path / "one"),
        fingerprint=data_fingerprint(data),
        budget=64 << 20,
    )
    assert result == json.loads(json.dumps(want.to_dict()))
    for split in SPLITS:
        got = pq.read_table(pa.BufferReader(storage.read_bytes(f"{base}/out/{split}.parquet")))
        ref = pq.read_table(tmp_path / "one" / f"{split}.parquet")
        assert ref.num_rows > 0 and got.equals(ref), split
    for doc in ("schema.json", "stats.json"):
        got_doc = storage.read_json(f"{base}/out/{doc}")
        assert got_doc == json.loads((tmp_path / "one" / doc).read_text()), doc
