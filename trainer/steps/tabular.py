"""Tabular building blocks of preprocess: read Parquet/CSV, split, impute, standardise, one-hot."""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from trainer import storage
from trainer.errors import InputError

MISSING = "__missing__"
"""The category that a missing categorical value becomes."""
OTHER = "__other__"
"""The category for values outside the kept top-N, and for values unseen in training."""
PARQUET_SUFFIXES = (".parquet", ".pq")
DATA_SUFFIXES = (*PARQUET_SUFFIXES, ".csv", ".tsv", ".txt")
"""Files of a dataset folder that are read (others, and names starting with . or _, are not)."""


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

    def delimiter_for(self, uri: str) -> str:
        """The field separator of file ``uri``."""
        if self.delimiter == "auto":
            return "\t" if uri.lower().endswith(".tsv") else ","
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


def _input_files(data_uri: str) -> list[str]:
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
        raise InputError(
            "E_DATA", f"dataset folder holds no data files ({', '.join(DATA_SUFFIXES)})", data_uri
        )
    return [storage.join(data_uri, n) for n in names]


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
        pf = pq.ParquetFile(pa.BufferReader(blob))
        _check_unique_names(pf.schema_arrow.names, uri)
        text = [
            f.name
            for f in pf.schema_arrow
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
        ]
        # Text read as dictionaries: categories are encoded once per distinct value, not row.
        return pq.read_table(pa.BufferReader(blob), read_dictionary=text)
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


def _parse_csv(
    blob: bytes, csv: CsvOptions, delimiter: str, *, use_threads: bool = True, **parse: Any
) -> pa.Table:
    read = pacsv.ReadOptions(
        use_threads=use_threads,
        autogenerate_column_names=not csv.header,
        encoding=csv.encoding,
    )
    null_values = [*pacsv.ConvertOptions().null_values, *csv.null_values]
    return pacsv.read_csv(
        pa.BufferReader(blob),
        read_options=read,
        parse_options=pacsv.ParseOptions(delimiter=delimiter, **parse),
        convert_options=pacsv.ConvertOptions(
            strings_can_be_null=True, null_values=null_values, check_utf8=True
        ),
    )


def _read_csv(uri: str, blob: bytes, csv: CsvOptions) -> pa.Table:
    if not blob.strip():
        raise InputError("E_EMPTY", "dataset is empty: the file has no header and no rows", uri)
    try:
        table = _parse_csv(blob, csv, csv.delimiter_for(uri))
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
        table = table.rename_columns([f"column_{i + 1}" for i in range(table.num_columns)])
    _check_unique_names(table.column_names, uri)
    return table


def _read_file(uri: str, blob: bytes, csv: CsvOptions) -> tuple[pa.Table, bool]:
    """Parse one file (Parquet by its magic bytes, else CSV); returns (table, is_csv)."""
    if blob[:4] == b"PAR1":
        return _read_parquet(uri, blob), False
    if uri.lower().endswith(PARQUET_SUFFIXES):
        what = "empty (0 bytes)" if not blob else "not Parquet: it lacks Parquet's PAR1 header"
        code = "E_EMPTY" if not blob else "E_DATA"
        raise InputError(code, f"the file is named like Parquet but is {what}", uri)
    return _read_csv(uri, blob, csv), True


HEAD_BYTES = 1 << 20
"""How much of a CSV file :func:`read_columns` reads to learn its header."""


def read_columns(data_uri: str, csv: CsvOptions) -> list[str]:
    """The column names of the dataset, read as preprocess reads them, from its first file only.

    A Parquet file's schema comes from its footer; a CSV file's header from its first
    :data:`HEAD_BYTES` (cut at a line end), parsed with the same options as the full read.

    Raises:
        InputError: The dataset is missing, unreadable, or not Parquet/CSV as named.
    """
    import pyarrow.parquet as pq

    uri = _input_files(data_uri)[0]
    try:
        with storage.open_input(uri) as f:
            head = f.read(HEAD_BYTES)
            if head[:4] == b"PAR1":
                return list(pq.read_schema(storage.local_path(uri) or f).names)
    except (OSError, RuntimeError, pa.ArrowException) as e:
        raise InputError("E_DATA", f"cannot read the dataset: {e}", uri) from None
    if len(head) == HEAD_BYTES and b"\n" in head:
        head = head[: head.rindex(b"\n") + 1]
    table, _ = _read_file(uri, head, csv)
    return list(table.column_names)


def is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


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
                raise InputError(
                    "E_SCHEMA",
                    f"files disagree on the type of column {name!r}: {dtype_name(tp)} here, "
                    f"{dtype_name(types[0])} in {files[0]}; make the files agree, or drop the "
                    f"column with {role_param(name, 'drop')}",
                    uri,
                ) from e
        columns.append(pa.chunked_array(chunks, type=common))
    return pa.table(columns, names=names)


def read_input(data_uri: str, csv: CsvOptions) -> RawInput:
    """Read every input file once: hash its bytes and parse them.

    Raises:
        InputError: A missing, unreadable, empty or malformed file (named), duplicate column
            names, text in another encoding, or files that disagree on columns or types.
    """
    files = _input_files(data_uri)
    digest = hashlib.sha256()
    tables, is_csv = [], []
    for uri in files:
        try:
            blob = storage.read_bytes(uri)
        except FileNotFoundError as e:
            raise InputError("E_DATA", "dataset file not found", uri) from e
        except (OSError, RuntimeError) as e:
            raise InputError("E_DATA", f"cannot read the dataset file: {e}", uri) from e
        digest.update(blob)
        table, is_text_file = _read_file(uri, blob, csv)
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


# --------------------------------------------------------------------------------------------
# Split and fitted transforms
# --------------------------------------------------------------------------------------------


def _round_half_up(x: np.ndarray) -> np.ndarray:
    # np.round rounds half to even; half-up is what a person computing the sizes by hand expects.
    return np.floor(x + 0.5).astype(np.int64)


def split_indices(
    n: int,
    *,
    classes: np.ndarray | None,
    val_fraction: float,
    test_fraction: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split rows ``0..n-1`` into train, validation and test at random, reproducibly.

    With ``classes`` (int class ids 0..K-1, one per row) the split is stratified: each class
    contributes ``round(count * fraction)`` rows to validation and to test, so every split keeps
    the class proportions.

    Args:
        n: Number of rows.
        classes: Class id per row for a stratified split, or None.
        val_fraction: Share of rows for validation.
        test_fraction: Share of rows for test.
        seed: Seed of the permutation; the same seed gives the same split.

    Returns:
        Sorted int64 row indices of train, validation and test.
    """
    order = np.random.default_rng(seed).permutation(n)
    if classes is None:
        n_test = int(_round_half_up(np.array(n * test_fraction)))
        n_val = int(_round_half_up(np.array(n * val_fraction)))
        test, val = order[:n_test], order[n_test : n_test + n_val]
    else:
        # Group the shuffled rows by class (stable, so each group stays in shuffled order), then
        # hand out each group's first rows to test and validation: no Python loop over rows.
        counts = np.bincount(classes, minlength=int(classes.max()) + 1 if n else 0)
        # A narrow key lets the stable argsort use radix sort: several times faster than int64.
        key = classes[order].astype(np.min_scalar_type(max(len(counts) - 1, 0)))
        grouped = order[np.argsort(key, kind="stable")]
        starts = np.cumsum(counts) - counts
        cls = np.repeat(np.arange(len(counts)), counts)
        rank = np.arange(n) - starts[cls]
        n_test_c = _round_half_up(counts * test_fraction)
        n_val_c = _round_half_up(counts * val_fraction)
        is_test = rank < n_test_c[cls]
        is_val = ~is_test & (rank < (n_test_c + n_val_c)[cls])
        test, val = grouped[is_test], grouped[is_val]
    # Sorted by a pass over a split label per row (linear) rather than by sorting each split.
    label = np.zeros(n, dtype=np.int8)
    label[val] = 1
    label[test] = 2
    return np.flatnonzero(label == 0), np.flatnonzero(label == 1), np.flatnonzero(label == 2)


@dataclass(slots=True)
class NumericFit:
    """A numeric column's training-split statistics and its output features."""

    name: str
    dtype: str
    missing: int
    train_missing: int
    median: float
    mean: float
    std: float
    outputs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The column's entry in ``schema.json``."""
        return {
            "name": self.name,
            "kind": "numeric",
            "dtype": self.dtype,
            "missing": self.missing,
            "train_missing": self.train_missing,
            "impute": "median",
            "median": self.median,
            "mean": self.mean,
            "std": self.std,
            "outputs": self.outputs,
        }


@dataclass(slots=True)
class CategoricalFit:
    """A categorical column's training-split categories and its one-hot output features."""

    name: str
    dtype: str
    missing: int
    categories: list[str]
    outputs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The column's entry in ``schema.json``."""
        return {
            "name": self.name,
            "kind": "categorical",
            "dtype": self.dtype,
            "missing": self.missing,
            "categories": self.categories,
            "other": OTHER,
            "outputs": self.outputs,
        }


class NoTrainingValues(Exception):
    """A column has no non-missing value in the training split (the caller names the column)."""


def encode_numeric(
    name: str, dtype: str, x: np.ndarray, n_train: int, *, missing_indicator: bool
) -> tuple[NumericFit, list[np.ndarray]]:
    """Impute with the train median, standardise with train mean/std, optionally flag missing.

    Args:
        name: Column name.
        dtype: The column's input type, for the schema.
        x: float64 values with NaN for missing, rows ordered train, then val, then test.
            Overwritten (it is a scratch copy).
        n_train: The first ``n_train`` rows of ``x`` are the training split.
        missing_indicator: Add ``<name>__missing`` when training rows had missing values.

    Returns:
        The fit and its float32 output columns (standardised value, then the indicator).

    Raises:
        NoTrainingValues: If every training value is missing.
    """
    miss = np.isnan(x)
    train_miss = miss[:n_train]
    n_train_missing = int(np.count_nonzero(train_miss))
    if n_train_missing == n_train:
        raise NoTrainingValues(name)
    train = x[:n_train]
    median = float(np.median(train[~train_miss] if n_train_missing else train))
    n_missing = int(np.count_nonzero(miss))
    if n_missing:
        x[miss] = median
    # Statistics of the imputed training values: what the scaler sees when it is applied.
    mean = float(train.mean())
    std = float(train.std())
    if not np.isfinite(std) or std == 0.0:
        std = 1.0
    x -= mean
    x /= std
    outputs = [name]
    with np.errstate(over="ignore"):  # overflow (inf) is the caller's to report
        columns = [x.astype(np.float32)]
    if missing_indicator and n_train_missing:
        outputs.append(f"{name}__missing")
        columns.append(miss.astype(np.float32))
    fit = NumericFit(
        name=name,
        dtype=dtype,
        missing=n_missing,
        train_missing=n_train_missing,
        median=median,
        mean=mean,
        std=std,
        outputs=outputs,
    )
    return fit, columns


def encode_categorical(
    name: str,
    dtype: str,
    codes: np.ndarray,
    values: list[str],
    n_train: int,
    *,
    max_categories: int,
) -> tuple[CategoricalFit, list[np.ndarray]]:
    """One-hot encode with the training split's most frequent categories.

    The ``max_categories`` most frequent training values (ties: by value) are kept, missing
    counting as the value ``__missing__``; every other value, and any value unseen in training,
    goes to ``__other__``. Kept categories are listed sorted by value, then ``__missing__``.

    Args:
        name: Column name.
        dtype: The column's input type, for the schema.
        codes: int32 index into ``values`` per row, -1 for missing; rows ordered train, val, test.
        values: The distinct values that ``codes`` index.
        n_train: The first ``n_train`` rows are the training split.
        max_categories: How many categories to keep.

    Returns:
        The fit and its float32 one-hot columns (kept categories, then ``__other__``).

    Raises:
        NoTrainingValues: If every training value is missing.
    """
    shifted = codes + 1  # slot 0 is "missing"
    counts = np.bincount(shifted[:n_train], minlength=len(values) + 1)
    if counts[0] == n_train:
        raise NoTrainingValues(name)
    labels = np.array([MISSING, *values], dtype=object)
    eligible = np.flatnonzero((counts > 0) & (labels != OTHER))
    # Most frequent first, ties broken by value, so the choice does not depend on row order.
    ranked = eligible[np.lexsort((labels[eligible].astype(str), -counts[eligible]))]
    kept = ranked[:max_categories]
    kept_values = sorted(str(labels[i]) for i in kept if i != 0)
    categories = kept_values + ([MISSING] if 0 in kept else [])
    position = {label: j for j, label in enumerate(categories)}
    lookup = np.full(len(labels), len(categories), dtype=np.intp)  # default: __other__
    for i in kept:
        lookup[i] = position[str(labels[i])]
    out_codes = lookup[shifted]
    # One scatter into a (categories x rows) block: each output column is a contiguous row.
    onehot = np.zeros((len(categories) + 1, len(codes)), dtype=np.float32)
    onehot[out_codes, np.arange(len(codes))] = 1.0
    outputs = [f"{name}={c}" for c in [*categories, OTHER]]
    fit = CategoricalFit(
        name=name,
        dtype=dtype,
        missing=int(np.count_nonzero(codes < 0)),
        categories=categories,
        outputs=outputs,
    )
    return fit, list(onehot)
