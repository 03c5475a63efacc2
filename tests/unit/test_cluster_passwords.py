"""No database password on a command line (issue 60, item 10): every local user of a node reads
every process's arguments in /proc/*/cmdline.

ML Metadata's server took its password as ``--mysql_config_password=$(DBCONFIG_PASSWORD)``
(Kubernetes expands it into the argument); manifests/kfp writes the server's config file from
the Secret in an init container instead, whose script runs here under dash and busybox with
every command it starts logged. Katib's MySQL probes ran ``mysqladmin ping -u root
-p${MYSQL_ROOT_PASSWORD}`` every 5 s; manifests/katib hands the password over in MYSQL_PWD.
The user path is rendered over upstream's objects (KFP's source tarball, Katib's Go module
download: skipped, naming them, where absent). The live processes are read on the cluster
(tests/cluster/test_credentials.py).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_cluster_credentials import (
    KATIB_PATCHED,
    KFP_PATCHED,
    _katib_objects,
    _kfp_objects,
    _user_path,
)

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = 'p@ss "quoted" \\back\\ $(id) `id` ${HOME} word'


def _deployments() -> dict[str, dict[str, Any]]:
    """The user path's Deployments of KFP and Katib, by name."""
    kfp = _user_path("kfp/platform-agnostic", _kfp_objects(*KFP_PATCHED))
    katib = _user_path(
        "katib",
        _katib_objects(*KATIB_PATCHED),
    )
    return {name: obj for (kind, name), obj in {**kfp, **katib}.items() if kind == "Deployment"}


def _containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    spec = deployment["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def _secret_vars(container: dict[str, Any]) -> set[str]:
    return {e["name"] for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}


def test_no_secret_is_expanded_into_a_containers_arguments() -> None:
    """Kubernetes expands ``$(NAME)`` in command and args before the process starts."""
    seen = 0
    for name, deployment in _deployments().items():
        for c in _containers(deployment):
            words = " ".join(c.get("command", []) + c.get("args", []))
            for var in _secret_vars(c):
                seen += 1
                assert f"$({var})" not in words, (
                    f"{name}/{c['name']} puts {var} on its command line"
                )
    assert seen >= 5, "no Secret-fed variable found: did the rendering change?"


def test_ml_metadata_reads_its_password_from_a_file_not_its_arguments() -> None:
    deployment = _deployments()["metadata-grpc-deployment"]
    spec = deployment["spec"]["template"]["spec"]
    (server,) = spec["containers"]
    assert "--metadata_store_server_config_file=/etc/mlmd/server.pbtxt" in server["args"]
    assert not [a for a in server["args"] if a.startswith("--mysql_config_")], server["args"]
    assert not _secret_vars(server), "the server's environment holds the password"
    (mount,) = server["volumeMounts"]
    assert mount == {"name": "mlmd-config", "mountPath": "/etc/mlmd", "readOnly": True}
    (volume,) = [v for v in spec["volumes"] if v["name"] == "mlmd-config"]
    assert volume["emptyDir"]["medium"] == "Memory"
    writer = _containers(deployment)[-2]
    assert writer["name"] == "write-config" and _secret_vars(writer) == {
        "DBCONFIG_USER",
        "DBCONFIG_PASSWORD",
    }
    assert writer["securityContext"]["runAsUser"] == server["securityContext"]["runAsUser"]


def test_katibs_database_probes_take_the_password_from_the_environment() -> None:
    (mysql,) = _deployments()["katib-mysql"]["spec"]["template"]["spec"]["containers"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        command = " ".join(mysql[probe]["exec"]["command"])
        assert "-p$" not in command and "-p${" not in command, (probe, command)
        assert 'MYSQL_PWD="${MYSQL_ROOT_PASSWORD}"' in command, (probe, command)


def _writer_script() -> str:
    deployment = _deployments()["metadata-grpc-deployment"]
    (writer,) = [c for c in _containers(deployment) if c["name"] == "write-config"]
    assert writer["command"] == ["/bin/sh", "-ec"]
    (script,) = writer["args"]
    return str(script)


def _unquote(text: str) -> str:
    """A text proto string's value (backslash escapes)."""
    return re.sub(r"\\(.)", r"\1", text)


SHELLS = [s for s in ("dash", "busybox") if shutil.which(s)]


@pytest.fixture(params=SHELLS or ["none"])
def shell(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "none":
        pytest.skip("neither dash nor busybox is here to run the init container's script")
    return ["dash"] if request.param == "dash" else ["busybox", "sh"]


def _run_writer(tmp_path: Path, shell: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run the init container's script with every command it starts logged (a wrapper for each
    on PATH); return its exit code, output and the commands' argument lines."""
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.log"
    bin_dir.mkdir()
    for tool in ("sed", "cat", "printf"):  # what the script may start (echo is built in)
        real = shutil.which(tool)
        if real is None:
            continue
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\necho "{tool} $*" >>"{log}"\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    out = subprocess.run(
        [*shell, "-ec", _writer_script()],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return out.returncode, out.stdout + out.stderr, log.read_text() if log.exists() else ""


def test_the_init_container_writes_the_config_owner_only_and_no_command_sees_the_password(
    tmp_path: Path, shell: list[str]
) -> None:
    config = tmp_path / "server.pbtxt"
    env = {
        "MLMD_CONFIG": str(config),
        "DBCONFIG_USER": "kfp",
        "DBCONFIG_PASSWORD": PASSWORD,
        "MYSQL_DATABASE": "metadb",
        "MYSQL_HOST": "mysql",
        "MYSQL_PORT": "3306",
    }
    code, output, argv = _run_writer(tmp_path, shell, env)
    assert code == 0, output
    if shell == ["dash"]:  # (this busybox runs its applets in the shell's process, no exec)
        assert "cat" in argv and "sed" in argv, "the wrappers saw no command: is PATH used?"
    assert PASSWORD not in argv and "quoted" not in argv, argv
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    text = config.read_text()
    fields = dict(re.findall(r'^\s*(\w+): "((?:[^"\\]|\\.)*)"$', text, re.M))
    assert {k: _unquote(v) for k, v in fields.items()} == {
        "host": "mysql",
        "database": "metadb",
        "user": "kfp",
        "password": PASSWORD,
    }
    assert re.search(r"^\s*port: 3306$", text, re.M)
    assert "migration_options { enable_upgrade_migration: true }" in text


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DBCONFIG_PASSWORD", "two\nlines", "holds a line break"),
        ("MYSQL_PORT", "3306; rm", "mysqlPort is not a number"),
    ],
    ids=["line-break", "port"],
)
def test_the_init_container_refuses_what_it_cannot_write(
    tmp_path: Path, shell: list[str], name: str, value: str, message: str
) -> None:
    env = {
        "MLMD_CONFIG": str(tmp_path / "server.pbtxt"),
        "DBCONFIG_USER": "kfp",
        "DBCONFIG_PASSWORD": "x",
        "MYSQL_DATABASE": "metadb",
        "MYSQL_HOST": "mysql",
        "MYSQL_PORT": "3306",
        name: value,
    }
    code, output, _ = _run_writer(tmp_path, shell, env)
    assert code == 1 and message in output, output
    assert not (tmp_path / "server.pbtxt").exists()


def test_the_test_clusters_server_reads_the_config_file(tmp_path: Path) -> None:
    """hack/cluster/addons/images/kfp/mlmd_server.py takes upstream's flag (ml-metadata needs
    protobuf < 5: skipped where it is not importable)."""
    pytest.importorskip("ml_metadata")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mlmd_server", ROOT / "hack/cluster/addons/images/kfp/mlmd_server.py"
    )
    assert spec and spec.loader
    server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server)
    config = tmp_path / "server.pbtxt"
    quoted = PASSWORD.replace("\\", "\\\\").replace('"', '\\"')
    config.write_text(
        'connection_config { mysql { host: "mysql" port: 3306 database: "metadb" '
        f'user: "kfp" password: "{quoted}" }} }}\n'
        "migration_options { enable_upgrade_migration: true }\n"
    )
    args = server.parse_args([f"--metadata_store_server_config_file={config}"])
    cfg = server.connection_config(args)
    assert (cfg.mysql.host, cfg.mysql.port, cfg.mysql.password) == ("mysql", 3306, PASSWORD)
    assert os.environ.get("DBCONFIG_PASSWORD") is None
