"""The statistics streaming preprocess gathers batch by batch, and the fits made of them:
exact moments (merged chunk by chunk, file by file), bounded category counts, and the
``schema.json``/``stats.json`` entries of :mod:`trainer.steps.preprocess.stream`.

Every statistic here merges: the moments of a file do not depend on how its rows were cut into
batches (:class:`MomentStream`), files' moments fold in file order (:meth:`Moments.merge`), and
category counts add (:meth:`CatStats.merge`), so processes that each read some of the files
(:mod:`trainer.steps.preprocess.wide`) reach one process's numbers bit for bit."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer.steps.preprocess.config import PreprocessConfig
from trainer.steps.preprocess.encode import MISSING, OTHER, CategoricalFit, NumericFit
from trainer.steps.preprocess.quantile import MedianSelect

CATEGORY_CAP = 1 << 18
"""Distinct values counted exactly per categorical column; beyond it the rarest half is
forgotten (the kept top categories are then those of a lossy count)."""


@dataclass(slots=True)
class Moments:
    """Count, mean, sum of squared deviations, min and max, merged batch by batch (Chan)."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf

    @classmethod
    def of(cls, x: np.ndarray) -> Moments:
        """The moments of the values ``x`` (no NaN), computed at once."""
        if not x.size:
            return cls()
        mean = float(x.mean(dtype=np.float64))
        m2 = float(np.square(x - mean, dtype=np.float64).sum())
        return cls(int(x.size), mean, m2, float(x.min()), float(x.max()))

    def add(self, x: np.ndarray) -> None:
        """Merge the values ``x`` (no NaN)."""
        self.merge(Moments.of(x))

    def merge(self, other: Moments) -> None:
        """Merge ``other`` in (Chan et al.'s pairwise update); merging into nothing copies it, so
        a fold that starts empty gives the same bits as one that starts with its first part."""
        if not other.n:
            return
        if not self.n:
            self.n, self.mean, self.m2 = other.n, other.mean, other.m2
            self.lo, self.hi = other.lo, other.hi
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self.mean += delta * other.n / n
        self.m2 += other.m2 + delta * delta * self.n * other.n / n
        self.n = n
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)

    @property
    def std(self) -> float:
        """Population standard deviation."""
        return math.sqrt(max(self.m2, 0.0) / self.n) if self.n else 0.0


MOMENT_CHUNK = 1 << 14
"""Values merged at a time by :class:`MomentStream` (128 KiB held per stream between batches)."""


@dataclass(slots=True)
class MomentStream:
    """The moments of one file's stream of values, :data:`MOMENT_CHUNK` values at a time.

    Whatever the batches (their size follows the memory budget), the values are merged in the
    same chunks: the file's moments are the same bits for any budget and any process that reads
    the file. A partial chunk waits (copied) for the next batch or :meth:`finish`.
    """

    done: Moments = field(default_factory=Moments)
    rest: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))

    def add(self, x: np.ndarray) -> None:
        """Feed the next values of the stream (no NaN)."""
        if self.rest.size:
            x = np.concatenate([self.rest, x])
        whole = x.size - x.size % MOMENT_CHUNK
        for lo in range(0, whole, MOMENT_CHUNK):
            self.done.merge(Moments.of(x[lo : lo + MOMENT_CHUNK]))
        self.rest = np.array(x[whole:], dtype=np.float64)  # a copy: never pins the batch

    def finish(self) -> Moments:
        """The file's moments (the last partial chunk merged); the stream starts over."""
        self.done.merge(Moments.of(self.rest))
        out, self.done = self.done, Moments()
        self.rest = np.empty(0, np.float64)
        return out


def fold(parts: list[Moments]) -> Moments:
    """Files' moments merged in file order (the one order every process uses)."""
    out = Moments()
    for m in parts:
        out.merge(m)
    return out


@dataclass(slots=True)
class Spec:
    """How one output column is computed from one input column, batch by batch."""

    name: str
    source: str
    how: str  # number | text_number | date | category
    kind: str
    dtype: str
    part: str = ""


@dataclass(slots=True)
class NumStats:
    """A numeric column's statistics: per-file moments (of every present value, and of the
    training rows'), folded into :attr:`all` and :attr:`train` by :meth:`finish`."""

    all: Moments = field(default_factory=Moments)
    train: Moments = field(default_factory=Moments)
    missing: int = 0
    train_missing: int = 0
    median: MedianSelect | None = None
    files_all: dict[int, Moments] = field(default_factory=dict)
    """Each read file's moments of the present values, by file index."""
    files_train: dict[int, Moments] = field(default_factory=dict)
    streams: tuple[MomentStream, MomentStream] = field(
        default_factory=lambda: (MomentStream(), MomentStream())
    )
    file: int = -1
    """The file whose values the streams hold."""

    def feed(self, file: int, present: np.ndarray, train: np.ndarray) -> None:
        """One batch of file ``file``: its present values and its training rows' ones."""
        if file != self.file:
            self.end_file()
            self.file = file
        self.streams[0].add(present)
        self.streams[1].add(train)

    def end_file(self) -> None:
        """Close the file being read (a no-op when none is)."""
        if self.file >= 0:
            self.files_all[self.file] = self.streams[0].finish()
            self.files_train[self.file] = self.streams[1].finish()
            self.file = -1

    def finish(self) -> None:
        """Fold the files' moments, in file order, into :attr:`all` and :attr:`train`."""
        self.end_file()
        self.all = fold([self.files_all[i] for i in sorted(self.files_all)])
        self.train = fold([self.files_train[i] for i in sorted(self.files_train)])

    def merge(self, other: NumStats) -> None:
        """Take in another process's counts and per-file moments (of other files)."""
        other.end_file()
        self.missing += other.missing
        self.train_missing += other.train_missing
        self.files_all.update(other.files_all)
        self.files_train.update(other.files_train)

    def partial(self) -> NumStats:
        """What another process needs of this one (no median state, no open streams)."""
        self.end_file()
        return NumStats(
            missing=self.missing,
            train_missing=self.train_missing,
            files_all=self.files_all,
            files_train=self.files_train,
        )


@dataclass(slots=True)
class CatStats:
    counts: dict[str, list[int]] = field(default_factory=dict)  # value -> [all, train]
    present: int = 0
    missing: int = 0
    train_missing: int = 0
    approximate: bool = False

    def merge(self, other: CatStats) -> None:
        """Add another process's counts. Exact while no column passes :data:`CATEGORY_CAP`
        distinct values in either process or merged; beyond it both one process's counts and
        merged ones are lossy (and marked ``approximate``), and may differ."""
        self.present += other.present
        self.missing += other.missing
        self.train_missing += other.train_missing
        self.approximate |= other.approximate
        counts = self.counts
        for value, (n_all, n_train) in other.counts.items():
            entry = counts.get(value)
            if entry is None:
                counts[value] = [n_all, n_train]
            else:
                entry[0] += n_all
                entry[1] += n_train
        _cap(self)


def _cap(st: CatStats) -> None:
    if len(st.counts) > CATEGORY_CAP:
        ranked = sorted(st.counts.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
        st.counts = dict(ranked[: CATEGORY_CAP // 2])
        st.approximate = True


def count_categories(
    st: CatStats, codes: np.ndarray, values: list[str], is_train: np.ndarray
) -> None:
    shifted = codes + 1
    all_c = np.bincount(shifted, minlength=len(values) + 1)
    train_c = np.bincount(shifted[is_train], minlength=len(values) + 1)
    st.missing += int(all_c[0])
    st.present += int(codes.size - all_c[0])
    st.train_missing += int(train_c[0])
    counts = st.counts
    for i in np.flatnonzero(all_c[1:]).tolist():
        entry = counts.get(values[i])
        if entry is None:
            counts[values[i]] = [int(all_c[i + 1]), int(train_c[i + 1])]
        else:
            entry[0] += int(all_c[i + 1])
            entry[1] += int(train_c[i + 1])
    _cap(st)


def fit_of(
    s: Spec,
    num: dict[str, NumStats],
    cat: dict[str, CatStats],
    n_train: int,
    cfg: PreprocessConfig,
) -> NumericFit | CategoricalFit:
    if s.kind == "numeric":
        st = num[s.name]
        assert st.median is not None
        median = st.median.value
        m, q = st.train.n, n_train - st.train.n
        # Moments of the imputed training values: the present ones and q copies of the median.
        mean = (m * st.train.mean + q * median) / n_train
        m2 = st.train.m2 + m * (st.train.mean - mean) ** 2 + q * (median - mean) ** 2
        std = math.sqrt(max(m2, 0.0) / n_train)
        if not math.isfinite(std) or std == 0.0:
            std = 1.0
        outputs = [s.name]
        if cfg.missing_indicator and q:
            outputs.append(f"{s.name}__missing")
        return NumericFit(
            name=s.name,
            dtype=s.dtype,
            missing=st.missing,
            train_missing=q,
            median=median,
            mean=mean,
            std=std,
            outputs=outputs,
        )
    c = cat[s.name]
    categories = kept_categories(c, cfg.max_categories)
    return CategoricalFit(
        name=s.name,
        dtype=s.dtype,
        missing=c.missing,
        categories=categories,
        outputs=[f"{s.name}={v}" for v in [*categories, OTHER]],
    )


def kept_categories(c: CatStats, max_categories: int) -> list[str]:
    """The kept categories as :func:`~trainer.steps.preprocess.encode.encode_categorical`
    chooses them: most frequent in training (ties by value), sorted, then ``__missing__``."""
    # None stands for the missing slot, ranked under its label like encode_categorical's.
    ranked: list[tuple[str | None, int]] = [
        (v, counts[1]) for v, counts in c.counts.items() if counts[1] > 0 and v != OTHER
    ]
    if c.train_missing:
        ranked.append((None, c.train_missing))
    ranked.sort(key=lambda vc: (-vc[1], MISSING if vc[0] is None else vc[0]))
    kept = ranked[:max_categories]
    values = sorted(v for v, _ in kept if v is not None)
    return values + ([MISSING] if any(v is None for v, _ in kept) else [])


def stats_of(s: Spec, num: dict[str, NumStats], cat: dict[str, CatStats]) -> dict[str, Any]:
    if s.kind == "numeric":
        st = num[s.name]
        return {
            "kind": "numeric",
            "count": st.all.n,
            "missing": st.missing,
            "min": st.all.lo,
            "max": st.all.hi,
            "mean": st.all.mean,
            "std": st.all.std,
        }
    c = cat[s.name]
    top = sorted(c.counts.items(), key=lambda kv: (-kv[1][0], kv[0]))[:10]
    out: dict[str, Any] = {
        "kind": "categorical",
        "count": c.present,
        "missing": c.missing,
        "distinct": len(c.counts),
        "top": [{"value": v, "count": counts[0]} for v, counts in top if counts[0] > 0],
    }
    if c.approximate:  # past CATEGORY_CAP: distinct is a lower bound, top counts lossy
        out["approximate"] = True
    return out


def target_stats(
    y: np.ndarray, labels: np.ndarray, split: int, classes: list[str] | None
) -> dict[str, Any]:
    if classes is not None:
        counts = np.bincount(y[labels == split], minlength=len(classes))
        return {
            "rows": int(counts.sum()),
            "classes": dict(zip(classes, counts.tolist(), strict=True)),
        }
    mom = Moments()
    step = 1 << 20
    for lo in range(0, y.size, step):
        part = y[lo : lo + step]
        mom.add(part[labels[lo : lo + step] == split].astype(np.float64))
    if not mom.n:
        return {"rows": 0}
    return {"rows": mom.n, "mean": mom.mean, "std": mom.std, "min": mom.lo, "max": mom.hi}
