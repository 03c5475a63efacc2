"""``gpupipe run --local`` with bad input, as a new user or an attacker would try it.

Every case asserts what a person sees: the exit code, the one ``ERROR [...] E_...`` line that
ends stderr, the ``--json`` line, and that nothing outside the run's own folder changed (the
user's data, working directory and any folder passed as ``--root``).

Cases rejected before any step runs are driven through the CLI's ``main`` in this process (the
console script is ``sys.exit(main())``), a few of them also through the real ``gpupipe``
process; failures inside a step are real kfp.local runs.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from pipelines.cli import main

pytestmark = pytest.mark.integration

GPUPIPE = Path(sys.executable).with_name("gpupipe")
RUN_TIMEOUT_S = 300


def snapshot(folder: Path, skip: Path | None = None) -> dict[str, tuple[int, str]]:
    """Every file and folder under ``folder`` (except ``skip``) with its size and content hash."""
    out: dict[str, tuple[int, str]] = {}
    for path in sorted(folder.rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        if path.is_file():
            out[str(path.relative_to(folder))] = (
                path.stat().st_size,
                hashlib.sha256(path.read_bytes()).hexdigest(),
            )
        else:
            out[str(path.relative_to(folder)) + "/"] = (0, "")
    return out


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def last_error(self) -> str:
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        assert lines, "nothing on stderr"
        return lines[-1]

    @property
    def json(self) -> dict[str, Any]:
        lines = self.stdout.strip().splitlines()
        assert lines, f"no stdout; stderr:\n{self.stderr[-3000:]}"
        return json.loads(lines[-1])


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A user's folder: a good table, a CSV, some unrelated files of their own."""
    ws = tmp_path / "ws"
    ws.mkdir()
    df = pd.DataFrame({"x1": [float(i % 7) for i in range(60)], "x2": list(range(60))})
    df["y"] = [i % 2 for i in range(60)]
    df.to_parquet(ws / "table.parquet")
    df.to_csv(ws / "table.csv", index=False)
    (ws / "notes.txt").write_text("my own notes\n")
    (ws / "empty-dir").mkdir()
    (ws / "not-parquet.parquet").write_text("this is not parquet")
    foreign = ws / "foreign-root"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("do not touch\n")
    with sqlite3.connect(foreign / "mlflow.db") as db:  # someone else's database
        db.execute("CREATE TABLE users (name TEXT)")
        db.execute("INSERT INTO users VALUES ('alice')")
    with sqlite3.connect(ws / "app.db") as db:
        db.execute("CREATE TABLE orders (id INTEGER)")
    (ws / "root-is-a-file").write_text("a file\n")
    return ws


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_in_process(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Outcome:
    code = main(argv)
    out, err = capsys.readouterr()
    return Outcome(code, out, err)


def run_process(
    argv: list[str], cwd: Path, timeout: float = RUN_TIMEOUT_S, **extra_env: str
) -> Outcome:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra_env)
    proc = subprocess.run(
        [str(GPUPIPE), *argv], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


# (id, extra argv (with {ws} and {port} filled in), code, text the error line must contain)
REJECTED = [
    ("epochs-not-int", ["--param", "epochs=abc"], "E_PARAM", "parameter epochs must be an integer"),
    ("epochs-negative", ["--param", "epochs=-1"], "E_PARAM", "epochs must be >= 0 (0: chosen"),
    ("lr-zero", ["--param", "learning_rate=0"], "E_PARAM", "(learning_rate)"),
    ("lr-text", ["--param", "learning_rate=fast"], "E_PARAM", "learning_rate must be a float"),
    ("batch-negative", ["--param", "batch_size=-8"], "E_PARAM", "(batch_size)"),
    ("nodes-zero", ["--param", "nodes=0"], "E_PARAM", "(nodes)"),
    ("unknown-param", ["--param", "epochz=3"], "E_PARAM", "unknown pipeline parameter 'epochz'"),
    ("no-equals", ["--param", "epochs"], "E_PARAM", "must look like name=value"),
    ("twice", ["--param", "epochs=2", "--param", "epochs=3"], "E_PARAM", "given twice"),
    (
        "hyperparams-not-json",
        ["--param", "hyperparams_json={optim.lr: 1}"],
        "E_PARAM",
        "hyperparams_json must be a JSON object",
    ),
    (
        "hyperparams-bad-value",
        ["--param", 'hyperparams_json={"optim.weight_decay": -1}'],
        "E_PARAM",
        "hyperparams_json: optim.weight_decay must be >= 0",
    ),
    (
        "hyperparams-unknown-key",
        ["--param", 'hyperparams_json={"optim.nope": 1}'],
        "E_PARAM",
        "hyperparams_json: unknown config key optim.nope",
    ),
    (
        "train-config-bad",
        ["--param", 'train_config_json={"timeout_s": -5}'],
        "E_PARAM",
        "train_config_json",
    ),
    (
        "tune-space-bad",
        ["--param", 'tune_space_json={"parameters": []}'],
        "E_PARAM",
        "tune_space_json",
    ),
    ("gate-metric", ["--param", "gate_metric=speed"], "E_PARAM", "gate_metric must be one of"),
    (
        "model-name",
        ["--param", "registered_model_name=a/b"],
        "E_PARAM",
        "registered_model_name must not contain",
    ),
    ("launcher", ["--param", "launcher=k8s"], "E_PARAM", "launcher must be one of"),
    ("task", ["--param", "task=clustering"], "E_PARAM", "task must be one of"),
    (
        "node-selector",
        ["--param", "gpu_node_selector=[1]"],
        "E_PARAM",
        "gpu_node_selector must be a JSON object",
    ),
    ("data-missing", ["--data", "{ws}/nope.parquet", "--target", "y"], "E_DATA", "nope.parquet"),
    (
        "data-empty-dir",
        ["--data", "{ws}/empty-dir", "--target", "y"],
        "E_DATA",
        "holds no data files",
    ),
    (
        "data-not-parquet",
        ["--data", "{ws}/not-parquet.parquet", "--target", "y"],
        "E_DATA",
        "not-parquet.parquet",
    ),
    (
        "target-missing",
        ["--data", "{ws}/table.parquet", "--target", "label"],
        "E_TARGET",
        "target column 'label' is not in the data (columns: x1, x2, y",
    ),
    ("target-missing-csv", ["--data", "{ws}/table.csv", "--target", "z"], "E_TARGET", "'z'"),
    ("data-without-target", ["--data", "{ws}/table.parquet"], "E_PARAM", "--target is required"),
    (
        "registry-refused",
        ["--param", "registry_uri=http://127.0.0.1:{port}"],
        "E_REGISTRY",
        "does not answer",
    ),
    (
        "registry-secret",
        ["--param", "registry_uri=http://alice:hunter2@127.0.0.1:{port}/"],
        "E_REGISTRY",
        "http://alice:***@127.0.0.1",
    ),
    (
        "registry-foreign-sqlite",
        ["--param", "registry_uri=sqlite:///{ws}/app.db"],
        "E_REGISTRY",
        "did not create",
    ),
    ("registry-not-uri", ["--param", "registry_uri=mlflow-server"], "E_PARAM", "registry_uri"),
]


@pytest.mark.parametrize(
    ("argv", "code", "text"),
    [pytest.param(a, c, t, id=i) for i, a, c, t in REJECTED],
)
def test_bad_input_is_rejected_before_any_step(
    workspace: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: str,
    text: str,
) -> None:
    root = workspace.parent / "root"
    port = closed_port()
    argv = [a.replace("{ws}", str(workspace)).replace("{port}", str(port)) for a in argv]
    before = snapshot(workspace)
    out = run_in_process(capsys, ["run", "--local", "--root", str(root), "--json", *argv])
    assert out.code == 2, out.stderr
    assert out.last_error.startswith(f"ERROR [gpupipe run] {code}: "), out.stderr
    assert text in out.last_error
    assert [ln for ln in out.stderr.splitlines() if ln.startswith("ERROR")] == [out.last_error]
    assert "Traceback" not in out.stderr
    assert "hunter2" not in out.stdout + out.stderr
    assert out.json == {"state": "REJECTED", "error": out.last_error, "exit_code": 2}
    assert snapshot(workspace) == before, "the user's files changed"
    assert not root.exists(), "a refused run created its root"


@pytest.mark.parametrize(
    ("root_of", "text"),
    [
        pytest.param(lambda ws: ws / "root-is-a-file", "must be a folder", id="file"),
        pytest.param(
            lambda ws: ws / "foreign-root",
            "did not create (keep.txt, mlflow.db)",
            id="foreign-folder-with-mlflow-db",
        ),
        pytest.param(lambda ws: ws, "did not create", id="the-working-directory"),
        pytest.param(
            lambda ws: Path("/sys/fs/gpupipe-root"), "not a writable folder", id="read-only"
        ),
    ],
)
def test_root_that_gpupipe_did_not_create_is_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str], root_of: Callable[[Path], Path], text: str
) -> None:
    root = root_of(workspace)
    before = snapshot(workspace)
    out = run_in_process(capsys, ["run", "--local", "--root", str(root), "--param", "epochs=1"])
    assert out.code == 2, out.stderr
    assert out.last_error.startswith("ERROR [gpupipe run] E_ROOT: "), out.stderr
    assert text in out.last_error and str(root) in out.last_error
    assert snapshot(workspace) == before
    with sqlite3.connect(workspace / "foreign-root" / "mlflow.db") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"users"}, "the unrelated mlflow.db was migrated"


def test_rejections_through_the_real_command(workspace: Path) -> None:
    """The console script itself: exit code 2, one line last on stderr, the JSON line."""
    for argv, code in (
        (["--param", 'hyperparams_json={"optim.weight_decay": 0.1}', "--param", "epochs=x"],
         "E_PARAM"),
        (["--data", str(workspace / "table.parquet"), "--target", "nope"], "E_TARGET"),
        (["--root", str(workspace / "foreign-root")], "E_ROOT"),
    ):  # fmt: skip
        if "--root" not in argv:
            argv = ["--root", str(workspace.parent / "root"), *argv]
        out = run_process(["run", "--local", "--json", *argv], cwd=workspace)
        assert out.code == 2, out.stderr
        assert out.last_error.startswith(f"ERROR [gpupipe run] {code}: "), out.stderr
        assert "Traceback" not in out.stderr
        assert out.json["state"] == "REJECTED"


def test_readme_hyperparams_example_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_in_process(
        capsys,
        ["render", "pytorchjob", "--param", 'hyperparams_json={"optim.weight_decay": 0.1}'],
    )
    assert out.code == 0, out.stderr
    assert "optim.weight_decay" not in out.stderr


# --- failures inside a step: real kfp.local runs ----------------------------------------------


def test_data_preprocess_would_reject_is_refused_before_any_step(workspace: Path) -> None:
    # Missing target values: preprocess refuses them, and the pre-step look at the data
    # (trainer/steps/preprocess/preview.py) says so before any step runs or any run folder
    # exists.
    table = workspace / "no-labels.csv"
    table.write_text("a,b,y\n1,2,\n3,4,\n5,6,\n")
    root = workspace.parent / "root"
    before = snapshot(workspace)
    out = run_process(
        ["run", "--local", "--root", str(root), "--json", "--data", str(table), "--target", "y"],
        cwd=workspace,
    )
    assert out.code == 2, out.stderr[-3000:]
    assert out.last_error.startswith("ERROR [gpupipe run] E_TARGET: "), out.stderr[-2000:]
    assert "missing values" in out.last_error and str(table) in out.last_error
    assert out.json == {"state": "REJECTED", "error": out.last_error, "exit_code": 2}
    assert not root.exists(), "a refused run created its root"
    assert snapshot(workspace) == before


class _FailingRegistry(http.server.BaseHTTPRequestHandler):
    """An MLflow server that answers health checks and look-ups but fails every write."""

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.startswith("/health"):
            self._answer(200, {})
        elif "registered-models/get" in self.path:  # evaluate: is there a champion? no
            self._answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no model"})
        else:
            self._answer(503, {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "down"})

    def do_POST(self) -> None:
        self._answer(503, {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "down"})


@pytest.fixture
def failing_registry() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FailingRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://user:s3cret-token@127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# A run into training (15-30 s): make test-slow (.ci/run runs it after make test).
@pytest.mark.slow
def test_failed_register_step_is_a_failed_run(workspace: Path, failing_registry: str) -> None:
    """Register fails after training and evaluation: the run is FAILED, exit 1, step named."""
    root = workspace.parent / "root"
    before = snapshot(workspace)
    out = run_process(
        ["run", "--local", "--root", str(root), "--json", "--param", "epochs=1",
         "--param", f"registry_uri={failing_registry}"],
        cwd=workspace,
        # The server answers 503 to every write: MLflow's own retries (backoff included) would
        # only repeat the same answer.
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
    )  # fmt: skip
    assert out.code == 1, out.stderr[-3000:]
    s = out.json
    assert s["state"] == "FAILED" and s["failed_step"] == "register", s
    assert s["exit_code"] == 1
    assert s["error"] == out.last_error
    assert out.last_error.startswith("ERROR [register] E_EXTERNAL: "), out.stderr[-2000:]
    assert "s3cret-token" not in out.stdout + out.stderr
    assert s["model_uri"] and s["gate_passed"] is True  # what did happen is still reported
    assert snapshot(workspace) == before


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# A run into training (15-30 s): make test-slow (.ci/run runs it after make test).
@pytest.mark.slow
def test_ctrl_c_stops_every_step_process_and_exits_130(workspace: Path) -> None:
    root = workspace.parent / "root"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen(
        # Still training when the signal comes, however late the log reaches us: 2000 epochs
        # (minutes) and no early stopping (which settings from the data would turn on).
        [str(GPUPIPE), "run", "--local", "--root", str(root), "--param", "epochs=2000",
         "--param", 'hyperparams_json={"train.early_stopping": null}'],
        cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # As in a terminal: Ctrl-C is not ignored. (A test run started in the background by a
        # non-interactive shell, `cmd &`, inherits SIGINT ignored, and Python keeps it so.)
        preexec_fn=_sigint_default,
    )  # fmt: skip
    seen: list[str] = []
    descendants: list[int] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for line in proc.stdout:
            seen.append(line)
            if line.split() == ["train", "RUNNING"]:  # the step's line as it starts
                break
            assert time.monotonic() < deadline, "train never started"
        from pipelines.local import _descendants

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until torchrun's workers exist
            descendants = _descendants(proc.pid)
            cmdlines = [_cmdline(p) for p in descendants]
            if any("trainer.worker" in c for c in cmdlines):
                break
            time.sleep(0.2)
        assert descendants, "no step process found"
        proc.send_signal(signal.SIGINT)  # to gpupipe alone, as `kill -INT` would
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(seen)[-2000:] + rest[-2000:]
    last = [ln for ln in rest.strip().splitlines() if ln.strip()][-1]
    assert last.startswith("ERROR [gpupipe run] E_INTERRUPTED: "), rest[-2000:]
    assert "Traceback" not in rest
    alive = [p for p in descendants if _running(p)]
    assert not alive, f"left running: {[_cmdline(p) for p in alive]}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
