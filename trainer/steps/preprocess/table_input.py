"""Which of its two inputs gives a step the table: a Dataset artifact or a URI, exactly one.

A KFP user's own step writes the table as an ``Output[Dataset]`` and hands it on: KFP's launcher
brings the artifact into the next step's pod as a local file or folder, so preprocess (and
fingerprint) read it with no store credentials at all. The other way, ``data_uri``, names a table
in a store that the step reads itself. Such a local copy may have no extension (a user's
component writes to ``data.path`` as KFP names it), so a file is told by its first bytes
(Parquet's ``PAR1``, else CSV text), and one that is neither is refused before any parse.
"""

from __future__ import annotations

import os

from trainer.base.errors import InputError
from trainer.steps.preprocess.file_kind import COMPRESSED_SUFFIXES, kind_of

ARTIFACT = "data"
"""The name of the Dataset artifact input of the preprocess and fingerprint components."""
URI = "data_uri"
"""The name of their URI input."""
_SNIFF_BYTES = 4096
_PARQUET = b"PAR1"
_GZIP = b"\x1f\x8b"
"""The one compression the reader tells by its bytes (bzip2 and zstd only by the name)."""
_FIX = "write it with df.to_parquet(path) or df.to_csv(path, index=False)"


def table_location(data_path: str | None, data_uri: str) -> str:
    """The table to read: the artifact's local path or ``data_uri``, whichever was given.

    Args:
        data_path: The local path of the Dataset artifact input (``data.path``); None when the
            step was given none.
        data_uri: The URI input; empty when not given.

    Returns:
        ``data_path`` (after :func:`check_artifact`) or ``data_uri``.

    Raises:
        InputError: ``E_PARAM`` when both or neither are given; ``E_DATA`` for an artifact that
            is neither Parquet nor CSV text.
    """
    given = data_path is not None
    if given and data_uri:
        raise InputError(
            "E_PARAM",
            f"give the table once: the Dataset artifact input {ARTIFACT!r} or {URI}, not both",
            URI,
        )
    if not given and not data_uri:
        raise InputError(
            "E_PARAM",
            f"no table: give the Dataset artifact input {ARTIFACT!r} (an upstream step's "
            f"output) or {URI} (a file or folder in a store)",
            URI,
        )
    if given:
        assert data_path is not None
        check_artifact(data_path)
        return data_path
    return data_uri


def check_artifact(path: str) -> None:
    """Refuse a Dataset artifact that preprocess cannot read as a table, in one line.

    A folder is read as a ``data_uri`` folder is (its ``.parquet``/``.csv`` files). A file is
    Parquet by its magic bytes whatever its name, gzip-compressed text, or CSV text; a file of
    another kind (a pickle, a NumPy array, any other binary) is refused here, not after a CSV
    parse. A name that says it is compressed (``table.csv.zst``) is left to the reader.

    Raises:
        InputError: ``E_DATA`` naming the artifact's path: missing, or a file of an unknown kind.
    """
    where = f"input artifact {ARTIFACT}: {path}"
    if not os.path.exists(path):
        raise InputError(
            "E_DATA",
            "the Dataset artifact has no file or folder: the upstream step wrote nothing to its "
            "output's path",
            where,
        )
    if os.path.isdir(path) or path.lower().endswith(COMPRESSED_SUFFIXES):
        return
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    if head.startswith((_PARQUET, _GZIP)) or kind_of(head) is not None:
        # Parquet; gzip-compressed text; or a kind the CSV reader names itself (a workbook, JSON).
        return
    if b"\x00" in head or not _is_text(head):
        raise InputError(
            "E_DATA",
            f"the Dataset artifact is neither Parquet nor CSV text (it starts with bytes "
            f"{head[:8].hex(' ')}): {_FIX}",
            where,
        )


def _is_text(head: bytes) -> bool:
    """Whether ``head`` reads as text in some single-byte-safe way: valid UTF-8 (a character cut
    at the end allowed), or mostly printable bytes (latin-1 and cp1252 CSVs)."""
    try:
        head.decode("utf-8")
        return True
    except UnicodeDecodeError as e:
        if e.start >= len(head) - 3 and e.reason == "unexpected end of data":
            return True
    printable = sum(1 for b in head if b >= 0x20 or b in (0x09, 0x0A, 0x0D))
    return printable >= 0.95 * len(head)
