"""Tabular Parquet larger than memory, read row group by row group: the streaming dataset and
the one-epoch source that serves it window by window to
:class:`trainer.data.datasets.BatchStream`.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch

from trainer.base.errors import InputError
from trainer.data.parquet_columns import (
    check_task,
    empty_rows,
    fill_rows,
    parquet_files,
    read_metadata,
    resolve_columns,
)


def _read_row_group(fs: pafs.FileSystem, path: str, index: int, columns: list[str]) -> pa.Table:
    """Reads one row group's columns (the only place streaming touches row data)."""
    with fs.open_input_file(path) as fh:
        return pq.ParquetFile(fh).read_row_group(index, columns=columns)


@dataclass(frozen=True, slots=True)
class _Unit:
    """One non-empty row group: the unit of streaming reads and of row-group shuffling."""

    file: int
    row_group: int
    num_rows: int


class StreamingParquetDataset:
    """Tabular Parquet read row group by row group, for data larger than memory.

    An epoch visits row groups in a seeded random order, in windows of `window_row_groups` row
    groups whose rows are shuffled together; at most one window (plus one batch) is in memory.
    Row counts come from the Parquet footers, so a stream can start anywhere without reading what
    it skips.
    """

    def __init__(
        self,
        uri: str,
        *,
        target: str,
        features: list[str] | None = None,
        task: str,
        window_row_groups: int = 8,
    ) -> None:
        """Reads footers only; rows are read (and validated) as the stream reaches them.

        Args:
            uri: a .parquet file or a folder of them (sorted by name).
            target: target column.
            features: feature columns; None means every column but the target, in file order.
            task: "classification" or "regression".
            window_row_groups: row groups shuffled together (and held in memory) at a time.

        Raises:
            ValueError: a missing or non-numeric column, or no rows.
        """
        check_task(task)
        if window_row_groups < 1:
            raise ValueError(f"window_row_groups must be >= 1, got {window_row_groups}")
        self.uri = uri
        self.target_name = target
        self.task = task
        self.window_row_groups = window_row_groups
        self._fs, self._files = parquet_files(uri)
        self._units: list[_Unit] = []
        self._metadata: list[pq.FileMetaData] = []
        names: list[str] | None = None
        for i, f in enumerate(self._files):
            md = read_metadata(self._fs, f)
            names = resolve_columns(
                md.schema.to_arrow_schema(), target=target, features=names or features, where=f.name
            )
            self._metadata.append(md)
            for rg in range(md.num_row_groups):
                rows = md.row_group(rg).num_rows
                if rows:
                    self._units.append(_Unit(i, rg, rows))
        assert names is not None
        self.feature_names = names
        self._len = sum(u.num_rows for u in self._units)
        if self._len == 0:
            raise InputError("E_DATA", "dataset is empty: 0 rows", uri)
        self._num_classes: int | None = None

    @classmethod
    def from_parquet(
        cls,
        uri: str,
        *,
        target: str,
        features: list[str] | None = None,
        task: str,
        window_row_groups: int = 8,
    ) -> StreamingParquetDataset:
        """Same as the constructor; mirrors `TabularDataset.from_parquet`."""
        return cls(
            uri, target=target, features=features, task=task, window_row_groups=window_row_groups
        )

    @property
    def num_classes(self) -> int | None:
        """Max label + 1 for classification (from row-group statistics); None for regression."""
        if self.task != "classification":
            return None
        if self._num_classes is None:
            self._num_classes = max(self._unit_target_max(u) for u in self._units) + 1
        return self._num_classes

    def _unit_target_max(self, unit: _Unit) -> int:
        rg = self._metadata[unit.file].row_group(unit.row_group)
        for k in range(rg.num_columns):
            chunk = rg.column(k)
            if chunk.path_in_schema == self.target_name:
                stats = chunk.statistics
                if stats is not None and stats.has_min_max:
                    return int(stats.max)
        # No statistics written: read just the target column of this row group.
        path = self._files[unit.file].path
        table = _read_row_group(self._fs, path, unit.row_group, [self.target_name])
        return int(pc.max(table.column(self.target_name)).as_py())

    def __len__(self) -> int:
        return self._len

    def first_sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first row as ``x`` [1, F] and ``y`` [1] (reads one row group)."""
        unit = self._units[0]
        x, y = empty_rows(unit.num_rows, len(self.feature_names), self.task)
        self._read_unit(unit, x, y)
        return torch.from_numpy(x[:1].copy()), torch.from_numpy(y[:1].copy())

    def _read_unit(self, unit: _Unit, x: np.ndarray, y: np.ndarray) -> None:
        """Reads and validates one row group into `x` [rows, F] and `y` [rows]."""
        f = self._files[unit.file]
        table = _read_row_group(
            self._fs, f.path, unit.row_group, [*self.feature_names, self.target_name]
        )
        where = f"{f.name} (row group {unit.row_group})"
        fill_rows(
            table,
            features=self.feature_names,
            target=self.target_name,
            task=self.task,
            where=where,
            x=x,
            y=y,
        )


class StreamSource:
    """One epoch of a streaming dataset, read window by window, moving forward only."""

    def __init__(self, dataset: StreamingParquetDataset, generator: torch.Generator | None):
        self._ds = dataset
        self._g = generator
        units = dataset._units
        order = (
            torch.randperm(len(units), generator=generator).tolist()
            if generator is not None
            else list(range(len(units)))
        )
        w = dataset.window_row_groups
        self._windows = [[units[u] for u in order[i : i + w]] for i in range(0, len(order), w)]
        sizes = [sum(u.num_rows for u in win) for win in self._windows]
        self._starts = list(itertools.accumulate(sizes, initial=0))
        self._drawn = 0  # windows whose row permutation the generator has produced
        self._loaded = -1
        self._x: torch.Tensor | None = None
        self._y: torch.Tensor | None = None
        self._perm: torch.Tensor | None = None

    def _size(self, w: int) -> int:
        return self._starts[w + 1] - self._starts[w]

    def _draw_perm(self, w: int) -> torch.Tensor:
        if self._g is None:
            return torch.arange(self._size(w))
        return torch.randperm(self._size(w), generator=self._g)

    def _load(self, w: int) -> None:
        assert w >= self._loaded, "streaming epochs are read forward only"
        if w == self._loaded:
            return
        self._x = self._y = self._perm = None  # free the old window before reading the next
        # Skipped windows are not read, but their permutations are drawn to keep the generator in
        # step with an uninterrupted run.
        while self._drawn < w:
            self._draw_perm(self._drawn)
            self._drawn += 1
        self._perm = self._draw_perm(w)
        self._drawn = w + 1
        x, y = empty_rows(self._size(w), len(self._ds.feature_names), self._ds.task)
        off = 0
        for unit in self._windows[w]:
            self._ds._read_unit(unit, x[off : off + unit.num_rows], y[off : off + unit.num_rows])
            off += unit.num_rows
        self._x, self._y, self._loaded = torch.from_numpy(x), torch.from_numpy(y), w

    def take(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        while start < stop:
            w = bisect.bisect_right(self._starts, start) - 1
            self._load(w)
            assert self._x is not None and self._y is not None and self._perm is not None
            lo = start - self._starts[w]
            hi = min(stop, self._starts[w + 1]) - self._starts[w]
            idx = self._perm[lo:hi]
            xs.append(self._x.index_select(0, idx))
            ys.append(self._y.index_select(0, idx))
            start += hi - lo
        if len(xs) == 1:
            return xs[0], ys[0]
        return torch.cat(xs), torch.cat(ys)
