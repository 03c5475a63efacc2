"""Atomic, checksummed ``step-<n>/`` training checkpoints that resume from the newest good one.

The folders' life cycle: written under a temporary name and renamed when complete, pruned to
the newest k, bad ones skipped and quarantined. What one folder holds, and how it is verified,
is :mod:`trainer.checkpoint.files`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from trainer.base import outputs, storage
from trainer.base.errors import StepFailure, disk_full, is_disk_full
from trainer.checkpoint.files import (
    FORMAT,
    MARKER_FILE,
    STATE_FILE,
    CorruptCheckpointError,
    check_loadable,
    local_file,
    read_verified,
    write_state,
)

logger = logging.getLogger(__name__)

ROOT_STEP = "checkpoints"
"""The step named in the root's :data:`trainer.base.outputs.OUTPUT_MARKER`: the root is the
manager's."""

ATTEMPTS_DIR = "attempts"
"""The root's folder of attempt records, ``<generation:08d>.json``: each run (attempt) that
resumes from or writes the root takes the next generation, and only the newest may write."""
STALE_CODE = "E_STALE_ATTEMPT"
"""The one line's code of a writer a newer attempt has fenced out (exit 1, never bad input)."""

_ATTEMPT = re.compile(r"(\d{8,})\.json")
_STEP_DIR = re.compile(r"step-(\d{8,})")
_TMP_DIR = re.compile(r"step-(\d{8,})\.tmp")
_REPLACED_DIR = re.compile(r"step-(\d{8,})\.replaced")


class CheckpointManager:
    """Writes, verifies, prunes and loads ``step-<n:08d>/`` checkpoints under one root URI.

    A save goes to ``step-<n>.tmp/``: ``state.pt`` first, then ``COMPLETE.json`` with the size and
    sha256 of every file, then an fsync and a rename to ``step-<n>/``. A directory is complete only
    when its marker exists, so a crash at any point leaves either the old set of checkpoints or the
    new one. Loading verifies the checksums and unpickles with ``weights_only=True`` only, so a
    checkpoint can never run code.

    Only one process may save (the caller passes ``ctx.is_main``). A sharded save
    (:mod:`trainer.checkpoint.dcp`) splits :meth:`save` into :meth:`begin` and :meth:`commit`,
    and the other ranks write their shard files into the temporary folder in between; the marker
    lists them, so they are verified like ``state.pt``. ``load_latest`` repairs the
    directory (quarantines bad steps, removes leftovers); on a shared root, let the main rank call
    it first, or pass ``repair=False`` on the other ranks.

    The root is the manager's own: it must be absent, empty, or carry the manager's marker
    (``.gpupipe-output.json`` for step ``checkpoints``, written on the first save); a folder of
    someone else's files is refused when the manager is created, before training starts. Inside
    its root the manager renames and deletes only names of its own patterns (``step-<n>`` and
    its ``.tmp``, ``.replaced`` and ``.corrupt-<k>`` forms); any other file there is left alone.

    Writers are fenced: the main rank of each attempt (a run, or a job's restart) takes the next
    generation under ``attempts/`` when it first resumes or saves, and every save checks that
    no newer generation exists before it touches a step folder. A process of an older attempt
    still running (its node cut off from the cluster, then back) thus stops with one
    ``E_STALE_ATTEMPT`` line instead of replacing, pruning or deleting the new attempt's
    checkpoints.

    Args:
        root: URI of the directory that holds the ``step-*`` folders (local path, s3://, gs://,
            minio://). Created on the first save.
        keep_last: How many complete checkpoints to keep after each save (>= 1).

    Raises:
        ValueError: If ``root`` is empty or ``keep_last`` < 1.
        InputError: ``E_OUTPUT`` naming ``root`` if it is not the manager's (see above).
    """

    def __init__(self, root: str, *, keep_last: int = 3) -> None:
        if not root:
            raise ValueError(f"checkpoint root must be a non-empty URI, got {root!r}")
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1, got {keep_last!r}")
        outputs.check_output_location(root, ROOT_STEP)
        self.root = root
        self.keep_last = keep_last
        self._claimed = False
        self.generation: int | None = None
        """This manager's attempt generation once it entered the root (:meth:`enter`)."""

    def save(self, step: int, state: dict[str, Any]) -> str:
        """Write ``state`` as checkpoint ``step`` atomically, then prune old checkpoints.

        Saving a step that already exists replaces it. Checkpoints of later steps are deleted
        (they belong to a timeline abandoned by a rollback), so the one just written is the one
        ``load_latest`` resumes from.

        Args:
            step: Global optimizer step the state belongs to (>= 0).
            state: Nested dicts/lists of tensors and plain Python values, as ``torch.load`` with
                ``weights_only=True`` accepts them.

        Returns:
            The URI of the complete ``step-<n>/`` directory.

        Raises:
            ValueError: If ``step`` is negative, or ``state`` holds a value that could not be loaded
                back with ``weights_only=True`` (the message names its key path); nothing is
                written then.
        """
        _check_step(step)
        if type(state) is not dict:
            raise ValueError(f"checkpoint state must be a dict, got {type(state).__name__}")
        check_loadable(state, "state")
        started = time.monotonic()
        self.begin(step)
        return self.commit(step, state, started=started)

    def begin(self, step: int) -> str:
        """Start a save of ``step``: claim the root and create an empty ``step-<n>.tmp/``.

        :meth:`save` is ``begin`` then :meth:`commit`. A sharded save puts the ranks' shard
        files into the returned folder in between and lists them in ``commit``'s ``files``.

        Returns:
            The URI of the temporary folder.
        """
        _check_step(step)
        self.enter()
        self.fence(f"begin checkpoint step {step}")
        tmp = self._uri(_dir_name(step) + ".tmp")
        storage.delete(tmp)  # a stale one from a crashed save would mix old files into this one
        storage.makedirs(tmp)
        return tmp

    def commit(
        self,
        step: int,
        state: dict[str, Any],
        *,
        files: dict[str, dict[str, Any]] | None = None,
        started: float | None = None,
    ) -> str:
        """Finish a save begun with :meth:`begin`: ``state.pt``, the marker, the rename, pruning.

        Args:
            step: The step passed to ``begin``.
            state: What ``state.pt`` holds (checked as in :meth:`save`).
            files: Other files already written into the temporary folder, with their
                ``{"sha256", "bytes"}`` entries; the marker lists and later verifies them.
            started: ``time.monotonic()`` when the save started (for the log line).

        Returns:
            The URI of the complete ``step-<n>/`` directory.
        """
        _check_step(step)
        check_loadable(state, "state")
        self.fence(f"commit checkpoint step {step}")
        started = time.monotonic() if started is None else started
        name = _dir_name(step)
        final, tmp, aside = (self._uri(name + suffix) for suffix in ("", ".tmp", ".replaced"))
        entries = dict(files or {})
        try:
            entries[STATE_FILE] = write_state(storage.join(tmp, STATE_FILE), state)
            marker = {
                "step": step,
                "files": entries,
                "format": FORMAT,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            storage.write_json(storage.join(tmp, MARKER_FILE), marker)
            storage.fsync_dir(tmp)
        except BaseException as e:
            # Nothing half-written stays behind (a full disk would stay full, too).
            local = local_file(tmp)
            full = is_disk_full(e, local) if local is not None else is_disk_full(e)
            with contextlib.suppress(Exception):
                storage.delete(tmp)
            if full and isinstance(e, Exception):
                raise disk_full(f"checkpoint step {step}", local or tmp) from e
            raise

        # Again at the rename (its .tmp stays: it may be the newer attempt's save of the step).
        self.fence(f"commit checkpoint step {step}")
        if storage.exists(final):
            # A rename onto a non-empty directory fails, and deleting first would leave a window
            # with no step-<n> at all: move the old one aside and drop it once the new one is in.
            storage.delete(aside)
            storage.rename(final, aside)
            storage.rename(tmp, final)
            storage.delete(aside)
        else:
            storage.rename(tmp, final)
        storage.fsync_dir(self.root)

        self._drop_newer_than(step)
        self._prune()
        logger.info(
            "saved checkpoint %s (%d bytes in %.2f s)",
            final,
            sum(int(e["bytes"]) for e in entries.values()),
            time.monotonic() - started,
        )
        return final

    def steps(self) -> list[int]:
        """Return the steps of complete checkpoints (with a ``COMPLETE.json``), ascending.

        Completeness is judged by the marker alone; checksums are verified when loading.
        """
        found = []
        for name in storage.list_dir(self.root):
            step = _parse(_STEP_DIR, name)
            if step is not None and storage.exists(self._uri(name, MARKER_FILE)):
                found.append(step)
        return sorted(found)

    def load_latest(self, *, repair: bool = True) -> tuple[int, dict[str, Any]] | None:
        """Load the newest checkpoint that verifies.

        A step directory that fails verification is skipped with a WARNING that names it and the
        reason; with ``repair`` it is renamed to ``step-<n>.corrupt-<k>`` so that saving that step
        again works. Leftover ``.tmp`` directories of interrupted saves are ignored (and removed).

        Args:
            repair: Quarantine bad directories and remove leftovers. Pass False for a read-only
                look, e.g. on ranks other than the main one.

        Returns:
            ``(step, state)`` of the newest good checkpoint, or None when there is none.
        """
        # The main rank of an attempt resuming: it is the root's newest writer from now on. (A
        # root without its marker has no checkpoint yet: the first save enters it; entering now
        # would race the other ranks' look at a folder that is new.)
        if repair and outputs.read_marker(self.root) is not None:
            self.enter()
        candidates = []
        for name in storage.list_dir(self.root):
            if (step := _parse(_STEP_DIR, name)) is not None:
                candidates.append(step)
            elif _parse(_TMP_DIR, name) is not None:
                logger.warning(
                    "ignoring %s: left over by an interrupted save%s",
                    self._uri(name),
                    "; removing it" if repair else "",
                )
                if repair:
                    storage.delete(self._uri(name))
            elif (step := _parse(_REPLACED_DIR, name)) is not None and repair:
                self._settle_replaced(name, step, candidates)

        for step in sorted(set(candidates), reverse=True):
            name = _dir_name(step)
            try:
                return step, self._read_verified(name, step)
            except CorruptCheckpointError as e:
                moved = self._quarantine(name) if repair else None
                logger.warning(
                    "skipping checkpoint %s: %s%s",
                    e.uri,
                    e.reason,
                    f" (quarantined as {moved})" if moved else "",
                )
        return None

    def load(self, step: int) -> dict[str, Any]:
        """Verify and load one checkpoint.

        Args:
            step: The step to load.

        Returns:
            The state dict that was saved, with every tensor on the CPU.

        Raises:
            ValueError: If the checkpoint does not exist or fails verification; the message names
                the directory (a ``CorruptCheckpointError`` in the latter case).
        """
        _check_step(step)
        name = _dir_name(step)
        if not storage.exists(self._uri(name)):
            raise ValueError(
                f"checkpoint {self._uri(name)} does not exist (complete steps: {self.steps()})"
            )
        return self._read_verified(name, step)

    def enter(self) -> int:
        """Take the next attempt generation under ``attempts/`` (once per manager); return it.

        Two attempts entering at the same moment may pick the same number: each writes a token
        and reads it back, and the one that finds another's takes the next number.
        """
        if self.generation is not None:
            return self.generation
        if not self._claimed:  # marker before anything else: the root is ours from now on
            outputs.claim_output_dir(self.root, ROOT_STEP)
            self._claimed = True
        token = uuid.uuid4().hex
        record = {
            "token": token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pod": os.environ.get("POD_NAME", ""),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        generation = self._newest_generation() + 1
        for _ in range(100):
            uri = self._uri(ATTEMPTS_DIR, f"{generation:08d}.json")
            if not storage.exists(uri):
                storage.write_json(uri, {**record, "generation": generation})
                if storage.read_json(uri).get("token") == token:
                    break
            generation = max(generation, self._newest_generation()) + 1
        else:
            raise StepFailure(STALE_CODE, f"could not take an attempt generation under {self.root}")
        self.generation = generation
        self._prune_attempts()
        logger.info("checkpoint attempt %d writes %s", generation, self.root)
        return generation

    def _newest_generation(self) -> int:
        folder = self._uri(ATTEMPTS_DIR)
        found = (
            [_parse(_ATTEMPT, n) for n in storage.list_dir(folder)]
            if storage.exists(folder)
            else []
        )
        return max((g for g in found if g is not None), default=0)

    def fence(self, what: str) -> None:
        """Raise ``E_STALE_ATTEMPT`` if a newer attempt has entered the root since this one."""
        if self.generation is None:
            return
        newest = self._newest_generation()
        if newest > self.generation:
            who = storage.read_json(self._uri(ATTEMPTS_DIR, f"{newest:08d}.json"))
            raise StepFailure(
                STALE_CODE,
                f"a newer attempt (generation {newest}, {who.get('pod') or who.get('host')}, "
                f"since {who.get('started')}) owns the checkpoints under {self.root}: this "
                f"process (generation {self.generation}) is stale and stops before it would "
                f"{what}",
            )

    def _prune_attempts(self, keep: int = 20) -> None:
        """Drop all but the newest ``keep`` attempt records (only the newest is ever read)."""
        folder = self._uri(ATTEMPTS_DIR)
        found = sorted(
            g for n in storage.list_dir(folder) if (g := _parse(_ATTEMPT, n)) is not None
        )
        for old in found[:-keep]:
            with contextlib.suppress(FileNotFoundError):
                storage.delete(self._uri(ATTEMPTS_DIR, f"{old:08d}.json"))

    def _uri(self, *parts: str) -> str:
        return storage.join(self.root, *parts)

    def _read_verified(self, name: str, step: int) -> dict[str, Any]:
        return read_verified(self._uri(name), step)

    def _quarantine(self, name: str) -> str | None:
        """Rename a bad step directory to the first free ``<name>.corrupt-<k>``; return its URI."""
        existing = set(storage.list_dir(self.root))
        k = 0
        while f"{name}.corrupt-{k}" in existing:
            k += 1
        target = self._uri(f"{name}.corrupt-{k}")
        try:
            storage.rename(self._uri(name), target)
        except FileNotFoundError:
            # Another rank repairing the same shared root moved it first.
            logger.info("%s was already moved away", self._uri(name))
            return None
        return target

    def _settle_replaced(self, name: str, step: int, candidates: list[int]) -> None:
        """Finish a replacing save that was interrupted between its renames."""
        final = self._uri(_dir_name(step))
        if storage.exists(final):
            logger.warning("removing %s: left over by a save that replaced it", self._uri(name))
            storage.delete(self._uri(name))
            return
        # The new copy never got its final name, so the old one is the best we have for this step.
        logger.warning("restoring %s from %s: its replacement never landed", final, self._uri(name))
        try:
            storage.rename(self._uri(name), final)
        except FileNotFoundError:
            return
        candidates.append(step)

    def _drop_newer_than(self, step: int) -> None:
        for newer in (s for s in self.steps() if s > step):
            uri = self._uri(_dir_name(newer))
            logger.warning(
                "deleting %s: newer than step %d just saved (abandoned timeline)", uri, step
            )
            storage.delete(uri)

    def _prune(self) -> None:
        complete = self.steps()
        for old in complete[: max(0, len(complete) - self.keep_last)]:
            uri = self._uri(_dir_name(old))
            logger.info("pruning checkpoint %s (keep_last=%d)", uri, self.keep_last)
            storage.delete(uri)


def _dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _parse(pattern: re.Pattern[str], name: str) -> int | None:
    """Return the step of a canonical ``name`` matching ``pattern``, else None."""
    match = pattern.fullmatch(name)
    if match is None or match[1] != f"{int(match[1]):08d}":
        return None
    return int(match[1])


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint step must be an int >= 0, got {step!r}")
