"""How a worker tells the ``python -m trainer.launch`` wrapper what really happened to it.

torchrun reports every failed worker as exit code 1. So each worker marks itself started
(:func:`record_started`) and, on its way out, leaves its own exit code
(:func:`record_exit_code`) in the folder ``$GPUPIPE_EXIT_DIR`` that the wrapper sets; the wrapper
reads them (:func:`read_exit_codes`, :func:`read_vanished`: started, never finished, so killed)
and maps them to a code the operator's ExitCode policy can act on
(:mod:`trainer.launch.torchrun`). This file format is the whole contract between the two sides,
so it lives below both: the worker (engine) and the wrapper (launch) import it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

EXIT_DIR_ENV = "GPUPIPE_EXIT_DIR"
"""Directory in which each worker records its exit code; set by this wrapper for torchrun."""


def _started_path(directory: str) -> str:
    return os.path.join(directory, f"started-{os.getpid()}")


def record_started() -> None:
    """Mark this worker as started; :func:`record_exit_code` removes the mark again.

    A mark that outlives its worker means the worker died without a word (SIGKILL, the OOM
    killer, a fatal signal): the job lost a member, which is retryable. A no-op unless
    ``GPUPIPE_EXIT_DIR`` is set; errors are logged, never raised.
    """
    directory = os.environ.get(EXIT_DIR_ENV)
    if not directory:
        return
    try:
        with open(_started_path(directory), "w", encoding="utf-8"):
            pass
    except OSError as e:
        log.warning("could not mark this worker as started in %s: %s", directory, e)


def read_vanished(directory: str | os.PathLike[str]) -> list[int]:
    """Process ids of workers that marked themselves started but never recorded a code."""
    pids: list[int] = []
    for path in Path(directory).glob("started-*"):
        pid = path.name.removeprefix("started-")
        if pid.isdigit():
            pids.append(int(pid))
    return sorted(pids)


def record_exit_code(code: int, rank: int | None) -> None:
    """Leave this worker's exit code for the wrapper; a no-op unless ``GPUPIPE_EXIT_DIR`` is set.

    The file is written under a temporary name and renamed, so the wrapper never reads half a
    number. Failing to write it only loses the mapping (the job then gets torchrun's code), so
    errors are logged, never raised.

    Args:
        code: the worker's exit code.
        rank: the global rank from the ``DistContext``; ``None`` when the worker failed before it
            had one (the file is then named after the process id).
    """
    directory = os.environ.get(EXIT_DIR_ENV)
    if not directory:
        return
    name = f"rank-{rank}.code" if rank is not None else f"rank-unknown-{os.getpid()}.code"
    target = os.path.join(directory, name)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{code}\n")
        os.replace(tmp, target)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_started_path(directory))
    except OSError as e:
        log.warning("could not record exit code %d in %s: %s", code, target, e)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def read_exit_codes(directory: str | os.PathLike[str]) -> dict[str, int]:
    """The codes the workers recorded, keyed ``"<rank>"`` or ``"unknown-<pid>"``.

    Unreadable or malformed files are skipped: the mapping is best effort by design.
    """
    codes: dict[str, int] = {}
    for path in Path(directory).glob("rank-*.code"):
        try:
            codes[path.name.removeprefix("rank-").removesuffix(".code")] = int(path.read_text())
        except (OSError, ValueError):
            log.warning("ignoring unreadable worker exit code file %s", path)
    return codes
