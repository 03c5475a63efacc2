"""Each cluster's own object-store keys and database accounts (hack/credentials.sh), never
upstream's fixed ones (minio/minio123, KFP's root with an empty password, Katib's "test").

The generator runs here against a fake kubectl that keeps Secrets in a file; the user path's
manifests are applied to upstream's own objects (KFP's source tarball, Katib's Go module
download: skipped, naming them, where absent) with the renderer of test_manifests.py; the test
cluster's database image's start script runs with stub server binaries and its SQL is read.
The live Secrets and the services that log in with them are checked on the cluster
(tests/cluster/test_credentials.py).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import label_selects
from tests.unit.test_manifests import json_patch, render

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "credentials.sh"
ADDONS = ROOT / "hack" / "cluster" / "addons"
ENTRYPOINT = ADDONS / "images" / "mariadb" / "entrypoint.sh"
UPSTREAM_DEFAULTS = {"", "minio", "minio123", "minioadmin", "test", "root"}
SECRETS = {
    "object-store": "mlpipeline-minio-artifact",
    "kfp-db": "mysql-secret",
    "katib-db": "katib-mysql-secrets",
}
READERS = {
    "object-store": {"seaweedfs", "ml-pipeline", "ml-pipeline-ui"},
    "kfp-db": {"mysql", "ml-pipeline", "metadata-grpc-deployment"},
    "katib-db": {"katib-mysql", "katib-db-manager"},
}
ACCOUNTS = {"kfp-db": ("username", "kfp"), "katib-db": ("DB_USER", "katib")}
"""The database accounts' fixed names (the grants in the manifests name them)."""


def _versions() -> dict[str, str]:
    text = (ROOT / "hack" / "cluster" / "versions.env").read_text()
    return dict(re.findall(r"^([A-Z0-9_]+)=(\S+)$", text, re.M))


VERSIONS = _versions()

FAKE_KUBECTL = r'''#!/usr/bin/env python3
"""kubectl for hack/credentials.sh: Secrets and Deployments in a JSON file; argv logged."""
import base64, json, os, sys

state_file, log = os.environ["FAKE_KUBE_STATE"], os.environ["FAKE_KUBE_LOG"]
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
state = json.load(open(state_file))
args = sys.argv[1:]
assert args[0] == "-n", args
ns, args = args[1], args[2:]
secrets = state.setdefault("secrets", {})
key = lambda name: f"{ns}/{name}"
if args[:2] == ["get", "secret"]:
    if key(args[2]) not in secrets:
        sys.exit(1)
    print(json.dumps({"data": secrets[key(args[2])]}))
elif args[:2] == ["delete", "secret"]:
    del secrets[key(args[2])]
elif args[:2] == ["get", "deployment"]:
    sys.exit(0 if key(args[2]) in state.get("deployments", []) else 1)
elif args[:3] == ["create", "secret", "generic"]:
    assert args[4] == "--from-env-file=/dev/stdin", args
    if key(args[3]) in secrets:
        sys.exit(1)
    data = {}
    for line in sys.stdin.read().splitlines():
        k, v = line.split("=", 1)
        data[k] = base64.b64encode(v.encode()).decode()
    secrets[key(args[3])] = data
elif args[:2] == ["label", "secret"]:
    pass
elif args[:2] == ["rollout", "restart"]:
    state.setdefault("restarted", []).append(key(args[2].split("/", 1)[1]))
else:
    sys.exit(f"fake kubectl: {args} not implemented")
json.dump(state, open(state_file, "w"))
'''


class FakeKube:
    """A kubectl double: its Secrets and Deployments, and every argument list it was given."""

    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "kubectl"
        self.bin.write_text(FAKE_KUBECTL)
        self.bin.chmod(0o755)
        self.state = tmp / "state.json"
        self.log = tmp / "argv.log"
        self.state.write_text("{}")
        self.log.write_text("")

    def put(self, name: str, values: dict[str, str], ns: str = "kubeflow") -> None:
        state = json.loads(self.state.read_text())
        data = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
        state.setdefault("secrets", {})[f"{ns}/{name}"] = data
        self.state.write_text(json.dumps(state))

    def deployments(self, *names: str) -> None:
        state = json.loads(self.state.read_text())
        state["deployments"] = [f"kubeflow/{n}" for n in names]
        self.state.write_text(json.dumps(state))

    def secret(self, name: str, ns: str = "kubeflow") -> dict[str, str] | None:
        data = json.loads(self.state.read_text()).get("secrets", {}).get(f"{ns}/{name}")
        if data is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def restarted(self) -> set[str]:
        return {n.split("/", 1)[1] for n in json.loads(self.state.read_text()).get("restarted", [])}

    def argv(self) -> str:
        return self.log.read_text()

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECTL": str(self.bin),
            "FAKE_KUBE_STATE": str(self.state),
            "FAKE_KUBE_LOG": str(self.log),
        }
        return subprocess.run(
            [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )


def new(kind: str) -> dict[str, str]:
    out = subprocess.run(
        [str(SCRIPT), "new", kind], capture_output=True, text=True, timeout=30, check=True
    )
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_new_credentials_are_random_and_none_is_a_default(kind: str) -> None:
    first, second = new(kind), new(kind)
    assert set(first) == set(second) and first, first
    fixed = dict([ACCOUNTS[kind]]) if kind in ACCOUNTS else {}
    for key, value in first.items():
        if key in fixed:
            assert value == second[key] == fixed[key]
            continue
        assert value not in UPSTREAM_DEFAULTS
        assert len(value) >= 20, (key, value)
        assert value != second[key], f"{key}: two runs gave the same value"
        assert re.fullmatch(r"[a-z0-9]+", value), f"{key}: {value!r} needs quoting somewhere"


def test_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    out = subprocess.run([str(SCRIPT), "new", "postgres"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "object-store, kfp-db, katib-db" in out.stderr


def test_ensure_makes_each_secret_once_and_keeps_it(tmp_path: Path) -> None:
    kube = FakeKube(tmp_path)
    made = kube.run("ensure", "object-store", "kfp-db", "katib-db")
    assert made.returncode == 0, made.stderr
    first = {kind: kube.secret(name) for kind, name in SECRETS.items()}
    assert all(first.values()), first
    again = kube.run("ensure", "object-store", "kfp-db", "katib-db")
    assert again.returncode == 0, again.stderr
    assert {kind: kube.secret(name) for kind, name in SECRETS.items()} == first
    assert again.stdout.count(": kept") == 3, again.stdout
    assert kube.restarted() == set()
    # No value ever reached kubectl as an argument (`ps` would show it).
    for values in first.values():
        for key, value in (values or {}).items():
            if (key, value) not in ACCOUNTS.values():
                assert value not in kube.argv(), key


UPSTREAM_SECRETS = [
    pytest.param("object-store", {"accesskey": "minio", "secretkey": "minio123"}, id="minio123"),
    pytest.param("kfp-db", {"username": "root", "password": ""}, id="kfp-root-no-password"),
    pytest.param("katib-db", {"MYSQL_ROOT_PASSWORD": "test"}, id="katib-test"),
    pytest.param(
        "kfp-db",
        {"username": "kfp", "password": "x" * 48, "root-password": ""},
        id="kfp-empty-root-password",
    ),
]


@pytest.mark.parametrize(("kind", "upstream"), UPSTREAM_SECRETS)
def test_ensure_replaces_an_upstream_default_and_restarts_its_readers(
    kind: str, upstream: dict[str, str], tmp_path: Path
) -> None:
    kube = FakeKube(tmp_path)
    kube.put(SECRETS[kind], upstream)
    readers = sorted(READERS[kind])
    kube.deployments(*readers[:-1])  # one reader not installed: nothing to restart there
    out = kube.run("ensure", kind)
    assert out.returncode == 0, out.stderr
    assert "upstream default" in out.stdout
    now = kube.secret(SECRETS[kind])
    assert now is not None and set(now) == set(new(kind))
    assert not set(now.values()) & (UPSTREAM_DEFAULTS - {"root"})
    assert kube.restarted() == set(readers[:-1])
    checked = kube.run("check", kind)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(("kind", "upstream"), UPSTREAM_SECRETS)
def test_check_refuses_an_upstream_default_naming_the_secret(
    kind: str, upstream: dict[str, str], tmp_path: Path
) -> None:
    kube = FakeKube(tmp_path)
    kube.put(SECRETS[kind], upstream)
    out = kube.run("check", kind)
    assert out.returncode == 1
    assert f"kubeflow/{SECRETS[kind]} holds an upstream default" in out.stderr


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_check_refuses_a_missing_secret_naming_it(kind: str, tmp_path: Path) -> None:
    out = FakeKube(tmp_path).run("check", kind)
    assert out.returncode == 1
    assert f"kubeflow/{SECRETS[kind]} is missing" in out.stderr


# --- the test cluster's database image: the SQL its start script runs -----------------------


def start_sql(
    tmp: Path, env: dict[str, str], initdb: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run images/mariadb/entrypoint.sh with stub server binaries: its exit status, the SQL it
    would start the server with, and its stderr."""
    stubs = tmp / "bin"
    stubs.mkdir()
    (stubs / "mariadb-install-db").write_text("#!/bin/sh\nexit 0\n")
    (stubs / "mariadbd").write_text("#!/bin/sh\nexit 0\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    (tmp / "initdb").mkdir()
    for name, text in (initdb or {}).items():
        (tmp / "initdb" / name).write_text(text)
    out = subprocess.run(
        ["sh", str(ENTRYPOINT), "--datadir", str(tmp / "data")],
        env={
            "PATH": f"{stubs}:/usr/bin:/bin",
            "TMPDIR": str(tmp),
            "GPUPIPE_INITDB_DIR": str(tmp / "initdb"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    sql = (tmp / "init.sql").read_text() if (tmp / "init.sql").exists() else ""
    return out.returncode, sql, out.stderr


def test_the_database_image_gives_root_no_remote_login_and_the_account_its_database(
    tmp_path: Path,
) -> None:
    code, sql, err = start_sql(
        tmp_path,
        {
            "MYSQL_ROOT_PASSWORD": "r00t'pw",
            "MYSQL_ROOT_HOST": "localhost",
            "MYSQL_USER": "katib",
            "MYSQL_PASSWORD": "s3cret",
            "MYSQL_DATABASE": "katib",
        },
        {"grants.sql": "GRANT ALL PRIVILEGES ON `metadb`.* TO 'katib'@'%';\n"},
    )
    assert code == 0, err
    assert "ALTER USER 'root'@'localhost' IDENTIFIED BY 'r00t''pw';" in sql
    assert "CREATE USER IF NOT EXISTS 'root'@'%'" not in sql
    # Every other root goes: a root@'%' left by an earlier start, and mariadb-install-db's
    # password-less root@127.0.0.1, root@::1 and root@<host name> (seen on the real image).
    for table in ("global_priv", "proxies_priv"):
        assert (
            f"DELETE FROM mysql.{table} WHERE User = 'root' AND Host NOT IN ('localhost', "
            "'localhost');" in sql
        )
    assert "ALTER USER 'katib'@'%' IDENTIFIED BY 's3cret';" in sql
    grants = re.findall(r"GRANT .*", sql)
    assert grants == [
        "GRANT ALL PRIVILEGES ON `katib`.* TO 'katib'@'%';",
        "GRANT ALL PRIVILEGES ON `metadb`.* TO 'katib'@'%';",
    ]
    assert sql.rstrip().endswith("FLUSH PRIVILEGES;")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"MYSQL_ALLOW_EMPTY_PASSWORD": "true"}, "MYSQL_ALLOW_EMPTY_PASSWORD is set", id="empty"
        ),
        pytest.param({}, "MYSQL_ROOT_PASSWORD is not set", id="no-root-password"),
        pytest.param(
            {"MYSQL_ROOT_PASSWORD": "x", "MYSQL_USER": "root", "MYSQL_PASSWORD": "y"},
            "MYSQL_USER must not be root",
            id="user-root",
        ),
        pytest.param(
            {"MYSQL_ROOT_PASSWORD": "x", "MYSQL_USER": "kfp"},
            "MYSQL_USER is set without MYSQL_PASSWORD",
            id="user-no-password",
        ),
    ],
)
def test_the_database_image_refuses_an_account_without_a_password(
    env: dict[str, str], message: str, tmp_path: Path
) -> None:
    code, _, err = start_sql(tmp_path, env)
    assert code != 0
    assert message in err


# --- the user path (manifests/) over upstream's objects --------------------------------------


def _kfp_objects(*paths: str) -> list[dict[str, Any]]:
    tarball = (
        ROOT.parent
        / "shared"
        / "src"
        / f"kubeflow-pipelines-{VERSIONS['KFP_VERSION']}-backend.tar.gz"
    )
    if not tarball.exists():
        pytest.skip(f"KFP's source tarball is not here ({tarball})")
    out = []
    with tarfile.open(tarball) as tar:
        for path in paths:
            member = tar.extractfile(f"kubeflow-pipelines-{VERSIONS['KFP_VERSION']}/{path}")
            assert member is not None, path
            out += [d for d in yaml.safe_load_all(member.read().decode()) if d]
    return out


KATIB_PATCHED = (
    "manifests/v1beta1/components/mysql/mysql.yaml",
    "manifests/v1beta1/components/db-manager/db-manager.yaml",
    # (patched so that the pod mutator leaves KFP's run pods and Katib's own alone)
    "manifests/v1beta1/components/webhook/webhooks.yaml",
)
"""The upstream files whose objects manifests/katib patches."""


def _katib_objects(*paths: str) -> list[dict[str, Any]]:
    gomodcache = Path(os.environ.get("GOMODCACHE", Path.home() / "go" / "pkg" / "mod"))
    src = gomodcache / "github.com" / "kubeflow" / f"katib@v{VERSIONS['KATIB_VERSION']}"
    if not src.is_dir():
        pytest.skip(f"Katib's Go module download is not here ({src})")
    return [d for p in paths for d in yaml.safe_load_all((src / p).read_text()) if d]


def _user_path(folder: str, upstream: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    """Upstream's objects as manifests/FOLDER changes them (its deletions and JSON patches),
    with its own objects, by (kind, name)."""
    rendered = render(ROOT / "manifests" / folder)
    objects = {(o["kind"], o["metadata"]["name"]): o for o in upstream}
    for key in rendered.deleted:
        objects.pop(key, None)
    for kind, name, ops in rendered.json_patches:
        assert (kind, name) in objects, f"manifests/{folder} patches {kind}/{name}, not upstream's"
        objects[(kind, name)] = json_patch(objects[(kind, name)], ops)
    objects.update({(o["kind"], o["metadata"]["name"]): o for o in rendered.objects})
    return objects


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _secret_keys(obj: dict[str, Any]) -> set[tuple[str, str]]:
    """(Secret, key) of every secretKeyRef in ``obj``."""
    text = json.dumps(obj)
    return set(
        re.findall(r'"secretKeyRef": \{"name": "([^"]+)", "key": "([^"]+)"', text)
        + [
            (n, k)
            for k, n in re.findall(r'"secretKeyRef": \{"key": "([^"]+)", "name": "([^"]+)"', text)
        ]
    )


def _generated_keys() -> set[tuple[str, str]]:
    return {(SECRETS[kind], key) for kind in SECRETS for key in new(kind)}


KFP_PATCHED = (
    "manifests/kustomize/third-party/seaweedfs/base/seaweedfs/mlpipeline-minio-artifact-secret.yaml",
    "manifests/kustomize/base/installs/generic/mysql-secret.yaml",
    "manifests/kustomize/third-party/mysql/base/mysql-deployment.yaml",
    "manifests/kustomize/base/pipeline/ml-pipeline-apiserver-deployment.yaml",
    "manifests/kustomize/base/metadata/base/metadata-grpc-deployment.yaml",
    "manifests/kustomize/third-party/seaweedfs/base/seaweedfs/seaweedfs-deployment.yaml",
    # (patched for Argo's requeue time, not for a credential)
    "manifests/kustomize/third-party/argo/base/workflow-controller-deployment-patch.yaml",
    # (trimmed: test_the_run_pods_account_reads_no_secret_but_the_stores)
    "manifests/kustomize/base/pipeline/pipeline-runner-role.yaml",
)
"""The upstream files whose objects manifests/kfp/platform-agnostic deletes or patches."""


def test_the_run_pods_account_reads_no_secret_but_the_stores() -> None:
    """Issue 60, item 1: upstream's pipeline-runner Role (every run pod's account) grants `get` on
    every Secret, `pods/exec`, Deployments and Services `*` and `kubeflow.org/*: *`; RBAC adds
    up, so manifests/rbac's narrow Role changed nothing. The user path trims it."""
    upstream = _kfp_objects(*KFP_PATCHED)
    (role,) = [o for o in upstream if o["kind"] == "Role"]
    before = role["rules"]
    assert any("secrets" in r["resources"] and "resourceNames" not in r for r in before)
    rules = _user_path("kfp/platform-agnostic", upstream)[("Role", "pipeline-runner")]["rules"]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "pods/exec" not in rule["resources"], rule
        assert not {"deployments", "services", "replicasets"} & set(rule["resources"]), rule
        assert rule["apiGroups"] != ["kubeflow.org"], rule
    (secrets,) = [r for r in rules if "secrets" in r["resources"]]
    assert secrets == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["mlpipeline-minio-artifact"],
        "verbs": ["get"],
    }


def test_kfp_user_path_keeps_no_upstream_credential() -> None:
    upstream = _kfp_objects(*KFP_PATCHED)
    assert {"minio123", ""} <= {
        v for o in upstream if o["kind"] == "Secret" for v in o["stringData"].values()
    }, "upstream's defaults moved: this test reads the wrong files"
    objects = _user_path("kfp/platform-agnostic", upstream)
    assert [k for k in objects if k[0] == "Secret"] == []
    env = _env(objects[("Deployment", "mysql")])
    assert "MYSQL_ALLOW_EMPTY_PASSWORD" not in env
    assert env["MYSQL_ROOT_HOST"] == "localhost"  # no root@'%'
    assert env["MYSQL_ROOT_PASSWORD"] == {
        "secretKeyRef": {"name": "mysql-secret", "key": "root-password"}
    }
    assert env["MYSQL_USER"] == {"secretKeyRef": {"name": "mysql-secret", "key": "username"}}
    # ML Metadata's database is granted to the same account, by the name the generator gives it.
    grants = objects[("ConfigMap", "mysql-kfp-grants")]["data"]["kfp-grants.sql"]
    assert f"TO '{ACCOUNTS['kfp-db'][1]}'@'%';" in grants
    assert all(line.endswith(";") for line in grants.splitlines()), "one statement a line"
    # Every key a Deployment reads from these Secrets is one the generator makes.
    read = {ref for o in objects.values() for ref in _secret_keys(o)}
    assert read >= {("mysql-secret", "password"), ("mlpipeline-minio-artifact", "secretkey")}
    assert read <= _generated_keys(), read - _generated_keys()


def test_katib_user_path_keeps_no_upstream_credential() -> None:
    upstream = _katib_objects("manifests/v1beta1/components/mysql/secret.yaml", *KATIB_PATCHED)
    objects = _user_path("katib", upstream)
    assert ("Secret", "katib-mysql-secrets") not in objects
    mysql = _env(objects[("Deployment", "katib-mysql")])
    assert "MYSQL_ALLOW_EMPTY_PASSWORD" not in mysql
    assert mysql["MYSQL_ROOT_HOST"] == "localhost"
    assert mysql["MYSQL_DATABASE"] == "katib"
    manager = _env(objects[("Deployment", "katib-db-manager")])
    # The DB manager logs in as the account, not as root.
    assert manager["DB_USER"] == {"secretKeyRef": {"name": "katib-mysql-secrets", "key": "DB_USER"}}
    assert manager["DB_PASSWORD"] == mysql["MYSQL_PASSWORD"]
    read = {ref for o in objects.values() for ref in _secret_keys(o)}
    assert read <= _generated_keys(), read - _generated_keys()


# --- who makes the Secrets, and when ---------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "kinds", "before"),
    [
        pytest.param(
            "object-store.sh", "object-store", 'apply_k "$PIECE" "$dir"', id="object-store"
        ),
        pytest.param(
            "kfp.sh", "object-store kfp-db", 'apply_k "$PIECE" "${dir}/install"', id="kfp"
        ),
        pytest.param("katib.sh", "katib-db", 'apply_overlay "$PIECE"', id="katib"),
    ],
)
def test_each_addon_makes_its_secrets_before_what_reads_them(
    script: str, kinds: str, before: str
) -> None:
    text = (ADDONS / script).read_text()
    install = text[text.index("addon_install() {") :]
    made = install.index(f'ensure_credentials "$PIECE" {kinds}\n')
    assert made < install.index(before)
    assert f'check_credentials "$PIECE" {kinds}\n' in text[text.index("addon_verify() {") :]


def test_the_object_store_addon_leaves_out_upstreams_secret() -> None:
    text = (ADDONS / "object-store.sh").read_text()
    assert re.search(r"\\\$patch: delete\n\s+apiVersion: v1\n\s+kind: Secret\n\s+metadata: "
                     r"\{name: mlpipeline-minio-artifact\}", text)  # fmt: skip


def test_kind_up_makes_the_secrets_before_kfp_and_katib() -> None:
    text = (ROOT / "hack" / "kind-up.sh").read_text()
    made = text.index("hack/credentials.sh ensure object-store kfp-db katib-db")
    assert made < text.index("kubectl apply -k manifests/kfp/platform-agnostic")
    assert made < text.index("-k manifests/katib")
    assert text.index("kubectl apply -k manifests/kfp/cluster-scoped-resources") < made


def _pod_labels(objects: dict[tuple[str, str], Any], deployment: str) -> dict[str, str]:
    return dict(objects[("Deployment", deployment)]["spec"]["template"]["metadata"]["labels"])


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"podSelector"}, f"only same-namespace pod selectors: {selector}"
    return label_selects(selector["podSelector"], labels)


@pytest.mark.parametrize(
    ("folder", "policy", "database", "servers", "others"),
    [
        (
            "kfp/platform-agnostic",
            "mysql",
            "mysql",
            ["ml-pipeline", "metadata-grpc-deployment"],
            ["ml-pipeline-persistenceagent", "ml-pipeline-scheduledworkflow", "seaweedfs"],
        ),
        ("katib", "katib-mysql", "katib-mysql", ["katib-db-manager"], ["katib-controller"]),
    ],
)
def test_each_database_admits_its_own_servers_only(
    folder: str, policy: str, database: str, servers: list[str], others: list[str]
) -> None:
    """The databases' NetworkPolicies select upstream's pods by the labels upstream gives them:
    the database itself, the servers that log in to it, and no other pod of the install (a run's
    step pod has KFP's run label and none of these)."""
    if folder == "katib":
        upstream = _katib_objects(
            *KATIB_PATCHED, "manifests/v1beta1/components/controller/controller.yaml"
        )
    else:
        upstream = _kfp_objects(
            "manifests/kustomize/base/pipeline/pipeline-runner-role.yaml",
            "manifests/kustomize/third-party/mysql/base/mysql-deployment.yaml",
            "manifests/kustomize/base/pipeline/ml-pipeline-apiserver-deployment.yaml",
            "manifests/kustomize/base/metadata/base/metadata-grpc-deployment.yaml",
            "manifests/kustomize/base/pipeline/ml-pipeline-persistenceagent-deployment.yaml",
            "manifests/kustomize/base/pipeline/ml-pipeline-scheduledworkflow-deployment.yaml",
            "manifests/kustomize/third-party/seaweedfs/base/seaweedfs/seaweedfs-deployment.yaml",
            "manifests/kustomize/third-party/argo/base/workflow-controller-deployment-patch.yaml",
        )
    objects = _user_path(folder, upstream)
    spec = objects[("NetworkPolicy", policy)]["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"]["matchLabels"].items() <= _pod_labels(objects, database).items()
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": 3306}]
    for name in servers:
        assert any(_selects(s, _pod_labels(objects, name)) for s in rule["from"]), name
    for name in [*others, database]:
        assert not any(_selects(s, _pod_labels(objects, name)) for s in rule["from"]), name
    step = {"pipelines.kubeflow.org/v2_component": "true"}
    assert not any(_selects(s, step) for s in rule["from"])
