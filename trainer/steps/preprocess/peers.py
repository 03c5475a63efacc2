"""How the streaming preprocess talks to the other processes of a wide run, and the one-process
stand-in: every exchange carries bad input along, so a rank's error ends every rank.

:mod:`trainer.steps.preprocess.stream` is written once against :class:`Peers`; one process
runs it with :data:`SOLO` (every exchange a no-op), N processes with
:class:`trainer.steps.preprocess.wide.Group` (torch.distributed over gloo). Each exchange runs
a piece of work on this process, catching :class:`~trainer.base.errors.InputError`, and then
meets the others: if any process's work failed, every process raises the error of the lowest
rank (the first file's, as one process reading the files in order would have met it first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from trainer.base import storage
from trainer.steps.preprocess.tabular import input_files

T = TypeVar("T")


class Peers(Protocol):
    """The processes of one preprocess run, ranked 0..world-1; rank 0 (main) decides and writes."""

    rank: int
    world: int

    @property
    def is_main(self) -> bool: ...

    def all(self, work: Callable[[], T]) -> list[T]:
        """Run ``work`` here; every process's result, in rank order, on every process."""
        ...

    def gather(self, work: Callable[[], T]) -> list[T] | None:
        """Run ``work`` here; every process's result on main (in rank order), None elsewhere."""
        ...

    def main(self, work: Callable[[], T]) -> T:
        """Run ``work`` on main only; its result on every process."""
        ...

    def scatter(self, work: Callable[[], list[T]]) -> T:
        """Run ``work`` on main (one item per rank); each process gets its item."""
        ...


class Solo:
    """One process: the work runs, nothing is exchanged (and nothing copied)."""

    rank = 0
    world = 1

    @property
    def is_main(self) -> bool:
        return True

    def all(self, work: Callable[[], T]) -> list[T]:
        return [work()]

    def gather(self, work: Callable[[], T]) -> list[T] | None:
        return [work()]

    def main(self, work: Callable[[], T]) -> T:
        return work()

    def scatter(self, work: Callable[[], list[T]]) -> T:
        return work()[0]


SOLO = Solo()


def file_sizes(data_uri: str) -> list[int]:
    """The size in bytes of each of the dataset's files, in its file order."""
    sizes = []
    for uri in input_files(data_uri):
        fs, path = storage.resolve(uri)
        sizes.append(int(fs.get_file_info(path).size or 0))
    return sizes


def file_groups(sizes: list[int], world: int) -> list[range]:
    """Contiguous groups of files, one per rank, balanced by bytes.

    File ``i`` goes to the rank whose share of the bytes holds the file's middle byte: the
    groups follow the files' order (rank 0 the first files), each takes about ``1/world`` of
    the bytes, and a rank gets no file where there are fewer files than ranks (or one file
    outweighs the others).

    Args:
        sizes: Each file's size in bytes, in the dataset's file order.
        world: How many processes share the files.
    """
    total = sum(sizes)
    owner = []
    before = 0
    for size in sizes:
        middle = (before + size / 2) / total if total else 0.0
        owner.append(min(world - 1, int(middle * world)))
        before += size
    if total == 0:  # nothing to weigh: by count
        owner = [min(world - 1, i * world // max(len(sizes), 1)) for i in range(len(sizes))]
    groups = []
    for rank in range(world):
        mine = [i for i, r in enumerate(owner) if r == rank]
        start = mine[0] if mine else sum(1 for r in owner if r < rank)
        groups.append(range(start, start + len(mine)))
    return groups


def first_error(results: list[tuple[bool, Any]]) -> None:
    """Raise the first (lowest rank's) error among exchanged ``(ok, value)`` pairs."""
    for ok, value in results:
        if not ok:
            raise value
