"""Where the suite may write: output-location checks, ownership markers and atomic publishing.

The rule (DESIGN.md, "Safety"): a step writes only into a location that is absent, an empty
folder, or a folder that carries gpupipe's own marker (``.gpupipe-output.json``) from an earlier
run of the *same* step; a retried step replaces its earlier attempt. Anything else (a folder
with files gpupipe did not create, another step's output, a regular file, the step's own inputs
or a folder around them, the working directory, the home directory, ``/``, a whole bucket) is
refused before any work with one :class:`~trainer.base.errors.InputError` (``E_OUTPUT``) that names
the path.

A folder output carries its marker inside it. A file output (an HTML report, a JSON file)
cannot, so its marker is a hidden sibling, ``.<name>.gpupipe-output.json``, written before the
file: a file without one was not written by gpupipe and is never replaced.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.base.version import __version__

OUTPUT_MARKER = ".gpupipe-output.json"
"""The marker's file name: inside a folder output, or ``.<name>`` + this next to a file output."""
CREATED_BY = "gpupipe"
"""The ``created_by`` value of every marker."""
ERROR_CODE = "E_OUTPUT"
"""The code of every refusal."""

Kind = Literal["dir", "file"]
_ADVICE = {"dir": "choose a new or empty folder", "file": "choose a new file name"}


def marker_uri(uri: str, kind: Kind = "dir") -> str:
    """The URI of the marker that says ``uri`` is gpupipe's output.

    Args:
        uri: The output location.
        kind: ``dir``: the marker is inside it; ``file``: a hidden sibling of it.
    """
    if kind == "dir":
        return storage.join(uri, OUTPUT_MARKER)
    parent, name = _split(uri)
    return storage.join(parent, f".{name}{OUTPUT_MARKER}")


def marker(step: str) -> dict[str, Any]:
    """The content of a new marker for an output of ``step``."""
    return {
        "created_by": CREATED_BY,
        "step": step,
        "version": __version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def read_marker(uri: str, kind: Kind = "dir") -> dict[str, Any] | None:
    """The marker of ``uri`` if it is a gpupipe marker; None if there is none or it is garbled.

    Raises:
        RuntimeError: If the object store cannot be reached.
    """
    try:
        data = storage.read_json(marker_uri(uri, kind))
    except (OSError, ValueError):  # missing, a folder, unreadable, not JSON
        return None
    ours = isinstance(data, dict) and data.get("created_by") == CREATED_BY
    return data if ours and isinstance(data.get("step"), str) else None


def check_output_location(
    uri: str,
    step: str,
    *,
    inputs: Mapping[str, str | None] | None = None,
    kind: Kind = "dir",
) -> None:
    """Refuse an output location that the suite may not write to; nothing is written here.

    Allowed: ``uri`` is absent, an empty folder (``kind="dir"``), or holds the marker of an
    earlier output of the same ``step`` (which the step then replaces).

    Args:
        uri: Where ``step`` wants to write (any storage URI).
        step: The producing step, recorded in and compared with the marker (e.g. ``preprocess``).
        inputs: What the step reads (or writes elsewhere), by role, e.g. ``{"data": uri}``:
            the output may not be one of them, lie inside one, or contain one. None values are
            skipped.
        kind: ``dir`` for a folder output, ``file`` for a single file.

    Raises:
        InputError: ``E_OUTPUT`` naming the path, if ``uri`` is not an allowed location.
        ValueError: If ``uri`` is not a supported URI.
        RuntimeError: If the object store cannot be reached.
    """
    where = _shown(uri)
    advice = _ADVICE[kind]
    what = "folder" if kind == "dir" else "file"

    def refuse(reason: str) -> InputError:
        return InputError(ERROR_CODE, f"{step} output {what} {reason}; {advice}", where)

    if (why := _special(uri)) is not None:
        raise refuse(why)
    for role, other in (inputs or {}).items():
        if other and (relation := _overlap(uri, other)) is not None:
            raise refuse(f"{relation} the {role} {_shown(other)}")
    if not storage.exists(uri):
        return
    if kind == "file":
        if storage.is_dir(uri):
            raise refuse("is an existing folder, not a file")
        found = read_marker(uri, "file")
        if found is None:
            raise refuse("exists and was not written by gpupipe: refusing to replace it")
    else:
        if not storage.is_dir(uri):
            raise refuse("is an existing file, not a folder")
        if not storage.list_dir(uri):
            return
        found = read_marker(uri)
        if found is None:
            raise refuse(
                f"is not empty and has no gpupipe marker ({OUTPUT_MARKER}): "
                "refusing to replace files gpupipe did not create"
            )
    if found["step"] != step:
        raise refuse(f"holds the output of the {found['step']} step: refusing to replace it")


def claim_output_dir(
    uri: str, step: str, *, inputs: Mapping[str, str | None] | None = None
) -> None:
    """Check ``uri`` like :func:`check_output_location`, then make it ``step``'s own folder.

    For working folders that grow during a run (checkpoints, a study journal) and must survive a
    retry: the folder is created with its marker, or kept as it is when the marker is there.

    Raises:
        InputError: ``E_OUTPUT`` naming the path, if ``uri`` may not be used.
    """
    check_output_location(uri, step, inputs=inputs)
    if read_marker(uri) is None:
        storage.makedirs(uri)
        storage.write_json(marker_uri(uri), marker(step))


def write_output_file(
    uri: str,
    data: bytes | str,
    *,
    step: str,
    inputs: Mapping[str, str | None] | None = None,
) -> None:
    """Write a file output of ``step`` atomically, with its marker, after checking ``uri``.

    The marker goes first, so a crash in between leaves a marker without a file (harmless)
    rather than a file that a retry would refuse to replace.

    Raises:
        InputError: ``E_OUTPUT`` naming the path, if ``uri`` may not be written.
    """
    blob = data.encode("utf-8") if isinstance(data, str) else data
    claim_output_file(uri, step, inputs=inputs, same_as=blob)
    storage.write_bytes(uri, blob)


def claim_output_file(
    uri: str,
    step: str,
    *,
    inputs: Mapping[str, str | None] | None = None,
    same_as: bytes | None = None,
) -> None:
    """Check file output ``uri`` of ``step`` and mark it as ``step``'s before it is written.

    Allowed as :func:`check_output_location` allows it, and also an unmarked file whose bytes
    are exactly ``same_as`` (writing it changes nothing a person owns: the same demo table, the
    same compiled YAML). An existing marker of the same step is kept as it is, so re-writing a
    committed file (a golden YAML) leaves its marker unchanged.

    Raises:
        InputError: ``E_OUTPUT`` naming the path, if ``uri`` may not be written.
    """
    identical = (
        same_as is not None
        and storage.exists(uri)
        and not storage.is_dir(uri)
        and read_marker(uri, "file") is None
        and storage.read_bytes(uri) == same_as
    )
    if not identical:
        check_output_location(uri, step, inputs=inputs, kind="file")
    found = read_marker(uri, "file")
    if found is None or found["step"] != step:
        storage.write_json(marker_uri(uri, "file"), marker(step))


@contextmanager
def atomic_dir(
    uri: str, *, step: str, inputs: Mapping[str, str | None] | None = None
) -> Iterator[str]:
    """Build a folder output of ``step`` under a temporary sibling name, publish it on success.

    ``uri`` is checked first (:func:`check_output_location`) and again before publishing. The
    published folder holds the marker, so a retried step may replace it. Locally the old folder
    is renamed aside, the new one renamed in, then the old one deleted: readers see the old
    output or the new one, never a mix. On object stores (no rename) the new files are copied
    over the old ones, each replaced whole, and a failed copy puts the old output back
    (:func:`_publish_remote`). On an exception the temporary folder is deleted and the exception
    re-raised: a failed step leaves no output and never touches an existing one.

    Args:
        uri: Where the finished folder should appear.
        step: The producing step, recorded in the marker.
        inputs: The step's inputs by role (see :func:`check_output_location`).

    Yields:
        The URI of the temporary folder to write into (``<uri>.tmp-<random>``).

    Raises:
        InputError: ``E_OUTPUT`` naming the path, if ``uri`` may not be written.
    """
    check_output_location(uri, step, inputs=inputs)
    tmp = _sibling(uri, "tmp")
    storage.makedirs(tmp)
    try:
        yield tmp
        # The location may have changed while the step worked: check again before replacing.
        check_output_location(uri, step, inputs=inputs)
        if storage.local_path(uri) is not None:
            _publish_local(tmp, uri, step)
        else:
            _publish_remote(tmp, uri, step)
    except BaseException:
        storage.delete(tmp)
        raise


def _publish_local(tmp: str, uri: str, step: str) -> None:
    """Rename ``tmp`` (with its marker) to ``uri``; an earlier output of ours goes aside first."""
    storage.write_json(storage.join(tmp, OUTPUT_MARKER), marker(step))
    storage.fsync_dir(tmp)
    path, tmp_path = storage.local_path(uri), storage.local_path(tmp)
    assert path is not None and tmp_path is not None
    if os.path.isdir(path) and os.listdir(path):  # checked: our own earlier output
        aside = storage.local_path(_sibling(uri, "replaced"))
        assert aside is not None
        os.rename(path, aside)
        try:
            os.rename(tmp_path, path)
        except BaseException:
            os.rename(aside, path)
            raise
        storage.delete(aside)
    else:
        # Absent or an empty folder: rename(2) replaces an empty folder and refuses one that
        # gained files since the check (ENOTEMPTY), so nothing of anyone else's is lost.
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.replace(tmp_path, path)
    storage.fsync_dir(os.path.dirname(path))


def _publish_remote(tmp: str, uri: str, step: str) -> None:
    """Replace ``uri`` with the objects under ``tmp``; never half-done.

    An object store has no rename of a prefix, so the new files are copied over the old ones
    (each object is replaced whole: a reader of a file gets the old or the new one, never a
    part or nothing) and only then are old files that the new output lacks deleted. An earlier
    output is first copied aside; if the publish fails midway, it is put back as it was, so a
    failed step leaves the old output, or nothing where there was none.
    """
    new = [f for f in storage.list_files(tmp) if f != OUTPUT_MARKER]
    old = [f for f in storage.list_files(uri) if f != OUTPUT_MARKER]
    had_marker = storage.exists(marker_uri(uri))
    aside = _sibling(uri, "replaced") if old else None
    if aside is not None:
        storage.copy_tree(uri, aside)
    try:
        # The marker first: a publish cut off below leaves a location the retry may replace.
        storage.write_json(marker_uri(uri), marker(step))
        for name in new:
            storage.copy_tree(storage.join(tmp, name), storage.join(uri, name))
        for name in sorted(set(old) - set(new)):
            storage.delete(storage.join(uri, name))
    except BaseException:
        for name in sorted(set(new) - set(old)):
            storage.delete(storage.join(uri, name))
        if aside is not None:
            for name in old:
                storage.copy_tree(storage.join(aside, name), storage.join(uri, name))
        if not had_marker:
            storage.delete(marker_uri(uri))
        raise
    finally:
        if aside is not None:
            storage.delete(aside)
    storage.delete(tmp)


def _sibling(uri: str, suffix: str) -> str:
    """``<uri>.<suffix>-<random>``, keeping a ``file://`` scheme."""
    local = storage.local_path(uri)
    base = uri.rstrip("/") if local is None else local
    name = f"{base}.{suffix}-{secrets.token_hex(4)}"
    return f"file://{name}" if uri.startswith("file://") else name


def _split(uri: str) -> tuple[str, str]:
    """(parent URI, base name) of ``uri``."""
    local = storage.local_path(uri)
    if local is not None:
        return os.path.dirname(local), os.path.basename(local)
    parent, _, name = uri.rstrip("/").rpartition("/")
    return parent, name


def _shown(uri: str) -> str:
    """How a message names ``uri``: the absolute path of a local one, else the URI."""
    try:
        local = storage.local_path(uri)
    except ValueError:
        return uri
    return uri if local is None else local


def _key(uri: str) -> tuple[str, str] | None:
    """A comparable (store, path) for ``uri``; None if it is not a storage URI.

    Local paths are resolved through symlinks; ``minio://`` and ``s3://`` count as one store.
    """
    try:
        local = storage.local_path(uri)
    except ValueError:
        return None
    if local is not None:
        return "", os.path.realpath(local)
    scheme, _, rest = uri.partition("://")
    store = "s3" if scheme.lower() in ("s3", "minio") else scheme.lower()
    return store, "/" + rest.strip("/")


def _within(inner: str, outer: str) -> bool:
    """Whether path ``inner`` is ``outer`` or lies below it."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _overlap(uri: str, other: str) -> str | None:
    """How output ``uri`` collides with ``other`` (as words for a message), or None."""
    a, b = _key(uri), _key(other)
    if a is None or b is None or a[0] != b[0]:
        return None
    if a[1] == b[1]:
        return "is"
    if _within(a[1], b[1]):
        return "is inside"
    if _within(b[1], a[1]):
        return "contains"
    return None


def _special(uri: str) -> str | None:
    """Why ``uri`` can never be an output (as words for a message), or None."""
    local = storage.local_path(uri)
    if local is None:
        _, path = storage.resolve(uri)
        if "/" not in path:
            return "is a whole bucket: name a folder inside it"
        return None
    real = os.path.realpath(local)
    if os.path.dirname(real) == real:
        return "is the filesystem root"
    if os.path.islink(local):
        return f"is a symbolic link (to {real}): refusing to replace it"
    for place, name in (
        (os.getcwd(), "current working directory"),
        (os.path.expanduser("~"), "home directory"),
    ):
        place = os.path.realpath(place)
        if _within(place, real):
            return f"{'is' if place == real else 'contains'} the {name} {place}"
    ancestor = os.path.dirname(local)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return f"cannot be created: {ancestor} is a file"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be written: {ancestor} is not writable"
    return None
