"""The preprocess step's config: ``PreprocessConfig`` and its mapping from pipeline parameters."""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any, Literal

from trainer.base.memory import MIN_BUDGET, default_memory_budget
from trainer.base.typedconfig import apply_overrides, from_dict, json_object, require
from trainer.launch.jobspec import ClusterConfig
from trainer.steps.preprocess.tabular import CsvOptions

COLUMN_KINDS = ("numeric", "categorical", "date", "keep", "drop")
LAUNCHERS = ("local", "pytorchjob")


@dataclass(kw_only=True, slots=True)
class PodsConfig(ClusterConfig):
    """The pods of a preprocess PyTorchJob (``launcher: pytorchjob``): the train step's cluster
    settings with a CPU pod's defaults. Each pod runs one worker and plans with its own memory
    (``memory_budget``, else half its limit); the GPU settings have no effect (the job asks for
    no GPU). The component fills ``image``, ``object_store_secret`` and
    ``image_pull_secrets`` from the pipeline's when they are left empty."""

    SECTION = "cluster"
    cpu_request: str | None = "500m"
    """CPU request per pod."""
    cpu_limit: str | None = "2"
    """CPU limit per pod (one worker reads, parses and encodes in about one core)."""
    memory_request: str | None = "1Gi"
    """Memory request per pod."""
    memory_limit: str | None = "4Gi"
    """Memory limit per pod; the worker's budget is half of it unless ``memory_budget`` says."""
    shm_size: str = "64Mi"
    """/dev/shm of a pod (gloo over TCP needs little)."""


@dataclass(kw_only=True, slots=True)
class PreprocessConfig:
    """What preprocess reads, how it types the columns, and how it splits the rows."""

    target: str
    """The target column."""
    task: Literal["auto", "classification", "regression"] = "auto"
    """``auto``: text or bool targets, and integer-valued targets with at most 20 distinct values,
    are classification; any other numeric target is regression."""
    column_roles: dict[str, str] = field(default_factory=dict)
    """Declared roles of feature columns: ``numeric``, ``categorical``, ``date`` (turned into
    year, month, day, weekday and elapsed days), ``keep`` (typed as inferred, but never left out
    as an identifier or a constant) or ``drop``. Columns not named here are inferred: numbers
    are numeric, text is categorical, dates (typed, or text such as ``2024-01-31``) are dates;
    identifiers (unique per row) and constant columns are left out with a warning. (Pipeline
    parameter ``column_roles_json``.)"""
    val_fraction: float = 0.15
    """Share of rows for the validation split (train validates on it; at least one row)."""
    test_fraction: float = 0.15
    """Share of rows for the test split (evaluate scores it; at least one row)."""
    seed: int = 0
    """Seed of the split; the same input and seed give byte-identical outputs."""
    max_categories: int = 50
    """Categories kept per categorical column (most frequent in train); rarer -> ``__other__``."""
    missing_indicator: bool = True
    """Add a ``<col>__missing`` 0/1 feature for numeric columns with missing values in train."""
    csv_delimiter: str = "auto"
    """Field separator of CSV input: one character, ``tab``, or ``auto`` (a tab for ``.tsv``
    files, else a comma)."""
    csv_header: bool = True
    """CSV files start with a header line; without one columns are ``column_1``, ``column_2`` ..."""
    csv_encoding: str = "utf-8"
    """Text encoding of CSV files (a Python codec name such as ``latin-1`` or ``cp1252``)."""
    csv_null_values: list[str] = field(default_factory=list)
    """CSV values read as missing, besides the empty field, ``NA``, ``N/A``, ``null``, ``NaN``
    and the other pyarrow defaults (e.g. ``["?", "-"]``)."""
    csv_decimal: str = "."
    """Decimal separator of numbers in CSV input: ``.`` or ``,`` (``26,9``). With ``,`` and
    ``csv_delimiter`` ``auto``, fields are separated by ``;`` (a tab for ``.tsv`` files)."""
    memory_budget: int | None = None
    """Bytes of memory the step plans its work in (batches, row groups, per-row state). A table
    whose in-memory size would exceed it is read in record batches, in passes, never whole.
    None: half the memory limit of the step's cgroup (the pod's limit), or 2 GiB where there is
    no limit. At least 16 MiB."""

    workers: int = 0
    """Processes that preprocess the data together, each reading a contiguous group of its
    files (the result is one process's, bit for bit). ``0``: chosen from the input's size,
    one per GiB of files as stored (up to 8, the CPUs, the files, and one per 512 MiB of
    ``memory_budget``), and only where one process would read in record batches (a table
    larger than the budget); ``1``: one process; more: that many, reading in record batches
    whatever the size (a worker with no file to read takes part all the same). Local workers
    share ``memory_budget``."""

    launcher: str = "local"
    """Where the workers run: ``local``, in the step's own process or pod (several workers are
    processes under torchrun there); ``pytorchjob``, several workers are the pods of a
    Kubeflow PyTorchJob the step launches and waits for (one process each, reading the data
    from the store and writing the output straight into it), and one worker is the step's pod
    as with ``local``. With ``pytorchjob`` and ``workers: 0`` the pods are one per GiB of
    files as stored, up to 8 and the files, where one pod would read in record batches."""
    cluster: PodsConfig = field(default_factory=PodsConfig)
    """The pods of a ``pytorchjob`` (resources, image, secrets; :class:`PodsConfig`)."""

    max_input_bytes: int = 256 << 30
    """Bytes the input may take once decompressed and parsed (Arrow's in-memory size): read
    from Parquet footers before any work (the rows times the columns' widths where that is
    more than the pages: repeated values take bytes on disk), counted while a CSV is read.
    Past it the step stops with one ``E_DATA`` line: a small file of repeated rows (a
    decompression bomb) never fills the pod's memory or disk."""
    max_columns: int = 10_000
    """Columns the input may have (read from the Parquet footer or the CSV header first)."""
    max_features: int = 20_000
    """Output features (the encoded width: numeric columns, their missing indicators and each
    categorical column's one-hot categories) the step may write; checked once the columns are
    typed and their categories counted, before any split is written."""

    def __post_init__(self) -> None:
        require(bool(self.target), "target", "must name a column", self.target)
        require(
            isinstance(self.workers, int) and 0 <= self.workers <= 64,
            "workers",
            "must be 0 (auto) or a number of processes from 1 to 64",
            self.workers,
        )
        require(
            self.launcher in LAUNCHERS,
            "launcher",
            f"must be one of {', '.join(LAUNCHERS)}",
            self.launcher,
        )
        for name in ("max_input_bytes", "max_columns", "max_features"):
            value = getattr(self, name)
            require(isinstance(value, int) and value > 0, name, "must be > 0", value)
        require(
            self.task in ("auto", "classification", "regression"),
            "task",
            "must be one of auto, classification, regression",
            self.task,
        )
        for name, kind in self.column_roles.items():
            require(
                kind in COLUMN_KINDS,
                f"column_roles.{name}",
                f"must be one of {', '.join(COLUMN_KINDS)}",
                kind,
            )
        require(
            self.target not in self.column_roles,
            f"column_roles.{self.target}",
            "must not name the target (the target is typed by the task parameter)",
            self.column_roles.get(self.target),
        )
        require(0 < self.val_fraction < 1, "val_fraction", "must be in (0, 1)", self.val_fraction)
        require(
            0 < self.test_fraction < 1, "test_fraction", "must be in (0, 1)", self.test_fraction
        )
        require(
            self.val_fraction + self.test_fraction < 1,
            "test_fraction",
            f"plus val_fraction={self.val_fraction} must be < 1 (rows must remain for training)",
            self.test_fraction,
        )
        require(self.seed >= 0, "seed", "must be >= 0", self.seed)
        require(self.max_categories > 0, "max_categories", "must be > 0", self.max_categories)
        require(
            self.csv_delimiter in ("auto", "tab")
            or (len(self.csv_delimiter) == 1 and self.csv_delimiter not in '"\r\n'),
            "csv_delimiter",
            "must be one character (not a quote or line break), 'tab' or 'auto'",
            self.csv_delimiter,
        )
        require(
            _is_codec(self.csv_encoding),
            "csv_encoding",
            "must name a text encoding",
            self.csv_encoding,
        )
        require(
            self.csv_decimal in (".", ","),
            "csv_decimal",
            "must be '.' or ','",
            self.csv_decimal,
        )
        require(
            self.csv_decimal != self.csv_delimiter,
            "csv_decimal",
            f"must differ from csv_delimiter {self.csv_delimiter!r}",
            self.csv_decimal,
        )
        if self.memory_budget is not None:
            require(
                isinstance(self.memory_budget, int) and self.memory_budget >= MIN_BUDGET,
                "memory_budget",
                f"must be a number of bytes >= {MIN_BUDGET} (16 MiB), or null for the default",
                self.memory_budget,
            )
        for value in self.csv_null_values:
            require(
                isinstance(value, str), "csv_null_values", "must hold strings", self.csv_null_values
            )

    def budget(self) -> int:
        """:attr:`memory_budget`, or the default read from the cgroup."""
        return self.memory_budget if self.memory_budget is not None else default_memory_budget()

    def csv_options(self) -> CsvOptions:
        """How CSV input is parsed."""
        return CsvOptions(
            delimiter=self.csv_delimiter,
            header=self.csv_header,
            encoding=self.csv_encoding,
            null_values=tuple(self.csv_null_values),
            decimal=self.csv_decimal,
        )


def _is_codec(name: str) -> bool:
    try:
        return codecs.lookup(name) is not None
    except LookupError:
        return False


def config_from_parameters(
    *,
    target: str,
    task: str,
    seed: int,
    column_roles_json: str | dict[str, Any],
    csv_delimiter: str,
    csv_header: bool,
    csv_encoding: str,
    csv_null_values: str,
    csv_decimal: str,
    preprocess_config_json: str | dict[str, Any],
) -> PreprocessConfig:
    """The step's config from the pipeline's parameters (same names, documented and defaulted
    once, in the pipeline's signature): the one mapping the component and the pipeline's
    parameter check share.

    ``column_roles_json`` is a JSON object ``{"column": "numeric" | "categorical" | "date" |
    "keep" | "drop"}``;
    ``csv_null_values`` comma-separated extra missing values (``?,-``);
    ``preprocess_config_json`` further :class:`PreprocessConfig` fields, dotted or nested,
    applied last.

    Raises:
        InputError: ``E_PARAM`` for a parameter that is not the JSON it must be; ``E_CONFIG``
            for a bad value (naming the field).
    """
    base: dict[str, Any] = {
        "target": target,
        "task": task,
        "seed": seed,
        "column_roles": json_object(column_roles_json, "column_roles_json"),
        "csv_delimiter": csv_delimiter,
        "csv_header": csv_header,
        "csv_encoding": csv_encoding,
        "csv_null_values": [v.strip() for v in csv_null_values.split(",") if v.strip()],
        "csv_decimal": csv_decimal,
    }
    overrides = json_object(preprocess_config_json, "preprocess_config_json")
    return from_dict(PreprocessConfig, apply_overrides(base, overrides))
