"""A cheap content fingerprint of a preprocess input, for caches that key on names, not bytes.

KFP's cache (on a cluster and under kfp.local) keys a task on its parameters and its input
artifacts' names, so preprocess given the same ``data_uri`` is served from cache even when the
file behind it was replaced. The pipeline therefore computes this fingerprint in a step that is
never cached and hands it to preprocess as a parameter: changed data, a changed key.

The fingerprint of one file is a hash of its size, its modification time (nanoseconds where the
filesystem has them; an object's Last-Modified on S3 and GCS) and of sampled bytes: the first and
the last :data:`EDGE_BYTES` and :data:`SAMPLES` blocks of :data:`SAMPLE_BYTES` spread evenly
between them (a file of at most :data:`WHOLE_FILE_BYTES` is hashed whole). That reads at most
~3 MiB per file however large it is, so it costs milliseconds on a local disk and a few ranged
GETs on an object store. Any rewrite changes the mtime; the sampled bytes catch a copy that
kept the old mtime (``cp -p``, ``rsync -t``) unless it also kept the size and every sampled
byte. A folder's fingerprint covers each data file that preprocess would read, by name.

A Dataset artifact's local copy is fingerprinted without its modification time: KFP's launcher
downloads the artifact into each step's pod, so the time is the download's, another in the
fingerprint step's pod than in preprocess's. Its content is what counts, and KFP's cache keys a
step on the artifact itself anyway.
"""

from __future__ import annotations

import hashlib

import pyarrow.fs as pafs

from trainer.base import storage
from trainer.base.errors import InputError

FORMAT = "fp1"
"""Prefix of every fingerprint: a scheme change changes every key."""
EDGE_BYTES = 1 << 20
"""Bytes hashed at the start and at the end of each file."""
SAMPLE_BYTES = 64 << 10
"""Bytes of each block sampled between the two ends."""
SAMPLES = 16
"""Blocks sampled between the two ends."""
WHOLE_FILE_BYTES = 4 << 20
"""Files up to this size are hashed whole."""


def _file_info(uri: str) -> pafs.FileInfo:
    fs, path = storage.resolve(uri)
    return fs.get_file_info(path)


def _sampled_ranges(size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the bytes hashed in a file of ``size`` bytes."""
    if size <= WHOLE_FILE_BYTES:
        return [(0, size)]
    ranges = [(0, EDGE_BYTES)]
    inner_start, inner_end = EDGE_BYTES, size - EDGE_BYTES - SAMPLE_BYTES
    step = (inner_end - inner_start) / (SAMPLES - 1)
    ranges += [(inner_start + round(i * step), SAMPLE_BYTES) for i in range(SAMPLES)]
    ranges.append((size - EDGE_BYTES, EDGE_BYTES))
    return ranges


def file_fingerprint(uri: str, *, with_mtime: bool = True) -> str:
    """The fingerprint of one file (any storage URI): size, mtime and sampled bytes, hashed.

    Args:
        uri: The file.
        with_mtime: False: leave the modification time out (a downloaded copy's is the
            download's).

    Raises:
        FileNotFoundError: If the file does not exist.
        RuntimeError: If the object store fails.
    """
    info = _file_info(uri)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no such file: {uri}")
    size = int(info.size or 0)
    mtime = info.mtime_ns if with_mtime else "-"
    digest = hashlib.sha256(f"{FORMAT}|{size}|{mtime}|".encode())
    with storage.open_input(uri) as f:
        for offset, length in _sampled_ranges(size):
            f.seek(offset)
            digest.update(f.read(length))
    return digest.hexdigest()


def data_fingerprint(data_uri: str, *, artifact: bool = False) -> str:
    """The fingerprint of a dataset: one file, or every data file of a folder, by name.

    Args:
        data_uri: What preprocess reads (``data_uri``): a file or a folder (any storage URI).
        artifact: ``data_uri`` is the local copy of a Dataset artifact: its files' modification
            times are left out (see the module's docstring).

    Returns:
        ``fp1:<64 hex digits>``; it changes when any file's size, modification time or
        sampled bytes change, or when a data file is added to or removed from the folder.

    Raises:
        InputError: ``E_DATA`` for a dataset that is missing or unreadable (named).
    """
    from trainer.steps.preprocess.tabular import input_files

    files = input_files(data_uri)
    digest = hashlib.sha256(FORMAT.encode())
    for uri in files:
        try:
            part = file_fingerprint(uri, with_mtime=not artifact)
        except (OSError, RuntimeError) as e:
            raise InputError("E_DATA", f"cannot read the dataset file: {e}", uri) from e
        name = uri[len(data_uri) :].lstrip("/") if len(files) > 1 else ""
        digest.update(f"|{name}|{part}".encode())
    return f"{FORMAT}:{digest.hexdigest()}"
