"""Exact order statistics (the median) of a column streamed in batches, in bounded memory.

No sketch: the values are mapped to order-preserving 64-bit keys, and the key's top 16 bits
are counted in a 65,536-bin histogram (512 KiB) during the statistics pass. The bin holding
the wanted rank is then read again: its values are collected and selected exactly if there
are at most ``cap`` of them, else the next 16 bits are counted among them, and so on (at most
four refinements: a key has 64 bits). A typical column needs one extra pass; the result is
the same float64 ``np.median`` gives.

Processes that each read part of the rows reach the same value: after each pass they exchange
what the pass gathered (:meth:`MedianSelect.pass_state`: a histogram, or a bin's collected
keys, at most ``cap``) and every one takes in the sum (:meth:`MedianSelect.merge_pass`), so
their next decisions, and the value, are one process's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

BITS = 16
"""Key bits resolved per pass."""
_BINS = 1 << BITS
_SIGN = np.uint64(1 << 63)


def order_keys(x: np.ndarray) -> np.ndarray:
    """uint64 keys of float64 values (no NaN) that sort as the values do (-0.0 before 0.0)."""
    bits = np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
    negative = (bits & _SIGN) != 0
    return np.where(negative, ~bits, bits | _SIGN)


def _from_keys(keys: np.ndarray) -> np.ndarray:
    negative = (keys & _SIGN) == 0
    return np.where(negative, ~keys, keys & ~_SIGN).view(np.float64)


@dataclass(slots=True)
class RankSelect:
    """Finds the value of rank ``rank`` (0-based, ascending) among values fed in passes."""

    rank: int
    cap: int
    shift: int = 0
    """Key bits already fixed (the prefix)."""
    prefix: int = 0
    below: int = 0
    """Values whose key sorts before every key with this prefix."""
    collect: bool = False
    """This pass collects the prefix's values instead of counting the next bits."""
    hist: np.ndarray = field(default_factory=lambda: np.zeros(_BINS, np.int64))
    collected: np.ndarray | None = None
    """The bin's keys, in one buffer sized from the histogram: many small arrays kept across
    a pass would pin the allocator's heap between the pass's freed temporaries."""
    filled: int = 0
    value: float | None = None

    def feed(self, keys: np.ndarray) -> None:
        """Count (or collect) ``keys`` of this pass; rows not under the prefix are ignored."""
        if self.value is not None:
            return
        if self.shift:
            keys = keys[(keys >> np.uint64(64 - self.shift)) == np.uint64(self.prefix)]
        if self.collect:
            assert self.collected is not None
            self.collected[self.filled : self.filled + keys.size] = keys
            self.filled += keys.size
            return
        digit = (keys >> np.uint64(64 - self.shift - BITS)) & np.uint64(_BINS - 1)
        self.hist += np.bincount(digit.astype(np.intp), minlength=_BINS)

    def end_pass(self) -> bool:
        """Close a pass; True once the value is known (else another pass is needed)."""
        if self.value is not None:
            return True
        if self.collect:
            assert self.collected is not None
            keys = self.collected[: self.filled]
            k = self.rank - self.below
            keys.partition(k)  # in place: the buffer is this selection's own (or shared)
            self.value = float(_from_keys(keys[k : k + 1])[0])
            self.collected = None
            return True
        cum = np.cumsum(self.hist)
        b = int(np.searchsorted(cum, self.rank - self.below, side="right"))
        self.below += int(cum[b] - self.hist[b])
        self.prefix = (self.prefix << BITS) | b
        self.shift += BITS
        in_bin = int(self.hist[b])
        self.hist[:] = 0
        if self.shift == 64:  # every key under the prefix is the same value
            self.value = float(_from_keys(np.array([self.prefix], np.uint64))[0])
            return True
        self.collect = in_bin <= self.cap
        if self.collect:
            self.collected = np.empty(in_bin, dtype=np.uint64)
            self.filled = 0
        return False


@dataclass(slots=True)
class MedianSelect:
    """The exact median (``np.median``'s value) of the values fed, by :class:`RankSelect`.

    The first pass counts the top key bits of every value (and how many there are); the two
    middle ranks then refine from that shared histogram.
    """

    cap: int
    """Most values collected in memory to select from (8 bytes each)."""
    count: int = 0
    parts: list[RankSelect] = field(default_factory=list)
    _first: RankSelect | None = None

    def feed(self, keys: np.ndarray) -> None:
        """Feed one batch's keys (:func:`order_keys` of its present values)."""
        if not self.parts:
            if self._first is None:
                self._first = RankSelect(rank=0, cap=self.cap)
            self._first.feed(keys)
            self.count += int(keys.size)
            return
        for part in self._leaders():
            part.feed(keys)

    def _leaders(self) -> list[RankSelect]:
        """The parts that read this pass: the upper middle rank rides along with the lower one
        when both collect the same bin (the usual case), so its values are held once."""
        if len(self.parts) == 2 and self._shared():
            return self.parts[:1]
        return self.parts

    def _shared(self) -> bool:
        a, b = self.parts
        return (
            a.value is None
            and b.value is None
            and a.collect
            and b.collect
            and (a.shift, a.prefix, a.below) == (b.shift, b.prefix, b.below)
        )

    def end_pass(self) -> bool:
        """Close a pass; True once the median is known.

        Raises:
            ValueError: If no value was fed (a median of nothing).
        """
        if not self.parts:
            if not self.count or self._first is None:
                raise ValueError("median of no values")
            ranks = sorted({(self.count - 1) // 2, self.count // 2})
            self.parts = [
                RankSelect(rank=r, cap=self.cap, hist=self._first.hist.copy()) for r in ranks
            ]
            self._first = None
        elif len(self.parts) == 2 and self._shared():
            self.parts[1].collected = self.parts[0].collected
            self.parts[1].filled = self.parts[0].filled
        done = all([part.end_pass() for part in self.parts])
        if not done and len(self.parts) == 2 and self._shared():
            self.parts[1].collected = None  # the upper rank reads the lower one's buffer
        return done

    def pass_state(self) -> Any:
        """What this pass gathered, for :meth:`merge_pass` in the other processes: the value
        count and the top bits' histogram (first pass), else each reading part's histogram or
        collected keys. Histograms travel as their non-zero bins."""
        if not self.parts:
            hist = self._first.hist if self._first is not None else np.zeros(_BINS, np.int64)
            return (self.count, _sparse(hist))
        out: list[Any] = []
        for part in self._leaders():
            if part.value is not None:
                out.append(None)
            elif part.collect:
                assert part.collected is not None
                out.append(part.collected[: part.filled].copy())
            else:
                out.append(_sparse(part.hist))
        return out

    def merge_pass(self, states: list[Any]) -> None:
        """Replace this pass's gatherings by every process's (``states``: :meth:`pass_state`
        of each, this one's included, in rank order) before :meth:`end_pass`."""
        if not self.parts:
            if self._first is None:
                self._first = RankSelect(rank=0, cap=self.cap)
            self.count = sum(int(c) for c, _ in states)
            self._first.hist = _dense([h for _, h in states])
            return
        for j, part in enumerate(self._leaders()):
            if part.value is not None:
                continue
            if part.collect:
                keys = np.concatenate([s[j] for s in states])
                part.collected = keys
                part.filled = int(keys.size)
            else:
                part.hist = _dense([s[j] for s in states])

    @property
    def value(self) -> float:
        """The median (after :meth:`end_pass` returned True)."""
        values = [p.value for p in self.parts]
        assert values and all(v is not None for v in values)
        return float(np.mean(np.array(values, dtype=np.float64)))


def _sparse(hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    nonzero = np.flatnonzero(hist)
    return nonzero.astype(np.int32), hist[nonzero]


def _dense(parts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    hist = np.zeros(_BINS, np.int64)
    for bins, counts in parts:
        np.add.at(hist, bins, counts)
    return hist
