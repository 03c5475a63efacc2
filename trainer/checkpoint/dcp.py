"""Sharded FSDP checkpoints: ``torch.distributed.checkpoint`` inside the usual step folders.

A sharded step folder is the :class:`~trainer.checkpoint.manager.CheckpointManager`'s
``step-<n>/`` with more files: each rank writes its shard of the model and the optimizer state
(``__<rank>_0.distcp``), rank 0 the DCP ``.metadata`` and the usual ``state.pt`` (loop state,
scheduler, RNG, data position). Every file is listed with its size and sha256 in
``COMPLETE.json``, so the manager's guarantees carry over unchanged: the folder is written as
``step-<n>.tmp/`` and renamed when complete, a truncated or altered shard fails verification
and the step is skipped with a warning naming the file (and quarantined), keep-last-k prunes.

Loading never runs code from a checkpoint: DCP's ``.metadata`` is unpickled by an unpickler
that admits only DCP's own metadata classes, and its non-tensor items go through
``torch.load(weights_only=True)`` (DCP's defaults are ``pickle.load`` and ``weights_only=False``).
DCP reshards on load, so a run may resume on a different world size.

Object stores (``s3://`` ...) are reached through a local staging folder per rank: each rank
uploads the files it wrote, and downloads the step's files before reading.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed.checkpoint as tdcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from trainer.base import storage
from trainer.checkpoint.files import STATE_FILE, CorruptCheckpointError, file_entry
from trainer.checkpoint.manager import CheckpointManager
from trainer.distributed import dist
from trainer.distributed.dist import DistContext

log = logging.getLogger(__name__)

METADATA_FILE = ".metadata"

# What a DCP .metadata pickle may name (checked on torch 2.13): DCP's metadata dataclasses, its
# file-layout record, and torch's plain value types. Anything else is refused.
_DCP_MODULES = ("torch.distributed.checkpoint.metadata",)
_ALLOWED_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata only: no global outside the short list above."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            (module in _DCP_MODULES and isinstance(getattr(sys.modules[module], name, None), type))
            or (module, name) in _ALLOWED_GLOBALS
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"refused global {module}.{name} in DCP metadata")
        return super().find_class(module, name)


class _SafeReader(FileSystemReader):
    """DCP's file reader with a restricted unpickler for ``.metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{METADATA_FILE} holds a {type(metadata).__name__}")
        meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        meta.load_id = self.load_id
        metadata.storage_meta = meta
        return metadata


class _SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading non-tensor items with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def _shard_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, *, with_optimizer: bool
) -> dict[str, Any]:
    """The sharded state DCP reads or writes. An optimizer that has never stepped is left out:
    DCP's template would otherwise initialise it with a zero-gradient step (AdamW's step 1)."""
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if with_optimizer:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    return state


@contextmanager
def _local_folder(uri: str) -> Iterator[tuple[str, bool]]:
    """``(path, staged)``: ``uri``'s own path, or a fresh local folder removed afterwards."""
    local = storage.local_path(uri)
    if local is not None:
        yield local, False
        return
    staging = tempfile.mkdtemp(prefix="gpupipe-dcp-")
    try:
        yield staging, True
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _why(error: CheckpointException) -> str:
    """The line of DCP's multi-rank report that says what was wrong."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    for line in lines:
        if "refused global" in line:
            return "its DCP " + line[line.index("refused global") :].split(";")[0]
    return f"DCP could not read it: {lines[-1][:300] if lines else type(error).__name__}"


def _download(uri: str, folder: str) -> None:
    """Copy a remote step folder's DCP files into a local staging folder."""
    for name in storage.list_dir(uri):
        if name != STATE_FILE:
            with open(os.path.join(folder, name), "wb") as f:
                f.write(storage.read_bytes(storage.join(uri, name)))


def _own_files(folder: str, ctx: DistContext) -> list[str]:
    """The files this rank wrote into a DCP folder (its shards; rank 0 also the metadata)."""
    names = sorted(n for n in os.listdir(folder) if n.startswith(f"__{ctx.rank}_"))
    if ctx.is_main:
        names.append(METADATA_FILE)
    return names


def save_sharded(
    mgr: CheckpointManager,
    ctx: DistContext,
    step: int,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any] | None,
) -> str | None:
    """Write checkpoint ``step``: every rank its shard, rank 0 ``state.pt`` and the marker.

    A collective: every rank calls it. ``state`` (rank 0's, ``None`` elsewhere) gets the key
    ``sharded_optimizer`` recorded so that loading knows what the shards hold.

    Returns:
        The complete step folder's URI on rank 0, ``None`` elsewhere.
    """
    started = time.monotonic()
    tmp = mgr.begin(step) if ctx.is_main else None
    tmp = dist.broadcast_object(ctx, tmp)
    with_optimizer = bool(optimizer.state)
    shards = _shard_state(model, optimizer, with_optimizer=with_optimizer)
    with _local_folder(tmp) as (folder, staged):
        tdcp.save(shards, storage_writer=FileSystemWriter(folder, sync_files=True))
        entries: dict[str, dict[str, Any]] = {}
        for name in _own_files(folder, ctx):
            if staged:
                with open(os.path.join(folder, name), "rb") as f:
                    storage.write_bytes(storage.join(tmp, name), f.read())
            entries[name] = file_entry(storage.join(tmp, name))
    gathered = dist.all_gather_object(ctx, entries)
    uri = None
    if ctx.is_main:
        assert state is not None
        files = {name: entry for part in gathered for name, entry in part.items()}
        state = {**state, "sharded_optimizer": with_optimizer}
        uri = mgr.commit(step, state, files=files, started=started)
    dist.control_barrier(ctx)
    return uri


def load_sharded(
    mgr: CheckpointManager,
    ctx: DistContext,
    step: int,
    payload: dict[str, Any],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> None:
    """Read the shards of verified checkpoint ``step`` into ``model`` and ``optimizer``.

    A collective: every rank calls it after the step folder was verified. DCP reshards, so the
    checkpoint may come from another world size.
    """
    with_optimizer = bool(payload.get("sharded_optimizer"))
    uri = storage.join(mgr.root, f"step-{step:08d}")
    shards = _shard_state(model, optimizer, with_optimizer=with_optimizer)
    with _local_folder(uri) as (folder, staged):
        if staged:
            _download(uri, folder)
        try:
            tdcp.load(shards, storage_reader=_SafeReader(folder), planner=_SafePlanner())
        except CheckpointException as e:
            raise CorruptCheckpointError(uri, _why(e)) from e
    set_model_state_dict(model, shards["model"])
    if with_optimizer:
        set_optimizer_state_dict(model, optimizer, shards["optim"])
    else:
        optimizer.state.clear()  # the checkpoint's optimizer had not stepped yet


def read_model_state(step_uri: str, model: nn.Module) -> nn.Module:
    """Load the model weights of a sharded checkpoint into a plain model, in one process.

    For looking into a checkpoint (or exporting from it) without starting the job: DCP reads
    every shard and reassembles the full tensors. The step folder is not verified here; use it
    on a folder :class:`trainer.checkpoint.manager.CheckpointManager` lists as complete.

    Args:
        step_uri: A ``step-<n>/`` folder written by :func:`save_sharded`.
        model: A freshly built, unsharded model of the same architecture.

    Returns:
        ``model``, with the checkpoint's weights.
    """
    state = {"model": model.state_dict()}
    with _local_folder(step_uri) as (folder, staged):
        if staged:
            _download(step_uri, folder)
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            tdcp.load(
                state, storage_reader=_SafeReader(folder), planner=_SafePlanner(), no_dist=True
            )
    model.load_state_dict(state["model"])
    return model
