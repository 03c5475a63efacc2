"""The one-line error contract of every step: ``ERROR [<step>] E_<CODE>: <what> (<where>)``."""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys

from trainer.base.redact import redact

EXIT_BAD_INPUT = 2
"""Permanent failure under the training operator's ExitCode restart policy (1-127)."""
EXIT_PREEMPTED = 143
"""128 + SIGTERM: a checkpoint was written after a preemption; the operator may retry (128-255)."""
EXIT_PEER_LOST = 200
"""A process of the job was lost: a peer (another rank, its node, or the rendezvous store) went
away mid-run (connection closed or reset by peer, store or collective timeout, NCCL communicator
aborted), or a worker died by a signal (SIGKILL, the OOM killer) without recording a code.
Retryable (128-255): the rerun resumes from the newest checkpoint. Chosen above 128 + any
signal number (129-192) so that it is never mistaken for one."""


def _rebuilt(cls: type[BaseException], args: tuple, state: dict) -> BaseException:
    """An exception of ``cls`` with ``args`` and the attributes ``state``, its ``__init__``
    not called (see :func:`reduce_error`)."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


def reduce_error(error: BaseException) -> tuple:
    """``__reduce__`` for an exception whose ``__init__`` takes other arguments than its ``args``.

    Python pickles an exception as ``cls(*args)``, which fails for ``InputError(code, message,
    where)`` (its ``args`` hold the one formatted line): a worker process's error then reaches
    the parent as ``BrokenProcessPool`` or an unpickling ``TypeError``, not as itself. This
    rebuilds it with its ``args`` and attributes as they were.
    """
    return _rebuilt, (type(error), error.args, dict(error.__dict__))


class InputError(ValueError):
    """Bad input a person must fix: names what is wrong and where (column, file or field)."""

    def __init__(self, code: str, message: str, where: str) -> None:
        super().__init__(f"{message} ({where})")
        self.code = code
        self.message = message
        self.where = where

    def __reduce__(self) -> tuple:
        return reduce_error(self)


NOT_INPUT_CODES = frozenset(
    {
        "E_TRAIN",
        "E_EXTERNAL",
        "E_STOPPED",
        "E_FAILED",
        "E_INTERNAL",
        "E_DISK_FULL",
        "E_STALE_ATTEMPT",
    }
)
"""Codes of failures that are not the user's input (a run that cannot go on, a failing
registry or object store): exit 1, never 2."""


class StepFailure(RuntimeError):
    """A child process failed for a reason other than bad input, reported with its own code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple:
        return reduce_error(self)


DISK_FULL_CODE = "E_DISK_FULL"
"""A write failed because its filesystem is full: the machine's problem, not the input (exit 1)."""
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException, path: str | None = None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a full filesystem.

    An ``OSError`` carries ENOSPC or EDQUOT. torch's zip writer loses the errno (``enforce fail
    at inline_container.cc ... unexpected pos``), so for any other error ``path``'s filesystem
    is asked directly: less than 1 MiB free counts as full.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL_ERRNOS:
            return True
        if "No space left on device" in str(seen) or "Disk quota exceeded" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return path is not None and free_bytes(path) < 1 << 20


def free_bytes(path: str) -> int:
    """Bytes free on the filesystem holding ``path`` (its nearest existing ancestor)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return 1 << 62


def disk_full(what: str, path: str) -> StepFailure:
    """The one-line failure for a write of ``what`` into ``path`` that found the disk full."""
    real = os.path.realpath(path)
    mount = real
    while not os.path.ismount(mount) and os.path.dirname(mount) != mount:
        mount = os.path.dirname(mount)
    try:
        usage = shutil.disk_usage(mount)
        size = f"{usage.free // 1024} KiB free of {usage.total // (1 << 20)} MiB"
    except OSError:
        size = "size unknown"
    return StepFailure(
        DISK_FULL_CODE,
        f"no space left on the filesystem at {mount} ({size}) while writing {what}; the "
        f"partial files were removed: free space there, then run again ({path})",
    )


def error_line(step: str, exc: BaseException, default_code: str = "E_INVALID") -> str:
    """Format ``exc`` as the single stderr line DESIGN.md promises, credentials redacted."""
    code = exc.code if isinstance(exc, InputError | StepFailure) else default_code
    text = redact(" ".join(str(exc).split())) or type(exc).__name__
    return f"ERROR [{step}] {code}: {printable(text)}"


def print_error_line(line: str) -> None:
    """Write ``line`` to stderr in one ``write``, so processes sharing a pipe never split it.

    ``print`` writes the text and its newline apart; torchrun's workers share the launcher's
    stderr, and two of them failing at once ran their lines together (seen in CI).
    """
    if sys.stderr is sys.__stderr__ and sys.stderr is not None:
        try:
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), (line + "\n").encode("utf-8", "replace"))
            return
        except (OSError, ValueError):
            pass
    print(line, file=sys.stderr, flush=True)  # a captured or wrapped stream (pytest)


def printable(text: str) -> str:
    """``text`` with control characters (NUL, escape ...) written as ``\\xNN``: a message that
    quotes a binary file never sends them to a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


_ERROR_LINE = re.compile(r"ERROR \[(?P<step>[\w -]+)\] (?P<code>E_[A-Z_]+): (?P<text>.*)$")


def parse_error_line(line: str, step: str = "train") -> InputError | StepFailure | None:
    """The error a child process reported with :func:`error_line`, if ``line`` is one.

    Launchers use it to fail their step the way the job failed: a job that rejected its input
    makes the step exit 2 with the same message (an :class:`InputError`); a job that failed for
    another reason (:data:`NOT_INPUT_CODES`) a :class:`StepFailure`, exit 1. A prefix
    (torchrun's ``[rank0]:``) is allowed.
    """
    m = _ERROR_LINE.search(line.strip())
    if m is None or m.group("step") != step:
        return None
    code, text = m.group("code"), m.group("text")
    if code in NOT_INPUT_CODES:
        return StepFailure(code, text)
    if text.endswith(")") and " (" in text:
        what, where = text[:-1].rsplit(" (", 1)
        return InputError(code, what, where)
    return InputError(code, text, step)
