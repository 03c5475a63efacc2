"""The fingerprint component: a cheap content fingerprint of the data, so caches see changes."""

from typing import Optional

from kfp import dsl
from kfp.dsl import Dataset, Input

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
# Optional, not `str | None`: KFP 2.17's component interface reads no PEP 604 union. An optional
# artifact is `Input[Dataset] = None`, never wrapped in Optional: on the real backend the input
# artifact comes untyped and the executor makes it from the annotation (tests/unit/
# test_executor_inputs.py), and `Optional[...]` cannot be made.
def fingerprint(
    data: Input[Dataset] = None,  # type: ignore[assignment]
    data_uri: str = "",
    registry_uri: Optional[str] = None,  # noqa: UP045
) -> str:
    """The data's fingerprint (size, modification time and sampled bytes of every data file).

    The table is ``data``, a Dataset artifact from an upstream step (KFP's launcher brings it
    in: no store credentials needed; its modification time, the download's, is left out), or
    ``data_uri``, a file or folder in a store that the step reads itself, with the store's
    credentials in its environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``); exactly
    one of them.

    Never cached: preprocess takes it as a parameter, so KFP's cache (which keys on parameters
    and artifact names, not contents) reads the data again whenever it changed.

    ``registry_uri``: where the pipeline will register its model, when it registers one (not
    given: no check). As the run's first step, this one refuses an empty ``registry_uri`` in a
    Kubernetes pod with no ``MLFLOW_TRACKING_URI`` in its environment before any work: the
    register step's embedded store would die with its pod.
    """
    from trainer.entry import run_guarded
    from trainer.steps.preprocess import data_fingerprint, table_location

    table = ""

    def body() -> str:
        nonlocal table
        if registry_uri is not None:
            from trainer.registry import named_tracking_uri

            named_tracking_uri(registry_uri)
        table = table_location(data.path if data is not None else None, data_uri)
        return data_fingerprint(table, artifact=data is not None)

    value = run_guarded("fingerprint", body)
    print(f"data fingerprint {value} ({table})", flush=True)
    return value
