"""How much memory this process may use: the cgroup's limit (a pod's memory limit), if any."""

from __future__ import annotations

from pathlib import Path

DEFAULT_BUDGET = 2 << 30
"""Memory budget where no cgroup limit is set (2 GiB): what a laptop or a small pod spares."""
MIN_BUDGET = 16 << 20
"""The smallest budget a step accepts (16 MiB): below it a batch holds too few rows to pay."""
BUDGET_SHARE = 0.5
"""Share of a cgroup limit a step budgets for its data: the rest is Python, pyarrow and numpy
themselves, the allocator's slack and the page cache of the files being written."""

_ROOT = Path("/sys/fs/cgroup")
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages)


def _limit_files(root: Path, proc_cgroup: Path) -> list[Path]:
    """The limit files that may apply, nearest first: this process's own cgroup (named in
    ``/proc/self/cgroup``; a pod's container sees its own at the root), then the root's."""
    files = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.strip("/")
        if controllers == "":  # v2's unified hierarchy
            files.append(root / rel / "memory.max" if rel else root / "memory.max")
        elif "memory" in controllers.split(","):
            base = root / "memory"
            files.append((base / rel if rel else base) / "memory.limit_in_bytes")
    files += [root / "memory.max", root / "memory" / "memory.limit_in_bytes"]
    return list(dict.fromkeys(files))


def cgroup_memory_limit(
    root: Path = _ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """The memory limit of this process's cgroup in bytes, or None where there is none.

    Reads cgroup v2's ``memory.max`` (``max`` means none) or cgroup v1's
    ``memory.limit_in_bytes`` (a value near 2**63 means none), of this process's cgroup first.
    """
    for path in _limit_files(root, proc_cgroup):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            continue
        try:
            value = int(text)
        except ValueError:
            continue
        if 0 < value < _NO_LIMIT:
            return value
    return None


def cgroup_memory_in_use(
    root: Path = _ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """Anonymous memory charged to this process's cgroup now, in bytes (every process of it:
    in a pod, KFP's launcher beside the step), or None where it cannot be read. The page cache
    is left out: the kernel reclaims it before it kills anything.

    Reads cgroup v2's ``memory.stat`` ``anon`` or cgroup v1's ``total_rss``, beside the limit
    file :func:`cgroup_memory_limit` reads.
    """
    keys = {"anon", "total_rss"}
    for limit_file in _limit_files(root, proc_cgroup):
        try:
            lines = (limit_file.parent / "memory.stat").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key in keys and value.strip().isdigit():
                return int(value)
    return None


def default_memory_budget(limit: int | None = None, in_use: int | None = None) -> int:
    """The budget a step plans its batches with: :data:`BUDGET_SHARE` of what the cgroup limit
    leaves beside the memory already in use (the interpreter with pyarrow and numpy loaded, and
    in a pod KFP's launcher: about 150 MiB), never under :data:`MIN_BUDGET`; else
    :data:`DEFAULT_BUDGET`. (Half the limit alone was too much under 192 MiB: the process was
    killed with 96 MiB planned.)"""
    if limit is None:
        limit = cgroup_memory_limit()
        if limit is not None and in_use is None:
            in_use = cgroup_memory_in_use()
    if limit is None:
        return DEFAULT_BUDGET
    return max(MIN_BUDGET, int(max(0, limit - (in_use or 0)) * BUDGET_SHARE))
