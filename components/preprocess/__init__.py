"""The preprocess component: raw Parquet/CSV in, validated and encoded splits plus schema out."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def preprocess(
    target: str,
    dataset: Output[Dataset],
    stats: Output[Metrics],
    # `Input[Dataset] = None`, not wrapped in Optional: on the real backend the input artifact
    # comes untyped and KFP's executor makes it from this annotation (tests/unit/
    # test_executor_inputs.py); `Optional[...]` cannot be made.
    data: Input[Dataset] = None,  # type: ignore[assignment]
    data_uri: str = "",
    task: str = "auto",
    seed: int = 0,
    column_roles_json: str = "{}",
    csv_delimiter: str = "auto",
    csv_header: bool = True,
    csv_encoding: str = "utf-8",
    csv_null_values: str = "",
    csv_decimal: str = ".",
    config_json: str = "{}",
    data_fingerprint: str = "",
    pipeline_run_id: str = "",
    task_name: str = "preprocess",
    cpu_image: str = "",
    object_store_secret: str = "",
    image_pull_secrets: list = [],  # noqa: B006 - compiled into the YAML, never mutated
) -> NamedTuple("PreprocessOutputs", [("data_hash", str), ("task", str)]):
    """Validate, impute, encode and split a table (see trainer.steps.preprocess).

    The table comes in one of two ways, exactly one of them: ``data``, a Dataset artifact from
    an upstream step (a Parquet or CSV file, named or not, or a folder of them), which KFP's
    launcher brings into the pod, so the step needs no store credentials; or ``data_uri``, a
    file or folder in a store (``s3://``, ``gs://``, ``minio://``) that the step reads itself,
    with the store's credentials in its environment (``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY``, e.g. from KFP's ``mlpipeline-minio-artifact`` secret through
    ``kfp.kubernetes.use_secret_as_env``).
    ``column_roles_json`` declares column roles (``{"zip": "categorical", "id": "keep"}``);
    the ``csv_*`` inputs say how CSV files are read (``csv_null_values``: comma-separated;
    ``csv_decimal``: ``.`` or ``,``); ``config_json`` sets further ``PreprocessConfig`` fields
    (``{"val_fraction": 0.2}``). ``data_fingerprint`` (from the fingerprint step) puts the
    data's content into the cache key; preprocess checks that the data still has it.

    With ``{"launcher": "pytorchjob"}`` in ``config_json`` a large table (or ``"workers": N``)
    is preprocessed by the pods of a Kubeflow PyTorchJob that this step launches and waits for
    (named from ``pipeline_run_id`` and ``task_name``): they read the table's store URI and
    write the output artifact straight into the store, so this step needs the store's
    credentials and the pods ``object_store_secret``; they run ``cpu_image`` (the pipeline
    passes this package version's) with ``image_pull_secrets``, in this pod's namespace
    (``POD_NAMESPACE``, ``POD_NAME`` and ``POD_UID`` from the downward API through
    ``kfp.kubernetes.use_field_path_as_env``: the job is then deleted with the run). The
    result equals one pod's, bit for bit.
    """
    from collections import namedtuple

    from trainer.entry import run_guarded, write_metadata_file
    from trainer.steps.preprocess import config_from_parameters, for_pods, table_location
    from trainer.steps.preprocess import preprocess as run

    def body():
        table = table_location(data.path if data is not None else None, data_uri)
        cfg = config_from_parameters(
            target=target,
            task=task,
            seed=seed,
            column_roles_json=column_roles_json,
            csv_delimiter=csv_delimiter,
            csv_header=csv_header,
            csv_encoding=csv_encoding,
            csv_null_values=csv_null_values,
            csv_decimal=csv_decimal,
            preprocess_config_json=config_json,
        )
        cfg, pods = for_pods(
            cfg,
            data_uri=data.uri if data is not None else data_uri,
            output_uri=dataset.uri,
            run_id=pipeline_run_id,
            task_name=task_name,
            image=cpu_image,
            object_store_secret=object_store_secret,
            image_pull_secrets=image_pull_secrets,
        )
        # The pods publish to dataset.uri: dataset.path is then left absent, and KFP's launcher
        # registers the artifact at its URI without uploading anything over it.
        return run(
            cfg,
            data_uri=table,
            output_uri=dataset.path,
            expected_fingerprint=data_fingerprint,
            artifact=data is not None,
            pods=pods,
        )

    result = run_guarded("preprocess", body)
    for split in ("train", "val", "test"):
        stats.log_metric(f"{split}_rows", getattr(result, f"{split}_rows"))
    stats.log_metric("features", len(result.features))
    dataset.metadata.update(
        {
            "task": result.task,
            "data_hash": result.data_hash,
            "features": len(result.features),
            # The run's summary shows them (identifiers, constants, leakage left out or named).
            "warnings": [n for n in result.notices if n.startswith("WARNING ")],
        }
    )
    write_metadata_file(stats.path, dict(stats.metadata))
    outputs = namedtuple("PreprocessOutputs", ["data_hash", "task"])
    return outputs(result.data_hash, result.task)
