"""Entry-point helpers: what a KFP component body and ``python -m trainer`` do around a step.

They live in ``trainer`` (not ``components``) because a component body runs under kfp's
executor with ``_KFP_RUNTIME=true``, where ``kfp.dsl`` has no ``component`` decorator: importing
anything under the ``components`` package there runs its ``__init__``, which defines the
components, and fails. A body can import only ``trainer`` (baked into the image) and kfp itself.
Nothing here imports kfp.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from trainer.base import redact
from trainer.base.errors import (
    DISK_FULL_CODE,
    EXIT_BAD_INPUT,
    error_line,
    is_disk_full,
    print_error_line,
)

T = TypeVar("T")


EXTERNAL_ERROR_CODE = "E_EXTERNAL"
"""Code of the one line for a failed external system (registry, object store, API server)."""


TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' termination message file of the container (``terminationMessagePath``)."""


def _fail(line: str, code: int) -> NoReturn:
    """Print the one error line, leave it as the pod's termination message, and exit ``code``.

    In a pod the line also becomes the container's termination message, which Kubernetes shows
    in the pod's status and Argo in the failed node's message (KFP's v2beta1 task details carry
    none: ``gpupipe run --host --wait`` reads the step's archived log instead).
    """
    print_error_line(line)
    if os.path.isfile(TERMINATION_LOG):
        with contextlib.suppress(OSError), open(TERMINATION_LOG, "w") as f:
            f.write(line[:4000])  # Kubernetes keeps at most 4096 bytes
    raise SystemExit(code)


def run_guarded(step: str, fn: Callable[[], T]) -> T:
    """Run ``fn``; turn its expected failures into one ``ERROR [<step>] E_...`` line.

    Bad input (``ValueError``, ``FileNotFoundError``) exits 2, permanent; a failing external
    system (``RuntimeError``, ``TimeoutError``, ``ConnectionError``: the registry, an object
    store, the Kubernetes API) exits 1, retryable. Anything else is a bug and keeps its
    traceback. For entry points only (components, the CLI): library code raises, it never exits.
    Log records and an uncaught traceback of the process are redacted from here on.
    """
    redact.install()
    try:
        return fn()
    except (ValueError, FileNotFoundError) as e:
        _fail(error_line(step, e), EXIT_BAD_INPUT)
    except (RuntimeError, TimeoutError, ConnectionError) as e:
        # Before OSError: TimeoutError and ConnectionError are OSErrors too (a launcher's
        # deadline printed a traceback until the real Katib's search ran past one).
        if type(e) is RuntimeError and not str(e):
            raise
        _fail(error_line(step, e, default_code=EXTERNAL_ERROR_CODE), 1)
    except OSError as e:
        if not is_disk_full(e):
            raise
        # A full disk is the machine's problem, not the input's: exit 1, never 2.
        _fail(error_line(step, e, default_code=DISK_FULL_CODE), 1)


def write_metadata_file(path: str, metadata: dict[str, Any]) -> None:
    """Give a metrics-style KFP output artifact a file: its metadata as JSON.

    ``Metrics.log_metric`` only fills metadata; an output artifact with no file counts as
    missing to kfp.local's cache, which then never serves the step from cache.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(metadata, f, sort_keys=True, indent=2, default=str)
