"""The test cluster from the tests' side: kubectl, the object store, and the launcher pod.

The cluster is hack/cluster-up.sh's (host processes, built from upstream); these helpers only
talk to it. The launcher pod is built the way KFP runs the train step: the trainer's CPU image,
the ``pipeline-runner`` ServiceAccount bound by ``manifests/rbac``'s Role, the downward-API
variables the launcher reads for its ownerReference, and the object store's secret as
environment variables.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("GPUPIPE_CLUSTER_DIR", "/var/lib/gpupipe-cluster"))
KUBECONFIG = STATE / "kubeconfig"
NODE_NAME = os.environ.get("GPUPIPE_NODE_NAME", "gpupipe-node")
"""Node 1's name (hack/cluster/lib.sh); node K's is ``<name>-K`` (hack/cluster/nodes.sh)."""
STORE_SECRET = "mlpipeline-minio-artifact"
"""KFP's artifact-store secret (``accesskey``/``secretkey``), made by the object-store add-on."""
BUCKET = "mlpipeline"
BUSYBOX_IMAGE = "gpupipe.local/busybox:1.35.0"
"""The node's busybox image (hack/cluster/lib.sh's BUSYBOX_IMAGE)."""
GPUPIPE_RUNTIME = "gpupipe-torch-distributed"
"""gpupipe's ClusterTrainingRuntime (hack/cluster/addons/trainer/): the TrainJob tests' runtime."""


def node_name(k: int) -> str:
    """Node K's name, as hack/cluster/nodes.sh names it: node 1 is the host, ``NODE_NAME``."""
    return NODE_NAME if k == 1 else f"{NODE_NAME}-{k}"


def _versions() -> dict[str, str]:
    out = {}
    for line in (ROOT / "hack/cluster/versions.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


VERSIONS = _versions()
CACHE = Path(
    os.environ.get(
        "GPUPIPE_CLUSTER_CACHE",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpupipe-cluster",
    )
)
KUBECTL = CACHE / "bin" / f"kubernetes-{VERSIONS['K8S_VERSION']}" / "kubectl"


def kubectl(
    *args: str, input: str | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run kubectl against the test cluster; with ``check``, a failure names the command."""
    proc = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(KUBECONFIG), *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def get_json(*args: str) -> dict[str, Any]:
    """``kubectl get ARGS -o json`` as a dict."""
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def apply(obj: dict[str, Any] | str) -> None:
    """``kubectl apply`` of one object (a dict) or of YAML text."""
    text = obj if isinstance(obj, str) else json.dumps(obj)
    kubectl("apply", "-f", "-", input=text)


def unavailable() -> str | None:
    """Why the cluster cannot be used (None when its API server answers).

    A cluster that answers wins over the line a failed ``cluster-up`` left behind (an earlier
    attempt's, or a test's of the script itself)."""
    if KUBECTL.exists() and KUBECONFIG.exists():
        proc = kubectl("get", "--raw", "/readyz", check=False, timeout=20)
        if proc.returncode == 0:
            return None
        down = f"the test cluster does not answer: {proc.stderr.strip()[:200]}"
    else:
        down = f"no test cluster ({KUBECONFIG} is missing): make cluster-up starts one"
    why = CACHE / "cluster.unavailable"
    if why.exists():
        return f"hack/cluster-up.sh: {why.read_text().strip()}"
    return down


def declared_addons() -> list[str]:
    """The add-ons this cluster was brought up with: ``GPUPIPE_CLUSTER_ADDONS`` where set, else
    hack/cluster-up.sh's default list (read from the script: one list, never two)."""
    if "GPUPIPE_CLUSTER_ADDONS" in os.environ:
        return os.environ["GPUPIPE_CLUSTER_ADDONS"].split()
    script = (ROOT / "hack" / "cluster-up.sh").read_text()
    found = re.search(r'^addons="\$\{GPUPIPE_CLUSTER_ADDONS-([^}]*)\}"', script, re.M)
    assert found, "hack/cluster-up.sh has no default add-on list (addons=...)"
    return found.group(1).split()


def need_addon(addon: str, present: bool | None = None, what: str = "") -> None:
    """Go on where ``addon`` is in this cluster (``present``, else its folder under the state's
    ``addons/``); else skip, saying so, where the cluster was brought up without it, and fail
    where it was brought up with it (:func:`declared_addons`): a declared add-on that is missing
    is a broken cluster, and a skip would pass for an untested one."""
    if present is None:
        present = (STATE / "addons" / addon).is_dir()
    if present:
        return
    missing = f"{what or 'the add-on ' + addon} is not in this cluster"
    declared = declared_addons()
    if addon in declared:
        pytest.fail(f"{missing}, though it was brought up with {addon} ({' '.join(declared)})")
    pytest.skip(f"{missing}: brought up without {addon} (GPUPIPE_CLUSTER_ADDONS)")


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def unique(prefix: str) -> str:
    """A fresh DNS-1035 name."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def secret_value(namespace: str, name: str, key: str) -> str:
    import base64

    data = get_json("secret", "-n", namespace, name)["data"]
    return base64.b64decode(data[key]).decode()


def store_env() -> dict[str, str]:
    """What ``minio://`` URIs need from this host to reach the in-cluster object store (KFP's
    SeaweedFS through its Service address, the keys of its generated Secret)."""
    return {
        "MINIO_ENDPOINT": service_address("kubeflow", "seaweedfs", 9000),
        "MINIO_ACCESS_KEY": secret_value("kubeflow", STORE_SECRET, "accesskey"),
        "MINIO_SECRET_KEY": secret_value("kubeflow", STORE_SECRET, "secretkey"),
    }


def demo_dataset(uri: str, folder: Path, rows: int = 3000) -> str:
    """The demo table of ``rows`` rows written under ``folder`` and preprocessed to ``uri`` (as
    the pipeline's first step does); ``uri``."""
    from trainer.steps.preprocess import PreprocessConfig, preprocess, write_demo_data

    data = str(folder / "churn.parquet")
    write_demo_data(data, rows=rows, task="classification", seed=0)
    preprocess(PreprocessConfig(target="churned"), data_uri=data, output_uri=uri)
    return uri


def service_address(namespace: str, name: str, port: int) -> str:
    """``<cluster IP>:<port>`` of a Service: the host reaches it through kube-proxy's rules."""
    return f"{get_json('service', '-n', namespace, name)['spec']['clusterIP']}:{port}"


JOB_POD_SETTINGS = {
    "object_store_secret": STORE_SECRET,
    "cpu_request": "250m",
    "cpu_limit": "1",
    "memory_request": "512Mi",
    "memory_limit": "3Gi",
    "shm_size": "256Mi",
}
"""The train step's ``cluster`` settings for a job whose two replicas fit this 2-core node.

A quarter CPU asked for each pod: .ci/run runs the cluster tests in one stream because two
(Katib's trials beside a TrainJob's nodes) overflow the node's requests at this size, and at a
tenth of a CPU (tried) the pods' CPU shares lose to the host's processes (make test beside them):
a Katib trial failed and the median-rule test ran out of time."""

RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}


KFP_RUN_LABEL = {"pipelines.kubeflow.org/v2_component": "true"}
"""What KFP v2 labels every pod of a run with (its Argo compiler's ``podMetadata``)."""


def launcher_pod(
    name: str,
    namespace: str,
    image: str,
    args: list[str],
    *,
    service_account: str = "pipeline-runner",
    step: str = "train",
    node: str | None = None,
) -> dict[str, Any]:
    """A launching step's pod as KFP runs it (``python -m trainer <step> ...``), restricted, with
    the label KFP gives a run's pods (the object store's and MLflow's NetworkPolicies admit it)."""
    field = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    field["POD_UID"] = "metadata.uid"
    env: list[dict[str, Any]] = [
        {"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in field.items()
    ]
    for env_name, key in (
        ("AWS_ACCESS_KEY_ID", "accesskey"),
        ("AWS_SECRET_ACCESS_KEY", "secretkey"),
    ):
        env.append(
            {"name": env_name, "valueFrom": {"secretKeyRef": {"name": STORE_SECRET, "key": key}}}
        )
    env.append({"name": "PYTHONUNBUFFERED", "value": "1"})
    # nodeName, past the scheduler: a cordon (the node-loss tests') does not keep it off.
    placement = {"nodeName": node} if node else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"gpupipe.dev/test": name, **KFP_RUN_LABEL},
        },
        "spec": {
            **placement,
            "serviceAccountName": service_account,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 60,
            "securityContext": RESTRICTED_POD,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-m", "trainer", step, *args],
                    "env": env,
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "256Mi"},
                        "limits": {"cpu": "1", "memory": "2Gi"},
                    },
                    "securityContext": RESTRICTED_CONTAINER,
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }


def pod_phase(namespace: str, name: str) -> str | None:
    proc = kubectl(
        "get", "pod", "-n", namespace, name, "-o", "jsonpath={.status.phase}", check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def wait_pod_done(namespace: str, name: str, timeout: float) -> dict[str, Any]:
    """Wait until the pod Succeeded or Failed; its status's terminated state (exit code...)."""
    wait_until(
        f"pod {namespace}/{name} to finish",
        lambda: pod_phase(namespace, name) in ("Succeeded", "Failed"),
        timeout,
        interval=2,
    )
    status = get_json("pod", "-n", namespace, name)["status"]
    return status["containerStatuses"][0]["state"]["terminated"]


def logs(namespace: str, name: str, container: str | None = None) -> str:
    extra = ["-c", container] if container else []
    return kubectl("logs", "-n", namespace, name, *extra, check=False).stdout


JOB_KINDS = {
    "pytorchjob": "training.kubeflow.org/job-name",
    "trainjob": "jobset.sigs.k8s.io/jobset-name",
}
"""Each launcher's job kind, and the label its operator puts on the job's pods (the job's name)."""


def jobs(namespace: str, kind: str = "pytorchjob") -> list[dict[str, Any]]:
    return get_json(f"{kind}s", "-n", namespace)["items"]


def job_pods(namespace: str, job: str, kind: str = "pytorchjob") -> list[dict[str, Any]]:
    return get_json("pods", "-n", namespace, "-l", f"{JOB_KINDS[kind]}={job}")["items"]


def job_gone(namespace: str, job: str, kind: str = "pytorchjob") -> bool:
    names = {j["metadata"]["name"] for j in jobs(namespace, kind)}
    return job not in names and not job_pods(namespace, job, kind)


def events(namespace: str) -> list[dict[str, Any]]:
    return get_json("events", "-n", namespace)["items"]


# --------------------------------------------------------------------------------------------
# The train step's launcher in a pod, for either launcher (tests/cluster/test_*job.py)
# --------------------------------------------------------------------------------------------

JOB_TIMEOUT_S = 900
"""Longest a test waits for one launcher: a 2-node job on this 2-core node, images local."""


def train_config(image: str, launcher: str = "pytorchjob", **over: Any) -> dict[str, Any]:
    """The train step's config for a 2-node CPU job of the demo table (``launcher`` picks the
    PyTorchJob or the TrainJob); requests fit one 2-core node. The same settings give the same
    weights (the node-loss tests rely on it). ``section__field=value`` overrides one field."""
    cfg: dict[str, Any] = {
        "launcher": launcher,
        "nnodes": 2,
        "gpus_per_node": 0,
        "checkpoint_every_steps": 5,
        # No early stopping: a run of known length (~190 steps), so a test can act mid-training.
        "train": {
            "epochs": 6,
            "seed": 0,
            "global_batch_size": 64,
            "log_every_steps": 1,
            "early_stopping": None,
        },
        # A lost peer that sends nothing (a dead node) is found by the collective timeout.
        "dist": {"timeout_s": 90},
        "cluster": {"image": image, **JOB_POD_SETTINGS},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            cfg.setdefault(section, {})[field] = value
        else:
            cfg[section] = value
    return cfg


@dataclass
class Launch:
    """One launcher pod and where its job writes."""

    namespace: str
    pod: str
    job: str
    base: str
    exit: dict[str, Any] | None = None
    """The launcher container's terminated state, once waited for."""
    kind: str = "pytorchjob"
    """The job's resource (the config's ``launcher``): kube.JOB_KINDS' key."""

    @property
    def model(self) -> str:
        return f"{self.base}/model"

    @property
    def container(self) -> str:
        """The training container of the job's pods."""
        return "pytorch" if self.kind == "pytorchjob" else "node"

    def done(self, timeout: float = JOB_TIMEOUT_S) -> dict[str, Any]:
        return wait_pod_done(self.namespace, self.pod, timeout)

    def log(self) -> str:
        return logs(self.namespace, self.pod)


def launch(
    namespace: str,
    image: str,
    dataset: str,
    cfg: dict[str, Any],
    *,
    job: str | None = None,
    base: str | None = None,
    node: str | None = None,
) -> Launch:
    """Start the train step's launcher pod; the config goes through the store, like KFP's."""
    from trainer.base import storage

    pod = unique("launcher")
    job = job or unique("gpupipe-train")
    base = base or f"minio://{BUCKET}/{namespace}/{job}"
    storage.write_json(f"{base}/config.json", cfg)
    args = ["--config", f"{base}/config.json", "--dataset", dataset]
    args += ["--model", f"{base}/model", "--work", f"{base}/work", "--job-name", job]
    apply(launcher_pod(pod, namespace, image, args, node=node))
    kind = str(cfg.get("launcher", "pytorchjob"))
    return Launch(namespace=namespace, pod=pod, job=job, base=base, kind=kind)


def weights(model_uri: str) -> dict[str, Any]:
    """The stored model's tensors by name."""
    from safetensors.torch import load

    from trainer.base import storage

    return load(storage.read_bytes(storage.join(model_uri, "model.safetensors")))


def pod_steps(namespace: str, pod: str, container: str) -> int:
    """The highest training step a pod's log reports (its JSON log lines)."""
    best = 0
    for line in logs(namespace, pod, container).splitlines():
        m = re.search(r'"step": (\d+)', line)
        if m and '"loss"' in line:
            best = max(best, int(m.group(1)))
    return best


CTR = ["ctr", "--address", str(STATE / "run" / "containerd.sock"), "-n", "k8s.io"]
"""Node 1's containerd (not Docker's)."""


def ctr_of(node: str) -> list[str]:
    """The ctr command for the containerd of ``node`` (node K's socket is ``containerd-K.sock``,
    hack/cluster/nodes.sh)."""
    suffix = node.removeprefix(NODE_NAME)
    if not suffix:
        return CTR
    return ["ctr", "--address", str(STATE / "run" / f"containerd{suffix}.sock"), "-n", "k8s.io"]


def kill_container(namespace: str, pod: str) -> None:
    """SIGKILL the pod's container from its node, as an OOM kill or a crash would: the pod stays
    (Failed), so the job it owns stays too."""
    obj = get_json("pod", "-n", namespace, pod)
    cid = obj["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    ctr = ctr_of(obj["spec"]["nodeName"])
    subprocess.run([*ctr, "tasks", "kill", "-s", "SIGKILL", cid], check=True, capture_output=True)


def run_script(name: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``hack/<name>`` (cluster-up.sh, cluster-down.sh) as a user does; its output kept."""
    return subprocess.run(
        [str(ROOT / "hack" / name)], capture_output=True, text=True, timeout=timeout, check=False
    )


def pods_quota(room_pods: int) -> dict[str, str]:
    """Kueue quota with room for ``room_pods`` pods of JOB_POD_SETTINGS' requests."""
    cpu = int(JOB_POD_SETTINGS["cpu_request"].rstrip("m")) * room_pods
    mem = int(JOB_POD_SETTINGS["memory_request"].rstrip("Mi")) * room_pods
    return {"cpu": f"{cpu}m", "memory": f"{mem}Mi"}


@contextlib.contextmanager
def kueue_queue(namespace: str, queue: str, quota: dict[str, str]) -> Iterator[str]:
    """A Kueue ClusterQueue with ``quota`` (resource -> nominal quota, e.g.
    :func:`pods_quota`) and the LocalQueue ``queue`` in ``namespace`` pointing to it
    (manifests/kueue's shapes, the add-on's ResourceFlavor); both deleted after. Skips where the
    cluster has no Kueue."""
    need_addon("kueue")
    cluster_queue = f"{queue}-{namespace}"
    resources = [{"name": k, "nominalQuota": v} for k, v in quota.items()]
    group = {"coveredResources": list(quota),
             "flavors": [{"name": "gpupipe-default", "resources": resources}]}  # fmt: skip
    apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
           "metadata": {"name": cluster_queue},
           "spec": {"namespaceSelector": {}, "resourceGroups": [group]}})  # fmt: skip
    apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
           "metadata": {"name": queue, "namespace": namespace},
           "spec": {"clusterQueue": cluster_queue}})  # fmt: skip
    try:
        yield queue
    finally:
        kubectl("delete", "localqueue", "-n", namespace, queue, "--ignore-not-found", check=False)
        kubectl("delete", "clusterqueue", cluster_queue, "--ignore-not-found", check=False)


@contextlib.contextmanager
def extended_resource(node: str, name: str, count: int) -> Iterator[str]:
    """``node`` advertises ``count`` of the extended resource ``name`` (a PATCH of its status,
    as Kubernetes' docs advertise one): room for exactly that many pods that ask one each,
    whatever else runs there. Removed after."""
    path = "/status/capacity/" + name.replace("~", "~0").replace("/", "~1")

    def patch(op: dict[str, Any]) -> None:
        kubectl(
            "patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps([op])
        )

    patch({"op": "add", "path": path, "value": str(count)})
    try:
        wait_until(
            f"{node}'s allocatable {name}",
            lambda: get_json("node", node)["status"].get("allocatable", {}).get(name) == str(count),
            60,
        )
        yield name
    finally:
        patch({"op": "remove", "path": path})
