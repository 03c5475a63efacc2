"""How big an input preprocess takes (issue 60, item 8): a decompression bomb, a table too wide
and an encoding too wide each stop in one E_DATA line naming the limit and how to raise it, in
bounded memory and time, with nothing written; a compressed file that expands past the
in-memory path's budget is streamed instead of read whole."""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.base.errors import InputError, error_line
from trainer.base.typedconfig import from_dict
from trainer.steps.preprocess import PreprocessConfig, make_demo_table, preprocess


def _cfg(**extra: object) -> PreprocessConfig:
    return from_dict(PreprocessConfig, {"target": "churned", **extra})


def _refused(cfg: PreprocessConfig, data: Path, out: Path) -> str:
    with pytest.raises(InputError) as e:
        preprocess(cfg, data_uri=str(data), output_uri=str(out))
    line = error_line("preprocess", e.value)
    assert e.value.code == "E_DATA" and "\n" not in line, line
    assert not out.exists()
    return line


def _bomb(path: Path, rows: int) -> Path:
    """A gzip CSV of ``rows`` identical rows: tiny on disk, large once parsed."""
    head = make_demo_table(50, seed=1).to_pandas()
    pair = [head.index[head["churned"] == v][0] for v in sorted(set(head["churned"]))[:2]]
    one = head.loc[pair].to_csv(index=False).splitlines()  # a row of each class
    with gzip.open(path, "wt", compresslevel=9) as f:
        f.write(one[0] + "\n")
        chunk = ("\n".join(one[1:]) + "\n") * 5_000  # 10,000 rows
        for _ in range(rows // 10_000):
            f.write(chunk)
    return path


def test_a_decompression_bomb_stops_at_max_input_bytes_while_it_is_read(tmp_path: Path) -> None:
    data = _bomb(tmp_path / "bomb.csv.gz", 2_000_000)
    assert data.stat().st_size < 2 << 20  # a couple of MB on disk
    started = time.monotonic()
    line = _refused(_cfg(max_input_bytes=32 << 20, memory_budget=16 << 20), data, tmp_path / "o")
    assert "reading it reached" in line and "over max_input_bytes 33554432" in line, line
    reached = int(re.search(r"reading it reached (\d+) bytes", line).group(1))
    suggested = int(re.search(r'\{"max_input_bytes": (\d+)\}', line).group(1))
    assert suggested >= 2 * reached > 2 * (32 << 20) and "bomb.csv.gz" in line, line
    assert time.monotonic() - started < 60


def test_a_parquet_bomb_is_refused_from_its_footer(tmp_path: Path) -> None:
    # Repeated values are dictionary- and run-length-encoded: the footer's page sizes say a
    # few KB for what Arrow holds in 16 MB (it was read whole, then failed on its columns).
    rows = 1_000_000
    table = pa.table({"x": np.full(rows, 0.5), "churned": np.arange(rows) % 2})
    pq.write_table(table, tmp_path / "bomb.parquet")
    assert (tmp_path / "bomb.parquet").stat().st_size < 64 << 10
    line = _refused(_cfg(max_input_bytes=4 << 20), tmp_path / "bomb.parquet", tmp_path / "o")
    assert "the dataset takes 16000000 bytes parsed, over max_input_bytes 4194304" in line, line


def test_a_csv_that_fits_the_memory_budget_is_still_held_to_max_input_bytes(
    tmp_path: Path,
) -> None:
    # The in-memory path read a 4 MB gzip CSV whole under a 256 KiB max_input_bytes and went on.
    data = _bomb(tmp_path / "bomb.csv.gz", 50_000)
    line = _refused(_cfg(max_input_bytes=256 << 10), data, tmp_path / "o")
    assert "over max_input_bytes 262144" in line and '{"max_input_bytes": 8250000}' in line


def test_a_compressed_file_larger_than_its_name_promised_is_streamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Estimated from its compressed size, the file was read whole by the in-memory path (a
    50 MB .zst of repeated rows OOM-killed the pod); read only as far as the budget allows, it
    goes the streaming way instead, and ends in the same outputs."""
    from trainer.steps.preprocess import step, stream

    data = _bomb(tmp_path / "bomb.csv.gz", 400_000)
    budget = 64 << 20
    assert not step.needs_streaming(str(data), budget)  # the estimate: it fits
    calls: list[str] = []
    real = stream.preprocess_streaming

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(str(kwargs["data_uri"]))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(stream, "preprocess_streaming", spy)
    res = preprocess(_cfg(memory_budget=budget), data_uri=str(data), output_uri=str(tmp_path / "o"))
    assert calls == [str(data)]
    assert res.train_rows + res.val_rows + res.test_rows == 400_000


def test_a_table_wider_than_max_columns_is_refused_from_its_header(tmp_path: Path) -> None:
    cols = {f"c{i}": np.zeros(10) for i in range(40)}
    table = pa.table({**cols, "churned": ["yes", "no"] * 5})
    pq.write_table(table, tmp_path / "wide.parquet")
    line = _refused(_cfg(max_columns=20), tmp_path / "wide.parquet", tmp_path / "o")
    assert "has 41 columns, over max_columns 20" in line and '{"max_columns": 41}' in line


def test_an_encoding_wider_than_max_features_is_refused_before_any_split(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            **{f"cat{i}": rng.choice([f"v{j}" for j in range(30)], 600) for i in range(4)},
            "churned": rng.choice(["yes", "no"], 600),
        }
    )
    pq.write_table(table, tmp_path / "cats.parquet")
    line = _refused(_cfg(max_features=50), tmp_path / "cats.parquet", tmp_path / "o")
    assert "features (numeric columns, missing indicators and one-hot categories)" in line
    assert "over max_features 50" in line and "max_categories" in line


@pytest.mark.parametrize("name", ["max_input_bytes", "max_columns", "max_features"])
def test_the_limits_are_positive(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        _cfg(**{name: 0})


def test_the_defaults_take_the_demo_table(tmp_path: Path) -> None:
    pq.write_table(make_demo_table(500, seed=2), tmp_path / "d.parquet")
    res = preprocess(_cfg(), data_uri=str(tmp_path / "d.parquet"), output_uri=str(tmp_path / "o"))
    assert res.train_rows > 0
    assert json.loads((tmp_path / "o" / "schema.json").read_text())["features"]
