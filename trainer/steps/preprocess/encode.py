"""Preprocess's split and fitted transforms: a reproducible (stratified) split, numeric
imputation and standardisation, and one-hot encoding with the training split's categories."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

MISSING = "__missing__"
"""The category that a missing categorical value becomes."""
OTHER = "__other__"
"""The category for values outside the kept top-N, and for values unseen in training."""


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


SPLIT_CHUNK = 1 << 16
"""Rows of the shuffled order handled at a time by :func:`split_labels`."""


def split_labels(
    n: int,
    *,
    classes: np.ndarray | None,
    val_fraction: float,
    test_fraction: float,
    seed: int,
) -> np.ndarray:
    """The split of each row (0 train, 1 validation, 2 test) as int8: :func:`split_indices`'s
    split exactly, in 5 bytes a row (a 32-bit shuffle and the labels) instead of about 50.

    The shuffle is the same draw (``Generator.shuffle`` of ``0..n-1`` is what
    ``Generator.permutation(n)`` does, whatever the integer width); a class's first rows in
    shuffled order go to test, then validation, counted chunk by chunk.
    """
    order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    np.random.default_rng(seed).shuffle(order)
    label = np.zeros(n, dtype=np.int8)
    if classes is None:
        n_test = int(_round_half_up(np.array(n * test_fraction)))
        n_val = int(_round_half_up(np.array(n * val_fraction)))
        label[order[n_test : n_test + n_val]] = 1
        label[order[:n_test]] = 2
        return label
    counts = np.bincount(classes, minlength=int(classes.max()) + 1 if n else 0)
    n_test_c = _round_half_up(counts * test_fraction)
    n_held_c = n_test_c + _round_half_up(counts * val_fraction)
    seen = np.zeros(len(counts), dtype=np.int64)
    for lo in range(0, n, SPLIT_CHUNK):
        rows = order[lo : lo + SPLIT_CHUNK]
        cls = classes[rows]
        # Rank of each row among its class so far: its class's earlier count plus its
        # position among the chunk's rows of that class (a stable sort groups them).
        by_class = np.argsort(cls, kind="stable")
        chunk_counts = np.bincount(cls, minlength=len(counts))
        starts = np.cumsum(chunk_counts) - chunk_counts
        sorted_cls = cls[by_class]
        rank = np.empty(rows.size, dtype=np.int64)
        rank[by_class] = np.arange(rows.size) - starts[sorted_cls] + seen[sorted_cls]
        seen += chunk_counts
        label[rows[(rank < n_held_c[cls]) & (rank >= n_test_c[cls])]] = 1
        label[rows[rank < n_test_c[cls]]] = 2
    return label


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
