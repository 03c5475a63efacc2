"""The kustomize manifests: every local resource renders and validates, RBAC matches the launcher.

kubectl/kustomize are not available where the tests run, so `render` below is a deliberately tiny
kustomize: it understands `resources` (files, folders, remote URLs), `namespace`, `patches` that
delete an object by kind and name (`$patch: delete`) or apply JSON 6902 operations to a target
named by kind and name, and `configMapGenerator` literals (without the name's hash suffix), and
fails on any other kustomization field or patch. The manifests use nothing else, so what it
renders is what `kubectl kustomize` renders; a manifest that starts using more kustomize features
fails here first, on purpose. Remote bases (training operator, Katib, KFP) cannot be fetched: for
them the tests check the pin and the shape only (tests/unit/test_cluster_credentials.py applies
the KFP and Katib patches to upstream's own files where those are on the machine).
"""

from __future__ import annotations

import copy
import importlib.metadata
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.helpers import label_selects
from trainer.tune.katib import KATIB_API_CALLS

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
K8S_VERSION = "1.30"
"""Schema version the resources are validated against (the kind node image's minor version)."""

SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "namespace", "patches", "configMapGenerator"}
CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ResourceFlavor",  # Kueue's (manifests/kueue)
    "ClusterQueue",
}
REMOTE = re.compile(r"^(https?://|git@|github\.com/)")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
"""A remote base's ref: a commit (a release tag can be moved to other files; a commit cannot)."""
VERSIONS = dict(
    re.findall(
        r"^([A-Z0-9_]+)=(\S+)$",
        (Path(__file__).resolve().parents[2] / "hack/cluster/versions.env").read_text(),
        re.M,
    )
)

# Katib calls of the tune step.
KATIB_CALLS = set(KATIB_API_CALLS)


@dataclass
class Rendered:
    """What a kustomization renders to: local objects, and remote bases left unfetched."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    remote: list[str] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)
    """(kind, name) of what `$patch: delete` patches remove (from remote bases too)."""
    json_patches: list[tuple[str, str, list[dict[str, Any]]]] = field(default_factory=list)
    """(kind, name, operations) of the JSON 6902 patches (applied to local objects; a remote
    base's are kept here unapplied)."""


def _pointer(doc: Any, path: str) -> tuple[Any, str | int]:
    """The parent of JSON pointer ``path`` in ``doc`` and the last token (an int for a list)."""
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in path.lstrip("/").split("/")]
    for token in tokens[:-1]:
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    last = tokens[-1]
    if isinstance(doc, list):
        return doc, len(doc) if last == "-" else int(last)
    return doc, last


def json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``obj`` with the JSON 6902 operations ``ops`` applied (test, add, replace, remove), as
    kustomize applies a patch with a target: a failed ``test`` fails the whole patch.

    Raises:
        ValueError: If a ``test`` does not hold or an operation is not one of the four.
    """
    out = copy.deepcopy(obj)
    for op in ops:
        parent, key = _pointer(out, op["path"])
        if op["op"] == "test":
            if parent[key] != op["value"]:
                raise ValueError(f"test failed at {op['path']}: {parent[key]!r} != {op['value']!r}")
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(key, copy.deepcopy(op["value"]))  # type: ignore[arg-type]
            else:
                parent[key] = copy.deepcopy(op["value"])
        elif op["op"] == "replace":
            if isinstance(parent, dict) and key not in parent:
                raise ValueError(f"replace of {op['path']}, which is not there")
            parent[key] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[key]
        else:
            raise ValueError(f"JSON patch operation {op['op']!r} is not implemented here")
    return out


def render(directory: Path) -> Rendered:
    """Render ``directory``'s kustomization.yaml the way ``kubectl kustomize`` would.

    Raises:
        ValueError: If the kustomization uses a field this renderer does not implement, or two
            resources share kind, namespace and name (kustomize rejects that too).
    """
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED_FIELDS
    if unknown:
        raise ValueError(
            f"{directory}: kustomization fields {sorted(unknown)} are not implemented by the "
            "test renderer; extend render() in tests/unit/test_manifests.py faithfully first"
        )
    out = Rendered()
    for entry in spec.get("resources", []):
        if REMOTE.match(entry):
            out.remote.append(entry)
            continue
        path = directory / entry
        if path.is_dir():
            sub = render(path)
            out.objects += sub.objects
            out.remote += sub.remote
            out.deleted += sub.deleted
            out.json_patches += sub.json_patches
        else:
            out.objects += [copy.deepcopy(d) for d in yaml.safe_load_all(path.read_text()) if d]
    for entry in spec.get("configMapGenerator", []):
        if set(entry) - {"name", "namespace", "literals"}:
            raise ValueError(
                f"{directory}: only configMapGenerator literals are implemented by the test "
                f"renderer, got {entry!r}"
            )
        meta = {"name": entry["name"]}
        if "namespace" in entry:
            meta["namespace"] = entry["namespace"]
        data = dict(lit.split("=", 1) for lit in entry["literals"])
        out.objects.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
        )
    for entry in spec.get("patches", []):
        if set(entry) == {"target", "patch"} and set(entry["target"]) == {"kind", "name"}:
            ops = yaml.safe_load(entry["patch"])
            if not isinstance(ops, list):
                raise ValueError(f"{directory}: a targeted patch must be JSON 6902, got {entry!r}")
            kind, name = entry["target"]["kind"], entry["target"]["name"]
            out.json_patches.append((kind, name, ops))
            out.objects = [
                json_patch(o, ops) if (o["kind"], o["metadata"]["name"]) == (kind, name) else o
                for o in out.objects
            ]
            continue
        doc = yaml.safe_load(entry.get("patch", "")) if set(entry) == {"patch"} else None
        if not isinstance(doc, dict) or doc.get("$patch") != "delete":
            raise ValueError(
                f"{directory}: only `$patch: delete` patches are implemented by the test "
                f"renderer, got {entry!r}"
            )
        key = (doc["kind"], doc["metadata"]["name"])
        out.deleted.append(key)
        out.objects = [o for o in out.objects if (o["kind"], o["metadata"]["name"]) != key]
    namespace = spec.get("namespace")
    if namespace:
        for obj in out.objects:
            if obj["kind"] == "Namespace":  # kustomize names a Namespace after `namespace:`
                obj["metadata"]["name"] = namespace
            elif obj["kind"] not in CLUSTER_SCOPED_KINDS:
                obj.setdefault("metadata", {})["namespace"] = namespace
    seen: set[tuple[str, str, str]] = set()
    for obj in out.objects:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in seen:
            raise ValueError(f"{directory}: duplicate resource {key}")
        seen.add(key)
    return out


KUSTOMIZATIONS = sorted(p.parent for p in MANIFESTS.rglob("kustomization.yaml"))
RENDERED = {d: render(d) for d in KUSTOMIZATIONS}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


LOCAL_OBJECTS = [
    pytest.param(obj, id=f"{_rel(d)}:{obj['kind']}/{obj['metadata']['name']}")
    for d, r in RENDERED.items()
    for obj in r.objects
]
REMOTE_REFS = [
    pytest.param(url, id=f"{_rel(d)}:{url.split('?')[0].split('/')[2]}")
    for d, r in RENDERED.items()
    for url in r.remote
]


def test_every_manifest_folder_is_found() -> None:
    names = {_rel(d) for d in KUSTOMIZATIONS}
    assert {
        "manifests/rbac",
        "manifests/rbac/base",
        "manifests/rbac/profile",
        "manifests/pod-security",
        "manifests/training-operator",
        "manifests/trainer/manager",
        "manifests/trainer/runtimes",
        "manifests/katib",
        "manifests/kfp/cluster-scoped-resources",
        "manifests/kfp/platform-agnostic",
        "manifests/mlflow",
        "manifests/monitoring",
    } <= names


def test_the_podmonitor_scrapes_the_job_pods() -> None:
    """The PodMonitor selects the pods the launchers build, by the port they declare
    (PyTorchJob) or the annotations they carry (TrainJob)."""
    from tests.unit.specs import job_spec
    from trainer.launch.jobspec import METRICS_PORT, SCRAPE_ANNOTATIONS
    from trainer.launch.pytorchjob import build_pytorchjob

    (monitor,) = RENDERED[MANIFESTS / "monitoring"].objects
    assert monitor["kind"] == "PodMonitor" and monitor["spec"]["namespaceSelector"] == {"any": True}
    pod = build_pytorchjob(job_spec(metrics_port=METRICS_PORT))["spec"]["pytorchReplicaSpecs"]
    template = pod["Master"]["template"]
    labels = template["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    by_port, by_annotation = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert by_port["port"] in ports and by_port["path"] == "/metrics"
    annotation_labels = {
        "__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", a)
        for a in SCRAPE_ANNOTATIONS[:2]
    }
    sources = {s for r in by_annotation["relabelings"] for s in r["sourceLabels"]}
    assert annotation_labels <= sources


PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
"""The label Kubeflow's profile controller puts on a user's namespace (a Namespace's label: only
who may patch Namespaces sets it)."""


def _admits(
    policy: dict[str, Any],
    namespace: str,
    labels: dict[str, str],
    port: int,
    ns_labels: dict[str, str] | None = None,
) -> bool:
    """Whether ``policy`` admits a pod with ``labels`` of ``namespace`` (labelled with its name and
    ``ns_labels``) to ``port``."""
    own = policy["metadata"].get("namespace", "kubeflow")
    names = {"kubernetes.io/metadata.name": namespace, **(ns_labels or {})}
    for rule in policy["spec"]["ingress"]:
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports and not [p for p in ports if isinstance(p, str)]:
            continue
        for peer in rule.get("from", []):
            if "namespaceSelector" in peer:
                if not label_selects(peer["namespaceSelector"], names):
                    continue
            elif namespace != own:  # no namespaceSelector: the policy's own namespace only
                continue
            if label_selects(peer.get("podSelector") or {}, labels):
                return True
    return False


def _store_admits(policy: dict[str, Any], namespace: str, labels: dict[str, str]) -> bool:
    return _admits(policy, namespace, labels, 8333, PROFILE if namespace == "team-a" else None)


def test_the_object_store_admits_the_pipelines_pods_and_no_other() -> None:
    """manifests/kfp's store policy admits, in the pipeline namespaces (kubeflow by name, and a
    profile namespace by its profile label), the pods KFP runs (its run label) and the pods of
    the jobs the launchers build (PyTorchJob, so Katib's trials too, and TrainJob through its
    runtime patch), by the labels the code gives them; a pod without them is refused, so is a pod
    with them in any other namespace, and upstream's policy, which admitted whole namespaces, is
    gone."""
    from tests.unit.specs import job_spec
    from trainer.launch.pytorchjob import build_pytorchjob
    from trainer.launch.trainjob import build_trainjob

    rendered = RENDERED[MANIFESTS / "kfp" / "platform-agnostic"]
    assert ("NetworkPolicy", "seaweedfs") in rendered.deleted
    (policy,) = [o for o in rendered.objects if o["metadata"]["name"] == "seaweedfs-pipeline-pods"]
    assert label_selects(policy["spec"]["podSelector"], {"app": "seaweedfs"})
    replicas = build_pytorchjob(job_spec())["spec"]["pytorchReplicaSpecs"]
    (patch,) = build_trainjob(job_spec())["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pods = {
        "a KFP run's pod": {"pipelines.kubeflow.org/v2_component": "true"},
        "a PyTorchJob's master": replicas["Master"]["template"]["metadata"]["labels"],
        "a TrainJob's node": node["template"]["spec"]["template"]["metadata"]["labels"],
    }
    for what, labels in pods.items():
        assert _store_admits(policy, "team-a", labels), (what, labels)
        assert _store_admits(policy, "kubeflow", labels), (what, labels)
        assert not _admits(policy, "elsewhere", labels, 8333), (what, labels)
    assert not _store_admits(policy, "team-a", {})
    assert not _store_admits(policy, "team-a", {"app": "ml-pipeline"})  # only in kubeflow
    assert _store_admits(policy, "kubeflow", {"app": "ml-pipeline"})
    # Every selector is written as expressions: the test cluster's object-store add-on applies
    # the file under kustomize `labels` with includeSelectors, which would add its label to any
    # `matchLabels` and then admit nothing of ours.
    peers = [p for r in policy["spec"]["ingress"] for p in r["from"]]
    assert not [p for p in peers for sel in p.values() if "matchLabels" in sel], peers


def _policies() -> list[tuple[str, dict[str, Any]]]:
    return [
        (str(folder.relative_to(MANIFESTS)), o)
        for folder, rendered in RENDERED.items()
        for o in rendered.objects
        if o["kind"] == "NetworkPolicy"
    ]


def test_no_policy_admits_a_namespace_by_what_its_pods_authors_set() -> None:
    """Issue 60, item 1: ``namespaceSelector: {}`` (every namespace) with a pod label admitted any
    pod author who set the label. Each namespace selector names namespaces, or selects the
    profile controller's namespace label."""
    found = _policies()
    assert {o["metadata"]["name"] for _, o in found} >= {
        "mlflow", "seaweedfs-pipeline-pods", "ml-pipeline", "metadata-grpc-server",
        "metadata-envoy", "ml-pipeline-ui", "katib-db-manager", "mysql", "katib-mysql",
    }  # fmt: skip
    allowed = {"kubernetes.io/metadata.name", *PROFILE}
    for folder, policy in found:
        for rule in policy["spec"]["ingress"]:
            for peer in rule.get("from", []):
                if "namespaceSelector" not in peer:
                    continue
                sel = peer["namespaceSelector"]
                keys = set(sel.get("matchLabels", {})) | {
                    e["key"] for e in sel.get("matchExpressions", [])
                }
                assert keys and keys <= allowed, (folder, policy["metadata"]["name"], sel)


@pytest.mark.parametrize(
    ("server", "port", "caller", "namespace", "admitted"),
    [
        ("ml-pipeline", 8888, {"pipelines.kubeflow.org/v2_component": "true"}, "kubeflow", True),
        ("ml-pipeline", 8887, {"pipelines.kubeflow.org/v2_component": "true"}, "team-a", True),
        ("ml-pipeline", 8888, {"pipelines.kubeflow.org/v2_component": "true"}, "elsewhere", False),
        ("ml-pipeline", 8888, {"app": "ml-pipeline-persistenceagent"}, "kubeflow", True),
        ("ml-pipeline", 8887, {"app": "ml-pipeline-scheduledworkflow"}, "kubeflow", True),
        ("ml-pipeline", 8888, {"app": "ml-pipeline-ui"}, "team-a", False),
        ("ml-pipeline", 8888, {}, "kubeflow", False),
        (
            "metadata-grpc-server",
            8080,
            {"pipelines.kubeflow.org/v2_component": "true"},
            "team-a",
            True,
        ),
        ("metadata-grpc-server", 8080, {"component": "metadata-envoy"}, "kubeflow", True),
        ("metadata-grpc-server", 8080, {}, "kubeflow", False),
        ("metadata-envoy", 9090, {"app": "ml-pipeline-ui"}, "kubeflow", True),
        (
            "metadata-envoy",
            9090,
            {"pipelines.kubeflow.org/v2_component": "true"},
            "kubeflow",
            False,
        ),
        ("ml-pipeline-ui", 3000, {"app": "ml-pipeline"}, "kubeflow", False),
        ("ml-pipeline-ui", 3000, {}, "istio-system", True),
        ("katib-db-manager", 6789, {}, "kubeflow", True),
        ("katib-db-manager", 6789, {}, "team-a", True),
        (
            "katib-db-manager",
            6789,
            {"katib.kubeflow.org/component": "controller"},
            "elsewhere",
            False,
        ),
        ("mlflow", "http", {"pipelines.kubeflow.org/v2_component": "true"}, "elsewhere", False),
        ("mlflow", "http", {"pipelines.kubeflow.org/v2_component": "true"}, "team-a", True),
    ],
)
def test_each_server_admits_its_callers_in_the_pipeline_namespaces_only(
    server: str, port: Any, caller: dict[str, str], namespace: str, admitted: bool
) -> None:
    (policy,) = [o for _, o in _policies() if o["metadata"]["name"] == server]
    ns_labels = PROFILE if namespace == "team-a" else None
    assert _admits(policy, namespace, caller, port, ns_labels) is admitted


OPERATOR_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}
"""The Prometheus operator's resources: no schema here (tested on their own below)."""
KUEUE_KINDS = {"ResourceFlavor", "ClusterQueue", "LocalQueue"}
"""Kueue's (manifests/kueue): validated against Kueue's own CRDs below."""


@pytest.mark.parametrize("obj", LOCAL_OBJECTS)
def test_resource_validates_against_kubernetes_schema(obj: dict[str, Any]) -> None:
    if (obj["apiVersion"], obj["kind"]) in OPERATOR_KINDS:
        pytest.skip("a Prometheus operator resource: test_the_podmonitor_scrapes_the_job_pods")
    if obj["apiVersion"].startswith("kueue.x-k8s.io/") and obj["kind"] in KUEUE_KINDS:
        _validate_against_kueues_crd(obj)
        return
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


NODE_READER = "gpupipe-node-reader"
"""manifests/rbac's ClusterRole: list nodes, nothing else (a GPU job no node can hold is refused
before it is created, issue 64 item 3)."""


def _kueue_crd(kind: str) -> dict[str, Any]:
    """Kueue's CRD of ``kind`` at KUEUE_VERSION, from its Go module (the download the test
    cluster builds Kueue from; ``go mod download`` fetches it from the module proxy)."""
    import json
    import shutil
    import subprocess

    if shutil.which("go") is None:
        pytest.skip("no Go toolchain to fetch Kueue's module (its CRDs) with")
    version = VERSIONS["KUEUE_VERSION"]
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kueue@v{version}"],
        capture_output=True, text=True, timeout=300, cwd="/tmp", check=False,
    )  # fmt: skip
    if out.returncode != 0:
        pytest.skip(f"Kueue v{version}'s module could not be fetched: {out.stdout[-200:]}")
    crds = Path(json.loads(out.stdout)["Dir"]) / "config/components/crd/bases"
    plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
              "LocalQueue": "localqueues"}[kind]  # fmt: skip
    return dict(yaml.safe_load((crds / f"kueue.x-k8s.io_{plural}.yaml").read_text()))


def _validate_against_kueues_crd(obj: dict[str, Any]) -> None:
    import jsonschema

    crd = _kueue_crd(obj["kind"])
    version = obj["apiVersion"].split("/")[1]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert served["served"] and served.get("storage"), f"{version} is not Kueue's stored version"
    schema = served["schema"]["openAPIV3Schema"]
    try:
        jsonschema.validate(obj, schema)
    except jsonschema.ValidationError as e:
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


@pytest.mark.parametrize("obj", LOCAL_OBJECTS)
def test_nothing_cluster_wide(obj: dict[str, Any]) -> None:
    # The exceptions: manifests/pod-security's labels for a namespace that exists already
    # (server-side apply merges them), nothing else in it; and the launchers' one cluster-scoped
    # right, listing nodes, and its bindings.
    labels_only = set(obj) == {"apiVersion", "kind", "metadata"} and set(obj["metadata"]) == {
        "name",
        "labels",
    }
    if obj["kind"] == "ClusterRole":
        assert obj["metadata"]["name"] == NODE_READER
        assert obj["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
        return
    if obj["kind"] == "ClusterRoleBinding":
        assert obj["roleRef"]["kind"] == "ClusterRole" and obj["roleRef"]["name"] == NODE_READER
        return
    if obj["kind"] in ("ResourceFlavor", "ClusterQueue"):  # Kueue's own: cluster-scoped by kind
        return
    assert obj["kind"] not in CLUSTER_SCOPED_KINDS or (obj["kind"] == "Namespace" and labels_only)


@pytest.mark.parametrize("url", REMOTE_REFS)
def test_remote_base_is_pinned_to_a_commit(url: str) -> None:
    refs = re.findall(r"[?&]ref=([^&]+)", url)
    assert len(refs) == 1, f"{url}: no ?ref= pin"
    assert COMMIT.match(refs[0]), f"{url}: ref {refs[0]!r} is not a commit (40 hex digits)"


@pytest.mark.parametrize(
    ("folder", "repo", "release"),
    [
        ("training-operator", "github.com/kubeflow/training-operator.git", "TRAINING_OPERATOR"),
        # Kubeflow Trainer v2 (TrainJob): the release whose CRDs are in ../shared/crds.
        ("trainer/manager", "github.com/kubeflow/trainer.git", "TRAINER"),
        ("trainer/runtimes", "github.com/kubeflow/trainer.git", "TRAINER"),
        ("katib", "github.com/kubeflow/katib.git", "KATIB"),
        # The KFP backend release of the SDK that compiles the pipelines (constraints.txt).
        ("kfp/cluster-scoped-resources", "github.com/kubeflow/pipelines", "KFP"),
        ("kfp/platform-agnostic", "github.com/kubeflow/pipelines", "KFP"),
    ],
)
def test_install_overlays_pin_the_expected_release(folder: str, repo: str, release: str) -> None:
    """Each base at the commit of the release the test cluster builds (versions.env's
    <release>_VERSION and _COMMIT), its tag named beside it."""
    tag = VERSIONS[f"{release}_VERSION"]
    text = (MANIFESTS / folder / "kustomization.yaml").read_text()
    assert re.search(rf"^  # v?{re.escape(tag)}: the commit its release tag names", text, re.M)
    rendered = RENDERED[MANIFESTS / folder]
    # Objects of our own: KFP's grant of ML Metadata's database to the generated account
    # (hack/credentials.sh), which the database runs on its first start, each database's
    # NetworkPolicy (only its own servers reach it), and the store's (the pipeline's pods).
    own = sorted((o["kind"], o["metadata"]["name"]) for o in rendered.objects)
    expected = {
        "kfp/platform-agnostic": [
            ("ConfigMap", "mysql-kfp-grants"),
            ("NetworkPolicy", "metadata-envoy"),
            ("NetworkPolicy", "metadata-grpc-server"),
            ("NetworkPolicy", "ml-pipeline"),
            ("NetworkPolicy", "ml-pipeline-ui"),
            ("NetworkPolicy", "mysql"),
            ("NetworkPolicy", "seaweedfs-pipeline-pods"),
        ],
        "katib": [("NetworkPolicy", "katib-db-manager"), ("NetworkPolicy", "katib-mysql")],
    }.get(folder, [])
    assert own == expected, "install overlays only point at upstream"
    assert len(rendered.remote) == 1
    assert rendered.remote[0].startswith(repo + "/")
    assert rendered.remote[0].endswith(f"?ref={VERSIONS[f'{release}_COMMIT']}")


def test_kfp_install_leaves_out_only_the_v1_parts() -> None:
    """gpupipe compiles v2 pipelines: the install drops what only v1 pipelines use, nothing else
    (the API server, ML Metadata, the UI and its proxy, Argo, the database and the store stay)."""
    deleted = RENDERED[MANIFESTS / "kfp" / "platform-agnostic"].deleted
    # The two Secrets that hold upstream's fixed credentials go too: hack/credentials.sh makes
    # them (tests/unit/test_cluster_credentials.py).
    secrets = {name for kind, name in deleted if kind == "Secret"}
    assert secrets == {"mlpipeline-minio-artifact", "mysql-secret"}, deleted
    # Upstream's store policy (every pod of the namespace and of the profile namespaces) gives way
    # to seaweedfs-networkpolicy.yaml's (the pipeline's pods).
    assert {name for kind, name in deleted if kind == "NetworkPolicy"} == {"seaweedfs"}, deleted
    # Services stay: the API server reads their addresses from its environment at start.
    assert {kind for kind, _ in deleted} == {"Deployment", "Secret", "NetworkPolicy"}, deleted
    names = {name for kind, name in deleted if kind == "Deployment"}
    assert names == {
        "cache-server",
        "cache-deployer-deployment",
        "metadata-writer",
        "ml-pipeline-visualizationserver",
        "ml-pipeline-viewer-crd",
    }, deleted


def test_kfp_backend_matches_the_sdk() -> None:
    assert importlib.metadata.version("kfp") == VERSIONS["KFP_VERSION"]
    for folder in ("kfp/cluster-scoped-resources", "kfp/platform-agnostic"):
        remote = RENDERED[MANIFESTS / folder].remote[0]
        assert remote.endswith(f"?ref={VERSIONS['KFP_COMMIT']}"), folder


def _expected_calls() -> set[tuple[str, str, str]]:
    from trainer.launch.pytorchjob import API_CALLS
    from trainer.launch.trainjob import API_CALLS as TRAINJOB_CALLS

    return set(API_CALLS) | set(TRAINJOB_CALLS) | KATIB_CALLS


def _granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize(
    ("folder", "namespace", "account"),
    [
        ("rbac", "kubeflow", "pipeline-runner"),
        ("rbac/profile", "kubeflow-user-example-com", "default-editor"),
    ],
)
def test_rbac_is_least_privilege_for_the_launcher(
    folder: str, namespace: str, account: str
) -> None:
    from trainer.launch.kube import CLUSTER_API_CALLS

    objects = RENDERED[MANIFESTS / folder].objects
    kinds = ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    assert sorted(o["kind"] for o in objects) == kinds
    role = next(o for o in objects if o["kind"] == "Role")
    binding = next(o for o in objects if o["kind"] == "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == namespace
    # The cluster-scoped calls (list nodes): a ClusterRole bound to the same account, and
    # nothing else in it.
    cluster_role = next(o for o in objects if o["kind"] == "ClusterRole")
    cluster_binding = next(o for o in objects if o["kind"] == "ClusterRoleBinding")
    assert _granted(cluster_role) == set(CLUSTER_API_CALLS)
    assert cluster_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": cluster_role["metadata"]["name"],
    }
    assert cluster_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    ]

    granted = _granted(role)
    expected = _expected_calls() - set(CLUSTER_API_CALLS)
    assert granted - expected == set(), "granted but never called"
    assert expected - granted == set(), "called but not granted"
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for key in ("apiGroups", "resources", "verbs"):
            assert not any("*" in v for v in rule[key]), f"wildcard in {key}: {rule}"
        assert "secrets" not in rule["resources"]

    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    # kustomize's `namespace:` leaves subjects alone (unless named "default"): spelled out.
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    ]


def test_renderer_refuses_fields_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\ncommonLabels: {a: b}\n")
    with pytest.raises(ValueError, match=r"\['commonLabels'\] are not implemented"):
        render(tmp_path)


def test_renderer_deletes_by_kind_and_name_and_refuses_other_patches(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"
    )
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [a.yaml]\npatches:\n  - patch: |-\n      $patch: delete\n"
        "      apiVersion: v1\n      kind: Service\n      metadata: {name: a}\n"
    )
    assert [o["kind"] for o in render(tmp_path).objects] == ["ConfigMap"]
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [a.yaml]\npatches:\n  - target: {kind: Service}\n    patch: '[]'\n"
    )
    with pytest.raises(ValueError, match="only `\\$patch: delete` patches"):
        render(tmp_path)


def test_the_runners_namespace_refuses_privileged_pods() -> None:
    """Issue 39: the namespace the runner's Role is in enforces Pod Security `baseline` (no
    privileged pods through a job created with its token) and warns of `restricted`; the test
    cluster and kind-up apply it (server-side: labels merged into the existing namespace)."""
    (ns,) = RENDERED[MANIFESTS / "pod-security"].objects
    role = next(o for o in RENDERED[MANIFESTS / "rbac"].objects if o["kind"] == "Role")
    assert ns["kind"] == "Namespace" and ns["metadata"]["name"] == role["metadata"]["namespace"]
    labels = ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert set(ns) == {"apiVersion", "kind", "metadata"} and set(ns["metadata"]) == {
        "name",
        "labels",
    }
    root = MANIFESTS.parent
    assert (
        '"${REPO_ROOT}/manifests/pod-security"'
        in (root / "hack" / "cluster" / "addons" / "training-operator.sh").read_text()
    )
    assert (
        "apply --server-side -k manifests/pod-security"
        in (root / "hack" / "kind-up.sh").read_text()
    )


def test_renderer_sets_the_namespace_on_namespaced_objects(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("namespace: team\nresources: [r.yaml]\n")
    (tmp_path / "r.yaml").write_text(
        "kind: ConfigMap\napiVersion: v1\nmetadata: {name: a, namespace: other}\n---\n"
        "kind: ClusterRole\napiVersion: rbac.authorization.k8s.io/v1\nmetadata: {name: b}\n"
    )
    objs = render(tmp_path).objects
    assert objs[0]["metadata"]["namespace"] == "team"
    assert "namespace" not in objs[1]["metadata"]


def _pod_specs() -> list[Any]:
    return [
        pytest.param(o["spec"]["template"]["spec"], id=f"{o['kind']}/{o['metadata']['name']}")
        for r in RENDERED.values()
        for o in r.objects
        if o["kind"] in {"Deployment", "StatefulSet", "Job", "DaemonSet"}
    ]


@pytest.mark.parametrize("pod", _pod_specs())
def test_workloads_meet_restricted_pod_security(pod: dict[str, Any]) -> None:
    pod_sc = pod.get("securityContext", {})
    assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault"
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, c["name"]
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        image = c["image"]
        name, _, tag = image.rpartition(":")
        assert name and "/" not in tag and tag not in {"", "latest"}, f"unpinned image {image}"
        assert "limits" in c.get("resources", {}), f"{c['name']}: no resource limits"


def test_kind_config_has_two_workers_on_a_pinned_node_image() -> None:
    config = yaml.safe_load((MANIFESTS / "kind" / "kind-config.yaml").read_text())
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert config["kind"] == "Cluster"
    roles = [n["role"] for n in config["nodes"]]
    assert roles == ["control-plane", "worker", "worker"]
    images = {n["image"] for n in config["nodes"]}
    assert len(images) == 1
    image = images.pop()
    m = re.fullmatch(r"kindest/node:v(\d+)\.(\d+)\.\d+@sha256:[0-9a-f]{64}", image)
    assert m, f"node image {image!r} is not pinned by version and digest"
    assert f"{m[1]}.{m[2]}" == K8S_VERSION, "validate against the cluster's Kubernetes minor"
