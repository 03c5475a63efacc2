"""The documentation's reference pages (``docs/reference/``) are generated from the code, are
not stale, and give every parameter, config field, code and command some text."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipelines import reference
from pipelines.params import pipeline_parameters

ROOT = Path(__file__).resolve().parents[2]
STALE = "stale: run `make compile` (python -m pipelines.reference)"


@pytest.mark.parametrize("name", list(reference.PAGES), ids=str)
def test_the_committed_page_is_what_the_code_generates(name: str) -> None:
    committed = (ROOT / reference.OUT / name).read_text()
    assert committed == reference.PAGES[name](), STALE


def _rows(page: str) -> dict[str, list[str]]:
    """Table rows of a generated page by their first cell's code name."""
    rows = {}
    for line in page.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_parameter_has_a_row_with_text() -> None:
    rows = _rows(reference.parameters_page())
    assert set(rows) == set(pipeline_parameters())
    assert [name for name, cells in rows.items() if not cells[-1]] == []


def _fields(cls: type, prefix: str = "") -> list[tuple[type, str, str]]:
    out = []
    for f in dataclasses.fields(cls):
        out.append((cls, f.name, prefix + f.name))
        nested = reference._nested(cls, f.name)
        if nested is not None:
            out += _fields(nested, f"{prefix}{f.name}.")
    return out


@pytest.mark.parametrize("config", reference.configs(), ids=lambda c: c.anchor)
def test_every_config_field_has_text(config: reference.Config) -> None:
    fields = _fields(config.cls)
    assert fields
    missing = [path for cls, name, path in fields if not reference.field_text(cls, name).strip()]
    assert missing == [], f"{config.cls.__name__}: document these fields (a docstring under each)"


def test_every_config_field_is_on_the_page() -> None:
    rows = _rows(reference.config_page())
    for config in reference.configs():
        shared = {f"{s}." for s in config.shared}
        for _, _, path in _fields(config.cls):
            if not any(path.startswith(s) for s in shared):
                assert path in rows, f"{config.cls.__name__}: {path}"


def test_every_code_has_a_heading_with_its_cause_and_fix() -> None:
    from trainer.base.codes import CODES

    page = reference.errors_page()
    for code, entry in CODES.items():
        section = page.split(f"### {code} {{#{code.lower()}}}\n", 1)[1].split("\n### ", 1)[0]
        assert f"**Cause.** {entry.cause}" in section and f"**Fix.** {entry.fix}" in section


def test_every_command_has_its_help() -> None:
    page = reference.cli_page()
    commands = reference.subcommands()
    assert {"run", "upload", "schedule", "compile"} <= set(commands)
    for name in commands:
        assert f"## gpupipe {name}\n\n```text\nusage: gpupipe {name}" in page


@pytest.mark.parametrize(
    ("text", "md"),
    [
        ("``a`` and :mod:`trainer.steps`", "`a` and `trainer.steps`"),
        ("two\n    lines", "two lines"),
    ],
    ids=["markup", "lines"],
)
def test_docstring_markup_becomes_markdown(text: str, md: str) -> None:
    assert reference.markdown(text) == md
