"""The test cluster's add-ons (hack/cluster/addons/) agree with the user path and with KFP 2.17.

The scripts build each piece locally and install the same manifests users apply (manifests/), with
only the image swapped; these checks keep the two from drifting apart, and hold the object store's
manifests (KFP 2.17's SeaweedFS base, written out in hack/cluster/addons/object-store/) to the
names KFP's backend looks for and to restricted Pod Security.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "hack" / "cluster"
STORE = CLUSTER / "addons" / "object-store"


def _versions() -> dict[str, str]:
    pairs = re.findall(r"^([A-Z0-9_]+)=(\S+)$", (CLUSTER / "versions.env").read_text(), re.M)
    return dict(pairs)


VERSIONS = _versions()


def _store_objects() -> list[dict[str, Any]]:
    spec = yaml.safe_load((STORE / "kustomization.yaml").read_text())
    assert set(spec) <= {"apiVersion", "kind", "namespace", "resources"}, sorted(spec)
    objects = []
    for name in spec["resources"]:
        for obj in yaml.safe_load_all((STORE / name).read_text()):
            if obj:
                obj["metadata"]["namespace"] = spec["namespace"]
                objects.append(obj)
    return objects


STORE_OBJECTS = {(o["kind"], o["metadata"]["name"]): o for o in _store_objects()}


def test_training_operator_version_is_the_user_paths() -> None:
    text = (ROOT / "manifests" / "training-operator" / "kustomization.yaml").read_text()
    assert f"?ref=v{VERSIONS['TRAINING_OPERATOR_VERSION']}\n" in text


@pytest.mark.parametrize("part", ["manager", "runtimes"])
def test_trainer_version_is_the_user_paths(part: str) -> None:
    text = (ROOT / "manifests" / "trainer" / part / "kustomization.yaml").read_text()
    assert f"?ref=v{VERSIONS['TRAINER_VERSION']}\n" in text


def _default_addons() -> list[str]:
    text = (ROOT / "hack" / "cluster-up.sh").read_text()
    (found,) = re.findall(r'^addons="\$\{GPUPIPE_CLUSTER_ADDONS-([^}]*)\}"$', text, re.M)
    return found.split()


def test_cluster_up_installs_both_operators_jobset_before_trainer() -> None:
    addons = _default_addons()
    assert {"training-operator", "jobset", "trainer"} <= set(addons), addons
    assert addons.index("jobset") < addons.index("trainer"), addons
    for name in addons:
        script = CLUSTER / "addons" / f"{name}.sh"
        assert script.exists(), script


@pytest.mark.parametrize("name", ["jobset", "trainer"])
def test_operator_images_are_built_from_their_go_module_from_scratch(name: str) -> None:
    script = (CLUSTER / "addons" / f"{name}.sh").read_text()
    version = VERSIONS[f"{name.upper()}_VERSION"]
    assert f'V="${{{name.upper()}_VERSION}}"' in script
    assert re.search(r"^\s*go_(install|build_in_module) ", script, re.M), script
    dockerfile = (CLUSTER / "addons" / "images" / name / "Dockerfile").read_text()
    assert "FROM scratch" in dockerfile and 'ENTRYPOINT ["/manager"]' in dockerfile
    assert version


def test_the_trainer_addon_applies_the_runtime_the_launcher_names_by_default() -> None:
    from trainer.launch.jobspec import ClusterConfig

    script = (CLUSTER / "addons" / "trainer.sh").read_text()
    (runtime,) = re.findall(r"^RUNTIME=(\S+)$", script, re.M)
    assert runtime == ClusterConfig(image="x").runtime
    # Every webhook is waited for: each install checks that its webhooks judge an object.
    for name in ("jobset", "trainer"):
        text = (CLUSTER / "addons" / f"{name}.sh").read_text()
        assert "wait_for 180 webhook_judges" in text, name


def test_mlflow_version_is_the_user_paths() -> None:
    text = (ROOT / "manifests" / "mlflow" / "deployment.yaml").read_text()
    assert f"image: ghcr.io/mlflow/mlflow:v{VERSIONS['MLFLOW_VERSION']}\n" in text


def test_seaweedfs_version_is_the_wrapper_modules_and_the_manifests() -> None:
    gomod = (CLUSTER / "gomod" / "seaweedfs" / "go.mod").read_text()
    module = f"github.com/seaweedfs/seaweedfs {VERSIONS['SEAWEEDFS_MODULE_VERSION']}"
    assert f"require {module}\n" in gomod
    pod = STORE_OBJECTS[("Deployment", "seaweedfs")]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == f"ghcr.io/chrislusf/seaweedfs:{VERSIONS['SEAWEEDFS_VERSION']}"


@pytest.mark.parametrize("key", sorted(STORE_OBJECTS), ids=lambda k: f"{k[0]}/{k[1]}")
def test_store_resource_validates_against_kubernetes_schema(key: tuple[str, str]) -> None:
    obj = STORE_OBJECTS[key]
    try:
        kubernetes_validate.validate(obj, "1.30", strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{key}: {e.message} at {list(e.path)}")


def test_store_has_the_names_kfp_looks_for() -> None:
    service = STORE_OBJECTS[("Service", "minio-service")]
    assert service["metadata"]["namespace"] == "kubeflow"
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(9000, 8333)]
    secret = STORE_OBJECTS[("Secret", "mlpipeline-minio-artifact")]
    assert set(secret["stringData"]) == {"accesskey", "secretkey"}
    template = STORE_OBJECTS[("Deployment", "seaweedfs")]["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    hook = pod["containers"][0]["lifecycle"]["postStart"]["exec"]["command"][-1]
    assert "s3.bucket.create --name mlpipeline" in hook
    assert "-access_key $accesskey -secret_key $secretkey -actions Admin" in hook
    claim = pod["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in STORE_OBJECTS


def test_store_meets_restricted_pod_security() -> None:
    pod = STORE_OBJECTS[("Deployment", "seaweedfs")]["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "limits" in c["resources"]


def test_katib_serves_every_cluster_algorithm_with_the_optuna_service() -> None:
    """Each algorithm the tune step allows on a cluster has a suggestion image in katib-config,
    and it is Katib's optuna service (goptuna ignores a parameter's distribution)."""
    from trainer.tune.space import CLUSTER_ALGORITHMS

    script = (CLUSTER / "addons" / "katib.sh").read_text()
    block = re.search(r"^SUGGESTIONS=\(\n(.*?)^\)", script, re.M | re.S)
    assert block, "katib.sh has no SUGGESTIONS=( ... ) block"
    served = dict(re.findall(r'"(\S+) (\S+)"', block.group(1)))
    assert {a: served.get(a) for a in CLUSTER_ALGORITHMS} == dict.fromkeys(
        CLUSTER_ALGORITHMS, "suggestion-optuna"
    )
