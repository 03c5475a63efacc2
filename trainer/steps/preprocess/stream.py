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

The same code runs in one process or in several at once (:mod:`~trainer.steps.preprocess.wide`,
through :class:`~trainer.steps.preprocess.peers.Peers`): each reads a contiguous group of the
files; main (rank 0) types the columns on the dataset's first rows, gathers the target, draws
the split and hands each rank its rows' share; the statistics are exchanged and merged in file
order (:mod:`~trainer.steps.preprocess.stream_stats`, :mod:`~trainer.steps.preprocess.quantile`);
each rank encodes its own rows and main assembles the published files. The result is one
process's, bit for bit: nothing computed depends on which process read a file, nor on the
batch size (moments merge in fixed chunks per file).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import dataclasses
import types
from collections.abc import Callable
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
from trainer.steps.preprocess.peers import SOLO, Peers, file_groups, file_sizes
from trainer.steps.preprocess.published import (
    _PARQUET_OPTIONS,
    PreprocessResult,
    feature_names,
    published_result,
    schema_document,
)
from trainer.steps.preprocess.quantile import MedianSelect, order_keys
from trainer.steps.preprocess.source import BatchSource, FileInfo, data_hash, open_source
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

SPLITS = ("train", "val", "test")
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
    cfg: PreprocessConfig,
    *,
    data_uri: str,
    output_uri: str,
    fingerprint: str,
    budget: int,
    peers: Peers = SOLO,
    plan_budget: int | None = None,
) -> PreprocessResult:
    """Preprocess ``data_uri`` into ``output_uri`` reading record batches (see the module doc).

    The caller has checked the output location and the fingerprint
    (:func:`trainer.steps.preprocess.step.preprocess`). With ``peers`` of several processes
    (:mod:`trainer.steps.preprocess.wide`) each reads its own contiguous group of files and the
    result is one process's, bit for bit.

    Args:
        cfg: What to read and how.
        data_uri: A data file, a folder of them, or a Hive-partitioned folder.
        output_uri: Where the splits, ``schema.json`` and ``stats.json`` are published.
        fingerprint: The data's fingerprint, recorded in ``schema.json``.
        budget: Bytes this process's batches and per-row state are planned to fit in.
        peers: The processes of the run; one by default.
        plan_budget: The budget one process would plan with (``budget`` by default): it sets
            the rows the column typing is decided on, so N processes type as one would.

    Raises:
        InputError: As :func:`~trainer.steps.preprocess.step.preprocess` (on every process).
    """
    csv = cfg.csv_options()
    block_bytes = int(min(max(budget // 16, 1 << 20), 64 << 20))
    own: range | None = None
    groups: list[range] = []
    if peers.world > 1:
        groups = peers.main(lambda: file_groups(file_sizes(data_uri), peers.world))
        own = groups[peers.rank]
    with contextlib.ExitStack() as stack:
        opened: list[BatchSource] = []

        def open_own() -> list[FileInfo]:
            src = open_source(
                data_uri, csv, block_bytes=block_bytes, max_bytes=cfg.max_input_bytes, own=own
            )
            stack.callback(src.close)
            opened.append(src)
            return src.scanned

        infos = peers.all(open_own)
        src = opened[0]
        if own is not None:
            src.complete([info for part in infos for info in part])
        else:
            groups = [src.read_files]
        return _run(cfg, src, data_uri, output_uri, fingerprint, budget, peers,
                    budget if plan_budget is None else plan_budget, groups)  # fmt: skip


@dataclasses.dataclass(slots=True)
class _Plan:
    """What main decides on the whole dataset and every process needs."""

    specs: list[Spec]
    classes: list[str] | None
    n_train: int
    cap: int


def _run(
    cfg: PreprocessConfig,
    src: BatchSource,
    data_uri: str,
    output_uri: str,
    fingerprint: str,
    budget: int,
    peers: Peers,
    plan_budget: int,
    groups: list[range],
) -> PreprocessResult:
    n = src.num_rows
    if n == 0:
        shown = ", ".join(map(repr, src.schema.names[:20]))
        raise InputError("E_EMPTY", f"dataset has no rows, only the columns ({shown})", data_uri)
    lo, hi = int(src.offsets[src.read_files.start]), int(src.offsets[src.read_files.stop])
    hashing = _hash_in_background(src.files) if peers.world > 1 and peers.is_main else None
    row_bytes = _row_bytes(src.schema)
    state_rows = n if peers.is_main else hi - lo  # main holds the whole target and split
    batch_rows = _budget_rows(budget, state_rows, 4 * row_bytes)
    head_rows = min(n, HEAD_ROWS, max(MIN_BATCH_ROWS, plan_budget // (16 * row_bytes)))
    heads = peers.gather(lambda: src.head(min(head_rows, hi) - lo) if lo < min(head_rows, hi)
                         else None)  # fmt: skip
    head = _concat([h for h in heads or [] if h is not None], src.schema)
    notes: list[Notice] = []

    def target_present() -> None:
        if cfg.target not in src.schema.names:
            target_column(src.raw_input(head), cfg, notes)  # raises the in-memory path's error

    peers.main(target_present)
    pieces = peers.gather(lambda: _target_piece(src, cfg, batch_rows))
    held: dict[str, Any] = {}

    def decide() -> _Plan:
        assert pieces is not None
        y, task, classes = _target(src, cfg, pieces, notes)
        pieces.clear()
        label_variants(cfg.target, classes, y, notes)
        head_in = src.raw_input(head)
        columns, dropped, decisions = feature_columns(head_in, cfg, notes)
        decisions += leakage_warnings(head_in, columns, y[:head_rows], classes, cfg.target, notes)
        specs = _specs(columns, decisions, src.schema)
        del columns, head_in
        release_memory()
        labels = split_labels(
            n,
            classes=y if classes is not None else None,
            val_fraction=cfg.val_fraction,
            test_fraction=cfg.test_fraction,
            seed=cfg.seed,
        )
        _check_labels(src, cfg, y, classes, labels)
        held.update(y=y, labels=labels, task=task, dropped=dropped, decisions=decisions)
        n_numeric = sum(1 for s in specs if s.kind == "numeric")
        # Values a median may collect in memory: both middle ranks of every column within half
        # the budget (8 bytes a value).
        cap = max(MIN_BATCH_ROWS, budget // (32 * max(n_numeric, 1)))
        return _Plan(specs, classes, int(np.count_nonzero(labels == 0)), cap)

    plan = peers.main(decide)
    head = src.schema.empty_table()  # the head rows are typed: let them go
    release_memory()
    specs, classes, n_train = plan.specs, plan.classes, plan.n_train

    def slices() -> list[tuple[np.ndarray, np.ndarray]]:
        y, labels = held["y"], held["labels"]
        return [
            (y[src.offsets[g.start] : src.offsets[g.stop]],
             labels[src.offsets[g.start] : src.offsets[g.stop]])
            for g in groups
        ]  # fmt: skip

    y_own, labels_own = peers.scatter(slices)
    sources = sorted({s.source for s in specs}, key=src.schema.names.index)

    num: dict[str, NumStats] = {
        s.name: NumStats(median=MedianSelect(cap=plan.cap)) for s in specs if s.kind == "numeric"
    }
    cat: dict[str, CatStats] = {s.name: CatStats() for s in specs if s.kind == "categorical"}

    def statistics() -> tuple[dict[str, NumStats], dict[str, CatStats], dict[str, Any]]:
        for start, table in src.batches(sources, batch_rows):
            is_train = labels_own[start - lo : start - lo + table.num_rows] == 0
            file = src.file_of(start)
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
                    train = v[is_train & present]
                    st.train_missing += int(np.count_nonzero(is_train)) - int(train.size)
                    st.feed(file, v[present], train)
                    assert st.median is not None
                    st.median.feed(order_keys(train))
        if peers.world == 1:
            return num, cat, {}
        medians = {k: st.median.pass_state() for k, st in num.items() if st.median is not None}
        return {k: st.partial() for k, st in num.items()}, dict(cat), medians

    gathered = peers.all(statistics)
    if peers.world > 1:
        _merge_statistics(num, cat, gathered)
    del gathered
    for st in num.values():
        st.finish()
    release_memory()
    for spec in specs:
        if spec.kind == "numeric" and num[spec.name].train.n == 0:
            _no_training_values(spec.name, n_train, cfg, data_uri)
        if spec.kind == "categorical":
            st_c = cat[spec.name]
            if st_c.train_missing == n_train:
                _no_training_values(spec.name, n_train, cfg, data_uri)
    _medians(src, specs, num, labels_own, lo, batch_rows, cfg, peers)
    release_memory()

    fits = [fit_of(s, num, cat, n_train, cfg) for s in specs]
    features = feature_names(fits, cfg.target, data_uri)
    check_features(len(features), cfg.max_features, data_uri)

    def documents() -> dict[str, dict[str, Any]]:
        """schema.json and stats.json (main, once the splits are written)."""
        y, labels, task = held["y"], held["labels"], held["task"]
        splits = {k: int(np.count_nonzero(labels == i)) for i, k in enumerate(SPLITS)}
        stats = {s.name: stats_of(s, num, cat) for s in specs}
        digest = hashing.result() if hashing is not None else data_hash(src.files)
        schema_doc = schema_document(
            target=cfg.target, task=task, fits=fits, dropped=held["dropped"],
            decisions=held["decisions"], notes=notes, classes=classes, data_hash=digest,
            fingerprint=fingerprint, data_uri=data_uri, seed=cfg.seed, splits=splits,
            features=features,
        )  # fmt: skip
        stats_doc = {
            "rows": n,
            "columns": stats,
            "target": {name: target_stats(y, labels, i, classes) for i, name in enumerate(SPLITS)},
        }
        held.update(splits=splits, digest=digest)
        return {"schema.json": schema_doc, "stats.json": stats_doc}

    _write(src, cfg, specs, fits, features, classes, y_own, labels_own, lo, output_uri,
           budget, state_rows, sources, documents, peers)  # fmt: skip
    if not peers.is_main:
        return _NOT_MAIN
    return published_result(held["splits"], features, held["task"], classes, held["digest"], notes)


_NOT_MAIN = PreprocessResult(0, 0, 0, [], "", None, "")
"""What a process other than main returns (main publishes and reports the result)."""


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    if not tables:
        return schema.empty_table()
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")


def _hash_in_background(files: list[str]) -> concurrent.futures.Future[str]:
    """:func:`data_hash` in a thread (sha256 over every file is sequential: main starts it
    first and collects it at the end; hashlib and file reads release the GIL)."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="data-hash")
    future = pool.submit(data_hash, files)
    pool.shutdown(wait=False)
    return future


def _merge_statistics(
    num: dict[str, NumStats],
    cat: dict[str, CatStats],
    gathered: list[tuple[dict[str, NumStats], dict[str, CatStats], dict[str, Any]]],
) -> None:
    """Every rank's statistics (in rank order) into this rank's ``num`` and ``cat``."""
    for name, st in num.items():
        merged = NumStats(median=st.median)
        for part_num, _, _ in gathered:
            merged.merge(part_num[name])
        assert st.median is not None
        st.median.merge_pass([medians[name] for _, _, medians in gathered])
        num[name] = merged
    for name in cat:
        merged_c = CatStats()
        for _, part_cat, _ in gathered:
            merged_c.merge(part_cat[name])
        cat[name] = merged_c


def _target_piece(src: BatchSource, cfg: PreprocessConfig, batch_rows: int) -> tuple[Any, ...]:
    """This process's rows of the target, compact: ``("num", float64 values)`` for a numeric
    target, ``("text", distinct values in first-seen order, int32 codes)`` for a text or
    true/false one. A missing or non-numeric value raises the in-memory path's error, naming
    the row."""
    name = cfg.target
    field_type = src.schema.field(name).type
    rows = int(src.offsets[src.read_files.stop] - src.offsets[src.read_files.start])
    first = int(src.offsets[src.read_files.start])
    unused: list[Notice] = []
    if not (is_text(field_type) or pa.types.is_boolean(field_type)):
        x = np.empty(rows, dtype=np.float64)
        for start, table in src.batches([name], batch_rows):
            col = table.column(0)
            if col.null_count or not is_number(col.type):
                target_column(src.raw_input(table, start), cfg, unused)  # names the row
            x[start - first : start - first + table.num_rows] = _numbers(
                src.raw_input(table, start), name, col, target=True
            )
        return ("num", x)
    codes = np.empty(rows, dtype=np.int32)
    ids: dict[Any, int] = {}
    for start, table in src.batches([name], batch_rows):
        col = table.column(0)
        if col.null_count:
            target_column(src.raw_input(table, start), cfg, unused)  # names the missing row
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if not pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_encode()
        lookup = np.array(
            [ids.setdefault(v, len(ids)) for v in arr.dictionary.to_pylist()], dtype=np.int32
        )
        indices = arr.indices.to_numpy(zero_copy_only=False)
        codes[start - first : start - first + table.num_rows] = (
            lookup[indices] if lookup.size else indices
        )
    return ("text", list(ids), codes)


def _target(
    src: BatchSource,
    cfg: PreprocessConfig,
    pieces: list[tuple[Any, ...]],
    notes: list[Notice],
) -> tuple[np.ndarray, str, list[str] | None]:
    """The target of every row, compact: class ids (one byte each up to 127 classes) or float32
    values, from every process's piece (:func:`_target_piece`, in rank order).

    A text or true/false target is held as int32 codes (4 bytes a row) and typed by the
    in-memory path's :func:`target_column` on its distinct values (in first-seen order over the
    whole dataset); a numeric one is gathered as float64 (8 bytes a row) and typed by it
    directly.
    """
    name = cfg.target
    field_type = src.schema.field(name).type
    if pieces[0][0] == "num":
        x = pieces[0][1] if len(pieces) == 1 else np.concatenate([p[1] for p in pieces])
        pieces.clear()
        y, task, classes = target_column(src.raw_input(pa.table({name: x})), cfg, notes)
        del x
        return (_narrow(y, classes), task, classes) if classes is not None else (y, task, None)
    if len(pieces) == 1:
        _, distinct_values, codes = pieces.pop()
    else:  # one numbering over the dataset: each piece's first-seen values, in rank order
        codes = np.empty(src.num_rows, dtype=np.int32)
        ids: dict[Any, int] = {}
        at = 0
        while pieces:
            _, values, part = pieces.pop(0)
            lookup = np.array([ids.setdefault(v, len(ids)) for v in values], dtype=np.int32)
            codes[at : at + part.size] = lookup[part] if lookup.size else part
            at += part.size
        distinct_values = list(ids)
    # Typed on its distinct values, once each: the same task, classes and notes.
    distinct = pa.table({name: pa.array(distinct_values, type=field_type)})
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
    lo: int,
    batch_rows: int,
    cfg: PreprocessConfig,
    peers: Peers,
) -> None:
    """Finish every numeric column's exact median, with as few passes as it takes (``labels``:
    the split of this process's rows, from row ``lo``); after each pass the processes pool
    what it gathered, so each takes the same next step."""

    def selector(name: str) -> MedianSelect:
        median = num[name].median
        assert median is not None
        return median

    pending = {name for name in num if not selector(name).end_pass()}
    while pending:
        wanted = [s for s in specs if s.name in pending]
        sources = sorted({s.source for s in wanted}, key=src.schema.names.index)

        def one_pass(
            wanted: list[Spec] = wanted, sources: list[str] = sources, names: set[str] = pending
        ) -> dict[str, Any]:
            for start, table in src.batches(sources, batch_rows):
                is_train = labels[start - lo : start - lo + table.num_rows] == 0
                values = _batch_values(wanted, table, src.raw_input(table, start), cfg)
                for s in wanted:
                    v = values[s.name]
                    assert isinstance(v, np.ndarray)
                    train = v[is_train]
                    selector(s.name).feed(order_keys(train[~np.isnan(train)]))
            if peers.world == 1:
                return {}
            return {name: selector(name).pass_state() for name in names}

        states = peers.all(one_pass)
        if peers.world > 1:
            for name in pending:
                selector(name).merge_pass([state[name] for state in states])
        pending -= {name for name in pending if selector(name).end_pass()}


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


PARTS = "_parts"
"""Folder of the output's temporary folder where the other ranks write their rows' splits."""


class _SplitWriter:
    """The three split files of a folder, each written ``group_rows`` rows a row group, rows
    in the order :meth:`add` gets them (so the row groups do not depend on the batches)."""

    def __init__(self, folder: str, schema: pa.Schema, group_rows: int, **options: Any) -> None:
        self._stack = contextlib.ExitStack()
        try:
            files = [
                self._stack.enter_context(storage.open_output(storage.join(folder, f"{s}.parquet")))
                for s in SPLITS
            ]
            self._writers = [
                self._stack.enter_context(pq.ParquetWriter(f, schema, **options)) for f in files
            ]
        except BaseException:
            self._stack.close()
            raise
        self.group_rows = group_rows
        self._pending: list[list[pa.Table]] = [[], [], []]
        self._held = [0, 0, 0]

    def __enter__(self) -> _SplitWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # the files see the failure: none is renamed into place
            self._stack.__exit__(exc_type, exc, tb)

    def add(self, i: int, table: pa.Table) -> None:
        """Append ``table``'s rows to split ``i``."""
        if table.num_rows:
            self._pending[i].append(table)
            self._held[i] += table.num_rows
        while self._held[i] >= self.group_rows:
            whole = pa.concat_tables(self._pending[i])
            self._writers[i].write_table(
                whole.slice(0, self.group_rows), row_group_size=self.group_rows
            )
            rest = whole.slice(self.group_rows)
            self._pending[i] = [rest] if rest.num_rows else []
            self._held[i] = rest.num_rows

    def close(self) -> None:
        """Write what is held and close the files (a no-op the second time)."""
        for i in range(3):
            if self._held[i]:
                self._writers[i].write_table(
                    pa.concat_tables(self._pending[i]), row_group_size=self.group_rows
                )
                self._pending[i], self._held[i] = [], 0
        self._stack.close()


def _write(
    src: BatchSource,
    cfg: PreprocessConfig,
    specs: list[Spec],
    fits: list[NumericFit | CategoricalFit],
    features: list[str],
    classes: list[str] | None,
    y: np.ndarray,
    labels: np.ndarray,
    lo: int,
    output_uri: str,
    budget: int,
    state_rows: int,
    sources: list[str],
    finish: Callable[[], dict[str, dict[str, Any]]],
    peers: Peers,
) -> None:
    """Encode every batch and append its rows to the split they belong to, a row group at a
    time (the in-memory path's row-group size where the budget allows it); ``y`` and
    ``labels`` hold this process's rows, from row ``lo``.

    With several processes, main writes its rows straight into the output's split files while
    each other rank writes its own into part files under the output's temporary folder; main
    then appends the parts, rank by rank and row group by row group (bounded memory), so the
    published files hold the rows in the dataset's order, in row groups cut as one process
    would cut them. A failure anywhere deletes the temporary folder: nothing is published.
    """
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
    group_rows = int(_PARQUET_OPTIONS["row_group_size"])
    group_rows = min(
        group_rows, max(MIN_GROUP_ROWS, _budget_rows(budget, state_rows, 8 * out_row) // 3)
    )
    batch_rows = _budget_rows(budget, state_rows, 2 * _row_bytes(src.schema) + 6 * out_row)
    options = {k: v for k, v in _PARQUET_OPTIONS.items() if k != "row_group_size"}
    with contextlib.ExitStack() as stack:
        main_writer: list[_SplitWriter] = []

        def open_output() -> str:
            tmp = stack.enter_context(atomic_dir(output_uri, step="preprocess"))
            main_writer.append(
                stack.enter_context(
                    _SplitWriter(tmp, schema, group_rows, use_dictionary=dictionary_columns,
                                 **options)
                )
            )  # fmt: skip
            return tmp

        tmp = peers.main(open_output)

        def encode_own() -> None:
            with contextlib.ExitStack() as own:
                if peers.is_main:
                    writer = main_writer[0]
                else:  # quick to write and read back: lz4, no dictionaries
                    part = storage.join(tmp, PARTS, f"rank-{peers.rank}")
                    storage.makedirs(part)
                    writer = own.enter_context(
                        _SplitWriter(part, schema, group_rows, compression="lz4",
                                     use_dictionary=False)
                    )  # fmt: skip
                for start, table in src.batches(sources, batch_rows):
                    rows = table.num_rows
                    view = src.raw_input(table, start)
                    values = _batch_values(specs, table, view, cfg)
                    arrays = _encode_batch(specs, fits, values, view)
                    ys = y[start - lo : start - lo + rows]
                    encoded = pa.table(
                        [pa.array(a) for a in arrays]
                        + [pa.array(ys.astype(np.int64) if classes is not None else ys)],
                        schema=schema,
                    )
                    del arrays, values
                    lab = labels[start - lo : start - lo + rows]
                    for i in range(3):
                        idx = np.flatnonzero(lab == i)
                        if idx.size:
                            writer.add(i, encoded.take(idx))

        peers.all(encode_own)

        def publish() -> None:
            writer = main_writer[0]
            for rank in range(1, peers.world):
                part = storage.join(tmp, PARTS, f"rank-{rank}")
                for i, name in enumerate(SPLITS):
                    with storage.open_input(storage.join(part, f"{name}.parquet")) as f:
                        pf = pq.ParquetFile(f)
                        for g in range(pf.num_row_groups):
                            writer.add(i, pf.read_row_group(g))
                storage.delete(part)
            writer.close()
            for name, doc in finish().items():
                storage.write_json(storage.join(tmp, name), doc)
            if peers.world > 1:
                storage.delete(storage.join(tmp, PARTS))
            stack.close()  # publishes (atomic_dir), inside the exchange: its errors reach all

        peers.main(publish)
