"""Run the training pipeline on this machine with ``kfp.local`` and report what really happened.

The run's outcome is kfp.local's own verdict, never a guess from the files that exist: a run
whose evaluate or register step failed is ``FAILED``, names the step, and carries the step's
one-line error. Everything a person can get wrong (parameters, the data, the target column, the
registry, the root folder) is checked before the first step starts.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import logging
import os
import re
import secrets
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.params import check_parameters, parameter_types
from trainer.base.errors import NOT_INPUT_CODES, InputError, parse_error_line
from trainer.base.redact import redact as _redact

log = logging.getLogger(__name__)

DEMO_TARGET = "churned"
ROOT_MARKER = ".gpupipe-root.json"
"""Written into a ``--root`` the suite created; a folder without it is never written into."""
REGISTRY_TIMEOUT_S = 5.0
"""How long the pre-flight check waits for a registry server to answer."""
EXTERNAL_CODES = NOT_INPUT_CODES
"""Codes of failures that are not the user's input (a registry or object store, a training run
that cannot go on, a full disk): the run then exits 1, not 2."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KFP_FAILURE = re.compile(r"finished with status FAILURE\. Inner task failed: (?P<chain>.*)\.$")
_EXCEPTION_LINE = re.compile(
    r"^\s*(?:[\w.]+\.)?(?P<type>[A-Z]\w*(?:Error|Exception|Interrupt))(?::|$)"
)


def pipeline_parameters() -> dict[str, Any]:
    """Names and defaults of the training pipeline's parameters (``None``: required)."""
    from pipelines.params import pipeline_parameters as names

    return names()


# --- the root folder -----------------------------------------------------------------------


def prepare_root(root: Path) -> Path:
    """Make ``root`` ready for runs, refusing any folder the suite did not create.

    ``root`` must be absent, an empty directory, or a directory holding :data:`ROOT_MARKER`
    (an earlier ``gpupipe run --local``). Anything else, such as a folder of the user's own
    files, or one holding an unrelated ``mlflow.db``, is refused: runs write and replace files
    under the root, and those must never be someone else's.

    Raises:
        InputError: ``E_ROOT`` naming the path: a file, a foreign folder, or not writable.
    """
    root = root.expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise InputError("E_ROOT", "--root must be a folder, but a file is there", str(root))
    marker = root / ROOT_MARKER
    if root.is_dir() and not marker.is_file():
        try:
            entries = sorted(p.name for p in root.iterdir())
        except OSError as e:
            raise InputError("E_ROOT", f"cannot read --root: {e.strerror}", str(root)) from None
        if entries:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise InputError(
                "E_ROOT",
                f"--root holds files gpupipe did not create ({shown}); use an empty or new folder",
                str(root),
            )
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not marker.is_file():
            tmp = root / f"{ROOT_MARKER}.tmp-{secrets.token_hex(4)}"
            tmp.write_text(json.dumps({"created_by": "gpupipe", "purpose": "gpupipe run --local"}))
            os.replace(tmp, marker)
        probe = root / f".write-test-{secrets.token_hex(4)}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise InputError(
            "E_ROOT", f"--root is not a writable folder: {reason}", str(root)
        ) from None
    return root


def new_run_id() -> str:
    """A run id that sorts by time and never repeats: ``20261122-210257-1a2b3c``."""
    return f"{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


# --- pre-flight checks of the data and the registry ----------------------------------------


def check_data(data: str, target: str, params: dict[str, Any]) -> None:
    """The data URI exists and is readable, ``target`` is one of its columns, and preprocess
    will accept them (:func:`trainer.steps.preprocess.inspect_data`); prints its decisions.

    The columns are read the way preprocess reads them (CSV delimiter, header, encoding from
    the pipeline parameters), from the first file's schema or header only.

    Raises:
        InputError: ``E_DATA`` naming the URI, or ``E_TARGET`` naming the column.
    """
    from pipelines.params import preprocess_config
    from trainer.steps.preprocess import read_columns

    cfg = preprocess_config({**params, "target": target})
    try:
        columns = read_columns(data, cfg.csv_options())
    except (OSError, RuntimeError) as e:
        reason = " ".join(str(e).split())[:200]
        raise InputError("E_DATA", f"cannot read the data: {reason}", data) from None
    if target not in columns:
        shown = ", ".join(columns[:20]) + (", ..." if len(columns) > 20 else "")
        same_case = [c for c in columns if c.casefold() == target.casefold()]
        close = same_case or difflib.get_close_matches(target, columns, n=1)
        hint = f"; did you mean {close[0]!r}? set --target {shlex.quote(close[0])}" if close else ""
        raise InputError(
            "E_TARGET",
            f"target column {target!r} is not in the data (columns: {shown}){hint}",
            data,
        )
    from trainer.steps.preprocess import inspect_data

    # What preprocess will decide (the task and why) and refuse (dates, a target that cannot
    # work, a split it cannot make), said before any step starts.
    for note in inspect_data(data, cfg):
        print(note.line("gpupipe run"), file=sys.stderr, flush=True)


def check_registry(uri: str, timeout_s: float = REGISTRY_TIMEOUT_S) -> None:
    """The registry at ``uri`` answers, within ``timeout_s`` (a refused connection at once).

    A tracking server (``http(s)://``) must answer MLflow's ``/health`` or its REST API; a
    SQLite store must be an MLflow database or not exist yet (it is never migrated).

    Raises:
        InputError: ``E_REGISTRY`` naming the (redacted) URI and what went wrong.
    """
    from trainer import registry

    if uri.startswith("sqlite:"):
        registry.check_sqlite_store(uri)
        return
    if not uri.startswith(("http://", "https://")):
        return  # databricks, file stores ...: MLflow's own client decides
    import base64
    import urllib.error
    import urllib.parse
    import urllib.request

    shown = _redact(uri)
    parts = urllib.parse.urlsplit(uri)
    headers = {}
    if parts.username is not None:  # user:password@host, as requests (and so MLflow) reads it
        token = (
            f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        )
        headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
        parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
    base = urllib.parse.urlunsplit(parts).rstrip("/")
    last = ""
    for path in ("/health", "/api/2.0/mlflow/experiments/search?max_results=1"):
        request = urllib.request.Request(base + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                if resp.status < 400:
                    return
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                raise InputError(
                    "E_REGISTRY", f"the registry refused the credentials (HTTP {e.code})", shown
                ) from None
            last = f"HTTP {e.code}"
            continue
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise InputError(
                "E_REGISTRY",
                f"the registry does not answer within {timeout_s:g} s: {reason} "
                "(check registry_uri, or --registry-timeout)",
                shown,
            ) from None
    raise InputError("E_REGISTRY", f"not an MLflow tracking server ({last})", shown)


# --- watching the run ----------------------------------------------------------------------


class _StepLog(io.TextIOBase):
    """Forwards kfp.local's output line by line with credentials masked, and remembers each
    step's error line and last exception.

    kfp.local prints every task's executor input, parameters included, so a registry URI with
    ``user:password@`` in it would otherwise reach the terminal.
    """

    def __init__(self, out: Any) -> None:
        super().__init__()
        self._out = out
        self._partial = ""
        self.error_lines: list[tuple[str, str]] = []
        """``(step, line)`` of every ``ERROR [step] E_...`` line, in order."""
        self.exceptions: list[str] = []
        """The last line of each traceback printed by a step (``RuntimeError: ...``)."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            line = _redact(line)
            self._out.write(line + "\n")
            self._scan(_ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def close_line(self) -> None:
        """Forward a last line that had no newline."""
        if self._partial:
            self.write("\n")
        self.flush()

    def _scan(self, line: str) -> None:
        stripped = line.strip()
        m = re.search(r"ERROR \[(?P<step>[\w -]+)\] (?P<code>E_[A-Z_]+): ", stripped)
        if m is not None:
            self.error_lines.append((m.group("step"), stripped[m.start() :]))
        elif _EXCEPTION_LINE.match(stripped) and not stripped.startswith("Traceback"):
            self.exceptions.append(stripped)


def _failed_task(message: str) -> tuple[str, list[str]] | None:
    """The innermost failed task and the chain, from kfp.local's failure message."""
    m = _KFP_FAILURE.search(_ANSI.sub("", message).strip())
    if m is None:
        return None
    chain = re.findall(r"'([^']+)'", m.group("chain"))
    return (chain[0] if chain else "", chain)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, []))
    return out


def stop_children(grace_s: float = 10.0) -> None:
    """SIGTERM every process this one started (steps, torchrun, workers); SIGKILL stragglers.

    Workers checkpoint on SIGTERM, so a rerun resumes where the interrupted run stopped.
    """
    pids = _descendants(os.getpid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:  # reap our own children so none is left a zombie
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while the run is in progress (children are stopped either way)."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- the run -------------------------------------------------------------------------------


def run_local(
    *,
    data: str | None,
    target: str | None,
    params: dict[str, Any],
    root: Path,
    quiet: bool = False,
    registry_timeout_s: float = REGISTRY_TIMEOUT_S,
    runner: str = "subprocess",
    image_overrides: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``training_pipeline`` under kfp.local (caching on): each step as a host process, or
    with ``runner="docker"`` in its image (see :mod:`pipelines.local_docker`).

    Everything lands under ``root``: ``runs/<run id>/`` (this run's artifacts), ``cache/``
    (kfp.local's cache, shared by runs), ``mlflow.db`` (the embedded registry, shared so later
    runs meet a champion) and ``demo/`` (generated data when ``data`` is not given). Runs on the
    same root may overlap: each has its own run folder and reports that one.

    Args:
        data: data URI; None writes and uses a demo table.
        target: target column (required with ``data``).
        params: typed pipeline parameters (see :func:`pipelines.params.typed_parameters`).
        root: the folder for everything the run writes.
        quiet: send kfp.local's output to stderr, keeping stdout for the summary.
        registry_timeout_s: how long the pre-flight check waits for a registry server.
        runner: ``subprocess`` (host processes) or ``docker`` (each step in its image).
        image_overrides: with ``docker``, step images to replace (``{original: replacement}``).

    Returns:
        The run summary: ``state`` (``SUCCEEDED`` or ``FAILED``), ``run_dir``, metrics, gate,
        model, report, registry version; on failure ``failed_step``, ``error`` and
        ``exit_code`` (2 when the step rejected the user's input, 1 otherwise).

    Raises:
        InputError: a bad parameter, data URI, target, registry or root, before any step runs.
    """
    from kfp import local

    from pipelines import local_docker
    from pipelines.training import PIPELINE_NAME, build_training_pipeline

    if runner not in local_docker.RUNNERS:
        raise InputError("E_PARAM", f"runner must be one of {local_docker.RUNNERS}", "--runner")
    if image_overrides and runner != "docker":
        raise InputError("E_PARAM", "image overrides need --runner docker", "--image-override")

    for name, flag, value in (("data_uri", "--data", data), ("target", "--target", target)):
        if value is not None and name in params:
            raise InputError("E_PARAM", f"give {name} once: {flag} or --param {name}=...", name)
    if target is not None and not target.strip():
        raise InputError(
            "E_PARAM",
            f"--target must name a column, got {target!r}; a column whose name is empty or "
            "blank cannot be the target: give it a name in the data",
            "--target",
        )
    arguments: dict[str, Any] = {"data_uri": data or "", "target": target or DEMO_TARGET}
    arguments.update(params)
    if arguments["data_uri"] and not (target or params.get("target")):
        raise InputError("E_PARAM", "--target is required with --data", "--target")
    # Everything is checked before anything is written anywhere.
    checked = check_parameters(arguments)
    if arguments["data_uri"]:
        check_data(arguments["data_uri"], arguments["target"], checked)
    if arguments.get("registry_uri"):
        check_registry(arguments["registry_uri"], registry_timeout_s)
    root = prepare_root(root)
    if not arguments.get("registry_uri"):
        arguments["registry_uri"] = f"sqlite:///{root / 'mlflow.db'}"
        check_registry(arguments["registry_uri"], registry_timeout_s)
    if not arguments["data_uri"]:
        from trainer.steps.preprocess import write_demo_data

        demo = root / "demo" / "churn.parquet"
        if not demo.exists():
            write_demo_data(str(demo), rows=4000, task="classification", seed=0)
        arguments["data_uri"] = str(demo)
    _prepare_registry(arguments["registry_uri"])
    types = parameter_types()
    arguments = {k: v for k, v in arguments.items() if k in types}

    training_pipeline = build_training_pipeline(retries=0, cluster=False)
    if runner == "docker":
        images = local_docker.set_step_images(training_pipeline, image_overrides or {})
        local_docker.check_images(images)
    # Components run `python3 -m kfp.dsl.executor_main`: make that (and torchrun inside the
    # train step) the interpreter that has gpupipe installed.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_id = new_run_id()
    pipeline_root = root / "runs" / run_id
    task_runner: Any = local.SubprocessRunner(use_venv=False)
    if runner == "docker":
        pipeline_root.mkdir(parents=True)  # Docker would create a missing one owned by root
        task_runner = local_docker.docker_runner(root, arguments["data_uri"])
    local.init(
        runner=task_runner,
        pipeline_root=str(pipeline_root),
        cache_root=str(root / "cache"),
        enable_caching=True,
        raise_on_error=True,
    )
    step_log = _StepLog(sys.stderr if quiet else sys.stdout)
    failure: tuple[str, list[str]] | None = None
    try:
        with (
            _sigterm_as_interrupt(),
            _run_tmpdir(pipeline_root),
            contextlib.redirect_stdout(step_log),
        ):
            try:
                training_pipeline(**arguments)
            finally:
                step_log.close_line()
    except KeyboardInterrupt:
        stop_children()
        raise RunInterrupted(_interrupted_summary(pipeline_root, run_id)) from None
    except RuntimeError as e:
        failure = _failed_task(str(e))
        if failure is None:
            raise
    runs = sorted(pipeline_root.glob(f"{PIPELINE_NAME}-*"))
    if not runs:
        raise RuntimeError(f"kfp.local produced no run folder under {pipeline_root}")
    summary = summarize(runs[-1])
    summary["run_id"] = run_id
    summary["registry_uri"] = _redact(arguments["registry_uri"])
    summary["registered_model_name"] = arguments.get("registered_model_name", "gpupipe-model")
    if failure is None:
        summary["state"] = "SUCCEEDED"
        summary["exit_code"] = 0
    else:
        summary.update(_failure_details(failure, step_log))
    return summary


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; ``summary`` says what it had done and saved."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.summary = summary


INTERRUPTED_ERROR = "ERROR [gpupipe run] E_INTERRUPTED: interrupted; steps stopped"


def _interrupted_summary(pipeline_root: Path, run_id: str) -> dict[str, Any]:
    """The summary of a stopped run: its folder, what finished, the checkpoints it left."""
    from pipelines.training import PIPELINE_NAME

    runs = sorted(pipeline_root.glob(f"{PIPELINE_NAME}-*"))
    summary: dict[str, Any] = summarize(runs[-1]) if runs else {"run_dir": str(pipeline_root)}
    checkpoints = sorted(
        str(marker.parent)
        for marker in pipeline_root.glob("*/*/*-work/checkpoints/step-*/COMPLETE.json")
    )
    summary.update(
        state="INTERRUPTED",
        run_id=run_id,
        exit_code=130,
        error=INTERRUPTED_ERROR,
        checkpoints=checkpoints,
        finished_steps=sorted(
            p.parent.name for p in pipeline_root.glob("*/*/executor_output.json")
        ),
    )
    return summary


@contextlib.contextmanager
def _run_tmpdir(pipeline_root: Path) -> Iterator[Path]:
    """Point every temporary file of the run (steps, the component launcher, torchrun's and
    torchelastic's folders, a downloaded champion) at ``<run folder>/tmp``, and remove it after.

    Child processes read ``TMPDIR``; this process's :mod:`tempfile` caches its folder, so the
    cache is reset on the way in and out. A run leaves nothing in the system's temporary folder.
    """
    import shutil
    import tempfile

    tmp = pipeline_root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "TEMP", "TMP")}
    for key in saved:
        os.environ[key] = str(tmp)
    tempfile.tempdir = None
    try:
        yield tmp
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        tempfile.tempdir = None
        shutil.rmtree(tmp, ignore_errors=True)


def _prepare_registry(uri: str) -> None:
    """Create a fresh SQLite registry once, under a lock, so concurrent runs never race on it."""
    from trainer import registry

    if uri.startswith("sqlite:"):
        registry.prepare_store(uri)


def _failure_details(failure: tuple[str, list[str]], step_log: _StepLog) -> dict[str, Any]:
    """``state``, ``failed_step``, ``error`` and ``exit_code`` of a failed run."""
    step, chain = failure
    lines = [line for s, line in step_log.error_lines if s == step] or [
        line for _, line in step_log.error_lines
    ]
    if lines:
        error = lines[-1]
        parsed = parse_error_line(error, error[error.index("[") + 1 : error.index("]")])
        code = parsed.code if parsed is not None else "E_FAILED"
    else:
        last = step_log.exceptions[-1] if step_log.exceptions else "see the step's log above"
        code = "E_FAILED"
        error = f"ERROR [{step}] E_FAILED: the step failed: {' '.join(last.split())}"
    return {
        "state": "FAILED",
        "failed_step": step,
        "failed_chain": chain,
        "error": _redact(error),
        "exit_code": 1 if code in EXTERNAL_CODES else 2,
    }


def _executor_output(task_dir: Path) -> dict[str, Any]:
    path = task_dir / "executor_output.json"
    return json.loads(path.read_text()) if path.exists() else {}


def summarize(run_dir: Path) -> dict[str, Any]:
    """Read a kfp.local run folder: each task's ``executor_output.json`` and artifacts."""
    out: dict[str, Any] = {"run_dir": str(run_dir)}
    pre = _executor_output(run_dir / "preprocess")
    for artifact in pre.get("artifacts", {}).get("dataset", {}).get("artifacts", []):
        warnings = artifact.get("metadata", {}).get("warnings")
        if warnings:
            out["data_warnings"] = list(warnings)
    ev = _executor_output(run_dir / "evaluate")
    params = ev.get("parameterValues", {})
    if "Output" in params:
        out["gate_passed"] = bool(params["Output"])
    for artifact in ev.get("artifacts", {}).get("report", {}).get("artifacts", []):
        out["gate_reason"] = artifact.get("metadata", {}).get("gate_reason", "")
    for artifact in ev.get("artifacts", {}).get("metrics", {}).get("artifacts", []):
        out["metrics"] = {
            k: v
            for k, v in artifact.get("metadata", {}).items()
            if k != "gate_passed" and isinstance(v, int | float)
        }
    report = run_dir / "evaluate" / "report"
    if report.exists():
        out["report"] = str(report)
    model = run_dir / "train" / "model"
    if (model / "model.json").exists():
        out["model_uri"] = str(model)
    if (model / "cost.json").exists():  # the estimate before launch and the actual
        out["cost"] = json.loads((model / "cost.json").read_text())
    tuned = _executor_output(run_dir / "tune").get("parameterValues", {})
    if tuned.get("best_hyperparams"):
        out["tuned_hyperparams"] = tuned["best_hyperparams"]
    reg = _executor_output(run_dir / "register").get("parameterValues", {})
    if reg:
        out["registered_version"] = reg.get("version")
        out["registered_model_uri"] = reg.get("model_uri")
        out["champion"] = reg.get("champion")
    return out
