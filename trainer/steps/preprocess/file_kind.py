"""What a file that should be CSV really is, from its first bytes: a workbook, an archive, JSON.

Read as CSV, such a file gave a person nothing to act on: a ZIP or an Excel workbook named
``.csv`` printed pyarrow's ``Exception ignored ... Traceback`` and echoed raw binary bytes in its
``E_CSV`` line, and a JSON Lines file was read as one column whose name was its first object.
Each is now named, with what to do, before any parse. Also here: the field separator and the
decimal mark of a CSV written with ``;`` and decimal commas (as European spreadsheets export it),
which ``csv_delimiter=auto`` otherwise read as one column.
"""

from __future__ import annotations

import json
import re

from trainer.base.errors import InputError

COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zst")
"""Compression of text files, told by the name (pyarrow's streams decompress these)."""

_ZIP = b"PK\x03\x04"
_OLE2 = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_DECIMAL_COMMA = re.compile(r"(?:^|;)\s*-?\d+,\d+\s*(?:;|$)")


def _zip_member(head: bytes) -> bytes:
    """The name of a ZIP archive's first member (its local file header), if the head has it."""
    if len(head) < 30:
        return b""
    size = int.from_bytes(head[26:28], "little")
    return head[30 : 30 + size]


def _first_line(head: bytes) -> str:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def kind_of(head: bytes) -> tuple[str, str] | None:
    """``(what it is, what to do)`` for a file that is not CSV text, from its first bytes; None
    for anything that may be CSV."""
    if head.startswith(_ZIP):
        if b"xl/" in head or _zip_member(head) == b"[Content_Types].xml":
            return (
                "an Excel workbook (.xlsx)",
                "save the sheet as CSV (File > Save As > CSV) or Parquet",
            )
        return "a ZIP archive", "unzip it and point data_uri at the CSV or Parquet inside"
    if head.startswith(_OLE2):
        return "an Excel 97-2003 workbook (.xls)", "save the sheet as CSV or Parquet"
    line = _first_line(head)
    if line.startswith("{"):
        try:
            first = json.loads(line)
        except ValueError:
            first = None
        if isinstance(first, dict):
            return (
                "JSON Lines (one JSON object a line)",
                "convert it to CSV or Parquet (e.g. pandas.read_json(path, lines=True))",
            )
    if line == "[" or line.startswith(("[{", '["', "[[")):
        return "a JSON document", "convert it to CSV or Parquet"
    return None


def refuse_non_csv(uri: str, head: bytes) -> None:
    """Refuse a file read as CSV that is something else, in one line naming what it is.

    Args:
        uri: The file, for the message.
        head: Its first bytes, decompressed.

    Raises:
        InputError: ``E_CSV`` naming the file's kind and what to do.
    """
    found = kind_of(head)
    if found is not None:
        what, fix = found
        raise InputError("E_CSV", f"the file is {what}, not CSV: {fix}", uri)


def sniff_separators(head: bytes, encoding: str = "utf-8") -> tuple[str, str] | None:
    """``(";", ",")`` for a CSV whose header is separated by ``;`` and holds no comma, with
    ``","`` as the decimal mark where its first lines have numbers written ``1,5``; ``(";",
    ".")`` without them; None where the header looks comma- or tab-separated."""
    try:
        text = head[:65536].decode(encoding, "replace")
    except LookupError:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()][:50]
    if not lines:
        return None
    header = lines[0]
    if ";" not in header or "," in header or "\t" in header:
        return None
    decimal = "," if any(_DECIMAL_COMMA.search(ln) for ln in lines[1:]) else "."
    return ";", decimal
