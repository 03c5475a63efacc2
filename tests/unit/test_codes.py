"""The table of codes (``trainer/base/codes.py``) covers every code the code can print, each with
a cause and a fix, and nothing else: the error reference page is generated from it, so a code
without text here is a code a user cannot look up."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from trainer.base.codes import CODES
from trainer.base.errors import NOT_INPUT_CODES

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "components", "pipelines")
CODE = re.compile(r"(?<![\w.])[EWI]_[A-Z][A-Z0-9_]*[A-Z0-9]\b")
NOT_CODES = {
    "W_CODE": "trainer/steps/preprocess/text_values.py's docstring: the placeholder of the format"
}


def _dynamic_codes() -> set[str]:
    """Codes built at run time from a prefix (``f"W_{reason.upper()}"``, ``f"E_RUN_{state}"``)."""
    from pipelines.cluster import TERMINAL_STATES
    from trainer.steps.preprocess.feature_columns import _INFERRED

    return {f"W_{reason.upper()}" for reason in _INFERRED} | {
        f"E_RUN_{state}" for state in TERMINAL_STATES - {"SUCCEEDED"}
    }


def _codes_in_source() -> dict[str, str]:
    """Every code written in a string of the packages' source, with one place it appears."""
    found: dict[str, str] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == ROOT / "trainer/base/codes.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for code in CODE.findall(node.value):
                        found.setdefault(code, f"{path.relative_to(ROOT)}:{node.lineno}")
    return {c: where for c, where in found.items() if c not in NOT_CODES}


def test_every_code_the_code_prints_is_in_the_table() -> None:
    missing = {c: w for c, w in _codes_in_source().items() if c not in CODES}
    missing |= {c: "built at run time" for c in _dynamic_codes() if c not in CODES}
    assert missing == {}, "add these to trainer/base/codes.py with a cause and a fix"


def test_every_code_in_the_table_is_used() -> None:
    used = set(_codes_in_source()) | _dynamic_codes()
    assert sorted(set(CODES) - used) == [], "codes no line prints: remove them from the table"


@pytest.mark.parametrize("code", list(CODES), ids=str)
def test_each_code_has_a_cause_and_a_fix(code: str) -> None:
    entry = CODES[code]
    assert entry.cause.strip() and entry.fix.strip(), f"{code} has no text"
    assert entry.cause.rstrip().endswith(".") and entry.fix.rstrip().endswith("."), code
    if entry.kind(code) == "error":
        assert entry.exit_code in (1, 2, 130), code
    else:
        assert entry.exit_code is None, f"{code}: a warning or note does not end the run"


def test_codes_that_are_not_the_input_exit_1() -> None:
    assert {c: CODES[c].exit_code for c in NOT_INPUT_CODES} == dict.fromkeys(NOT_INPUT_CODES, 1)
