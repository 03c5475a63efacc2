"""Preprocess in bounded memory: the same outputs as the in-memory path, from record batches.

The passes over the data (:class:`~trainer.steps.preprocess.source.BatchSource`):

0. the target column alone (classes, task, the seeded split: the only per-row state kept,
   5 bytes a row: a split label and the target);
1. the statistics the encoders need, on the training rows: exact streaming moments (mean and
   variance merged batch by batch), category counts (exact up to a cap of distinct values),
   and a histogram of each numeric column's order keys for the median;
2. the median, exactly (:mod:`trainer.steps.preprocess.quantile`: usually one pass over the
   numeric columns that collects the values of one histogram bin);
3. encode and write each split as Parquet row groups of the in-memory path's size.

Column typing (numeric, categorical, date; identifiers and constants left out; leakage) is
decided by the in-memory path's own checks on the first rows (:data:`HEAD_ROWS` or what the
budget allows); a table that fits there gets the same decisions, splits and features as the
in-memory path (row for row; features equal to float rounding of the streamed sums).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer.base import storage
from trainer.base.errors import InputError
from trainer.base.outputs import atomic_dir
from trainer.steps.preprocess.column_checks import DATE_PARTS, Decision, date_features
from trainer.steps.preprocess.columns import (
    _check_range,
    _Column,
    _numbers,
    _text_as_numbers,
    label_variants,
    target_column,
)
from trainer.steps.preprocess.config import PreprocessConfig
from trainer.steps.preprocess.encode import (
    MISSING,
    CategoricalFit,
    NumericFit,
    split_labels,
)
from trainer.steps.preprocess.feature_columns import feature_columns, leakage_warnings
from trainer.steps.preprocess.limits import check_features
from trainer.steps.preprocess.published import (
    _PARQUET_OPTIONS,
    PreprocessResult,
    feature_names,
    published_result,
    schema_document,
)
from trainer.steps.preprocess.quantile import MedianSelect, order_keys
from trainer.steps.preprocess.source import BatchSource, data_hash, open_source
from trainer.steps.preprocess.splits import check_splits
from trainer.steps.preprocess.stream_stats import (
    CatStats,
    NumStats,
    Spec,
    count_categories,
    fit_of,
    stats_of,
    target_stats,
)
from trainer.steps.preprocess.tabular import (
    dictionary_codes,
    is_number,
    is_text,
    param,
    role_param,
)
from trainer.steps.preprocess.text_values import Notice

HEAD_ROWS = 200_000
"""Rows the column typing is decided on (fewer if the budget is small)."""
MAX_BATCH_ROWS = 1 << 20
MIN_BATCH_ROWS = 1024
MIN_GROUP_ROWS = 1 << 14
"""Fewest rows in an output row group: each adds footer metadata per column, held until the
file closes, and the trainer reads a row group at a time."""
PROCESS_BYTES = 160 << 20
"""What the process holds before any data: the interpreter with numpy, pyarrow and pandas
(about 110 MiB resident) and the allocators' slack; the budget covers the whole process."""
ROW_STATE_BYTES = 9
"""Bytes a row of per-row state costs while the split is drawn (label, target, permutation)."""


def release_memory() -> None:
    """Hand freed memory back to the system between passes: Arrow's allocator and glibc's keep
    freed blocks for reuse, which would make one pass's peak every later pass's floor."""
    pa.default_memory_pool().release_unused()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _budget_rows(budget: int, n: int, row_bytes: int) -> int:
    free = max(budget - ROW_STATE_BYTES * n - PROCESS_BYTES, budget // 4)
    return int(min(MAX_BATCH_ROWS, max(MIN_BATCH_ROWS, free // max(row_bytes, 1))))


def _row_bytes(schema: pa.Schema) -> int:
    """A rough in-memory size of one row: 8 bytes a number, 32 a text value."""
    return sum(8 if is_number(f.type) else 32 for f in schema) + 8


def preprocess_streaming(
    cfg: PreprocessConfig, *, data_uri: str, output_uri: str, fingerprint: str, budget: int
) -> PreprocessResult:
    """Preprocess ``data_uri`` into ``output_uri`` reading record batches (see the module doc).

    The caller has checked the output location and the fingerprint
    (:func:`trainer.steps.preprocess.step.preprocess`).

    Args:
        cfg: What to read and how.
        data_uri: A data file, a folder of them, or a Hive-partitioned folder.
        output_uri: Where the splits, ``schema.json`` and ``stats.json`` are published.
        fingerprint: The data's fingerprint, recorded in ``schema.json``.
        budget: Bytes the batches and per-row state are planned to fit in.

    Raises:
        InputError: As :func:`~trainer.steps.preprocess.step.preprocess`.
    """
    csv = cfg.csv_options()
    with open_source(
        data_uri,
        csv,
        block_bytes=int(min(max(budget // 16, 1 << 20), 64 << 20)),
        max_bytes=cfg.max_input_bytes,
    ) as src:
        return _run(cfg, src, data_uri, output_uri, fingerprint, budget)


def _run(
    cfg: PreprocessConfig,
    src: BatchSource,
    data_uri: str,
    output_uri: str,
    fingerprint: str,
    budget: int,
) -> PreprocessResult:
    n = src.num_rows
    if n == 0:
        shown = ", ".join(map(repr, src.schema.names[:20]))
        raise InputError("E_EMPTY", f"dataset has no rows, only the columns ({shown})", data_uri)
    row_bytes = _row_bytes(src.schema)
    batch_rows = _budget_rows(budget, n, 4 * row_bytes)
    head_rows = min(n, HEAD_ROWS, max(MIN_BATCH_ROWS, budget // (16 * row_bytes)))
    head = src.head(head_rows)
    notes: list[Notice] = []
    y, task, classes = _target(src, cfg, head, notes, batch_rows)
    label_variants(cfg.target, classes, y, notes)
    head_in = src.raw_input(head)
    columns, dropped, decisions = feature_columns(head_in, cfg, notes)
    decisions += leakage_warnings(head_in, columns, y[:head_rows], classes, cfg.target, notes)
    specs = _specs(columns, decisions, src.schema)
    del columns, head, head_in
    release_memory()

    labels = split_labels(
        n,
        classes=y if classes is not None else None,
        val_fraction=cfg.val_fraction,
        test_fraction=cfg.test_fraction,
        seed=cfg.seed,
    )
    _check_labels(src, cfg, y, classes, labels)
    release_memory()
    sources = sorted({s.source for s in specs}, key=src.schema.names.index)

    num: dict[str, NumStats] = {s.name: NumStats() for s in specs if s.kind == "numeric"}
    cat: dict[str, CatStats] = {s.name: CatStats() for s in specs if s.kind == "categorical"}
    # Values a median may collect in memory: both middle ranks of every column within half the
    # budget (8 bytes a value).
    cap = max(MIN_BATCH_ROWS, budget // (32 * max(len(num), 1)))
    for start, table in src.batches(sources, batch_rows):
        is_train = labels[start : start + table.num_rows] == 0
        view = src.raw_input(table, start)
        values = _batch_values(specs, table, view, cfg)
        for spec in specs:
            v = values[spec.name]
            if isinstance(v, tuple):
                count_categories(cat[spec.name], v[0], v[1], is_train)
            else:
                st = num[spec.name]
                present = ~np.isnan(v)
                st.missing += int(v.size - np.count_nonzero(present))
                st.all.add(v[present])
                train = v[is_train & present]
                st.train_missing += int(np.count_nonzero(is_train)) - int(train.size)
                st.train.add(train)
                if st.median is None:
                    st.median = MedianSelect(cap=cap)
                st.median.feed(order_keys(train))
    release_memory()
    n_train = int(np.count_nonzero(labels == 0))
    for spec in specs:
        if spec.kind == "numeric" and num[spec.name].train.n == 0:
            _no_training_values(spec.name, n_train, cfg, data_uri)
        if spec.kind == "categorical":
            st_c = cat[spec.name]
            if st_c.train_missing == n_train:
                _no_training_values(spec.name, n_train, cfg, data_uri)
    _medians(src, specs, num, labels, batch_rows, cfg)
    release_memory()

    fits = [fit_of(s, num, cat, n_train, cfg) for s in specs]
    features = feature_names(fits, cfg.target, data_uri)
    check_features(len(features), cfg.max_features, data_uri)
    splits = {k: int(np.count_nonzero(labels == i)) for i, k in enumerate(("train", "val", "test"))}
    stats = {s.name: stats_of(s, num, cat) for s in specs}
    schema_doc = schema_document(
        target=cfg.target, task=task, fits=fits, dropped=dropped, decisions=decisions,
        notes=notes, classes=classes, data_hash=data_hash(src.files), fingerprint=fingerprint,
        data_uri=data_uri, seed=cfg.seed, splits=splits, features=features,
    )  # fmt: skip
    stats_doc = {
        "rows": n,
        "columns": stats,
        "target": {
            name: target_stats(y, labels, i, classes)
            for i, name in enumerate(("train", "val", "test"))
        },
    }
    _write(src, cfg, specs, fits, features, classes, y, labels, output_uri, budget, sources,
           {"schema.json": schema_doc, "stats.json": stats_doc})  # fmt: skip
    return published_result(splits, features, task, classes, str(schema_doc["data_hash"]), notes)


def _target(
    src: BatchSource,
    cfg: PreprocessConfig,
    head: pa.Table,
    notes: list[Notice],
    batch_rows: int,
) -> tuple[np.ndarray, str, list[str] | None]:
    """The target of every row, compact: class ids (one byte each up to 127 classes) or float32
    values.

    A text or true/false target is read batch by batch into int32 codes (4 bytes a row) and
    typed by the in-memory path's :func:`target_column` on its distinct values; a numeric one
    is gathered as float64 (8 bytes a row) and typed by it directly.
    """
    name = cfg.target
    if name not in src.schema.names:
        target_column(src.raw_input(head), cfg, notes)  # raises the in-memory path's error
    field_type = src.schema.field(name).type
    if not (is_text(field_type) or pa.types.is_boolean(field_type)):
        x = np.empty(src.num_rows, dtype=np.float64)
        for start, table in src.batches([name], batch_rows):
            col = table.column(0)
            if col.null_count or not is_number(col.type):
                target_column(src.raw_input(table, start), cfg, notes)  # names the row
            x[start : start + table.num_rows] = _numbers(
                src.raw_input(table, start), name, col, target=True
            )
        y, task, classes = target_column(src.raw_input(pa.table({name: x})), cfg, notes)
        del x
        return (_narrow(y, classes), task, classes) if classes is not None else (y, task, None)
    codes = np.empty(src.num_rows, dtype=np.int32)
    ids: dict[Any, int] = {}
    for start, table in src.batches([name], batch_rows):
        col = table.column(0)
        if col.null_count:
            target_column(src.raw_input(table, start), cfg, notes)  # names the missing row
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if not pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_encode()
        lookup = np.array(
            [ids.setdefault(v, len(ids)) for v in arr.dictionary.to_pylist()], dtype=np.int32
        )
        indices = arr.indices.to_numpy(zero_copy_only=False)
        codes[start : start + table.num_rows] = lookup[indices] if lookup.size else indices
    # Typed on its distinct values, once each: the same task, classes and notes.
    distinct = pa.table({name: pa.array(list(ids), type=field_type)})
    y_distinct, task, classes = target_column(src.raw_input(distinct), cfg, notes)
    np.take(y_distinct.astype(np.int32), codes, out=codes)  # in place: no second row array
    return _narrow(codes, classes), task, classes


def _narrow(y: np.ndarray, classes: list[str] | None) -> np.ndarray:
    """Class ids in the narrowest integer type that holds them (one byte for up to 127)."""
    assert classes is not None
    return y.astype(np.min_scalar_type(-max(len(classes), 1)))


def _specs(columns: list[_Column], decisions: list[Decision], schema: pa.Schema) -> list[Spec]:
    dated = {d.column for d in decisions if d.action == "date"}
    specs = []
    for c in columns:
        base, _, part = c.name.rpartition("__")
        if base in dated and (part in DATE_PARTS or part == "hour"):
            specs.append(Spec(c.name, base, "date", "numeric", c.dtype, part))
            continue
        t = schema.field(c.name).type
        if c.kind == "categorical":
            specs.append(Spec(c.name, c.name, "category", "categorical", c.dtype))
        elif is_text(t):
            specs.append(Spec(c.name, c.name, "text_number", "numeric", c.dtype))
        else:
            specs.append(Spec(c.name, c.name, "number", "numeric", c.dtype))
    return specs


def _batch_values(
    specs: list[Spec], table: pa.Table, view: Any, cfg: PreprocessConfig
) -> dict[str, np.ndarray | tuple[np.ndarray, list[str]]]:
    """Each output column of one batch: float64 values (NaN missing) or (codes, values)."""
    out: dict[str, np.ndarray | tuple[np.ndarray, list[str]]] = {}
    dates: dict[str, dict[str, np.ndarray]] = {}
    for s in specs:
        col = table.column(s.source)
        if s.how == "number":
            out[s.name] = _numbers(view, s.name, col, target=False)
        elif s.how == "text_number":
            codes, values = dictionary_codes(col)
            declared = cfg.column_roles.get(s.name) == "numeric"
            x = _text_as_numbers(view, s.name, codes, values, declared=declared)
            if x is None:
                raise InputError(
                    "E_MIXED_TYPES",
                    f"column {s.name!r} mixes numbers and text: its first rows are numbers, "
                    f"later rows are not; fix the values, or declare the column categorical "
                    f"with {role_param(s.name, 'categorical')}",
                    view.locate(0),
                )
            _check_range(view, s.name, x, target=False)
            out[s.name] = x
        elif s.how == "date":
            if s.source not in dates:
                parts = date_features(col)
                if parts is None:
                    raise InputError(
                        "E_SCHEMA",
                        f"column {s.source!r} reads as dates in its first rows but not in "
                        f"later ones; write them as 2024-01-31, or declare it "
                        f"{role_param(s.source, 'categorical')}",
                        view.locate(0),
                    )
                dates[s.source] = parts
            parts = dates[s.source]
            if s.part in parts:
                out[s.name] = parts[s.part]
            else:  # no time of day in this batch: hour 0 where there is a date
                out[s.name] = np.where(np.isnan(parts["year"]), np.nan, 0.0)
        else:
            if not is_text(col.type):
                col = col.cast(pa.string())
            out[s.name] = dictionary_codes(col)
    return out


def _medians(
    src: BatchSource,
    specs: list[Spec],
    num: dict[str, NumStats],
    labels: np.ndarray,
    batch_rows: int,
    cfg: PreprocessConfig,
) -> None:
    """Finish every numeric column's exact median, with as few passes as it takes."""
    pending = {name for name, st in num.items() if st.median and not st.median.end_pass()}
    while pending:
        wanted = [s for s in specs if s.name in pending]
        sources = sorted({s.source for s in wanted}, key=src.schema.names.index)
        for start, table in src.batches(sources, batch_rows):
            is_train = labels[start : start + table.num_rows] == 0
            values = _batch_values(wanted, table, src.raw_input(table, start), cfg)
            for s in wanted:
                v = values[s.name]
                assert isinstance(v, np.ndarray)
                train = v[is_train]
                median = num[s.name].median
                assert median is not None
                median.feed(order_keys(train[~np.isnan(train)]))
        done = set()
        for name in pending:
            median = num[name].median
            assert median is not None
            if median.end_pass():
                done.add(name)
        pending -= done


def _no_training_values(name: str, n_train: int, cfg: PreprocessConfig, data_uri: str) -> None:
    raise InputError(
        "E_ALL_MISSING",
        f"column {name!r} has no values in the training split "
        f"({n_train} rows, seed {cfg.seed}); fill it, drop it with "
        f"{role_param(name, 'drop')}, or split differently with "
        f"{param('seed', cfg.seed + 1)}",
        data_uri,
    )


def _check_labels(
    src: BatchSource,
    cfg: PreprocessConfig,
    y: np.ndarray,
    classes: list[str] | None,
    labels: np.ndarray,
) -> None:
    """The in-memory path's split checks, run on index arrays only when one would fail."""
    sizes = np.bincount(labels, minlength=3)
    bad = bool((sizes == 0).any())
    if classes is not None and not bad:
        in_train = np.zeros(len(classes), dtype=np.int64)
        for lo in range(0, y.size, 1 << 20):  # chunked: no row-sized temporaries
            part = y[lo : lo + (1 << 20)]
            in_train += np.bincount(part[labels[lo : lo + (1 << 20)] == 0], minlength=len(classes))
        bad = bool((in_train == 0).any())
    if bad:
        train, val, test = (np.flatnonzero(labels == i) for i in range(3))
        check_splits(src.raw_input(pa.table({})), cfg, y, classes, train, val, test)


def _encode_batch(
    specs: list[Spec],
    fits: list[NumericFit | CategoricalFit],
    values: dict[str, np.ndarray | tuple[np.ndarray, list[str]]],
    view: Any,
) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for s, fit in zip(specs, fits, strict=True):
        v = values[s.name]
        if isinstance(fit, NumericFit):
            assert isinstance(v, np.ndarray)
            miss = np.isnan(v)
            x = np.where(miss, fit.median, v)
            x -= fit.mean
            x /= fit.std
            with np.errstate(over="ignore"):
                scaled = x.astype(np.float32)
            bad = ~np.isfinite(scaled)
            if bad.any():
                row = int(np.argmax(bad))
                raise InputError(
                    "E_OVERFLOW",
                    f"column {fit.name!r}: {v[row]:g} standardised with the training split's "
                    f"mean {fit.mean:g} and std {fit.std:g} overflows float32; fix the value or "
                    f"rescale the column (e.g. a log), or drop it with "
                    f"{role_param(fit.name, 'drop')}",
                    view.locate(row),
                )
            out.append(scaled)
            if len(fit.outputs) > 1:
                out.append(miss.astype(np.float32))
        else:
            assert isinstance(v, tuple)
            codes, batch_values = v
            position = {c: j for j, c in enumerate(fit.categories)}
            other = len(fit.categories)
            lookup = np.array(
                [position.get(MISSING, other)] + [position.get(b, other) for b in batch_values],
                dtype=np.intp,
            )
            out_codes = lookup[codes + 1]
            onehot = np.zeros((other + 1, codes.size), dtype=np.float32)
            onehot[out_codes, np.arange(codes.size)] = 1.0
            out.extend(onehot)
    return out


def _write(
    src: BatchSource,
    cfg: PreprocessConfig,
    specs: list[Spec],
    fits: list[NumericFit | CategoricalFit],
    features: list[str],
    classes: list[str] | None,
    y: np.ndarray,
    labels: np.ndarray,
    output_uri: str,
    budget: int,
    sources: list[str],
    docs: dict[str, dict[str, Any]],
) -> None:
    """Encode every batch and append its rows to the split they belong to, a row group at a
    time (the in-memory path's row-group size where the budget allows it)."""
    target_type = pa.int64() if classes is not None else pa.float32()
    schema = pa.schema(
        [pa.field(f, pa.float32(), nullable=False) for f in features]
        + [pa.field(cfg.target, target_type, nullable=False)]
    )
    numeric = {f.name for f in fits if isinstance(f, NumericFit)}
    dictionary_columns = [f for f in features if f not in numeric]
    if classes is not None:
        dictionary_columns.append(cfg.target)
    out_row = 4 * len(features) + 8
    n = src.num_rows
    group_rows = int(_PARQUET_OPTIONS["row_group_size"])
    group_rows = min(group_rows, max(MIN_GROUP_ROWS, _budget_rows(budget, n, 8 * out_row) // 3))
    batch_rows = _budget_rows(budget, n, 2 * _row_bytes(src.schema) + 6 * out_row)
    options = {k: v for k, v in _PARQUET_OPTIONS.items() if k != "row_group_size"}
    names = ("train", "val", "test")
    with atomic_dir(output_uri, step="preprocess") as tmp:
        with contextlib.ExitStack() as stack:
            files = [
                stack.enter_context(storage.open_output(storage.join(tmp, f"{s}.parquet")))
                for s in names
            ]
            writers = [
                stack.enter_context(
                    pq.ParquetWriter(f, schema, use_dictionary=dictionary_columns, **options)
                )
                for f in files
            ]
            pending: list[list[pa.Table]] = [[], [], []]
            held = [0, 0, 0]
            for start, table in src.batches(sources, batch_rows):
                rows = table.num_rows
                view = src.raw_input(table, start)
                arrays = _encode_batch(specs, fits, _batch_values(specs, table, view, cfg), view)
                ys = y[start : start + rows]
                encoded = pa.table(
                    [pa.array(a) for a in arrays]
                    + [pa.array(ys.astype(np.int64) if classes is not None else ys)],
                    schema=schema,
                )
                del arrays
                lab = labels[start : start + rows]
                for i in range(3):
                    idx = np.flatnonzero(lab == i)
                    if idx.size:
                        pending[i].append(encoded.take(idx))
                        held[i] += idx.size
                    while held[i] >= group_rows:
                        whole = pa.concat_tables(pending[i])
                        writers[i].write_table(
                            whole.slice(0, group_rows), row_group_size=group_rows
                        )
                        rest = whole.slice(group_rows)
                        pending[i] = [rest] if rest.num_rows else []
                        held[i] = rest.num_rows
            for i in range(3):
                if held[i]:
                    writers[i].write_table(pa.concat_tables(pending[i]), row_group_size=group_rows)
        for name, doc in docs.items():
            storage.write_json(storage.join(tmp, name), doc)
