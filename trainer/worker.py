"""Training entry point run by torchrun everywhere: ``python -m trainer.worker --config <uri>``.

Parse, build, try train, finally close. Exit codes follow DESIGN.md: 0 done, 2 bad input
(permanent under the operator's ExitCode policy), 143 checkpointed after SIGTERM (retryable),
200 a peer of the job was lost (retryable: another rank, its node or the store went away),
1 anything else (a bug: permanent).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from trainer.base import exitcodes, storage
from trainer.base.errors import (
    DISK_FULL_CODE,
    EXIT_BAD_INPUT,
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    error_line,
    is_disk_full,
    print_error_line,
)
from trainer.checkpoint.manager import STALE_CODE
from trainer.config import WorkerConfig, load_worker_config
from trainer.distributed import dist
from trainer.training.loop import train
from trainer.training.stop import Preempted, StopSignal

log = logging.getLogger("trainer.worker")

CLOSE_TIMEOUT_S = 10.0
"""How long tearing the process group down may take. After a SIGTERM the job's other ranks and
the rendezvous store (hosted with rank 0) may already be gone, and gloo's teardown can then block
for as long as the platform's grace period: seen once in a container test under load, where the
stopped worker was killed (137) instead of exiting 143 after its peers had checkpointed."""


def main(argv: list[str] | None = None) -> int:
    """Run one training process; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m trainer.worker", description=__doc__)
    parser.add_argument("--config", required=True, help="worker config JSON (any storage URI)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. optim.lr=0.01",
    )
    args = parser.parse_args(argv)
    stop = StopSignal()
    stop.install()  # before the (slow) setup, so an early SIGTERM is not lost
    exitcodes.record_started()
    rank: int | None = None
    exit_code = 1  # what an exception escaping below means: a bug (permanent), with its traceback
    try:
        try:
            cfg = load_worker_config(args.config, args.overrides)
            ctx = dist.init(cfg.dist.backend, cfg.dist.timeout_s)
        except (ValueError, FileNotFoundError) as e:
            code = "E_CONFIG" if isinstance(e, FileNotFoundError) else "E_INVALID"
            print_error_line(error_line("train", e, code))
            exit_code = EXIT_BAD_INPUT
            return exit_code
        except RuntimeError as e:  # the rendezvous store went away, or never answered
            if not dist.peer_lost(e):
                raise
            exit_code = _peer_lost(e)
            return exit_code
        rank = ctx.rank
        try:
            exit_code = _train(cfg, ctx, stop)
        finally:
            closed = _close_within(ctx, CLOSE_TIMEOUT_S)
        if not closed:
            # The exit code is decided and its checkpoint (if any) written: leave now, without the
            # interpreter's teardown, which would wait on the same process group again.
            log.warning(
                "the process group did not close within %g s (its peers are gone); exit %d",
                CLOSE_TIMEOUT_S,
                exit_code,
            )
            stop.uninstall()
            exitcodes.record_exit_code(exit_code, rank)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exit_code)
        return exit_code
    finally:
        stop.uninstall()
        # torchrun reports every failure as 1: tell the trainer.launch wrapper what really happened.
        exitcodes.record_exit_code(exit_code, rank)


def _close_within(ctx: dist.DistContext, timeout_s: float) -> bool:
    """:func:`dist.close` in a daemon thread, waited for ``timeout_s``: False when it hangs."""
    errors: list[BaseException] = []

    def close() -> None:
        try:
            dist.close(ctx)
        except BaseException as e:  # re-raised in the caller's thread below
            errors.append(e)

    closer = threading.Thread(target=close, name="close-process-group", daemon=True)
    closer.start()
    closer.join(timeout_s)
    if closer.is_alive():
        return False
    if errors:
        raise errors[0]
    return True


def _peer_lost(e: BaseException) -> int:
    """Log a lost peer as what it is (not this rank's fault) and return the retryable code.

    Deliberately not an ``ERROR [train] E_...`` line: launchers read those as bad input.
    """
    text = " ".join(str(e).split())
    log.error(
        "lost a peer of this job (%s): %s; exit %d, retryable",
        type(e).__name__,
        text,
        EXIT_PEER_LOST,
    )
    return EXIT_PEER_LOST


def _store_unreachable(e: BaseException) -> bool:
    """``e``, or an error it was raised from, is :class:`storage.StoreUnreachable`."""
    seen: BaseException | None = e
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, storage.StoreUnreachable):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _train(cfg: WorkerConfig, ctx: dist.DistContext, stop: StopSignal) -> int:
    """Train and turn the outcome into the worker's exit code."""
    try:
        train(cfg, ctx, stop)
        return 0
    except Preempted as e:
        log.warning("%s", e)
        return EXIT_PREEMPTED
    except OSError as e:
        if not is_disk_full(e):
            raise
        print_error_line(error_line("train", e, DISK_FULL_CODE))
        return 1
    except (ValueError, FileNotFoundError) as e:
        print_error_line(error_line("train", e))
        return EXIT_BAD_INPUT
    except RuntimeError as e:
        if dist.peer_lost(e):
            return _peer_lost(e)
        if _store_unreachable(e):
            # The path to the store failed mid-training (a lost node took the cluster's DNS or
            # the store's pod with it): retryable, the job restarts and resumes from the last
            # checkpoint that was written whole. Not an E_ line: launchers read those as final.
            log.error("lost the object store: %s; exit %d, retryable", e, EXIT_PEER_LOST)
            return EXIT_PEER_LOST
        if getattr(e, "code", None) == STALE_CODE:
            # Retryable: should the operator still count this pod, its job restarts and resumes.
            print_error_line(error_line("train", e))
            return EXIT_PEER_LOST
        # A run that cannot go on (rollbacks or OOM fallbacks used up): say why in one line,
        # keep the traceback in the log for whoever debugs it.
        log.debug("training failed", exc_info=True)
        print_error_line(error_line("train", e, "E_TRAIN"))
        return 1


if __name__ == "__main__":
    sys.exit(main())
