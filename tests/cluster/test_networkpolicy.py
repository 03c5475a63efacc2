"""The test cluster enforces NetworkPolicy (issue 39): MLflow, the object store and the two
databases refuse a pod outside their policies.

kube-router's network policy controller (hack/cluster/addons/network-policy.sh) keeps the node's
iptables in step with the policies: manifests/mlflow's admits only pods with KFP's run label
(``pipelines.kubeflow.org/v2_component``), manifests/kfp's SeaweedFS policy (in place of
upstream's, which admitted every pod of ``kubeflow`` and of the profile namespaces) those and the
training jobs' pods (``app.kubernetes.io/name=gpupipe``), and in ``kubeflow`` KFP's API server
and UI. Each refusal here has its positive control, a
pod that differs only in what the policy admits and reaches the same service, so that neither a
dead service nor a broken pod network can pass for a policy. The node itself is not a pod: the
tests' host-side reads through the services' cluster IPs still work. The databases' policies
(manifests/kfp and manifests/katib) admit their own servers' pods only, by their labels: a probe
pod with those labels stands for the server (never Ready, so no Service sends it anything).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.cluster import kube
from tests.cluster.conftest import namespace_doc

NS = "kubeflow"
MLFLOW = "mlflow.kubeflow:5000"
STORE = "seaweedfs.kubeflow:9000"
KFP_LABEL = kube.KFP_RUN_LABEL
JOB_LABEL = {"app.kubernetes.io/name": "gpupipe"}
"""What the launchers label a PyTorchJob's, a TrainJob's and a Katib trial's pods with."""
PROFILE_LABEL = {"app.kubernetes.io/part-of": "kubeflow-profile"}
KFP_DB = "tcp:mysql.kubeflow:3306"
KATIB_DB = "tcp:katib-mysql.kubeflow:3306"
TRIES = 5
"""Connections each probe makes to each address, a second apart (after 3 s: kube-router adds a
new pod's address to the policies' ipsets on the sync its start triggers)."""


ADDON_OF = {
    "mlflow": "mlflow",
    "seaweedfs": "object-store",
    "mysql": "kfp",
    "ml-pipeline": "kfp",
    "metadata-grpc-service": "kfp",
    "ml-pipeline-ui": "kfp-ui",
    "katib-mysql": "katib",
    "katib-db-manager": "katib",
}
"""The add-on that installs each Service these tests reach."""


def _need_services(*names: str) -> None:
    for name in names:
        present = kube.kubectl("get", "service", "-n", NS, name, check=False).returncode == 0
        kube.need_addon(ADDON_OF[name], present, f"Service {NS}/{name}")


@pytest.fixture(scope="module", autouse=True)
def _enforced() -> None:
    kube.need_addon("network-policy")
    _need_services("mlflow", "seaweedfs")


def _namespace(labels: dict[str, str]) -> Iterator[str]:
    name = kube.unique("gpupipe-np")
    kube.apply(namespace_doc(name, {"pod-security.kubernetes.io/enforce": "restricted", **labels}))
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def outside() -> Iterator[str]:
    """A namespace that neither policy admits (no profile label)."""
    yield from _namespace({})


@pytest.fixture(scope="module")
def profile() -> Iterator[str]:
    """A namespace labelled as Kubeflow's profile controller labels a user's namespace."""
    yield from _namespace(PROFILE_LABEL)


def _probe_pod(name: str, namespace: str, labels: dict[str, str], targets: list[str]) -> None:
    """A restricted busybox pod that tries each target TRIES times and prints one line a try:
    ``<target> <try> reached|refused <words>``. A ``host:port`` target is asked over HTTP
    (reached: any HTTP answer, 401 and 403 included; refused: none within 10 s); a
    ``tcp:host:port`` target is connected to (reached: the connection opened; busybox's nc then
    runs ``true`` on it and leaves, where the server would keep it waiting). The pod is never
    Ready: with a server's labels it must not become one of that server's Service endpoints."""
    script = f"""
sleep 3
for target in {" ".join(targets)}; do
  for i in $(seq {TRIES}); do
    case "$target" in
    tcp:*)
      hp="${{target#tcp:}}"
      out="$(timeout 10 nc -w 5 "${{hp%:*}}" "${{hp##*:}}" -e true 2>&1 >/dev/null)" &&
        got=reached || got=refused ;;
    *)
      out="$(timeout 10 wget -q -O /dev/null "http://$target/" 2>&1)" && got=reached || got=refused
      case "$out" in *HTTP/*) got=reached ;; esac ;;
    esac
    echo "$target $i $got ${{out:-200 OK}}"
    sleep 1
  done
done
"""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": kube.RESTRICTED_POD,
                "containers": [
                    {
                        "name": "probe",
                        "image": kube.BUSYBOX_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", script],
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "16Mi"},
                            "limits": {"cpu": "200m", "memory": "64Mi"},
                        },
                        "securityContext": kube.RESTRICTED_CONTAINER,
                        "readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 60},
                    }
                ],
            },
        }
    )


def _outcomes(name: str, namespace: str) -> dict[str, list[str]]:
    """The probe pod's outcomes per target, in order; its lines stay in the assertion messages."""
    done = kube.wait_pod_done(namespace, name, timeout=180)
    assert done["exitCode"] == 0, kube.logs(namespace, name)
    found: dict[str, list[str]] = {}
    for line in kube.logs(namespace, name).splitlines():
        target, _, outcome, _ = [*line.split(" ", 3), "", "", ""][:4]
        found.setdefault(target, []).append(outcome)
    return found


Probes = dict[str, tuple[str, dict[str, str], list[str]]]


def _probe(probes: Probes) -> dict[str, dict[str, list[str]]]:
    """Run the probe pods side by side, {role: (namespace, labels, targets)}; each role's
    outcomes per target."""
    pods = {role: (kube.unique(role), namespace) for role, (namespace, _, _) in probes.items()}
    try:
        for role, (namespace, labels, targets) in probes.items():
            _probe_pod(pods[role][0], namespace, labels, targets)
        return {role: _outcomes(name, namespace) for role, (name, namespace) in pods.items()}
    finally:  # some stand in kubeflow's own namespace, which outlives the test
        for name, namespace in pods.values():
            kube.kubectl("delete", "pod", "-n", namespace, name, "--wait=false", check=False)


def test_a_pod_outside_the_policy_cannot_reach_mlflow(outside: str, profile: str) -> None:
    got = _probe(
        {
            "plain": (profile, {}, [MLFLOW]),
            "kfp-step": (profile, KFP_LABEL, [MLFLOW]),
            "kfp-step-in-kubeflow": (NS, KFP_LABEL, [MLFLOW]),
            "kfp-step-elsewhere": (outside, KFP_LABEL, [MLFLOW]),
        }
    )
    # Refused on every try; the same namespace's pod with KFP's run label reaches it, in the
    # pipeline namespaces (kubeflow, and a profile namespace) only: elsewhere the label opens
    # nothing (issue 60: anyone who can make a pod can label it).
    assert got["plain"][MLFLOW] == ["refused"] * TRIES, got
    assert got["kfp-step"][MLFLOW][-1] == "reached", got
    assert got["kfp-step-in-kubeflow"][MLFLOW][-1] == "reached", got
    assert got["kfp-step-elsewhere"][MLFLOW] == ["refused"] * TRIES, got


def test_only_the_pipelines_pods_reach_the_object_store(outside: str, profile: str) -> None:
    got = _probe(
        {
            "plain": (outside, {}, [STORE]),
            "profile": (profile, {}, [STORE, MLFLOW]),
            "kubeflow": (NS, {}, [STORE]),
            "kfp-step": (profile, KFP_LABEL, [STORE]),
            "kfp-step-elsewhere": (outside, KFP_LABEL, [STORE]),
            "job": (profile, JOB_LABEL, [STORE, MLFLOW]),
            "job-elsewhere": (outside, JOB_LABEL, [STORE]),
            "kfp-api-server": (NS, {"app": "ml-pipeline"}, [STORE]),
            "kfp-api-server-elsewhere": (outside, {"app": "ml-pipeline"}, [STORE]),
        }
    )
    # Upstream's policy admitted any pod of kubeflow and of a profile namespace; manifests/kfp's
    # admits none of them without a pipeline's label...
    assert got["plain"][STORE] == ["refused"] * TRIES, got
    assert got["profile"][STORE] == ["refused"] * TRIES, got
    assert got["kubeflow"][STORE] == ["refused"] * TRIES, got
    assert got["profile"][MLFLOW] == ["refused"] * TRIES, got
    # ...and admits, in the pipeline namespaces, a run's pod and a training job's (the
    # launchers' label), and in its own the API server; the job's label does not open MLflow (a
    # run's pods only). Outside the pipeline namespaces no label opens it.
    assert got["kfp-step"][STORE][-1] == "reached", got
    assert got["job"][STORE][-1] == "reached", got
    assert got["kfp-api-server"][STORE][-1] == "reached", got
    assert got["job"][MLFLOW] == ["refused"] * TRIES, got
    for role in ("kfp-step-elsewhere", "job-elsewhere", "kfp-api-server-elsewhere"):
        assert got[role][STORE] == ["refused"] * TRIES, (role, got)


# "kfp" in its name: KFP's database comes with KFP's add-on, so the runs that select KFP's tests
# (`-k kfp`: .ci/run's stage 3, `make test-cluster`'s KFP stream) run it, where it can.
def test_only_their_own_servers_reach_the_kfp_and_katib_databases() -> None:
    _need_services("mysql", "katib-mysql")
    got = _probe(
        {
            # A run's step pod: in a standalone install it shares the databases' namespace.
            "kfp-step": (NS, KFP_LABEL, [KFP_DB, KATIB_DB]),
            "kfp-api-server": (NS, {"app": "ml-pipeline"}, [KFP_DB, KATIB_DB]),
            "ml-metadata": (NS, {"component": "metadata-grpc-server"}, [KFP_DB]),
            "katib-db-manager": (NS, {"katib.kubeflow.org/component": "db-manager"}, [KATIB_DB]),
        }
    )
    assert got["kfp-step"][KFP_DB] == ["refused"] * TRIES, got
    assert got["kfp-step"][KATIB_DB] == ["refused"] * TRIES, got
    # Each database reached by the pods its policy admits, and by those only.
    assert got["kfp-api-server"][KFP_DB][-1] == "reached", got
    assert got["ml-metadata"][KFP_DB][-1] == "reached", got
    assert got["kfp-api-server"][KATIB_DB] == ["refused"] * TRIES, got
    assert got["katib-db-manager"][KATIB_DB][-1] == "reached", got


@pytest.mark.parametrize(("service", "port"), [("mlflow", 5000), ("seaweedfs", 9000)])
def test_the_node_reaches_them_through_their_cluster_ips(service: str, port: int) -> None:
    """kube-router accepts what comes from the node's own addresses (the kubelet's probes, and
    these tests' reads through kube-proxy), as upstream's controller does on every node."""
    url = f"http://{kube.service_address(NS, service, port)}/"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            status = answer.status
    except urllib.error.HTTPError as e:  # unauthenticated: 401 (MLflow), 403 (SeaweedFS)
        status = e.code
    assert status in (200, 401, 403), (url, status)


KFP_API = "ml-pipeline.kubeflow:8888"
KFP_GRPC = "tcp:ml-pipeline.kubeflow:8887"
MLMD = "tcp:metadata-grpc-service.kubeflow:8080"
MLMD_WEB = "metadata-envoy-service.kubeflow:9090"
KFP_UI = "ml-pipeline-ui.kubeflow:80"
KATIB_DB_MANAGER = "tcp:katib-db-manager.kubeflow:6789"


def test_kfp_and_katib_servers_admit_the_pipeline_namespaces_callers_only(
    outside: str, profile: str
) -> None:
    """Issue 60, item 1: standalone KFP asks no caller who they are, and any pod could start a
    run through the API server (its steps then read what pipeline-runner may), or write ML
    Metadata. manifests/kfp's policies admit KFP's own servers and a run's pods, in the pipeline
    namespaces only; manifests/katib's the pods of those namespaces to Katib's DB manager."""
    _need_services("ml-pipeline", "metadata-grpc-service", "ml-pipeline-ui", "katib-db-manager")
    every = [KFP_API, KFP_GRPC, MLMD, MLMD_WEB, KFP_UI, KATIB_DB_MANAGER]
    ui = {"app": "ml-pipeline-ui"}
    got = _probe(
        {
            "elsewhere": (outside, {}, every),
            "elsewhere-labelled": (outside, {**KFP_LABEL, **ui}, every),
            "kubeflow": (NS, {}, [KFP_API, MLMD, MLMD_WEB, KFP_UI, KATIB_DB_MANAGER]),
            "kfp-step": (NS, KFP_LABEL, [KFP_API, KFP_GRPC, MLMD, MLMD_WEB, KFP_UI]),
            "kfp-step-profile": (profile, KFP_LABEL, [KFP_API, MLMD, MLMD_WEB, KATIB_DB_MANAGER]),
            "kfp-ui": (NS, ui, [KFP_API, MLMD_WEB]),
        }
    )
    refused, reached = ["refused"] * TRIES, "reached"
    # Outside the pipeline namespaces: nothing, labels or not.
    for role in ("elsewhere", "elsewhere-labelled"):
        for target in every:
            assert got[role][target] == refused, (role, target, got[role])
    # In kubeflow without a label: Katib's DB manager only (its experiments' pods carry no label
    # of ours: suggestions, early stopping, the trials' metrics collectors).
    for target in (KFP_API, MLMD, MLMD_WEB, KFP_UI):
        assert got["kubeflow"][target] == refused, (target, got["kubeflow"])
    assert got["kubeflow"][KATIB_DB_MANAGER][-1] == reached, got["kubeflow"]
    # A run's pod, in kubeflow or a profile namespace: the API server and ML Metadata, not the
    # UI's side (its grpc-web proxy, the UI itself).
    for role in ("kfp-step", "kfp-step-profile"):
        assert got[role][KFP_API][-1] == reached, (role, got[role])
        assert got[role][MLMD][-1] == reached, (role, got[role])
        assert got[role][MLMD_WEB] == refused, (role, got[role])
    assert got["kfp-step"][KFP_GRPC][-1] == reached, got["kfp-step"]
    assert got["kfp-step"][KFP_UI] == refused, got["kfp-step"]
    assert got["kfp-step-profile"][KATIB_DB_MANAGER][-1] == reached, got["kfp-step-profile"]
    # The UI's server: the API server and the grpc-web proxy.
    assert got["kfp-ui"][KFP_API][-1] == reached, got["kfp-ui"]
    assert got["kfp-ui"][MLMD_WEB][-1] == reached, got["kfp-ui"]
    # People reach the UI with a port-forward (a browser on the machine), wherever its pod runs:
    # the kubelet connects inside the pod. (The Service's cluster address from the host is the
    # host's traffic, which the policy refuses on any node but the pod's own.)
    from tests.cluster.kfp import port_forward

    with (
        port_forward("ml-pipeline-ui", 80) as url,
        urllib.request.urlopen(url, timeout=10) as answer,
    ):
        assert answer.status == 200, url
