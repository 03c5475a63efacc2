"""A dataset read as record batches in bounded memory: Parquet files (a folder of them, or a
Hive-partitioned ``key=value/`` layout) row group by row group, CSV files (plain or compressed)
block by block.

CSV files are parsed once, incrementally, into a spill of Parquet files in a local temporary
folder, so the passes that follow read columns, not text. Rows come out in the order the
in-memory reader (:func:`trainer.steps.preprocess.tabular.read_input`) concatenates them: files
sorted by name, each file's rows in order.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.steps.preprocess.file_kind import refuse_non_csv
from trainer.steps.preprocess.limits import check_input_bytes
from trainer.steps.preprocess.tabular import (
    COMPRESSED_SUFFIXES,
    HEAD_BYTES,
    PARQUET_SUFFIXES,
    CsvOptions,
    RawInput,
    _check_unique_names,
    _common_type,
    dtype_name,
    input_files,
    readable_types,
    text_head,
    types_disagree,
)

HASH_CHUNK = 8 << 20
"""Bytes read at a time when hashing the input files."""
_PARTITION_RE = re.compile(r"^([^=/]+)=([^/]*)$")
_CSV_COLUMN_RE = re.compile(r"In CSV column #(\d+)")


def partition_values(data_uri: str, uri: str) -> dict[str, str]:
    """The ``key=value`` folders between ``data_uri`` and file ``uri`` (Hive partitioning)."""
    rel = uri[len(data_uri.rstrip("/")) + 1 :] if uri != data_uri else ""
    out: dict[str, str] = {}
    for part in rel.split("/")[:-1]:
        m = _PARTITION_RE.match(part)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _partition_type(values: list[str]) -> pa.DataType:
    """int64 if every value of a partition key reads as an integer, else text (as pyarrow's
    Hive discovery does, but in 64 bits)."""
    return pa.int64() if all(re.fullmatch(r"-?\d+", v) for v in values) else pa.string()


def _is_parquet(uri: str) -> bool:
    with storage.open_input(uri) as f:
        return bool(f.read(4) == b"PAR1")


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One input file as opening it found it: what the processes that read other files need."""

    is_csv: bool
    schema: pa.Schema
    rows: int


@dataclass(slots=True)
class BatchSource:
    """The rows of a dataset, as record batches, over as many passes as a caller needs.

    Call :meth:`close` (or use it as a context manager) to remove a CSV spill.
    """

    uri: str
    files: list[str]
    """The input files as the user named them (for messages)."""
    is_csv: list[bool]
    schema: pa.Schema
    offsets: np.ndarray
    """First row of each file, plus the total."""
    csv_header: bool = True
    first_file: int = 0
    """Index of the first file this source reads (see :attr:`read_files`)."""
    scanned: list[FileInfo] = field(default_factory=list)
    """What opening found of each file read."""
    _parquet: list[str] = field(default_factory=list)
    """The Parquet file read for each input file (itself, or its CSV spill)."""
    _partitions: list[dict[str, str]] = field(default_factory=list)
    _spill: str | None = None

    @property
    def num_rows(self) -> int:
        """Rows in the dataset."""
        return int(self.offsets[-1])

    def __enter__(self) -> BatchSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the CSV spill, if there is one."""
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)
            self._spill = None

    def raw_input(self, table: pa.Table, start: int = 0) -> RawInput:
        """A :class:`RawInput` over ``table``, rows ``start..``, whose ``locate`` names the file
        and line of the whole dataset (so the in-memory checks report real rows)."""
        return RawInput(
            self.uri,
            table,
            self.files,
            self.offsets - start,
            self.is_csv,
            "",
            self.csv_header,
        )

    def batches(self, columns: list[str] | None, batch_rows: int) -> Iterator[tuple[int, pa.Table]]:
        """``(first row, table)`` for consecutive batches of at most ``batch_rows`` rows."""
        names = self.schema.names if columns is None else columns
        for j, path in enumerate(self._parquet):
            i = self.first_file + j  # the file's index in the whole dataset
            start = int(self.offsets[i])
            parts = self._partitions[i] if self._partitions else {}
            stored = [n for n in names if n not in parts]
            schema = _open_parquet(path).schema_arrow
            # Text read as dictionaries: categories are decoded once per distinct value.
            text = [f.name for f in schema if f.name in stored and _is_str(f.type)]
            pf = _open_parquet(path, read_dictionary=text)
            for batch in pf.iter_batches(batch_size=batch_rows, columns=stored, use_threads=True):
                table = readable_types(pa.Table.from_batches([batch]))
                cols = []
                for n in names:
                    want = self.schema.field(n).type
                    if n in parts:
                        value = pa.scalar(parts[n]).cast(want)
                        cols.append(pa.repeat(value, table.num_rows))
                        continue
                    col = table.column(n)
                    if col.type != want and not (
                        pa.types.is_dictionary(col.type) and col.type.value_type == want
                    ):
                        col = _cast(col, want, n, self.files[i])
                    cols.append(col)
                yield start, pa.table(cols, names=names)
                start += table.num_rows

    def file_of(self, row: int) -> int:
        """The index of the file that holds dataset row ``row``."""
        return int(np.searchsorted(self.offsets, row, side="right")) - 1

    @property
    def read_files(self) -> range:
        """The files this source reads (all of them, unless opened with ``own``)."""
        return range(self.first_file, self.first_file + len(self._parquet))

    def complete(self, infos: list[FileInfo]) -> None:
        """Set the dataset's schema and row offsets from every file's :class:`FileInfo` (in
        file order): what a source opened on some of the files (``own``) learns from the
        processes that opened the others.

        Raises:
            InputError: Files that disagree on columns or types.
        """
        partitions = [partition_values(self.uri, f) for f in self.files]
        keys = sorted({k for p in partitions for k in p})
        self.is_csv = [info.is_csv for info in infos]
        self.schema = _unified([info.schema for info in infos], self.files, partitions, keys)
        self._partitions = partitions if keys else []
        self.offsets = np.cumsum([0, *(info.rows for info in infos)]).astype(np.int64)

    def head(self, rows: int) -> pa.Table:
        """The first ``rows`` rows (all columns)."""
        parts = []
        got = 0
        for _, table in self.batches(None, min(rows, 1 << 16)):
            parts.append(table.slice(0, rows - got))
            got += parts[-1].num_rows
            if got >= rows:
                break
        if not parts:
            return self.schema.empty_table()
        return pa.concat_tables(parts, promote_options="permissive")


def _cast(col: pa.ChunkedArray, want: pa.DataType, name: str, uri: str) -> pa.ChunkedArray:
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    try:
        return col.cast(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        there = f"{dtype_name(want)} elsewhere"
        raise types_disagree(name, dtype_name(col.type), there, uri) from e


def _is_str(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _open_parquet(uri: str, **options: Any) -> pq.ParquetFile:
    """A Parquet file by local path or storage URI (read through pyarrow's filesystems)."""
    # pre_buffer off: with it, pyarrow keeps every column chunk it has read cached until the
    # file closes, so one pass over a file held all of it (measured: 16M rows, +700 MB).
    local = storage.local_path(uri)
    if local is not None:
        return pq.ParquetFile(local, pre_buffer=False, **options)
    fs, path = storage.resolve(uri)
    return pq.ParquetFile(fs.open_input_file(path), pre_buffer=False, **options)


def data_hash(files: list[str]) -> str:
    """sha256 over the files' bytes in order, as the in-memory reader records it (a ``.gz``
    name decompressed), read in :data:`HASH_CHUNK` pieces."""
    digest = hashlib.sha256()
    for uri in files:
        try:
            with storage.open_input_stream(uri) as f:
                while chunk := f.read(HASH_CHUNK):
                    digest.update(chunk)
        except (OSError, RuntimeError) as e:
            raise InputError("E_DATA", f"cannot read the dataset file: {e}", uri) from e
    return digest.hexdigest()


def open_source(
    data_uri: str,
    csv: CsvOptions,
    block_bytes: int,
    max_bytes: int | None = None,
    own: range | None = None,
) -> BatchSource:
    """Open a dataset for batch reads; CSV files are spilled to local Parquet first.

    Args:
        data_uri: A file, a folder of files, or a Hive-partitioned folder.
        csv: How CSV files are parsed.
        block_bytes: Bytes of CSV text parsed at a time.
        max_bytes: The most the CSV files may take once parsed, counted while they are read
            (``preprocess.max_input_bytes``); None: no limit.
        own: Open only these files (indexes in the dataset's file order); the source is then
            incomplete until :meth:`BatchSource.complete` is given every file's
            :class:`FileInfo`. None: every file, complete.

    Raises:
        InputError: Missing, unreadable, empty or malformed files (named), or files that
            disagree on columns or types.
    """
    files = input_files(data_uri)
    read = range(len(files)) if own is None else own
    src = BatchSource(
        data_uri, files, [], pa.schema([]), np.zeros(1, np.int64), csv.header, read.start
    )
    try:
        for index in read:
            uri = files[index]
            parquet = _is_parquet(uri)
            if not parquet and uri.lower().endswith(PARQUET_SUFFIXES):
                raise InputError("E_DATA", "the file is named like Parquet but is not Parquet", uri)
            if parquet:
                try:
                    pf = _open_parquet(uri)
                    schema, n = pf.schema_arrow, pf.metadata.num_rows
                except (pa.ArrowException, OSError) as e:
                    raise InputError(
                        "E_DATA", f"cannot read Parquet: {' '.join(str(e).split())}", uri
                    ) from e
                src._parquet.append(uri)
            else:
                if src._spill is None:
                    src._spill = tempfile.mkdtemp(prefix="gpupipe-spill-")
                path = f"{src._spill}/{index:06d}.parquet"
                schema, n = _spill_csv(uri, csv, block_bytes, path, max_bytes)
                src._parquet.append(path)
            readable = readable_types(schema.empty_table()).schema
            src.scanned.append(FileInfo(not parquet, readable, n))
        if own is None:
            src.complete(src.scanned)
        return src
    except BaseException:
        src.close()
        raise


def _unified(
    schemas: list[pa.Schema], files: list[str], partitions: list[dict[str, str]], keys: list[str]
) -> pa.Schema:
    names = [n for n in schemas[0].names if not n.startswith("__index_level_")]
    _check_unique_names(names, files[0])
    for schema, uri in zip(schemas[1:], files[1:], strict=True):
        have = [n for n in schema.names if not n.startswith("__index_level_")]
        extra = [n for n in have if n not in names]
        lacking = [n for n in names if n not in have]
        if extra or lacking:
            what = f"lacks column {lacking[0]!r}" if lacking else f"has extra column {extra[0]!r}"
            raise InputError(
                "E_SCHEMA", f"files disagree on columns: this file {what} (vs {files[0]})", uri
            )
    fields = []
    for name in names:
        types = [s.field(name).type for s in schemas]
        types = [t.value_type if pa.types.is_dictionary(t) else t for t in types]
        fields.append(pa.field(name, types[0] if len(set(types)) == 1 else _common_type(types)))
    for key in keys:
        if key in names:
            raise InputError(
                "E_SCHEMA", f"partition key {key!r} is also a column of the files", files[0]
            )
        fields.append(pa.field(key, _partition_type([p.get(key, "") for p in partitions])))
    return pa.schema(fields)


def _spill_csv(
    uri: str, csv: CsvOptions, block_bytes: int, path: str, max_bytes: int | None = None
) -> tuple[pa.Schema, int]:
    """Parse CSV file ``uri`` block by block into Parquet file ``path``; (schema, rows).

    Column types are inferred from the first block; a later block that does not fit a
    column's type widens it (integers to float64, anything to text) and the file is parsed
    again, as the in-memory reader, which sees every value before typing, would type it.
    """
    try:
        with storage.open_input(uri) as f:
            head = text_head(uri, f.read(HEAD_BYTES))[:65536]
    except (OSError, pa.ArrowException) as e:
        raise InputError("E_DATA", f"cannot read the dataset: {e}", uri) from None
    refuse_non_csv(uri, head)
    csv = csv.for_head(uri, head)
    types: dict[str, pa.DataType] = {}
    for _ in range(1000):
        try:
            return _spill_once(uri, csv, block_bytes, path, types, max_bytes)
        except pa.ArrowInvalid as e:
            m = _CSV_COLUMN_RE.search(str(e))
            if not m or not types:
                raise _csv_error(uri, e) from None
            name = list(types)[int(m.group(1))]
            old = types[name]
            if pa.types.is_string(old):
                raise _csv_error(uri, e) from None
            types[name] = pa.float64() if pa.types.is_integer(old) else pa.string()
    raise AssertionError("unreachable: each retry widens a column")


def _csv_error(uri: str, e: Exception) -> InputError:
    return InputError("E_CSV", f"cannot parse CSV: {' '.join(str(e).split())}", uri)


def _spill_once(
    uri: str,
    csv: CsvOptions,
    block_bytes: int,
    path: str,
    types: dict[str, pa.DataType],
    max_bytes: int | None = None,
) -> tuple[pa.Schema, int]:
    read = pacsv.ReadOptions(
        use_threads=True,
        autogenerate_column_names=not csv.header,
        encoding=csv.encoding,
        block_size=block_bytes,
    )
    convert = pacsv.ConvertOptions(
        strings_can_be_null=True,
        null_values=[*pacsv.ConvertOptions().null_values, *csv.null_values],
        check_utf8=True,
        decimal_point=csv.decimal,
        column_types=dict(types),
    )
    parse = pacsv.ParseOptions(delimiter=csv.delimiter_for(uri))
    rows = parsed = 0
    with storage.open_input(uri) as raw:
        gzip_named_plain = raw.read(2) == b"\x1f\x8b" and not uri.lower().endswith(
            COMPRESSED_SUFFIXES
        )
    with storage.open_input_stream(uri) as raw:
        # A gzip file named like plain text (data.csv) is decompressed too, as read_input does.
        stream = pa.CompressedInputStream(raw, "gzip") if gzip_named_plain else raw
        try:
            reader = pacsv.open_csv(
                stream, read_options=read, parse_options=parse, convert_options=convert
            )
        except pa.ArrowInvalid as e:
            if "Empty CSV file" in str(e):
                raise InputError(
                    "E_EMPTY", "dataset is empty: the file has no header and no rows", uri
                ) from None
            raise
        schema = reader.schema
        if not csv.header:
            schema = pa.schema([pa.field(f"column_{i + 1}", f.type) for i, f in enumerate(schema)])
        if not types:
            types.update({f.name: f.type for f in reader.schema})
        with pq.ParquetWriter(path, schema, compression="lz4") as writer:
            for batch in reader:
                if not csv.header:
                    batch = pa.RecordBatch.from_arrays(batch.columns, schema=schema)
                writer.write_batch(batch)
                rows += batch.num_rows
                parsed += batch.nbytes
                if max_bytes is not None and parsed > max_bytes:
                    # Stop here: the rest is never read (a decompression bomb ends in seconds).
                    check_input_bytes(parsed, max_bytes, uri, so_far=True)
    return schema, rows
