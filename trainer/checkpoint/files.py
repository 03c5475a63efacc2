"""What one ``step-<n>/`` checkpoint folder holds on disk, and how it is checked.

``state.pt`` (``torch.save`` of plain values and tensors, refused at save time if
``torch.load(weights_only=True)`` could not read it back), other files a sharded save adds, and
``COMPLETE.json``: the format, the step, and the size and sha256 of every file. Reading a folder
verifies all of it before unpickling ``state.pt`` with ``weights_only=True``, so a checkpoint can
never run code. The life cycle of the folders (write, rename, prune, quarantine) is
:class:`trainer.checkpoint.manager.CheckpointManager`'s.
"""

from __future__ import annotations

import collections
import hashlib
import io
import os
import pickle
import re
from typing import Any

import torch

from trainer.base import storage

FORMAT = 1
"""Version of the on-disk layout, recorded in every completion marker."""
STATE_FILE = "state.pt"
MARKER_FILE = "COMPLETE.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")

# What a state.pt that passed its checksum can still raise from torch.load: a refused global
# (UnpicklingError) or a malformed archive or pickle. OSError is deliberately absent: an I/O
# failure says nothing about the checkpoint and must not get a good one quarantined.
_LOAD_ERRORS = (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError, IndexError)

# Exact types that torch.load(weights_only=True) accepts by default (checked on torch 2.13).
# Exact, not isinstance: subclasses such as defaultdict or namedtuples pickle a class reference
# and are refused.
_SAFE_LEAVES: frozenset[type] = frozenset(
    {str, bytes, bytearray, int, float, bool, complex, type(None), torch.Size, torch.dtype}
    | {torch.device, torch.Tensor, torch.nn.Parameter}
)
_SAFE_CONTAINERS: frozenset[type] = frozenset(
    {dict, collections.OrderedDict, collections.Counter, list, tuple, set}
)


class CorruptCheckpointError(ValueError):
    """A checkpoint directory that is incomplete, fails its checksums or cannot be loaded safely."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"checkpoint {uri} is unusable: {reason}")
        self.uri = uri
        self.reason = reason


def read_verified(uri: str, step: int) -> dict[str, Any]:
    """Check marker, sizes and sha256 of ``name``, then load its state with weights_only."""
    marker_uri = storage.join(uri, MARKER_FILE)
    if not storage.exists(marker_uri):
        raise CorruptCheckpointError(uri, f"no {MARKER_FILE} (incomplete save)")
    try:
        marker = storage.read_json(marker_uri)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CorruptCheckpointError(uri, f"{MARKER_FILE} is not valid JSON ({e})") from e
    files = check_marker(uri, marker, step)

    # Local files are hashed and loaded in place; remote ones are read once into memory.
    state_source: str | io.BytesIO | None = None
    for file_name, expected in files.items():
        file_uri = storage.join(uri, file_name)
        local = local_file(file_uri)
        try:
            if local is not None:
                digest, size = hash_file(local)
                source: str | io.BytesIO = local
            else:
                data = storage.read_bytes(file_uri)
                digest, size = hashlib.sha256(data).hexdigest(), len(data)
                source = io.BytesIO(data)
        except FileNotFoundError as e:
            raise CorruptCheckpointError(uri, f"{file_name} is missing") from e
        if size != expected["bytes"]:
            raise CorruptCheckpointError(
                uri, f"{file_name} has {size} bytes, {MARKER_FILE} says {expected['bytes']}"
            )
        if digest != expected["sha256"]:
            raise CorruptCheckpointError(uri, f"{file_name} fails its sha256 checksum")
        if file_name == STATE_FILE:
            state_source = source
    assert state_source is not None  # check_marker guarantees STATE_FILE is listed
    try:
        state = torch.load(state_source, map_location="cpu", weights_only=True)
    except _LOAD_ERRORS as e:
        raise CorruptCheckpointError(
            uri, f"{STATE_FILE} cannot be loaded with weights_only=True: {_why(e)}"
        ) from e
    if not isinstance(state, dict):
        raise CorruptCheckpointError(
            uri, f"{STATE_FILE} holds a {type(state).__name__}, expected a dict"
        )
    return state


def local_file(uri: str) -> str | None:
    """The OS path of a local ``uri``; None for object stores, which get whole-buffer I/O."""
    return storage.local_path(uri)


def check_loadable(value: Any, path: str) -> None:
    """Raise ValueError naming the first value under ``path`` that weights_only would refuse.

    Catching it here fails the save, loudly and at once, instead of the resume hours later.
    """
    kind = type(value)
    if kind in _SAFE_LEAVES or kind in torch.serialization.get_safe_globals():
        return
    if kind not in _SAFE_CONTAINERS:
        raise ValueError(
            f"{path} is a {kind.__module__}.{kind.__qualname__}, which"
            " torch.load(weights_only=True) refuses; store tensors or plain Python values"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            check_loadable(key, f"{path} key {key!r}")
            check_loadable(item, f"{path}[{key!r}]")
    else:
        for index, item in enumerate(value):
            check_loadable(item, f"{path}[{index}]")


def write_state(uri: str, state: dict[str, Any]) -> dict[str, Any]:
    """torch.save ``state`` to ``uri`` durably; return its ``{"sha256", "bytes"}`` entry."""
    local = local_file(uri)
    if local is None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        storage.write_bytes(uri, data)
        return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    torch.save(state, local)
    fd = os.open(local, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    digest, size = hash_file(local)
    return {"sha256": digest, "bytes": size}


def file_entry(uri: str) -> dict[str, Any]:
    """The ``{"sha256", "bytes"}`` marker entry of a file already written at ``uri``."""
    local = local_file(uri)
    if local is not None:
        digest, size = hash_file(local)
    else:
        data = storage.read_bytes(uri)
        digest, size = hashlib.sha256(data).hexdigest(), len(data)
    return {"sha256": digest, "bytes": size}


def hash_file(path: str) -> tuple[str, int]:
    """Return the sha256 hex digest and size of a local file, reading it in chunks."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        size = os.fstat(f.fileno()).st_size
    return digest, size


def check_marker(uri: str, marker: Any, step: int) -> dict[str, dict[str, Any]]:
    """Validate a parsed ``COMPLETE.json``; return its ``files`` table."""
    if not isinstance(marker, dict):
        raise CorruptCheckpointError(uri, f"{MARKER_FILE} is not a JSON object")
    if marker.get("format") != FORMAT:
        raise CorruptCheckpointError(
            uri, f"{MARKER_FILE} has format {marker.get('format')!r}, expected {FORMAT}"
        )
    if marker.get("step") != step or isinstance(marker.get("step"), bool):
        raise CorruptCheckpointError(
            uri, f"{MARKER_FILE} is for step {marker.get('step')!r}, not {step}"
        )
    files = marker.get("files")
    if not isinstance(files, dict) or STATE_FILE not in files:
        raise CorruptCheckpointError(uri, f"{MARKER_FILE} does not list {STATE_FILE}")
    for file_name, entry in files.items():
        ok_name = isinstance(file_name, str) and file_name == os.path.basename(file_name)
        ok_entry = (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and _SHA256.fullmatch(entry["sha256"]) is not None
            and type(entry.get("bytes")) is int
            and entry["bytes"] >= 0
        )
        if not (ok_name and ok_entry and file_name not in ("", ".", "..")):
            raise CorruptCheckpointError(uri, f"{MARKER_FILE} has a bad entry for {file_name!r}")
    return files


def _why(error: BaseException) -> str:
    """Shorten torch.load's error to the line that says what was wrong, without the boilerplate."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip()
        if "GLOBAL" in line:  # "Trying to load unsupported GLOBAL posix.mkdir whose module ..."
            return line
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"
