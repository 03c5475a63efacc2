"""The register component: records the model version in the MLflow registry (idempotent per run)."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Input, Metrics, Model

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def register(
    model: Input[Model],
    metrics: Input[Metrics],
    evaluation: Input[HTML],
    data_hash: str,
    gate_passed: bool,
    pipeline_run_id: str,
    registry_uri: str = "",
    registered_model_name: str = "gpupipe-model",
    params_json: str = "{}",
    baselines: Input[Metrics] = None,
) -> NamedTuple("RegisterOutputs", [("version", str), ("model_uri", str), ("champion", bool)]):
    """Register ``model`` with its run id, data hash, parameters and evaluation metrics.

    ``evaluation`` is evaluate's report: its metadata names the gate metric and the champion
    version evaluate compared against, so the alias moves only if that decision still holds.
    ``baselines`` (optional) is evaluate's baselines artifact: its scores are recorded too, as
    ``baseline_<baseline>_<metric>``.

    The step reads no store (KFP's launcher brings the model in); the registry
    (``registry_uri``, else ``MLFLOW_TRACKING_URI``) takes its account from
    ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` (e.g. the ``mlflow-auth``
    secret through ``kfp.kubernetes.use_secret_as_env``).
    """
    import json
    from collections import namedtuple

    from trainer.entry import run_guarded
    from trainer.steps.register import register as run
    from trainer.steps.register import register_config

    def body():
        cfg = register_config(
            registered_model_name=registered_model_name,
            registry_uri=registry_uri,
            evaluated_metric=str(evaluation.metadata.get("gate_metric", "")),
            evaluated_champion=str(evaluation.metadata.get("champion_version", "")),
        )

        def numbers(artifact, prefix=""):
            return {
                f"{prefix}{k}": float(v)
                for k, v in artifact.metadata.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }

        values = numbers(metrics)
        if baselines is not None:
            values.update(numbers(baselines, "baseline_"))
        return run(
            cfg,
            model_uri=model.path,
            pipeline_run_id=pipeline_run_id,
            data_hash=data_hash,
            params=json.loads(params_json),
            metrics=values,
            gate_passed=gate_passed,
        )

    result = run_guarded("register", body)
    print(json.dumps({"event": "registered", **result.to_dict()}), flush=True)
    outputs = namedtuple("RegisterOutputs", ["version", "model_uri", "champion"])
    return outputs(result.version, result.model_uri, result.champion)
