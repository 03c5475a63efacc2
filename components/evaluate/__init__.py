"""The evaluate component: scores the test split, writes metrics and a report, decides the gate."""

from kfp import dsl
from kfp.dsl import HTML, ClassificationMetrics, Dataset, Input, Metrics, Model, Output

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def evaluate(
    model: Input[Model],
    dataset: Input[Dataset],
    metrics: Output[Metrics],
    baselines: Output[Metrics],
    classification: Output[ClassificationMetrics],
    report: Output[HTML],
    gate_metric: str = "auto",
    gate_threshold: float = 0.0,
    gate_baseline: str = "trivial",
    registry_uri: str = "",
    registered_model_name: str = "gpupipe-model",
    model_name: str = "mlp",
    max_champion_bytes: int = 1 << 30,
) -> bool:
    """Score the candidate (and the registry's champion, if any) on the test split.

    Returns whether the gate passed: the step's single output, which the pipeline's condition
    reads (the reason is in the report's metadata, ``gate_reason``). ``metrics`` holds the
    model's own metrics and ``gate_passed``; ``baselines`` the baselines' scores on the same
    split, as ``<baseline>_<metric>`` (``trivial_accuracy``, ``linear_roc_auc``): apart, so
    that the KFP UI's metrics table opens on the model's. ``gate_threshold`` 0 means
    no threshold; ``gate_baseline`` ``trivial`` fails a candidate worse than the trivial
    predictor, ``best`` one that does not beat the best baseline; ``registry_uri`` empty means
    ``MLFLOW_TRACKING_URI``, else the embedded local registry; in a Kubernetes pod with neither,
    the step refuses before any work (that registry would die with the pod).
    ``model_name`` is the pipeline's model: a plugin (``package.module:build``) named there is
    the only code a model artifact may make this step import, and only from the installed
    environment. ``max_champion_bytes`` bounds the champion's download (one E_MODEL line past it).

    The step reads no store (KFP's launcher brings the model and the dataset in); a registry
    that asks who is calling takes its account from ``MLFLOW_TRACKING_USERNAME`` and
    ``MLFLOW_TRACKING_PASSWORD`` (e.g. the ``mlflow-auth`` secret through
    ``kfp.kubernetes.use_secret_as_env``).
    """
    from trainer.entry import run_guarded, write_metadata_file
    from trainer.steps.evaluate import evaluate as run
    from trainer.steps.evaluate import evaluate_config

    def body():
        from trainer.registry import get_champion
        from trainer.registry_files import SizeLimit

        cfg = evaluate_config(
            gate_metric=gate_metric,
            gate_threshold=gate_threshold,
            gate_baseline=gate_baseline,
            model_name=model_name,
            max_champion_bytes=max_champion_bytes,
        )
        limit = SizeLimit(cfg.max_champion_bytes, "pipeline parameter max_champion_bytes")
        champion = get_champion(registry_uri or None, registered_model_name, limit=limit)
        # register re-checks the alias against this version: a concurrent run may move it.
        report.metadata["champion_version"] = champion.version if champion else ""
        if champion is None:
            return run(cfg, model_uri=model.path, dataset_uri=dataset.path, report_uri=report.path)
        return run(
            cfg,
            model_uri=model.path,
            dataset_uri=dataset.path,
            report_uri=report.path,
            champion_model_uri=champion.local_model_dir,
            champion_name=f"{registered_model_name} v{champion.version}",
            champion_stored_metrics=champion.metrics,
        )

    result = run_guarded("evaluate", body)
    for key, value in sorted(result.metrics.items()):
        metrics.log_metric(key, value)
    metrics.log_metric("gate_passed", float(result.gate_passed))
    for name, scores in result.baselines.items():
        for key, value in sorted(scores.items()):
            baselines.log_metric(f"{name}_{key}", value)
    if result.confusion_matrix is not None and result.labels:
        classification.log_confusion_matrix(result.labels, result.confusion_matrix)
    if result.roc:
        classification.log_roc_curve(result.roc["fpr"], result.roc["tpr"], result.roc["thresholds"])
    report.metadata.update(
        {
            "gate_passed": result.gate_passed,
            "gate_reason": result.gate_reason,
            "gate_metric": result.gate_metric,
        }
    )
    # The file also carries the gate's reason: on a cluster it is what `gpupipe run --host
    # --wait` reads back from the store for its summary (the metadata lives in ML Metadata).
    write_metadata_file(metrics.path, {**metrics.metadata, "gate_reason": result.gate_reason})
    write_metadata_file(baselines.path, dict(baselines.metadata))
    write_metadata_file(classification.path, dict(classification.metadata))
    return result.gate_passed
