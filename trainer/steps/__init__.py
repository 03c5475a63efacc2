"""The pipeline steps: one function each, for KFP components, ``python -m trainer`` and tests."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from trainer.errors import EXIT_BAD_INPUT, error_line

T = TypeVar("T")


def run_guarded(step: str, fn: Callable[[], T]) -> T:
    """Run ``fn``; turn bad input into the one-line ``ERROR [<step>] E_...`` and exit code 2.

    For entry points only (components, the CLI): library code raises, it never exits.
    """
    try:
        return fn()
    except (ValueError, FileNotFoundError) as e:
        print(error_line(step, e), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_BAD_INPUT) from None
