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


def _raise(what: str, name: str, limit: int, needed: int, advice: str, uri: str) -> None:
    """The ``E_DATA`` line; the setting it suggests is at least what this input ``needed`` (a
    doubled limit alone could still be too small: 41 columns over a limit of 20)."""
    setting = f'preprocess_config_json {{"{name}": {max(limit * 2, needed)}}}'
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
            columns,
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
            size * 2 if so_far else size,  # read only so far: the whole is larger
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
            features,
            "lower max_categories, or drop wide categorical columns with column_roles_json",
            uri,
        )


def _row_width(schema: pa.Schema) -> float:
    """The fewest bytes a row of ``schema`` takes in Arrow: each fixed-width column's width, a
    variable-width one's offset (its values' bytes come on top), a dictionary's index."""
    width = 0.0
    for field in schema:
        t = field.type.index_type if pa.types.is_dictionary(field.type) else field.type
        try:
            width += t.bit_width / 8
        except ValueError:  # not fixed-width: an offset a value, 8 bytes for the large types
            large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
            width += 8 if large or pa.types.is_large_list(t) else 4
    return width


def parquet_bytes(files: list[str]) -> int:
    """What the Parquet files among ``files`` take once read, from their footers: each row
    group's uncompressed pages, or its rows times the columns' widths where that is more (a
    dictionary- or run-length-encoded column of repeated values takes bytes on disk and
    gigabytes in memory: 15 KB of Parquet was 15 MB of Arrow, a Parquet bomb)."""
    total = 0
    for uri in files:
        with storage.open_input(uri) as f:
            if f.read(4) != b"PAR1":
                continue
        try:
            with storage.open_input(uri) as f:
                pf = pq.ParquetFile(f)
                meta, width = pf.metadata, _row_width(pf.schema_arrow)
                for i in range(meta.num_row_groups):
                    group = meta.row_group(i)
                    total += max(group.total_byte_size, int(group.num_rows * width))
        except (pa.ArrowException, OSError):
            continue  # the reader names an unreadable file
    return total
