"""Run the training pipeline on this machine with ``kfp.local`` and report what really happened.

The run's outcome is kfp.local's own verdict, never a guess from the files that exist: a run
whose evaluate or register step failed is ``FAILED``, names the step, and carries the step's
one-line error. Everything a person can get wrong (parameters, the data, the target column, the
registry, the root folder) is checked before the first step starts
(:mod:`pipelines.local_checks`); what the run printed and left is read by
:mod:`pipelines.local_report`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.local_checks import (
    REGISTRY_TIMEOUT_S,
    check_data,
    check_registry,
    prepare_root,
)
from pipelines.local_progress import LOG_NAME, Progress, captured, open_log
from pipelines.local_report import StepLog, failed_task, failure_details, summarize
from pipelines.params import check_parameters, parameter_types
from trainer.base.errors import InputError
from trainer.base.redact import redact as _redact

log = logging.getLogger(__name__)

DEMO_TARGET = "churned"


def new_run_id() -> str:
    """A run id that sorts by time and never repeats: ``20261122-210257-1a2b3c``."""
    return f"{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


# --- the processes the run started ---------------------------------------------------------


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
    verbose: bool = False,
) -> dict[str, Any]:
    """Run ``training_pipeline`` under kfp.local (caching on): each step as a host process, or
    with ``runner="docker"`` in its image (see :mod:`pipelines.local_docker`).

    The terminal gets a line per step as it starts and ends (:mod:`pipelines.local_progress`)
    and the summary; each step's output, kfp.local's own lines and library warnings go to
    ``runs/<run id>/run.log`` (its path printed first), and with ``verbose`` to the terminal too.

    Everything lands under ``root``: ``runs/<run id>/`` (this run's artifacts), ``cache/``
    (kfp.local's cache, shared by runs), ``mlflow.db`` (the embedded registry, shared so later
    runs meet a champion) and ``demo/`` (generated data when ``data`` is not given). Runs on the
    same root may overlap: each has its own run folder and reports that one.

    Args:
        data: data URI; None writes and uses a demo table.
        target: target column (required with ``data``).
        params: typed pipeline parameters (see :func:`pipelines.params.typed_parameters`).
        root: the folder for everything the run writes.
        quiet: print the steps' lines (or the log) to stderr, keeping stdout for the summary.
        registry_timeout_s: how long the pre-flight check waits for a registry server.
        runner: ``subprocess`` (host processes) or ``docker`` (each step in its image).
        image_overrides: with ``docker``, step images to replace (``{original: replacement}``).
        verbose: print the run's whole log as it is written, not only the steps' lines.

    Returns:
        The run summary: ``state`` (``SUCCEEDED`` or ``FAILED``), ``run_dir``, ``log``, metrics,
        gate, model, report, registry version; on failure ``failed_step``, ``error`` and
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
    # Made here, not by kfp.local: the log goes in it (and Docker would make it owned by root).
    pipeline_root.mkdir(parents=True)
    terminal = sys.stderr if quiet else sys.stdout
    log_path = pipeline_root / LOG_NAME
    where = "" if verbose else "; -v prints it here too"
    print(f"run {run_id}: the steps' output goes to {log_path}{where}", file=terminal, flush=True)
    failure: tuple[str, list[str]] | None = None
    with open_log(pipeline_root) as log_file:
        progress = Progress(log_file, terminal, verbose=verbose)
        step_log = StepLog(progress)
        try:
            with (
                _sigterm_as_interrupt(),
                _run_tmpdir(pipeline_root),
                captured(step_log),
            ):
                try:
                    _prepare_registry(arguments["registry_uri"])
                    task_runner: Any = local.SubprocessRunner(use_venv=False)
                    if runner == "docker":
                        task_runner = local_docker.docker_runner(root, arguments["data_uri"])
                    local.init(
                        runner=task_runner,
                        pipeline_root=str(pipeline_root),
                        cache_root=str(root / "cache"),
                        enable_caching=True,
                        raise_on_error=True,
                    )
                    training_pipeline(**arguments)
                finally:
                    step_log.close_line()
        except KeyboardInterrupt:
            stop_children()
            summary = _interrupted_summary(pipeline_root, run_id)
            summary["log"] = str(log_path)
            raise RunInterrupted(summary) from None
        except RuntimeError as e:
            failure = failed_task(str(e))
            if failure is None:
                raise
    runs = sorted(pipeline_root.glob(f"{PIPELINE_NAME}-*"))
    if not runs:
        raise RuntimeError(f"kfp.local produced no run folder under {pipeline_root}")
    summary = summarize(runs[-1])
    summary["run_id"] = run_id
    summary["log"] = str(log_path)
    summary["registry_uri"] = _redact(arguments["registry_uri"])
    summary["registered_model_name"] = arguments.get("registered_model_name", "gpupipe-model")
    if failure is None:
        summary["state"] = "SUCCEEDED"
        summary["exit_code"] = 0
    else:
        summary.update(failure_details(failure, step_log, log=log_path))
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
