"""``python -m trainer.launch [torchrun args]``: torchrun with exit codes the operator can act on.

:func:`torchrun_command` is the one training command every launcher runs (locally, in every
replica of a PyTorchJob, in a tune trial); :func:`main` is the wrapper it names.

torchrun reports every failed worker as exit code 1, so a PyTorchJob's ``restartPolicy: ExitCode``
(1-127 permanent, 128-255 retried) could never retry a preemption nor stop retrying bad input.
This wrapper runs ``python -m torch.distributed.run <args>`` as a child, forwards SIGTERM and
SIGINT to it (torchrun passes them on to the workers, which checkpoint), and maps the result using
the code each worker left in ``$GPUPIPE_EXIT_DIR/rank-<rank>.code``:

- torchrun exited 0: 0;
- any worker exited 2 (bad input): 2, permanent;
- this wrapper got SIGTERM: 143, retryable;
- any worker reported another failure (1: a bug, or a run that cannot go on): torchrun's own
  code (1), permanent;
- a worker lost a peer (200: another rank, its node or the store went away), or a worker that
  had started vanished without recording any code (killed by a signal: SIGKILL, the OOM killer):
  200 (:data:`~trainer.errors.EXIT_PEER_LOST`), retryable;
- workers exited 143 (checkpointed after SIGTERM): 143, retryable;
- otherwise torchrun's own code (1).

A worker that crashed (exit 1) makes torchrun SIGTERM its peers, which then checkpoint and exit
143, or fail their next collective and exit 200; that crash must stay permanent, hence the order
above. What a kill -9 looks like (gloo, torch 2.13, two nodes of one rank each): the survivor's
next collective raises ``RuntimeError: [...gloo/transport/tcp/pair.cc] Connection closed by peer``
(or ``Connection reset by peer``), and both torchruns exit 1, the killed rank's with exitcode -9
and no code recorded; without this mapping the operator would fail the whole job.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from types import FrameType

from trainer.base.errors import EXIT_BAD_INPUT, EXIT_PEER_LOST, EXIT_PREEMPTED
from trainer.base.exitcodes import (
    EXIT_DIR_ENV,
    read_exit_codes,
    read_vanished,
)

log = logging.getLogger(__name__)

_FORWARDED = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1


def resolve_exit_code(
    torchrun_code: int,
    worker_codes: Mapping[str, int],
    *,
    terminated: bool,
    vanished: int = 0,
) -> int:
    """The exit code that tells the training operator whether to retry (see the module docstring).

    Args:
        torchrun_code: torchrun's return code (negative when a signal killed it).
        worker_codes: what :func:`read_exit_codes` found.
        terminated: whether this wrapper received SIGTERM.
        vanished: how many workers started but died without recording a code
            (:func:`read_vanished`).
    """
    if torchrun_code == 0:
        return 0
    own = torchrun_code if torchrun_code > 0 else 128 - torchrun_code
    codes = set(worker_codes.values())
    if EXIT_BAD_INPUT in codes:
        return EXIT_BAD_INPUT
    if terminated:
        return EXIT_PREEMPTED
    if codes - {0, EXIT_PREEMPTED, EXIT_PEER_LOST}:
        return own  # a worker failed on its own: whatever its peers saw next is a consequence
    if EXIT_PEER_LOST in codes or vanished:
        return EXIT_PEER_LOST
    if EXIT_PREEMPTED in codes:
        return EXIT_PREEMPTED
    return own


def torchrun_command(
    config_uri: str, *, nproc_per_node: int, standalone: bool, python: str = sys.executable
) -> list[str]:
    """The one training command, shared by every local launcher.

    torchrun runs inside this wrapper (``python -m trainer.launch``), which turns torchrun's
    blanket exit code 1 back into the workers' own codes (2 bad input, 143 preempted).
    """
    cmd = [python, "-m", "trainer.launch"]
    if standalone:
        cmd.append("--standalone")
    cmd += [f"--nproc_per_node={nproc_per_node}", "-m", "trainer.worker", "--config", config_uri]
    return cmd


def _format_codes(codes: Mapping[str, int]) -> str:
    def order(key: str) -> tuple[int, int, str]:
        return (0, int(key), "") if key.isdigit() else (1, 0, key)

    return "{" + ", ".join(f"{k}: {codes[k]}" for k in sorted(codes, key=order)) + "}"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM torchrun if this wrapper is SIGKILLed (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv`` (default: this process's arguments); returns the mapped code."""
    args = sys.argv[1:] if argv is None else argv
    received: list[int] = []
    proc: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)

    exit_dir = tempfile.mkdtemp(prefix="gpupipe-exit-")
    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        env = dict(os.environ)
        env[EXIT_DIR_ENV] = exit_dir
        # Own process group: a terminal's Ctrl-C reaches torchrun once, through forward().
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *args],
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        for signum in received:  # arrived between installing the handler and starting torchrun
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)
        torchrun_code = proc.wait()
        worker_codes = read_exit_codes(exit_dir)
        vanished = read_vanished(exit_dir)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(exit_dir, ignore_errors=True)
    terminated = signal.SIGTERM in received
    code = resolve_exit_code(
        torchrun_code, worker_codes, terminated=terminated, vanished=len(vanished)
    )
    if code != torchrun_code:
        kind = "permanent" if 0 < code < 128 else "retryable"
        after = " after SIGTERM" if terminated else ""
        gone = (
            f", {len(vanished)} died without one (pid {', '.join(map(str, vanished))})"
            if vanished
            else ""
        )
        print(
            f"gpupipe launch: worker exit codes {_format_codes(worker_codes)}{gone}{after} "
            f"-> {code} ({kind})",
            file=sys.stderr,
            flush=True,
        )
    return code
