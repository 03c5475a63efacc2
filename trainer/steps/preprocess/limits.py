"""How big an input preprocess takes: ``max_input_bytes``, ``max_columns`` and ``max_features``
(:class:`~trainer.steps.preprocess.config.PreprocessConfig`). Checked from metadata and the
header before any work where they can be, counted while reading where they cannot (a CSV's
parsed size), each past its limit one ``E_DATA`` line naming the limit and how to raise it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from trainer.base import storage
from trainer.base.errors import InputError


class InputTooLarge(Exception):
    """A file grew past what the in-memory path may hold while it was read (a compressed file
    larger than its name promised): preprocess reads it in record batches instead."""


def _raise(what: str, name: str, limit: int, advice: str, uri: str) -> None:
    setting = f'preprocess_config_json {{"{name}": {limit * 2}}}'
    raise InputError(
        "E_DATA", f"{what}, over {name} {limit}: {advice}, or raise it ({setting})", uri
    )


def check_columns(columns: int, limit: int, uri: str) -> None:
    """Refuse more than ``limit`` columns (``max_columns``; from the footer or the header)."""
    if columns > limit:
        _raise(
            f"the dataset has {columns} columns",
            "max_columns",
            limit,
            "leave out the columns the model does not need",
            uri,
        )


def check_input_bytes(size: int, limit: int, uri: str, *, so_far: bool = False) -> None:
    """Refuse an input larger than ``limit`` (``max_input_bytes``) once parsed (``so_far``:
    counted while reading, the rest not read)."""
    if size > limit:
        what = f"{'reading it reached' if so_far else 'the dataset takes'} {size} bytes parsed"
        _raise(
            what,
            "max_input_bytes",
            limit,
            "check that the file is what you meant (a small compressed file of repeated rows "
            "expands without bound)",
            uri,
        )


def check_features(features: int, limit: int, uri: str) -> None:
    """Refuse an encoded width over ``limit`` (``max_features``) before any split is written."""
    if features > limit:
        _raise(
            f"encoding makes {features} features (numeric columns, missing indicators and "
            "one-hot categories)",
            "max_features",
            limit,
            "lower max_categories, or drop wide categorical columns with column_roles_json",
            uri,
        )


def parquet_bytes(files: list[str]) -> int:
    """The uncompressed size of the Parquet files among ``files``, from their footers."""
    total = 0
    for uri in files:
        with storage.open_input(uri) as f:
            if f.read(4) != b"PAR1":
                continue
        try:
            with storage.open_input(uri) as f:
                meta = pq.ParquetFile(f).metadata
                total += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        except (pa.ArrowException, OSError):
            continue  # the reader names an unreadable file
    return total
