"""Training entry point run by torchrun everywhere: ``python -m trainer.worker --config <uri>``.

Parse, build, try train, finally close. Exit codes follow DESIGN.md: 0 done, 2 bad input
(permanent under the operator's ExitCode policy), 143 checkpointed after SIGTERM (retryable),
1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import sys

from trainer import dist, launch
from trainer.config import WorkerConfig, load_worker_config
from trainer.errors import EXIT_BAD_INPUT, EXIT_PREEMPTED, error_line
from trainer.loop import Preempted, StopSignal, train

log = logging.getLogger("trainer.worker")


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
    try:
        cfg = load_worker_config(args.config, args.overrides)
        ctx = dist.init(cfg.dist.backend, cfg.dist.timeout_s)
    except (ValueError, FileNotFoundError) as e:
        stop.uninstall()
        code = "E_CONFIG" if isinstance(e, FileNotFoundError) else "E_INVALID"
        print(error_line("train", e, code), file=sys.stderr, flush=True)
        launch.record_exit_code(EXIT_BAD_INPUT, None)
        return EXIT_BAD_INPUT
    try:
        exit_code = _train(cfg, ctx, stop)
    finally:
        dist.close(ctx)
        stop.uninstall()
    # torchrun reports every failure as 1: tell the trainer.launch wrapper what really happened.
    launch.record_exit_code(exit_code, ctx.rank)
    return exit_code


def _train(cfg: WorkerConfig, ctx: dist.DistContext, stop: StopSignal) -> int:
    """Train and turn the outcome into the worker's exit code."""
    try:
        train(cfg, ctx, stop)
        return 0
    except Preempted as e:
        log.warning("%s", e)
        return EXIT_PREEMPTED
    except (ValueError, FileNotFoundError) as e:
        print(error_line("train", e), file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except RuntimeError as e:
        # A run that cannot go on (rollbacks or OOM fallbacks used up): say why in one line,
        # keep the traceback in the log for whoever debugs it.
        log.debug("training failed", exc_info=True)
        print(error_line("train", e, "E_TRAIN"), file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
