"""The statistics streaming preprocess gathers batch by batch, and the fits made of them:
exact moments (merged per batch), bounded category counts, and the ``schema.json``/``stats.json``
entries of :mod:`trainer.steps.preprocess.stream`."""

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

    def add(self, x: np.ndarray) -> None:
        """Merge the values ``x`` (no NaN)."""
        nb = int(x.size)
        if not nb:
            return
        mb = float(x.mean(dtype=np.float64))
        m2b = float(np.square(x - mb, dtype=np.float64).sum())
        n = self.n + nb
        delta = mb - self.mean
        self.mean += delta * nb / n
        self.m2 += m2b + delta * delta * self.n * nb / n
        self.n = n
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))

    @property
    def std(self) -> float:
        """Population standard deviation."""
        return math.sqrt(max(self.m2, 0.0) / self.n) if self.n else 0.0


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
    all: Moments = field(default_factory=Moments)
    train: Moments = field(default_factory=Moments)
    missing: int = 0
    train_missing: int = 0
    median: MedianSelect | None = None


@dataclass(slots=True)
class CatStats:
    counts: dict[str, list[int]] = field(default_factory=dict)  # value -> [all, train]
    present: int = 0
    missing: int = 0
    train_missing: int = 0
    approximate: bool = False


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
    if len(counts) > CATEGORY_CAP:
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
        st.counts = dict(ranked[: CATEGORY_CAP // 2])
        st.approximate = True


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
