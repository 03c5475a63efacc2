"""The cluster's own credentials (hack/credentials.sh), live: the object store's keys and the
databases' accounts are generated for this cluster (no minio/minio123, no empty root password,
no "test", no root@'%'), and the services work with them.

Each part skips, naming it, where its add-on is not installed. The databases are asked from
inside their own pods (``kubectl exec``; the passwords stay in the pod's environment, passed to
the client as MYSQL_PWD, never as an argument).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from typing import Any

import boto3
import botocore
import pytest
from botocore.config import Config

from tests.cluster import kube

NS = "kubeflow"
SCRIPT = kube.ROOT / "hack" / "credentials.sh"


ADDON_OF = {
    "seaweedfs": "object-store",
    "mysql": "kfp",
    "ml-pipeline": "kfp",
    "metadata-grpc-deployment": "kfp",
    "katib-mysql": "katib",
    "katib-db-manager": "katib",
}
"""The add-on that installs each Deployment these tests read."""


def need(deployment: str) -> None:
    present = kube.kubectl("-n", NS, "get", "deployment", deployment, check=False).returncode == 0
    kube.need_addon(ADDON_OF[deployment], present, f"Deployment {NS}/{deployment}")


def in_pod(deployment: str, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` in the Deployment's pod (its environment: the Secret's values)."""
    return kube.kubectl(
        "exec", "-n", NS, f"deploy/{deployment}", "--", "sh", "-c", script, check=check
    )


@pytest.mark.parametrize(
    ("kind", "deployment"),
    [
        pytest.param("object-store", "seaweedfs", id="object-store"),
        pytest.param("kfp-db", "mysql", id="kfp-db"),
        pytest.param("katib-db", "katib-mysql", id="katib-db"),
    ],
)
def test_the_secret_holds_values_generated_for_this_cluster(kind: str, deployment: str) -> None:
    need(deployment)
    out = subprocess.run(
        [str(SCRIPT), "check", kind],
        env={**os.environ, "KUBECTL": str(kube.KUBECTL), "KUBECONFIG": str(kube.KUBECONFIG)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr


# --- the object store ------------------------------------------------------------------------


def s3(access: str | None, secret: str | None) -> Any:
    config = Config(signature_version=botocore.UNSIGNED) if access is None else None
    return boto3.client(
        "s3",
        endpoint_url=f"http://{kube.service_address(NS, 'seaweedfs', 9000)}",
        region_name="us-east-1",
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        config=config,
    )


def test_the_object_store_takes_the_generated_keys_only() -> None:
    need("seaweedfs")
    access = kube.secret_value(NS, kube.STORE_SECRET, "accesskey")
    secret = kube.secret_value(NS, kube.STORE_SECRET, "secretkey")
    assert (access, secret) != ("minio", "minio123")
    key = f"gpupipe-credentials/{uuid.uuid4().hex}.txt"
    for name, client in [
        ("unsigned", s3(None, None)),
        ("upstream's minio/minio123", s3("minio", "minio123")),
        ("the right key with a wrong secret", s3(access, "minio123")),
    ]:
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            client.put_object(Bucket=kube.BUCKET, Key=key, Body=b"x")
        assert refused.value.response["Error"]["Code"] in {
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
        }, (name, refused.value.response)
    good = s3(access, secret)
    good.put_object(Bucket=kube.BUCKET, Key=key, Body=b"generated\n")
    assert good.get_object(Bucket=kube.BUCKET, Key=key)["Body"].read() == b"generated\n"
    good.delete_object(Bucket=kube.BUCKET, Key=key)


def test_the_store_identity_holds_the_secrets_key_and_no_other() -> None:
    need("seaweedfs")
    out = in_pod("seaweedfs", "echo s3.configure | /usr/bin/weed shell").stdout
    keys = re.findall(r'"accessKey":\s*"([^"]*)"', out)
    assert keys == [kube.secret_value(NS, kube.STORE_SECRET, "accesskey")], keys


def test_kfp_and_the_steps_read_the_generated_store_secret() -> None:
    need("ml-pipeline")
    spec = kube.get_json("deployment", "-n", NS, "ml-pipeline")["spec"]["template"]["spec"]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for c in spec["containers"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs["OBJECTSTORECONFIG_SECRETACCESSKEY"] == {
        "name": kube.STORE_SECRET,
        "key": "secretkey",
    }
    # The API server started with them: it answers (it checks the store and the database at start).
    # Through a port-forward, as a user reaches it (the Kubernetes API server's service proxy is
    # refused by upstream's NetworkPolicy when the pod is on another node: hack/cluster/addons/
    # kfp.sh's api_get).
    import urllib.request

    from tests.cluster.kfp import port_forward

    with port_forward("ml-pipeline", 8888) as url:
        healthz = urllib.request.urlopen(f"{url}/apis/v2beta1/healthz", timeout=30).read().decode()
    assert '"multi_user":false' in healthz


# --- the databases ---------------------------------------------------------------------------

DATABASES = [
    # deployment, Service, the account's databases, a table its service made there
    pytest.param("mysql", "mysql", {"mlpipeline": "pipelines", "metadb": "Artifact"}, id="kfp"),
    pytest.param("katib-mysql", "katib-mysql", {"katib": "observation_logs"}, id="katib"),
]


def sql(deployment: str, query: str, who: str = "root", host: str = "", db: str = "") -> str:
    """``query``'s rows, as root over the pod's socket or as the account (``who="account"``)."""
    login = (
        'MYSQL_PWD="$MYSQL_ROOT_PASSWORD" mariadb -uroot'
        if who == "root"
        else 'MYSQL_PWD="$MYSQL_PASSWORD" mariadb --user="$MYSQL_USER"'
    )
    where = f" -h {host}" if host else ""
    return in_pod(deployment, f'{login}{where} -N -B {db} -e "{query}"').stdout


@pytest.mark.parametrize(("deployment", "service", "databases"), DATABASES)
def test_root_has_no_remote_login_and_no_empty_password(
    deployment: str, service: str, databases: dict[str, str]
) -> None:
    need(deployment)
    accounts = set(sql(deployment, "SELECT CONCAT(user, '@', host) FROM mysql.user").split())
    user = in_pod(deployment, 'printf %s "$MYSQL_USER"').stdout
    assert user and user != "root"
    remote = {a for a in accounts if not a.endswith("@localhost")}
    assert remote == {f"{user}@%"}, accounts  # no root@'%'
    # Over the network root is refused, with its password and without one.
    for login in (
        'MYSQL_PWD="$MYSQL_ROOT_PASSWORD" mariadb -uroot',
        "env -u MYSQL_PWD mariadb -uroot",
    ):
        out = in_pod(deployment, f"{login} -h {service}.{NS} -e 'SELECT 1'", check=False)
        assert out.returncode != 0, (login, out.stdout)
        assert re.search(r"Access denied|is not allowed to connect", out.stderr), (
            login,
            out.stderr,
        )


@pytest.mark.parametrize(("deployment", "service", "databases"), DATABASES)
def test_the_account_reaches_its_databases_only(
    deployment: str, service: str, databases: dict[str, str]
) -> None:
    need(deployment)
    host = f"{service}.{NS}"
    grants = sql(deployment, "SHOW GRANTS FOR CURRENT_USER()", who="account", host=host)
    granted = {line.split(" ON ")[1].split(" TO ")[0] for line in grants.splitlines()}
    assert granted == {"*.*"} | {f"`{db}`.*" for db in databases}, grants
    assert "GRANT USAGE ON *.*" in grants  # *.*: no privilege beyond logging in
    # The services made their tables with it (Katib's DB manager makes its own once it has
    # connected, which can come a little after cluster-up: seen with this test run first).
    for db, table in databases.items():
        kube.wait_until(
            f"{db}'s table {table}",
            lambda db=db, table=table: (
                table in sql(deployment, "SHOW TABLES", who="account", host=host, db=db).split()
            ),
            180,
            5,
        )
    refused = in_pod(
        deployment,
        f'MYSQL_PWD="$MYSQL_PASSWORD" mariadb --user="$MYSQL_USER" -h {host} '
        '-e "SELECT user FROM mysql.user"',
        check=False,
    )
    assert refused.returncode != 0 and "denied" in refused.stderr, refused.stderr


def test_katibs_db_manager_logs_in_as_the_account() -> None:
    need("katib-db-manager")
    spec = kube.get_json("deployment", "-n", NS, "katib-db-manager")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("valueFrom", e.get("value")) for e in spec["containers"][0]["env"]}
    assert env["DB_USER"] == {"secretKeyRef": {"name": "katib-mysql-secrets", "key": "DB_USER"}}
    assert env["DB_PASSWORD"] == {
        "secretKeyRef": {"name": "katib-mysql-secrets", "key": "DB_PASSWORD"}
    }
    kube.kubectl("-n", NS, "rollout", "status", "deployment/katib-db-manager", "--timeout=60s")


def _command_lines() -> dict[int, bytes]:
    """Every process's arguments on this node (the cluster's pods run here), by pid."""
    lines = {}
    for proc in os.listdir("/proc"):
        if proc.isdigit():
            try:
                with open(f"/proc/{proc}/cmdline", "rb") as f:
                    lines[int(proc)] = f.read()
            except OSError:
                continue  # gone, or not ours to read
    return lines


@pytest.mark.parametrize(
    ("secret", "keys", "deployment"),
    [
        pytest.param("mysql-secret", ("password", "root-password"), "metadata-grpc-deployment",
                     id="kfp-db"),
        pytest.param("katib-mysql-secrets", ("MYSQL_ROOT_PASSWORD", "DB_PASSWORD"), "katib-mysql",
                     id="katib-db"),
    ],
)  # fmt: skip
def test_no_process_on_the_node_has_a_database_password_in_its_arguments(
    secret: str, keys: tuple[str, ...], deployment: str
) -> None:
    """Issue 60, item 10: ML Metadata's server ran with --mysql_config_password=<password> and
    Katib's database probes with -p<root password> every 5 s; any local user reads either in
    /proc/*/cmdline. Read for 20 s (four probe periods), every process each second."""
    need(deployment)
    passwords = {kube.secret_value(NS, secret, key).encode() for key in keys}
    assert all(len(p) >= 8 for p in passwords), "the Secret holds no generated password"
    seen = 0
    for _ in range(20):
        for pid, line in _command_lines().items():
            seen += 1
            leaked = [p for p in passwords if p in line]
            assert not leaked, f"pid {pid} has {secret}'s password in its arguments: " + (
                line.split(b"\0")[0].decode(errors="replace")
            )
        time.sleep(1)
    assert seen > 100, "too few processes read: is this the cluster's node?"
