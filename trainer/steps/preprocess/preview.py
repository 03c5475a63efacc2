"""What preprocess will decide about a dataset, found before any step runs.

``gpupipe run --local`` calls :func:`inspect_data` before it starts the pipeline, so the task
(and why), a target that cannot work, date columns (which become numbers) and numbers with the
other decimal separator are said at once, not after minutes of steps. The target column is read
whole (its every value decides the task and the split); the feature columns from the first
:data:`SAMPLE_ROWS` rows of the first file, for what a sample can show for certain.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.steps.preprocess.column_checks import DATE_PARTS, date_features
from trainer.steps.preprocess.columns import _comma_numbers_notice, target_column
from trainer.steps.preprocess.config import PreprocessConfig
from trainer.steps.preprocess.source import partition_values
from trainer.steps.preprocess.splits import check_splits
from trainer.steps.preprocess.tabular import (
    COMPRESSED_SUFFIXES,
    HEAD_BYTES,
    RawInput,
    _check_unique_names,
    _parse_csv,
    _read_file,
    dictionary_codes,
    dtype_name,
    input_files,
    is_text,
    readable_types,
    split_indices,
    text_head,
)
from trainer.steps.preprocess.text_values import Notice, is_temporal, looks_like_dates

SAMPLE_ROWS = 10_000
"""Rows of the first file whose feature columns are inspected."""


CHECK_ROWS = 1_000_000
"""Rows whose target the check reads, the first ones: its verdicts on a larger table are those
of its first rows (preprocess itself reads them all). Bounds the check's memory and time."""


def _target_head(uri: str, cfg: PreprocessConfig, rows: int) -> tuple[pa.Table, bool]:
    """The target column of the first ``rows`` rows of one file, read incrementally, and
    whether the file is CSV. A CSV that the incremental reader cannot parse is read whole, as
    preprocess reads it, for preprocess's own message."""
    csv = cfg.csv_options()
    limit = rows
    with storage.open_input(uri) as f:
        magic = f.read(4)
        if magic == b"PAR1":
            pf = pq.ParquetFile(storage.local_path(uri) or f, pre_buffer=False)
            _check_unique_names(pf.schema_arrow.names, uri)
            if cfg.target not in pf.schema_arrow.names:
                return pf.schema_arrow.empty_table(), False  # names the columns in the refusal
            batches = []
            for batch in pf.iter_batches(batch_size=min(rows, 1 << 16), columns=[cfg.target]):
                batches.append(batch)
                rows -= batch.num_rows
                if rows <= 0:
                    break
            table = pa.Table.from_batches(batches, schema=pf.schema_arrow.empty_table().select(
                [cfg.target]).schema)  # fmt: skip
            return readable_types(table).slice(0, limit), False
    gzip_named_plain = magic[:2] == b"\x1f\x8b" and not uri.lower().endswith(COMPRESSED_SUFFIXES)
    if csv.header:
        try:
            return _csv_target_head(uri, cfg, rows, gzip_named_plain).slice(0, limit), True
        except (pa.ArrowException, UnicodeDecodeError):
            pass  # read whole below, for the message preprocess gives
    table = _read_file(uri, storage.read_bytes(uri), csv)[0]
    if cfg.target in table.column_names:
        table = table.select([cfg.target])
    return table.slice(0, rows), True


def _csv_target_head(uri: str, cfg: PreprocessConfig, rows: int, gzipped: bool) -> pa.Table:
    with storage.open_input(uri) as f:
        head = text_head(uri, f.read(HEAD_BYTES))
    csv = cfg.csv_options().for_head(uri, head[:65536])  # ";" and decimal commas, as read
    null_values = [*pacsv.ConvertOptions().null_values, *csv.null_values]
    with storage.open_input_stream(uri) as raw:
        stream = pa.CompressedInputStream(raw, "gzip") if gzipped else raw
        reader = pacsv.open_csv(
            stream,
            read_options=pacsv.ReadOptions(encoding=csv.encoding, block_size=1 << 20),
            parse_options=pacsv.ParseOptions(delimiter=csv.delimiter_for(uri)),
            convert_options=pacsv.ConvertOptions(
                strings_can_be_null=True,
                null_values=null_values,
                check_utf8=True,
                decimal_point=csv.decimal,
                include_columns=[cfg.target],
            ),
        )
        batches = []
        for batch in reader:
            batches.append(batch)
            rows -= batch.num_rows
            if rows <= 0:
                break
        return pa.Table.from_batches(batches, schema=reader.schema)


def _target_table(
    data_uri: str, files: list[str], cfg: PreprocessConfig
) -> tuple[pa.Table, list[bool]]:
    """The target column of the first :data:`CHECK_ROWS` rows, concatenated, read as
    preprocess reads it (a Hive folder's partition keys are columns too)."""
    chunks, is_csv = [], []
    left = CHECK_ROWS
    for uri in files:
        if left <= 0:
            break
        parts = partition_values(data_uri, uri)
        if cfg.target in parts:  # a Hive partition key: one value per file
            with storage.open_input(uri) as f:
                n = pq.ParquetFile(f).metadata.num_rows
            table = pa.table({cfg.target: pa.array([parts[cfg.target]] * min(n, left))})
            text = False
        else:
            table, text = _target_head(uri, cfg, left)
        chunks.append(table)
        is_csv.append(text)
        left -= table.num_rows
    if any(cfg.target not in t.column_names for t in chunks):
        return chunks[0], is_csv  # target_column names the missing target and the columns
    types = {t.schema.types[0] for t in chunks}
    if len(types) > 1:
        chunks = [t.cast(pa.schema([(cfg.target, pa.string())])) for t in chunks]
    return pa.concat_tables(chunks), is_csv


def _sample(uri: str, cfg: PreprocessConfig) -> pa.Table:
    """The first rows of one file (a Parquet file's first batch; a CSV file's first MiB)."""
    with storage.open_input(uri) as f:
        head = f.read(HEAD_BYTES)
        if head[:4] == b"PAR1":
            with pq.ParquetFile(storage.local_path(uri) or f) as pf:
                batches = pf.iter_batches(batch_size=SAMPLE_ROWS)
                try:  # closed here, not left to the garbage collector at exit
                    first = next(batches, None)
                finally:
                    batches.close()
                table = (
                    pf.schema_arrow.empty_table()
                    if first is None
                    else pa.Table.from_batches([first])
                )
            return readable_types(table)
    head = text_head(uri, head)
    csv = cfg.csv_options().for_head(uri, head[:65536])
    return _parse_csv(head, csv, csv.delimiter_for(uri))


def inspect_data(data_uri: str, cfg: PreprocessConfig) -> list[Notice]:
    """What preprocess will decide about ``data_uri``: notes and warnings, or a refusal.

    Returns:
        The task decision (``I_TASK``) and warnings (``W_TASK``, ``W_TARGET``, ``W_DECIMAL``,
        ``W_TEST_SPLIT``) and date columns (``I_DATE``), in that order.

    Raises:
        InputError: What preprocess would refuse: a target that cannot work (missing values,
            one class, numbers written as text), a split it cannot make.
    """
    files = input_files(data_uri)
    try:
        target, is_csv = _target_table(data_uri, files, cfg)
    except (OSError, RuntimeError, pa.ArrowException) as e:
        raise InputError("E_DATA", f"cannot read the data: {e}", data_uri) from None
    # One file's bookkeeping for all rows: the messages name the dataset, not a row's file.
    raw = RawInput(data_uri, target, files[:1], np.array([0, target.num_rows]), is_csv, "")
    notes: list[Notice] = []
    if target.num_rows == 0:
        shown = ", ".join(map(repr, _sample(files[0], cfg).column_names[:20]))
        raise InputError(
            "E_EMPTY",
            f"dataset has no rows, only the columns ({shown})",
            data_uri,
        )
    y, _, classes = target_column(raw, cfg, notes)
    n = len(y)
    train, val, test = split_indices(
        n,
        classes=y if classes is not None else None,
        val_fraction=cfg.val_fraction,
        test_fraction=cfg.test_fraction,
        seed=cfg.seed,
    )
    check_splits(raw, cfg, y, classes, train, val, test)
    # Imported here: the evaluate package imports torch, which reading a table does not need.
    from trainer.steps.evaluate import MIN_GATE_ROWS

    if test.size < MIN_GATE_ROWS:
        notes.append(
            Notice(
                "W_TEST_SPLIT",
                f"the test split will have {test.size} rows (test_fraction {cfg.test_fraction} "
                f"of {n}), fewer than the {MIN_GATE_ROWS} a score needs to mean anything: the "
                "model will be trained and scored but not gated or registered",
                data_uri,
            )
        )
    sample = _sample(files[0], cfg)
    sample_raw = RawInput(data_uri, sample, files[:1], np.array([0, sample.num_rows]), is_csv, "")
    for name in sample.column_names:
        role = cfg.column_roles.get(name)
        if name == cfg.target or role in ("drop", "categorical", "numeric"):
            continue
        col = sample.column(name)
        example = f"type {dtype_name(col.type)}" if is_temporal(col.type) else None
        if is_text(col.type):
            _, values = dictionary_codes(col)
            if (value := looks_like_dates(values)) is not None:
                example = repr(value)
            elif role is None:
                _comma_numbers_notice(sample_raw, cfg, name, values, notes)
        if example is not None:
            # The parts preprocess makes: DATE_PARTS, and hour when a value has a time of day
            # (time-zone-aware timestamps included).
            parts = list(DATE_PARTS)
            if "hour" in (date_features(col) or {}):
                parts.append("hour")
            notes.append(
                Notice(
                    "I_DATE",
                    f"column {name!r} holds dates ({example}): it becomes the numbers "
                    f"{', '.join(f'{name}__{p}' for p in parts)}",
                    data_uri,
                )
            )
    return notes
