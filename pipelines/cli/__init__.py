"""The ``gpupipe`` command: demo data, compile, run locally (``kfp.local``) or on a KFP cluster."""

# Each subcommand's flags stand beside its handler, a module a command: ``files`` (demo-data,
# compile, render), ``run``, ``upload``, ``schedule``; ``host`` holds what every command that
# talks to KFP shares, ``help`` the help's formatting and ``--version``. Here the parser is put
# together, and an error becomes one line and an exit code. (The docstring above is the
# parser's description: ``gpupipe --help`` prints it.)

from __future__ import annotations

import argparse
import sys
from typing import Any

from pipelines.cli import files, run, schedule, upload
from pipelines.cli.help import PlainHelp, Version
from trainer.base.errors import error_line


def build_parser() -> argparse.ArgumentParser:
    """The ``gpupipe`` parser: every subcommand, in the order ``--help`` lists them."""
    parser = argparse.ArgumentParser(prog="gpupipe", description=__doc__, formatter_class=PlainHelp)
    parser.add_argument(
        "--version",
        action=Version,
        nargs=0,
        help="print the version and the container images it compiles into pipelines",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("formatter_class", PlainHelp)
        return sub.add_parser(name, **kwargs)

    files.add_parsers(add)
    run.add_parser(add)
    upload.add_parser(add)
    schedule.add_parser(add)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpupipe`` console script."""
    args = build_parser().parse_args(argv)
    step = f"gpupipe {args.command}"
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        # run_local has already stopped the steps it started.
        print(f"ERROR [{step}] E_INTERRUPTED: interrupted; steps stopped", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        print(error_line(step, e), file=sys.stderr)
        return 2
    except (PermissionError, IsADirectoryError, NotADirectoryError) as e:
        print(error_line(step, e, default_code="E_PATH"), file=sys.stderr)
        return 2
    except RuntimeError as e:
        from pipelines.cluster import ClusterError

        if not isinstance(e, ClusterError):  # a bug or an unexpected failure: keep the trace
            raise
        print(error_line(step, e, default_code=e.code), file=sys.stderr)
        return e.exit_code
