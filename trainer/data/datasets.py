"""Data path: Parquet into columnar tensors, served as sharded, resumable batches by global step.

In-memory datasets (:class:`TabularDataset`, :class:`TokenDataset`) live here with the batch
stream; data over ``data.max_memory_mb`` streams through :mod:`trainer.data.streaming`, and
the Parquet column handling both share is :mod:`trainer.data.parquet_columns`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
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
from trainer.data.streaming import StreamingParquetDataset, StreamSource

KINDS = ("tabular", "tokens")


@dataclass(frozen=True, slots=True)
class DataPosition:
    """Where a training stream stands: `step` global steps already consumed in `epoch`.

    Saved in checkpoints; a stream started from it yields exactly what an uninterrupted run would.
    """

    epoch: int = 0
    step: int = 0

    def __post_init__(self) -> None:
        for name in ("epoch", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"DataPosition.{name} must be an int >= 0, got {value!r}")

    def to_dict(self) -> dict[str, int]:
        """Returns the position as a JSON-ready dict."""
        return {"epoch": self.epoch, "step": self.step}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DataPosition:
        """Builds a position from `to_dict()` output.

        Raises:
            ValueError: on unknown keys or invalid values.
        """
        unknown = sorted(set(d) - {"epoch", "step"})
        if unknown:
            raise ValueError(f"unknown DataPosition keys: {', '.join(unknown)}")
        return cls(**d)


class TabularDataset:
    """A feature matrix and target held in memory as tensors; batches are `index_select`s."""

    def __init__(
        self,
        features: torch.Tensor,
        target: torch.Tensor,
        feature_names: Sequence[str],
        *,
        task: str,
    ) -> None:
        """Wraps ready tensors.

        Args:
            features: float32 [N, F].
            target: int64 [N] class ids (classification) or float32 [N] (regression).
            feature_names: F column names, in column order.
            task: "classification" or "regression".
        """
        check_task(task)
        if features.dim() != 2 or features.shape[1] != len(feature_names):
            raise ValueError(
                f"features must be [N, {len(feature_names)}], got {list(features.shape)}"
            )
        if target.shape != (features.shape[0],):
            raise ValueError(f"target must be [{features.shape[0]}], got {list(target.shape)}")
        self.features = features
        self.target = target
        self.feature_names = list(feature_names)
        self.task = task
        self._num_classes = (
            int(target.max()) + 1 if task == "classification" and len(target) else None
        )

    @classmethod
    def from_parquet(
        cls, uri: str, *, target: str, features: list[str] | None = None, task: str
    ) -> TabularDataset:
        """Reads a .parquet file, or a folder of them (sorted by name), into memory.

        Args:
            uri: file or folder URI (local path, s3://, gs://, ...).
            target: target column.
            features: feature columns; None means every column but the target, in file order.
            task: "classification" (integer-coded 0..K-1 target) or "regression".

        Raises:
            ValueError: a missing or non-numeric column, null/NaN/inf values, bad class labels,
                or no rows; the message names the column and the file.
        """
        check_task(task)
        fs, files = parquet_files(uri)
        names: list[str] | None = None
        metadata = []
        for f in files:
            md = read_metadata(fs, f)
            names = resolve_columns(
                md.schema.to_arrow_schema(), target=target, features=names or features, where=f.name
            )
            metadata.append(md)
        assert names is not None
        n = sum(md.num_rows for md in metadata)
        if n == 0:
            raise InputError("E_DATA", "dataset is empty: 0 rows", uri)
        # Preallocated and filled row group by row group: peak memory is the result plus one group.
        x, y = empty_rows(n, len(names), task)
        off = 0
        for f, md in zip(files, metadata, strict=True):
            with fs.open_input_file(f.path) as fh:
                pf = pq.ParquetFile(fh)
                for i in range(md.num_row_groups):
                    table = pf.read_row_group(i, columns=[*names, target])
                    end = off + table.num_rows
                    fill_rows(
                        table,
                        features=names,
                        target=target,
                        task=task,
                        where=f.name,
                        x=x[off:end],
                        y=y[off:end],
                    )
                    off = end
        return cls(torch.from_numpy(x), torch.from_numpy(y), names, task=task)

    @property
    def num_classes(self) -> int | None:
        """Max label + 1 for classification; None for regression."""
        return self._num_classes

    def __len__(self) -> int:
        return self.features.shape[0]

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (features[idx], target[idx]) for an int64 index tensor."""
        return self.features.index_select(0, idx), self.target.index_select(0, idx)


class TabularRowGroups:
    """A tabular split read row group by row group: validated ``(x, y)`` numpy blocks (float32
    features ``[rows, F]``, int64 class ids or float32 targets), never the whole table.

    The same columns, checks and messages as :meth:`TabularDataset.from_parquet`, which holds
    every row; this holds one row group at a time, so a split of any size can be scored.
    """

    def __init__(
        self, uri: str, *, target: str, features: list[str] | None = None, task: str
    ) -> None:
        """Reads the footers only.

        Raises:
            ValueError: a missing or non-numeric column, or no rows (naming the file).
        """
        self.task = check_task(task)
        self.target = target
        self._fs, self._files = parquet_files(uri)
        names: list[str] | None = None
        self._metadata = []
        for f in self._files:
            md = read_metadata(self._fs, f)
            names = resolve_columns(
                md.schema.to_arrow_schema(), target=target, features=names or features, where=f.name
            )
            self._metadata.append(md)
        assert names is not None
        self.features: list[str] = names
        self.num_rows = sum(md.num_rows for md in self._metadata)
        if self.num_rows == 0:
            raise InputError("E_DATA", "dataset is empty: 0 rows", uri)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The row groups in order (files sorted by name), each validated as it is read.

        Raises:
            ValueError: nulls, NaN/inf, or bad class labels (naming the column and the file).
        """
        for f, md in zip(self._files, self._metadata, strict=True):
            with self._fs.open_input_file(f.path) as fh:
                pf = pq.ParquetFile(fh, pre_buffer=False)  # else it caches each group read
                for i in range(md.num_row_groups):
                    table = pf.read_row_group(i, columns=[*self.features, self.target])
                    x, y = empty_rows(table.num_rows, len(self.features), self.task)
                    fill_rows(
                        table,
                        features=self.features,
                        target=self.target,
                        task=self.task,
                        where=f.name,
                        x=x,
                        y=y,
                    )
                    del table
                    yield x, y


class TokenDataset:
    """A flat stream of token ids cut into samples of `seq_len + 1` tokens (x and y shifted by 1).

    Sample i is tokens[i*seq_len : i*seq_len + seq_len + 1]: consecutive samples share one token,
    so every token is predicted exactly once.
    """

    def __init__(
        self, tokens: torch.Tensor, *, seq_len: int, vocab_size: int | None = None
    ) -> None:
        """Wraps a 1-D int32/int64 token tensor.

        Args:
            tokens: token ids, 1-D.
            seq_len: tokens per input sequence.
            vocab_size: vocabulary size; None means max token id + 1.
        """
        if tokens.dim() != 1 or tokens.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"tokens must be 1-D int32/int64, got {tokens.dtype} {list(tokens.shape)}"
            )
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        n = (tokens.numel() - 1) // seq_len
        if n < 1:
            raise ValueError(
                f"{tokens.numel()} tokens are fewer than one sample of seq_len + 1 = {seq_len + 1}"
            )
        self.tokens = tokens.contiguous()
        self.seq_len = seq_len
        self.vocab_size = vocab_size if vocab_size is not None else int(tokens.max()) + 1
        # Overlapping rows of one buffer: no copy, and index_select gathers whole samples.
        self._blocks = self.tokens.as_strided((n, seq_len + 1), (seq_len, 1))

    @classmethod
    def from_parquet(cls, uri: str, *, column: str = "tokens", seq_len: int) -> TokenDataset:
        """Reads an integer column (or a list-of-integers column, flattened) of token ids.

        Raises:
            ValueError: missing or non-integer column, nulls, negative ids, or too few tokens.
        """
        fs, files = parquet_files(uri)
        parts: list[np.ndarray] = []
        for f in files:
            schema = pq.read_schema(f.path, filesystem=fs)
            if column not in schema.names:
                raise InputError("E_DATA", f"token column {column!r} not found", f.name)
            t = schema.field(column).type
            inner = t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else t
            if not pa.types.is_integer(inner):
                raise InputError("E_DATA", f"token column {column!r} is {t}, not integer", f.name)
            col = pq.read_table(f.path, columns=[column], filesystem=fs).column(column)
            if inner is not t:
                col = col.combine_chunks().flatten()
            if col.null_count:
                raise InputError(
                    "E_DATA", f"token column {column!r} has {col.null_count} nulls", f.name
                )
            arr = col.to_numpy()
            if arr.size and arr.min() < 0:
                raise InputError("E_DATA", f"token column {column!r} has negative ids", f.name)
            parts.append(arr)
        tokens = np.concatenate(parts) if parts else np.empty(0, np.int64)
        if tokens.size < seq_len + 1:
            raise ValueError(
                f"dataset {uri} is empty: {tokens.size} tokens, fewer than seq_len + 1 = "
                f"{seq_len + 1}"
            )
        dtype = np.int32 if tokens.max() < 2**31 else np.int64
        return cls(torch.from_numpy(tokens.astype(dtype, copy=False)), seq_len=seq_len)

    def __len__(self) -> int:
        return self._blocks.shape[0]

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (x, y), both int64 [B, seq_len], y shifted one token ahead of x."""
        blocks = self._blocks.index_select(0, idx).to(torch.int64)
        return blocks[:, :-1].contiguous(), blocks[:, 1:].contiguous()


Dataset = TabularDataset | TokenDataset | StreamingParquetDataset


class _IndexSource:
    """One epoch of an in-memory dataset: positions map to sample ids through `order`."""

    def __init__(self, dataset: TabularDataset | TokenDataset, order: torch.Tensor) -> None:
        self._dataset = dataset
        self._order = order

    def take(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._dataset.batch(self._order[start:stop])


def _epoch_source(
    dataset: Dataset, *, epoch: int, seed: int, shuffle: bool
) -> _IndexSource | StreamSource:
    g = torch.Generator().manual_seed(seed + epoch) if shuffle else None
    if isinstance(dataset, StreamingParquetDataset):
        return StreamSource(dataset, g)
    n = len(dataset)
    order = torch.randperm(n, generator=g) if g is not None else torch.arange(n)
    return _IndexSource(dataset, order)


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")


class BatchStream:
    """This rank's share of each global batch, step after step, across epochs, forever.

    Each epoch draws one permutation of all samples from `seed + epoch`; global step k takes
    permuted positions [k*G, (k+1)*G) and rank r the contiguous slice [r*G/W, (r+1)*G/W) of it.
    So the ranks' slices concatenated equal the 1-process batch, whatever the world size. The
    trailing partial global batch of an epoch is dropped.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        shuffle: bool = True,
        start: DataPosition = DataPosition(),
    ) -> None:
        """Checks the batch geometry.

        Args:
            dataset: any of the three dataset kinds.
            global_batch_size: samples per optimizer step over all ranks (G).
            rank: this process's rank (r).
            world_size: number of ranks (W); must divide G.
            seed: the run's seed; epoch e shuffles with `seed + e`.
            shuffle: False serves samples in file order.
            start: where to begin; (e, steps_per_epoch) is the same as (e + 1, 0).

        Raises:
            ValueError: G not divisible by W, fewer samples than G, or a bad rank or start.
        """
        _check_rank(rank, world_size)
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        if global_batch_size % world_size:
            raise ValueError(
                f"global_batch_size {global_batch_size} must be divisible by "
                f"world_size {world_size}"
            )
        n = len(dataset)
        if n < global_batch_size:
            raise ValueError(
                f"dataset has {n} samples, fewer than one global batch of {global_batch_size}"
            )
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // world_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.steps_per_epoch = n // global_batch_size
        self.start = self._checked(start)

    def _checked(self, start: DataPosition) -> DataPosition:
        if start.step > self.steps_per_epoch:
            raise ValueError(
                f"start step {start.step} is past the {self.steps_per_epoch} steps of an epoch"
            )
        return start

    def starting_at(self, start: DataPosition) -> BatchStream:
        """This stream from ``start`` on (a resumed run's position): the same batches an
        uninterrupted iteration yields from there.

        Raises:
            ValueError: ``start`` is past the end of an epoch.
        """
        stream = copy.copy(self)
        stream.start = self._checked(start)
        return stream

    def __iter__(self) -> Iterator[tuple[DataPosition, torch.Tensor, torch.Tensor]]:
        """Yields (position after this step, x_local, y_local); the caller decides when to stop.

        The position after an epoch's last step is (epoch + 1, 0).
        """
        epoch, step = self.start.epoch, self.start.step
        if step == self.steps_per_epoch:
            epoch, step = epoch + 1, 0
        g, b = self.global_batch_size, self.local_batch_size
        while True:
            source = _epoch_source(self.dataset, epoch=epoch, seed=self.seed, shuffle=self.shuffle)
            for k in range(step, self.steps_per_epoch):
                begin = k * g + self.rank * b
                x, y = source.take(begin, begin + b)
                done = k + 1 == self.steps_per_epoch
                yield (DataPosition(epoch + 1, 0) if done else DataPosition(epoch, k + 1)), x, y
            epoch, step = epoch + 1, 0


def eval_batches(
    dataset: Dataset, *, batch_size: int, rank: int, world_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """Every sample exactly once across ranks, in file order, as (x, y, n_valid) batches.

    Rank r takes the contiguous shard [r*S, (r+1)*S) with S = ceil(N / W), so concatenating
    the ranks' valid rows in rank order gives the dataset order. Every rank yields the same
    number of full-size batches: the last ones are padded with copies of sample 0, and only the
    first `n_valid` rows count, so collectives under DDP never wait on a rank that has finished.

    Raises:
        ValueError: batch_size < 1 or a bad rank.
    """
    _check_rank(rank, world_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(dataset)
    shard = math.ceil(n / world_size)
    lo, hi = min(rank * shard, n), min((rank + 1) * shard, n)
    source = _epoch_source(dataset, epoch=0, seed=0, shuffle=False)
    pad: tuple[torch.Tensor, torch.Tensor] | None = None
    for i in range(math.ceil(shard / batch_size)):
        begin = lo + i * batch_size
        end = min(begin + batch_size, hi)
        n_valid = max(0, end - begin)
        if n_valid == batch_size:
            x, y = source.take(begin, end)
            yield x, y, n_valid
            continue
        if pad is None:
            pad = _first_sample(dataset)
        parts = [source.take(begin, end)] if n_valid else []
        parts.append(
            (
                pad[0].expand(batch_size - n_valid, *pad[0].shape[1:]),
                pad[1].expand(batch_size - n_valid, *pad[1].shape[1:]),
            )
        )
        yield torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), n_valid


def _first_sample(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(dataset, StreamingParquetDataset):
        return dataset.first_sample()
    return dataset.batch(torch.zeros(1, dtype=torch.int64))


def load_dataset(
    uri: str,
    *,
    kind: str,
    target: str | None = None,
    features: list[str] | None = None,
    task: str | None = None,
    seq_len: int | None = None,
    max_memory_bytes: int,
) -> Dataset:
    """Opens a dataset, in memory when it fits and streamed from Parquet when it does not.

    Args:
        uri: a .parquet file or a folder of them.
        kind: "tabular" or "tokens".
        target: tabular target column; for tokens, the token column (default "tokens").
        features: tabular feature columns; None means all but the target.
        task: "classification" or "regression" (tabular only).
        seq_len: tokens per sequence (tokens only).
        max_memory_bytes: tabular data whose uncompressed Parquet size (from the footers) is larger
            is streamed, with windows of about this size.

    Raises:
        ValueError: an unknown kind, a missing argument for it, or any dataset error.
    """
    if kind == "tokens":
        if seq_len is None:
            raise ValueError("seq_len is required for kind 'tokens'")
        return TokenDataset.from_parquet(uri, column=target or "tokens", seq_len=seq_len)
    if kind != "tabular":
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if target is None:
        raise ValueError("target is required for kind 'tabular'")
    task = check_task(task)
    fs, files = parquet_files(uri)
    sizes = [
        md.row_group(i).total_byte_size
        for md in (read_metadata(fs, f) for f in files)
        for i in range(md.num_row_groups)
    ]
    if sum(sizes) <= max_memory_bytes:
        return TabularDataset.from_parquet(uri, target=target, features=features, task=task)
    window = max(1, max_memory_bytes // max(1, max(sizes)))
    return StreamingParquetDataset(
        uri, target=target, features=features, task=task, window_row_groups=window
    )
