"""The preprocess step: a raw Parquet/CSV table to validated, encoded, standardised splits.

What other code may use is exported here; the rest is this step's own:

- :mod:`~trainer.steps.preprocess.step`: :func:`preprocess` itself (read, decide, encode,
  split, publish) and its :class:`PreprocessResult`;
- :mod:`~trainer.steps.preprocess.config`: :class:`PreprocessConfig` and its mapping from the
  pipeline's parameters;
- :mod:`~trainer.steps.preprocess.tabular`: reading Parquet/CSV and text columns, over
  :mod:`~trainer.steps.preprocess.encode` (the split and the fitted encoders);
- :mod:`~trainer.steps.preprocess.columns`, :mod:`~trainer.steps.preprocess.feature_columns`,
  :mod:`~trainer.steps.preprocess.column_checks`, :mod:`~trainer.steps.preprocess.text_values`:
  which columns are features, of what kind, and which are left out and why;
- :mod:`~trainer.steps.preprocess.splits`: the checks after the split;
- :mod:`~trainer.steps.preprocess.preview`: the same decisions, found before any step runs
  (``gpupipe run --local``);
- :mod:`~trainer.steps.preprocess.fingerprint`: the input's content fingerprint, for caches;
- :mod:`~trainer.steps.preprocess.table_input`: which input gives the table, a Dataset artifact
  or ``data_uri``;
- :mod:`~trainer.steps.preprocess.demo_data`: the synthetic demo table;
- :mod:`~trainer.steps.preprocess.wide`: several workers at once, local processes or the pods
  of a PyTorchJob (:class:`PodsJob`, :func:`for_pods`: where the pods read and write).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.base.lazy import lazy_exports

if TYPE_CHECKING:
    from trainer.steps.preprocess.config import PreprocessConfig, config_from_parameters
    from trainer.steps.preprocess.demo_data import make_demo_table, write_demo_data
    from trainer.steps.preprocess.fingerprint import data_fingerprint
    from trainer.steps.preprocess.preview import inspect_data
    from trainer.steps.preprocess.step import PreprocessResult, preprocess
    from trainer.steps.preprocess.table_input import table_location
    from trainer.steps.preprocess.tabular import read_columns
    from trainer.steps.preprocess.wide import PodsJob, for_pods

__all__ = [
    "PodsJob",
    "PreprocessConfig",
    "PreprocessResult",
    "config_from_parameters",
    "data_fingerprint",
    "for_pods",
    "inspect_data",
    "make_demo_table",
    "preprocess",
    "read_columns",
    "table_location",
    "write_demo_data",
]

# Loaded on first use: the fingerprint step reads the table's bytes without pandas and the
# encoders; the pre-run checks load only the preview.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "PodsJob": "wide",
        "PreprocessConfig": "config",
        "PreprocessResult": "step",
        "config_from_parameters": "config",
        "data_fingerprint": "fingerprint",
        "for_pods": "wide",
        "inspect_data": "preview",
        "make_demo_table": "demo_data",
        "preprocess": "step",
        "read_columns": "tabular",
        "table_location": "table_input",
        "write_demo_data": "demo_data",
    },
)
