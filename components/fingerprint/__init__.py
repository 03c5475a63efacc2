"""The fingerprint component: a cheap content fingerprint of the data, so caches see changes."""

from typing import Optional

from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
# Optional, not `str | None`: KFP 2.17's component interface reads no PEP 604 union.
def fingerprint(data_uri: str, registry_uri: Optional[str] = None) -> str:  # noqa: UP045
    """The data's fingerprint (size, modification time and sampled bytes of every data file).

    Never cached: preprocess takes it as a parameter, so KFP's cache (which keys on parameters
    and artifact names, not contents) reads the data again whenever it changed.

    ``registry_uri``: where the pipeline will register its model, when it registers one (not
    given: no check). As the run's first step, this one refuses an empty ``registry_uri`` in a
    Kubernetes pod with no ``MLFLOW_TRACKING_URI`` in its environment before any work: the
    register step's embedded store would die with its pod.
    """
    from trainer.entry import run_guarded
    from trainer.steps.preprocess import data_fingerprint

    def body() -> str:
        if registry_uri is not None:
            from trainer.registry import named_tracking_uri

            named_tracking_uri(registry_uri)
        return data_fingerprint(data_uri)

    value = run_guarded("fingerprint", body)
    print(f"data fingerprint {value} ({data_uri})", flush=True)
    return value
