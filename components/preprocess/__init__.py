"""The preprocess component: raw Parquet/CSV in, validated and encoded splits plus schema out."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Metrics, Output

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def preprocess(
    data_uri: str,
    target: str,
    dataset: Output[Dataset],
    stats: Output[Metrics],
    task: str = "auto",
    seed: int = 0,
    config_json: str = "{}",
) -> NamedTuple("PreprocessOutputs", [("data_hash", str), ("task", str)]):
    """Validate, impute, encode and split a table (see trainer.steps.preprocess)."""
    import json
    from collections import namedtuple

    from trainer.config import apply_overrides, from_dict
    from trainer.steps import run_guarded, write_metadata_file
    from trainer.steps.preprocess import PreprocessConfig
    from trainer.steps.preprocess import preprocess as run

    def body():
        base = {"target": target, "task": task, "seed": seed}
        cfg = from_dict(PreprocessConfig, apply_overrides(base, json.loads(config_json)))
        return run(cfg, data_uri=data_uri, output_uri=dataset.path)

    result = run_guarded("preprocess", body)
    for split in ("train", "val", "test"):
        stats.log_metric(f"{split}_rows", getattr(result, f"{split}_rows"))
    stats.log_metric("features", len(result.features))
    dataset.metadata.update(
        {"task": result.task, "data_hash": result.data_hash, "features": len(result.features)}
    )
    write_metadata_file(stats.path, dict(stats.metadata))
    outputs = namedtuple("PreprocessOutputs", ["data_hash", "task"])
    return outputs(result.data_hash, result.task)
