"""The test cluster's add-ons (hack/cluster/addons/) agree with the user path and with KFP 2.17.

The scripts build each piece locally and install the same manifests users apply (manifests/), with
only the images swapped; these checks keep the two from drifting apart, and hold the trainer's
object-store defaults to the names KFP 2.17's backend uses (read from its source tarball in
../shared/src). The renderings themselves are compared on the cluster
(tests/cluster/test_kfp_manifests.py), where kustomize and the extracted sources are.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "hack" / "cluster"


def _versions() -> dict[str, str]:
    pairs = re.findall(r"^([A-Z0-9_]+)=(\S+)$", (CLUSTER / "versions.env").read_text(), re.M)
    return dict(pairs)


VERSIONS = _versions()


KFP_TARBALL = (
    ROOT.parent / "shared" / "src" / f"kubeflow-pipelines-{VERSIONS['KFP_VERSION']}-backend.tar.gz"
)


def _kfp_file(path: str) -> str:
    """One file of KFP's backend source tarball (skips, naming it, where the tarball is absent)."""
    if not KFP_TARBALL.exists():
        pytest.skip(f"KFP's source tarball is not here ({KFP_TARBALL})")
    with tarfile.open(KFP_TARBALL) as tar:
        member = tar.extractfile(f"kubeflow-pipelines-{VERSIONS['KFP_VERSION']}/{path}")
        assert member is not None, path
        return member.read().decode()


def test_kfp_tarball_is_the_one_versions_env_names() -> None:
    if not KFP_TARBALL.exists():
        pytest.skip(f"KFP's source tarball is not here ({KFP_TARBALL})")
    digest = hashlib.sha256(KFP_TARBALL.read_bytes()).hexdigest()
    assert digest == VERSIONS["KFP_SRC_SHA256"]


def test_minio_uris_default_to_the_store_kfp_drivers_use() -> None:
    """KFP 2.17 has no `minio-service` Service: its driver and launcher reach minio:// at
    `seaweedfs.kubeflow:9000` (v2/objectstore), and so must the trainer's steps by default."""
    source = _kfp_file("backend/src/v2/objectstore/config.go")
    (endpoint,) = re.findall(r'DefaultEndpointInMultiUserMode = "([^"]+)"', source)
    from trainer.base import storage

    assert endpoint == storage._DEFAULT_MINIO_ENDPOINT
    deployment = _kfp_file(
        "manifests/kustomize/base/pipeline/ml-pipeline-apiserver-deployment.yaml"
    )
    host = re.search(r"name: OBJECTSTORECONFIG_HOST\n\s+value: \"([^\"]+)\"", deployment)
    port = re.search(r"name: OBJECTSTORECONFIG_PORT\n\s+value: \"([^\"]+)\"", deployment)
    assert host and port
    assert f"{host.group(1)}:{port.group(1)}" == endpoint


def test_training_operator_version_is_the_user_paths() -> None:
    text = (ROOT / "manifests" / "training-operator" / "kustomization.yaml").read_text()
    assert f"?ref={VERSIONS['TRAINING_OPERATOR_COMMIT']}\n" in text
    assert f"# v{VERSIONS['TRAINING_OPERATOR_VERSION']}: the commit" in text


@pytest.mark.parametrize("part", ["manager", "runtimes"])
def test_trainer_version_is_the_user_paths(part: str) -> None:
    text = (ROOT / "manifests" / "trainer" / part / "kustomization.yaml").read_text()
    assert f"?ref={VERSIONS['TRAINER_COMMIT']}\n" in text
    assert f"# v{VERSIONS['TRAINER_VERSION']}: the commit" in text


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


@pytest.mark.parametrize("name", ["jobset", "trainer", "kueue"])
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
    common = (CLUSTER / "addons" / "common.sh").read_text()
    assert "wait_for 180 webhook_judges" in common
    for name in ("jobset", "trainer", "training-operator", "katib", "kueue"):
        text = (CLUSTER / "addons" / f"{name}.sh").read_text()
        assert re.search(r"^webhook_judges\(\) \{$", text, re.M), name
        assert re.search(r'^  webhooks_judge "\$PIECE" ', text, re.M), name


def test_mlflow_version_is_the_user_paths() -> None:
    text = (ROOT / "manifests" / "mlflow" / "deployment.yaml").read_text()
    # The -full variant: it carries the auth extra (Flask-WTF) the basic-auth app needs.
    assert f"image: ghcr.io/mlflow/mlflow:v{VERSIONS['MLFLOW_VERSION']}-full\n" in text


def test_seaweedfs_version_is_the_wrapper_modules() -> None:
    gomod = (CLUSTER / "gomod" / "seaweedfs" / "go.mod").read_text()
    module = f"github.com/seaweedfs/seaweedfs {VERSIONS['SEAWEEDFS_MODULE_VERSION']}"
    assert f"require {module}\n" in gomod


def test_object_store_applies_kfps_own_seaweedfs_base() -> None:
    """No hand-written copy: the store is KFP's third-party/seaweedfs base from the tarball."""
    script = (CLUSTER / "addons" / "object-store.sh").read_text()
    assert "third-party/seaweedfs/base" in script and 'kfp_source "$PIECE"' in script
    assert not (CLUSTER / "addons" / "object-store").exists()


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


PIN = re.compile(r"^[A-Za-z0-9_.-]+==[A-Za-z0-9_.+!-]+$")


def _pip_installs(dockerfile: Path) -> list[str]:
    """Every `pip install` command of ``dockerfile``, its continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    return [m.group(0) for m in re.finditer(r"pip install[^&;\n]*", text)]


@pytest.mark.parametrize(
    "dockerfile",
    sorted(
        [*ROOT.glob("images/*/Dockerfile"), *ROOT.glob("hack/cluster/addons/images/*/Dockerfile*")]
    ),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_package_an_image_installs_is_pinned(dockerfile: Path) -> None:
    """Issue 39: every pip install of an image is constrained by a file that pins every
    package (name==version), or installs only from such a file without dependencies."""
    for command in _pip_installs(dockerfile):
        pinned = "-c " in command or ("--no-deps" in command and "-r " in command)
        local_build = "--no-build-isolation" in command  # gpupipe itself, from the build context
        assert pinned or local_build, f"{dockerfile.name}: unpinned: {command}"
    for pins in dockerfile.parent.glob("*.txt"):
        lines = [ln.strip() for ln in pins.read_text().splitlines()]
        loose = [ln for ln in lines if ln and not ln.startswith("#") and not PIN.match(ln)]
        assert loose == [], f"{pins.name} pins loosely: {loose}"


def test_katib_pins_every_python_service_it_builds() -> None:
    script = (CLUSTER / "addons" / "katib.sh").read_text()
    services = re.search(r"PY_SERVICES=\(\n(.*?)\n\)", script, re.S)
    assert services
    names = [line.split()[0].strip('"') for line in services.group(1).splitlines()]
    assert names and all(
        (CLUSTER / "addons" / "images" / "katib" / f"constraints-{n}.txt").is_file() for n in names
    ), names


# --- KFP's UI (hack/cluster/addons/kfp-ui.sh) ----------------------------------------------------

FRONTEND_TARBALL = KFP_TARBALL.with_name(
    f"kubeflow-pipelines-{VERSIONS['KFP_VERSION']}-frontend.tar.gz"
)


def test_kfp_ui_comes_after_the_backend_it_fronts() -> None:
    addons = _default_addons()
    assert addons.index("kfp") < addons.index("kfp-ui"), addons


def test_kfp_frontend_tarball_and_node_are_the_ones_versions_env_names() -> None:
    if not FRONTEND_TARBALL.exists():
        pytest.skip(f"KFP's frontend tarball is not here ({FRONTEND_TARBALL})")
    assert (
        hashlib.sha256(FRONTEND_TARBALL.read_bytes()).hexdigest() == VERSIONS["KFP_FRONTEND_SHA256"]
    )
    with tarfile.open(FRONTEND_TARBALL) as tar:
        member = tar.extractfile(f"kubeflow-pipelines-{VERSIONS['KFP_VERSION']}/frontend/.nvmrc")
        assert member is not None
        assert member.read().decode().strip() == f"v{VERSIONS['NODE_VERSION']}"


def test_the_grpc_web_proxy_serves_where_upstreams_envoy_config_says(tmp_path: Path) -> None:
    """The proxy's start script reads the Envoy config of upstream's ConfigMap (the argument the
    Deployment passes): its listener port and ML Metadata's address become grpcwebproxy's."""
    import subprocess

    import yaml

    configmap = yaml.safe_load(
        _kfp_file("manifests/kustomize/base/metadata/base/metadata-envoy-configmap.yaml")
    )
    config = tmp_path / "envoy-config.yaml"
    config.write_text(configmap["data"]["envoy-config.yaml"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "grpcwebproxy").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "grpcwebproxy").chmod(0o755)
    script = CLUSTER / "addons" / "images" / "kfp-ui" / "metadata-grpcweb.sh"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = subprocess.run(["sh", str(script), str(config)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    args = out.stdout.splitlines()[1:]
    assert "--server_http_debug_port=9090" in args, args
    assert "--backend_addr=metadata-grpc-service:8080" in args, args
    assert "--run_tls_server=false" in args, args
    config.write_text("admin: {}\n")
    bad = subprocess.run(["sh", str(script), str(config)], env=env, capture_output=True, text=True)
    assert bad.returncode == 2, bad.stdout
    assert "names no listener_0 port or no metadata-cluster address" in bad.stderr
