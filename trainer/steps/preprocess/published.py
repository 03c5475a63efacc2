"""What preprocess publishes, shared by its in-memory and streaming paths: the result, the
schema format, the Parquet writer's options and the output feature names."""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from typing import Any

from trainer.base.errors import InputError
from trainer.steps.preprocess.encode import CategoricalFit, NumericFit

SCHEMA_FORMAT = "gpupipe.schema/v1"


# Fixed writer options: the same table always gives the same bytes.
_PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "snappy",
    "row_group_size": 128 * 1024,
    "write_statistics": True,
}


@dataclass(slots=True)
class PreprocessResult:
    """What preprocess produced; also recorded in ``schema.json``."""

    train_rows: int
    val_rows: int
    test_rows: int
    features: list[str]
    task: str
    classes: list[str] | None
    data_hash: str
    notices: list[str] = dataclasses.field(default_factory=list)
    """The decisions and warnings a person should read (``NOTE``/``WARNING`` lines)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (for KFP outputs and logs)."""
        return dataclasses.asdict(self)


def display_uri(uri: str) -> str:
    """``uri`` without credentials (``s3://key:secret@bucket`` -> ``s3://bucket``), for records."""
    return re.sub(r"^([a-zA-Z][\w+.-]*://)[^/@]*@", r"\1", uri)


def feature_names(fits: list[NumericFit | CategoricalFit], target: str, data_uri: str) -> list[str]:
    """The output feature names, refusing one produced twice or equal to the target."""
    features = [name for fit in fits for name in fit.outputs]
    clash = sorted({f for f in features if features.count(f) > 1} | ({target} & set(features)))
    if clash:
        raise InputError(
            "E_SCHEMA",
            f"output feature name {clash[0]!r} is produced twice (a categorical column's "
            "'<column>=<value>' features collide with a column of that name, or with the "
            "target); rename a column in the data",
            data_uri,
        )
    return features


def schema_document(
    *,
    target: str,
    task: str,
    fits: list[Any],
    dropped: Any,
    decisions: list[Any],
    notes: list[Any],
    classes: list[str] | None,
    data_hash: str,
    fingerprint: str,
    data_uri: str,
    seed: int,
    splits: dict[str, int],
    features: list[str],
) -> dict[str, Any]:
    """``schema.json``'s content, the same from the in-memory and the streaming path."""
    return {
        "format": SCHEMA_FORMAT,
        "target": target,
        "task": task,
        "features": features,
        "columns": [fit.to_dict() for fit in fits],
        "dropped": dropped,
        "decisions": [d.to_dict() for d in decisions],
        "warnings": [note.line("preprocess") for note in notes if note.code.startswith("W_")],
        "classes": classes,
        "data_hash": data_hash,
        "data_fingerprint": fingerprint,
        "source": display_uri(data_uri),
        "seed": seed,
        "splits": splits,
    }


def published_result(
    splits: dict[str, int],
    features: list[str],
    task: str,
    classes: list[str] | None,
    data_hash: str,
    notes: list[Any],
) -> PreprocessResult:
    """The result of a preprocess that published its outputs, its notes printed into the step's
    log (stderr: stdout carries results; a failure prints one line instead), the same from the
    in-memory and the streaming path."""
    lines = [note.line("preprocess") for note in notes]
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return PreprocessResult(
        train_rows=splits["train"],
        val_rows=splits["val"],
        test_rows=splits["test"],
        features=features,
        task=task,
        classes=classes,
        data_hash=data_hash,
        notices=lines,
    )
