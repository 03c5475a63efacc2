"""Tabular building blocks of preprocess: read Parquet/CSV and encode text columns.

The split, imputation, standardisation and one-hot encoding are in
:mod:`trainer.steps.preprocess.encode` (re-exported here).
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import shlex
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from trainer.base import storage
from trainer.base.errors import InputError

# The split and the fitted transforms live in trainer.steps.preprocess.encode; importable from
# here too.
from trainer.steps.preprocess.encode import (  # noqa: F401 - re-exported
    MISSING,
    OTHER,
    CategoricalFit,
    NoTrainingValues,
    NumericFit,
    encode_categorical,
    encode_numeric,
    split_indices,
)
from trainer.steps.preprocess.file_kind import (
    COMPRESSED_SUFFIXES,
    refuse_non_csv,
    sniff_separators,
)
from trainer.steps.preprocess.limits import InputTooLarge

PARQUET_SUFFIXES = (".parquet", ".pq")
_TEXT_SUFFIXES = (".csv", ".tsv", ".txt")
DATA_SUFFIXES = (
    *PARQUET_SUFFIXES,
    *_TEXT_SUFFIXES,
    *(t + c for t in _TEXT_SUFFIXES for c in COMPRESSED_SUFFIXES),
)
"""Files of a dataset folder that are read (others, and names starting with . or _, are not)."""
_GZIP_MAGIC = b"\x1f\x8b"


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CsvOptions:
    """How CSV files are parsed (Parquet files carry their own schema)."""

    delimiter: str = "auto"
    """One character; ``auto``: a tab for ``.tsv`` files, else a comma."""
    header: bool = True
    """The first line names the columns; without it they are ``column_1``, ``column_2``, ..."""
    encoding: str = "utf-8"
    """Text encoding of the files (any Python codec name)."""
    null_values: tuple[str, ...] = ()
    """Values read as missing, besides the empty field and pyarrow's defaults (NA, null ...)."""
    decimal: str = "."
    """Decimal separator of numbers: ``.`` or ``,``."""

    def for_head(self, uri: str, head: bytes) -> CsvOptions:
        """These options for the file ``uri`` whose first bytes (decompressed) are ``head``:
        with ``delimiter`` ``auto`` and the default decimal point, a header separated by ``;``
        with no comma reads as ``;``, with decimal commas where the first lines have them (a
        European spreadsheet's export), instead of one column."""
        if self.delimiter != "auto" or self.decimal != "." or self.delimiter_for(uri) != ",":
            return self
        found = sniff_separators(head, self.encoding)
        if found is None:
            return self
        return dataclasses.replace(self, delimiter=found[0], decimal=found[1])

    def delimiter_for(self, uri: str) -> str:
        """The field separator of file ``uri`` (``auto`` with decimal commas: ``;``)."""
        if self.delimiter == "auto":
            if strip_compression(uri).lower().endswith(".tsv"):
                return "\t"
            return ";" if self.decimal == "," else ","
        return "\t" if self.delimiter == "tab" else self.delimiter


@dataclass(slots=True)
class RawInput:
    """All input files concatenated, with enough bookkeeping to name a row's file and line."""

    uri: str
    table: pa.Table
    files: list[str]
    offsets: np.ndarray  # first global row of each file, plus the total
    is_csv: list[bool]
    data_hash: str
    csv_header: bool = True

    def locate(self, row: int) -> str:
        """Where global ``row`` is: ``<file> row <n>`` (Parquet) or ``<file> line <n>`` (CSV)."""
        i = int(np.searchsorted(self.offsets, row, side="right")) - 1
        local = row - int(self.offsets[i])
        if self.is_csv[i]:
            # Line 1 is the header (when there is one), so data row 0 is on line 2.
            return f"{self.files[i]} line {local + 1 + int(self.csv_header)}"
        return f"{self.files[i]} row {local + 1}"

    @property
    def any_csv(self) -> bool:
        """Whether any input file is CSV (CSV-only advice applies)."""
        return any(self.is_csv)


def strip_compression(uri: str) -> str:
    """``uri`` without a compression suffix (``t.tsv.gz`` -> ``t.tsv``)."""
    for suffix in COMPRESSED_SUFFIXES:
        if uri.lower().endswith(suffix):
            return uri[: -len(suffix)]
    return uri


def decompressed(uri: str, blob: bytes, limit: int | None = None) -> bytes:
    """``blob`` itself, or its gzip-decompressed content when it starts with gzip's magic bytes.

    Storage streams decompress a ``.gz`` name already; this catches a gzip file named like
    plain text (``data.csv``), which would otherwise be parsed as bytes and blamed on the
    encoding.

    Raises:
        InputError: ``E_DATA`` if the gzip stream is damaged.
    """
    if blob[:2] != _GZIP_MAGIC:
        return blob
    try:
        if limit is None:
            return gzip.decompress(blob)
        with gzip.GzipFile(fileobj=io.BytesIO(blob)) as z:
            out = z.read(limit + 1)
        if len(out) > limit:
            raise InputTooLarge(uri)
        return out
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise InputError(
            "E_DATA", f"the file is gzip-compressed but cannot be decompressed ({e})", uri
        ) from None


def readable_types(table: pa.Table) -> pa.Table:
    """``table`` with decimal columns (SQL and Spark exports) cast to float64, read as numbers.

    Decimals up to 38 digits fit float64's range; the cast rounds to about 16 digits, which is
    what training (float32) can use anyway.
    """
    cast = {
        i: pa.float64()
        for i, t in enumerate(table.schema.types)
        if pa.types.is_decimal(t)
        or (pa.types.is_dictionary(t) and pa.types.is_decimal(t.value_type))
    }
    for i, t in cast.items():
        col = table.column(i)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        table = table.set_column(i, table.field(i).name, col.cast(t))
    return table


def param(name: str, value: Any) -> str:
    """A pipeline parameter as a person pastes it into a shell.

    ``param("column_roles_json", {"zip": "categorical"})`` gives
    ``--param 'column_roles_json={"zip": "categorical"}'``: quoted for the shell, JSON for
    structured values, so the advice in an error message works as printed.
    """
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return "--param " + shlex.quote(f"{name}={text}")


def role_param(column: str, role: str) -> str:
    """The ``--param`` that declares ``column``'s role (``numeric``, ``categorical``, ``drop``)."""
    return param("column_roles_json", {column: role})


def input_files(data_uri: str) -> list[str]:
    """The data file, or the folder's data files sorted by name."""
    try:
        found = storage.exists(data_uri)
        is_dir = found and storage.is_dir(data_uri)
    except (OSError, RuntimeError) as e:
        raise InputError("E_DATA", f"cannot reach the dataset: {e}", data_uri) from e
    if not found:
        raise InputError("E_DATA", "dataset not found: no such file or folder", data_uri)
    if not is_dir:
        return [data_uri]
    names = [
        n
        for n in storage.list_dir(data_uri)
        if n.lower().endswith(DATA_SUFFIXES) and not n.startswith((".", "_"))
    ]
    if not names:
        names = hive_files(data_uri)
    if not names:
        raise InputError(
            "E_DATA", f"dataset folder holds no data files ({', '.join(DATA_SUFFIXES)})", data_uri
        )
    return [storage.join(data_uri, n) for n in names]


def hive_files(data_uri: str) -> list[str]:
    """The data files of a Hive-partitioned folder (``year=2024/month=1/part-0.parquet``),
    relative to it and sorted, or ``[]`` if it is not one.

    Every folder between the root and a file must be ``key=value``; other files are ignored.
    """
    found = []
    for rel in storage.list_files(data_uri):
        *folders, name = rel.split("/")
        if not folders or name.startswith((".", "_")) or not name.lower().endswith(DATA_SUFFIXES):
            continue
        if all("=" in f and not f.startswith((".", "_", "=")) for f in folders):
            found.append(rel)
    return sorted(found)


def is_hive(data_uri: str, files: list[str]) -> bool:
    """Whether ``files`` (from :func:`input_files`) lie in ``key=value`` folders of ``data_uri``."""
    root = data_uri.rstrip("/") + "/"
    return any("/" in f[len(root) :] for f in files if f.startswith(root))


def _check_unique_names(names: list[str], uri: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(
                "E_SCHEMA",
                f"column name {name!r} appears {names.count(name)} times; "
                "rename the columns so that each name is unique",
                uri,
            )
        seen.add(name)


def _read_parquet(uri: str, blob: bytes) -> pa.Table:
    try:
        pf = pq.ParquetFile(_reader(blob))
        _check_unique_names(pf.schema_arrow.names, uri)
        text = [
            f.name
            for f in pf.schema_arrow
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
        ]
        # Text read as dictionaries: categories are encoded once per distinct value, not row.
        return readable_types(pq.read_table(_reader(blob), read_dictionary=text))
    except (pa.ArrowException, OSError) as e:
        raise InputError("E_DATA", f"cannot read Parquet: {' '.join(str(e).split())}", uri) from e


def _bad_encoding(uri: str, blob: bytes, encoding: str) -> InputError | None:
    """The error for the first byte that ``encoding`` cannot decode, if there is one."""
    try:
        codecs.decode(blob, encoding)
    except UnicodeDecodeError as e:
        line = blob.count(b"\n", 0, e.start) + 1
        byte = blob[e.start : e.start + 1].hex()
        other = "latin-1" if codecs.lookup(encoding).name != "latin-1" else "cp1252"
        return InputError(
            "E_ENCODING",
            f"the file is not valid {encoding} text: byte 0x{byte} on line {line}; set the "
            f"file's encoding, e.g. {param('csv_encoding', other)}",
            uri,
        )
    return None


def _csv_parse_error(uri: str, blob: bytes, csv: CsvOptions, e: Exception) -> InputError:
    """One line for a CSV that pyarrow cannot parse: the bad line's number and text if known."""
    rows: list[Any] = []

    def first_bad(row: Any) -> str:
        rows.append(row)
        return "error"

    delimiter = csv.delimiter_for(uri)
    # Parse again on one thread, which numbers rows, only to say where the first bad one is.
    # pyarrow hands the handler each bad row decoded as UTF-8: with bytes that are not, its
    # callback fails inside pyarrow, which prints "Exception ignored ... Traceback" and the raw
    # bytes on stderr. Such a file (binary, or text in another encoding than the one given)
    # gets the message without the line.
    transcoded = codecs.lookup(csv.encoding).name != "utf-8"
    if transcoded or _bad_encoding(uri, blob, "utf-8") is None:
        with contextlib.suppress(pa.ArrowException, UnicodeDecodeError):
            _parse_csv(blob, csv, delimiter, use_threads=False, invalid_row_handler=first_bad)
    shown = "tab" if delimiter == "\t" else delimiter
    guess = guess_delimiter(blob[: blob.find(b"\n")].decode("utf-8", "replace"), delimiter)
    hint = (
        f"fix that line, or, if fields are not separated by {shown!r}, set the separator, "
        f"e.g. {param('csv_delimiter', guess)}"
    )
    if rows:
        row = rows[0]
        text = row.text if len(row.text) <= 80 else row.text[:77] + "..."
        return InputError(
            "E_CSV",
            f"cannot parse CSV line {row.number}: expected {row.expected_columns} fields "
            f"separated by {shown!r}, got {row.actual_columns} ({text!r}); {hint}",
            uri,
        )
    return InputError("E_CSV", f"cannot parse CSV: {' '.join(str(e).split())}; {hint}", uri)


def guess_delimiter(header: str, current: str) -> str:
    """The likeliest field separator of a header line other than ``current`` (``tab`` for a tab)."""
    candidates = [c for c in (";", "\t", "|", ",") if c != current]
    best = max(candidates, key=header.count)
    if not header.count(best):
        best = candidates[0]
    return "tab" if best == "\t" else best


def _reader(blob: bytes) -> pa.BufferReader:
    """An Arrow reader over a copy of ``blob`` in Arrow's own memory.

    Why a copy: a reader over Python ``bytes`` keeps a ``PyBuffer`` whose destructor takes the
    GIL. When a threaded read fails (a CSV that is not valid UTF-8, say), pyarrow returns the
    error while its pool threads still hold that reader; the last of them to let go may do so
    after interpreter shutdown has begun, and taking the GIL then ends the thread with
    ``pthread_exit`` inside a C++ destructor: ``terminate called without an active exception``,
    exit 134, after the step's own error line. Arrow-owned memory needs no GIL to free.
    """
    buf = pa.allocate_buffer(len(blob))
    if blob:
        np.frombuffer(buf, dtype=np.uint8)[:] = np.frombuffer(blob, dtype=np.uint8)
    return pa.BufferReader(buf)


def _parse_csv(
    blob: bytes,
    csv: CsvOptions,
    delimiter: str,
    *,
    use_threads: bool = True,
    columns: list[str] | None = None,
    **parse: Any,
) -> pa.Table:
    read = pacsv.ReadOptions(
        use_threads=use_threads,
        autogenerate_column_names=not csv.header,
        encoding=csv.encoding,
    )
    null_values = [*pacsv.ConvertOptions().null_values, *csv.null_values]
    return pacsv.read_csv(
        _reader(blob),
        read_options=read,
        parse_options=pacsv.ParseOptions(delimiter=delimiter, **parse),
        convert_options=pacsv.ConvertOptions(
            strings_can_be_null=True,
            null_values=null_values,
            check_utf8=True,
            decimal_point=csv.decimal,
            include_columns=columns or [],
        ),
    )


def _read_csv(uri: str, blob: bytes, csv: CsvOptions) -> pa.Table:
    if not blob.strip():
        raise InputError("E_EMPTY", "dataset is empty: the file has no header and no rows", uri)
    try:
        table = _parse_csv(blob, csv, csv.delimiter_for(uri))
        names = table.column_names  # a header that is not valid UTF-8 fails here
    except UnicodeDecodeError:
        raise _bad_encoding(uri, blob, csv.encoding) or InputError(
            "E_ENCODING", f"the file is not valid {csv.encoding} text", uri
        ) from None
    except pa.ArrowException as e:
        raise _csv_parse_error(uri, blob, csv, e) from None
    # pyarrow reads text that is not valid UTF-8 as binary rather than failing.
    binary = any(pa.types.is_binary(t) for t in table.schema.types)
    if binary and (error := _bad_encoding(uri, blob, "utf-8")):
        raise error
    if not csv.header:
        names = [f"column_{i + 1}" for i in range(table.num_columns)]
        table = table.rename_columns(names)
    _check_unique_names(names, uri)
    return table


def _read_file(
    uri: str, blob: bytes, csv: CsvOptions, max_text_bytes: int | None = None
) -> tuple[pa.Table, bool]:
    """Parse one file (Parquet by its magic bytes, else CSV); returns (table, is_csv)."""
    if blob[:4] == b"PAR1":
        return _read_parquet(uri, blob), False
    if uri.lower().endswith(PARQUET_SUFFIXES):
        what = "empty (0 bytes)" if not blob else "not Parquet: it lacks Parquet's PAR1 header"
        code = "E_EMPTY" if not blob else "E_DATA"
        raise InputError(code, f"the file is named like Parquet but is {what}", uri)
    text = decompressed(uri, blob, max_text_bytes)
    refuse_non_csv(uri, text[:65536])
    return _read_csv(uri, text, csv.for_head(uri, text[:65536])), True


HEAD_BYTES = 1 << 20
"""How much of a CSV file :func:`read_columns` reads to learn its header."""


def read_columns(data_uri: str, csv: CsvOptions) -> list[str]:
    """The column names of the dataset, read as preprocess reads them, from its first file only.

    A Parquet file's schema comes from its footer; a CSV file's header from its first
    :data:`HEAD_BYTES` (cut at a line end), parsed with the same options as the full read.

    Raises:
        InputError: The dataset is missing, unreadable, or not Parquet/CSV as named.
    """
    files = input_files(data_uri)
    uri = files[0]
    # A Hive folder's partition keys (``region=east/``) are columns too, after the files' own.
    keys = list(dict.fromkeys(k for f in files for k in _partition_keys(data_uri, f)))
    return [*_file_columns(uri, csv), *keys]


def _partition_keys(data_uri: str, uri: str) -> list[str]:
    rel = uri[len(data_uri.rstrip("/")) + 1 :] if uri != data_uri else ""
    return [p.split("=", 1)[0] for p in rel.split("/")[:-1] if "=" in p]


def _file_columns(uri: str, csv: CsvOptions) -> list[str]:
    """The column names of one data file (its footer or its header)."""
    try:
        with storage.open_input(uri) as f:
            head = f.read(HEAD_BYTES)
            if head[:4] == b"PAR1":
                return list(pq.read_schema(storage.local_path(uri) or f).names)
        head = text_head(uri, head)
    except (OSError, RuntimeError, pa.ArrowException) as e:
        raise InputError("E_DATA", f"cannot read the dataset: {e}", uri) from None
    table, _ = _read_file(uri, head, csv)
    return list(table.column_names)


def text_head(uri: str, raw_head: bytes) -> bytes:
    """The first :data:`HEAD_BYTES` of a text file as preprocess reads it (decompressed), cut
    at a line end; ``raw_head`` is its first bytes as stored."""
    if raw_head[:2] == _GZIP_MAGIC or uri.lower().endswith(COMPRESSED_SUFFIXES):
        # Decompressed as read, only as far as the head: never the whole file.
        gzip_named_plain = not uri.lower().endswith(COMPRESSED_SUFFIXES)
        try:
            with storage.open_input_stream(uri) as raw:
                stream = pa.CompressedInputStream(raw, "gzip") if gzip_named_plain else raw
                raw_head = stream.read(HEAD_BYTES)
        except (OSError, pa.ArrowException) as e:
            raise InputError(
                "E_DATA", f"the file is gzip-compressed but cannot be decompressed ({e})", uri
            ) from None
    if len(raw_head) == HEAD_BYTES and b"\n" in raw_head:
        raw_head = raw_head[: raw_head.rindex(b"\n") + 1]
    return raw_head


def is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def types_disagree(name: str, here: str, there: str, uri: str) -> InputError:
    """``E_SCHEMA``: the files of a dataset give column ``name`` different types (``here`` in
    ``uri``, ``there`` in another)."""
    return InputError(
        "E_SCHEMA",
        f"files disagree on the type of column {name!r}: {here} here, {there}; make the files "
        f"agree, or drop the column with {role_param(name, 'drop')}",
        uri,
    )


def _common_type(types: list[pa.DataType]) -> pa.DataType:
    """One type for a column whose files disagree: text wins, so mixed values get checked."""
    real = [t for t in types if not pa.types.is_null(t)]
    if not real:
        return pa.null()
    if any(is_text(t) for t in real):
        return pa.string()
    if all(is_number(t) for t in real):
        return pa.float64()
    return real[0]  # e.g. timestamps in every file: reported as unsupported later


def _concat(tables: list[pa.Table], files: list[str]) -> pa.Table:
    """Concatenate per-file tables, checking that every file has the same columns and types."""
    names = tables[0].column_names
    for table, uri in zip(tables[1:], files[1:], strict=True):
        extra = [n for n in table.column_names if n not in names]
        lacking = [n for n in names if n not in table.column_names]
        if extra or lacking:
            what = f"lacks column {lacking[0]!r}" if lacking else f"has extra column {extra[0]!r}"
            raise InputError(
                "E_SCHEMA", f"files disagree on columns: this file {what} (vs {files[0]})", uri
            )
    tables = [t.select(names) for t in tables]
    columns = []
    for name in names:
        types = [t.schema.field(name).type for t in tables]
        common = types[0] if len(set(types)) == 1 else _common_type(types)
        chunks = []
        for t, uri, tp in zip(tables, files, types, strict=True):
            try:
                chunks.extend(t.column(name).cast(common).chunks)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                there = f"{dtype_name(types[0])} in {files[0]}"
                raise types_disagree(name, dtype_name(tp), there, uri) from e
        columns.append(pa.chunked_array(chunks, type=common))
    return pa.table(columns, names=names)


def read_input(data_uri: str, csv: CsvOptions, max_text_bytes: int | None = None) -> RawInput:
    """Read every input file once: hash its bytes and parse them.

    ``max_text_bytes``: the most a file's (decompressed) content may take here; past it
    :class:`~trainer.steps.preprocess.limits.InputTooLarge` is raised after reading at most
    that much (preprocess then streams the table instead).

    Raises:
        InputError: A missing, unreadable, empty or malformed file (named), duplicate column
            names, text in another encoding, or files that disagree on columns or types.
    """
    files = input_files(data_uri)
    digest = hashlib.sha256()
    tables, is_csv = [], []
    for uri in files:
        try:
            blob = storage.read_bytes(uri, max_text_bytes)
        except FileNotFoundError as e:
            raise InputError("E_DATA", "dataset file not found", uri) from e
        except (OSError, RuntimeError) as e:
            raise InputError("E_DATA", f"cannot read the dataset file: {e}", uri) from e
        if max_text_bytes is not None and len(blob) > max_text_bytes:
            raise InputTooLarge(uri)
        digest.update(blob)
        table, is_text_file = _read_file(uri, blob, csv, max_text_bytes)
        del blob  # parsed: the raw bytes need not outlive this iteration
        tables.append(table)
        is_csv.append(is_text_file)
    table = tables[0] if len(tables) == 1 else _concat(tables, files)
    offsets = np.cumsum([0, *(t.num_rows for t in tables)])
    # pandas writes a non-default index as __index_level_N__: never data.
    keep = [n for n in table.column_names if not n.startswith("__index_level_")]
    if len(keep) != table.num_columns:
        table = table.select(keep)
    return RawInput(data_uri, table, files, offsets, is_csv, digest.hexdigest(), csv.header)


# --------------------------------------------------------------------------------------------
# Column encoding
# --------------------------------------------------------------------------------------------


def dtype_name(t: pa.DataType) -> str:
    """A column type as schema.json records it (a dictionary column by its value type)."""
    return str(t.value_type) if pa.types.is_dictionary(t) else str(t)


def dictionary_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Dictionary-encode a text column: (int32 codes with -1 for missing, distinct values)."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    # Combining unifies the per-chunk dictionaries into one.
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    codes = pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False).astype(np.int32)
    values = [str(v) for v in arr.dictionary.to_pylist()]
    if len(set(values)) != len(values):  # a dictionary may repeat values: map them together
        uniq, inverse = np.unique(np.array(values, dtype=object), return_inverse=True)
        remap = np.append(inverse.astype(np.int32), -1)  # index -1 stays -1
        codes = remap[codes]
        values = [str(v) for v in uniq]
    return codes, values
