"""Odd files where CSV was expected (issue 60, item 15), tried as a new user would: each is
named in one line, with what to do, and a European spreadsheet's export (``;`` between fields,
decimal commas) is read as it is meant under ``csv_delimiter=auto``."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.local_checks import check_data
from pipelines.params import with_defaults
from trainer.base.errors import InputError, error_line
from trainer.base.typedconfig import from_dict
from trainer.steps.preprocess import PreprocessConfig, preprocess
from trainer.steps.preprocess.file_kind import kind_of, sniff_separators

ROWS = [(round(float(a), 2), round(float(b), 2), int(y)) for a, b, y in zip(
    np.linspace(-1, 1, 60), np.linspace(2, 5, 60), [0, 1] * 30, strict=True
)]  # fmt: skip


def _csv_text(sep: str = ",", decimal: str = ".") -> str:
    lines = [sep.join(("a", "b", "y"))]
    for a, b, y in ROWS:
        lines.append(sep.join((str(a).replace(".", decimal), str(b).replace(".", decimal), str(y))))
    return "\n".join(lines) + "\n"


def _zip(members: dict[str, str]) -> bytes:
    sink = io.BytesIO()
    with zipfile.ZipFile(sink, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return sink.getvalue()


ODD = {
    "xlsx": (
        _zip({"[Content_Types].xml": "<Types/>", "xl/workbook.xml": "<workbook/>"}),
        "the file is an Excel workbook (.xlsx), not CSV: save the sheet as CSV",
    ),
    "zip": (_zip({"data.csv": _csv_text()}), "the file is a ZIP archive, not CSV: unzip it"),
    "xls": (
        b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 600,
        "the file is an Excel 97-2003 workbook (.xls), not CSV",
    ),
    "jsonl": (
        "".join(json.dumps({"a": a, "b": b, "y": y}) + "\n" for a, b, y in ROWS).encode(),
        "the file is JSON Lines (one JSON object a line), not CSV: convert it to CSV or Parquet",
    ),
    "json": (
        json.dumps([{"a": a, "y": y} for a, _, y in ROWS], indent=1).encode(),
        "the file is a JSON document, not CSV",
    ),
}


@pytest.mark.parametrize("kind", sorted(ODD))
def test_a_file_that_is_not_csv_is_named_in_one_line(
    kind: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    blob, expected = ODD[kind]
    path = tmp_path / "data.csv"
    path.write_bytes(blob)
    out = tmp_path / "out"
    cfg = from_dict(PreprocessConfig, {"target": "y"})
    for run in (
        lambda: preprocess(cfg, data_uri=str(path), output_uri=str(out)),
        lambda: check_data(str(path), "y", with_defaults({"target": "y"})),
    ):
        with pytest.raises(InputError) as e:
            run()
        line = error_line("preprocess", e.value)
        assert e.value.code == "E_CSV" and expected in line, line
        assert "\n" not in line and line.isprintable(), line
        assert not out.exists()
    # Before: pyarrow's "Exception ignored ... Traceback" and raw bytes on the terminal.
    said = capfd.readouterr()
    assert "Traceback" not in said.err + said.out


@pytest.mark.parametrize("streaming", [False, True], ids=["in-memory", "streaming"])
def test_semicolons_and_decimal_commas_are_read_as_meant(tmp_path: Path, streaming: bool) -> None:
    path = tmp_path / "export.csv"
    path.write_text(_csv_text(sep=";", decimal=","))
    assert sniff_separators(path.read_bytes()) == (";", ",")
    extra = {"memory_budget": 16 << 20} if streaming else {}
    cfg = from_dict(PreprocessConfig, {"target": "y", **extra})
    if streaming:
        from trainer.steps.preprocess.stream import preprocess_streaming

        preprocess_streaming(
            cfg, data_uri=str(path), output_uri=str(tmp_path / "out"), fingerprint="",
            budget=16 << 20,
        )  # fmt: skip
    else:
        preprocess(cfg, data_uri=str(path), output_uri=str(tmp_path / "out"))
    schema = json.loads((tmp_path / "out" / "schema.json").read_text())
    assert {c["name"]: c["kind"] for c in schema["columns"]} == {"a": "numeric", "b": "numeric"}
    train = pq.read_table(tmp_path / "out" / "train.parquet").to_pandas()
    assert len(train) > 0 and schema["classes"] == ["0", "1"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a;b;y\n1,5;2;0\n", (";", ",")),
        ("a;b;y\n1.5;2;0\n", (";", ".")),
        ("a,b,y\n1.5,2,0\n", None),
        ("a\tb\n1\t2\n", None),
        ("name;note, with comma\n", None),
    ],
    ids=["decimal-comma", "decimal-point", "comma", "tab", "comma-in-header"],
)
def test_separators_are_sniffed_from_the_header_only_when_unambiguous(
    text: str, expected: tuple[str, str] | None
) -> None:
    assert sniff_separators(text.encode()) == expected


def test_plain_csv_is_no_odd_kind() -> None:
    assert kind_of(_csv_text().encode()) is None
    assert kind_of(b"[a],b\n1,2\n") is None
