"""The README stays a short front page: the two commands first, under 150 lines, and every link
it has leads to a file (the rest of the documentation is docs/, built strictly by make docs)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 150


def test_the_two_commands_come_first() -> None:
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in first_block.splitlines()] == [
        ["make", "run"],
        ["make", "test"],
    ]
    assert README.index("```") == README.index("```bash\nmake run"), "no command before them"


def test_every_link_leads_to_a_file() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    assert targets, "the README links into docs/"
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert missing == []


def test_the_readme_reaches_kfp_errors_and_parameters_in_one_click() -> None:
    for page in ("docs/kfp.md", "docs/reference/errors.md", "docs/reference/parameters.md"):
        assert f"]({page})" in README, page
