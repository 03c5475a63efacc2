"""What ``gpupipe run --local`` checks before the first step starts: the root folder it writes
into, the data and its target column, and the registry."""

from __future__ import annotations

import difflib
import json
import os
import secrets
import shlex
import sys
from pathlib import Path
from typing import Any

from trainer.base.errors import InputError
from trainer.base.redact import redact as _redact

ROOT_MARKER = ".gpupipe-root.json"
"""Written into a ``--root`` the suite created; a folder without it is never written into."""
REGISTRY_TIMEOUT_S = 5.0
"""How long the pre-flight check waits for a registry server to answer."""


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
