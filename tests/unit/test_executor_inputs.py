"""Every component's artifact inputs as KFP 2.17's backend hands them to the step.

The backend's driver builds an input artifact from its ML Metadata record, and that record's
runtime form carries no type (backend/src/v2/metadata/converter.go, toRuntimeArtifact): the
SDK's executor then makes the artifact from the parameter's annotation. kfp.local always sends
the type, so a local run never shows what this test does. `Optional[Input[Dataset]]` made
preprocess fail on the real backend with `TypeError: Cannot instantiate typing.Union` (issue 62
item 1); tests/cluster/test_kfp.py runs the same on the cluster.
"""

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
from kfp.dsl import Artifact
from kfp.dsl.executor import Executor
from kfp.dsl.types import type_annotations

COMPONENTS = ("fingerprint", "preprocess", "tune", "train", "evaluate", "register", "notify")


def _artifact_inputs(func: Any) -> dict[str, Any]:
    """The function's input artifacts, by name, with their annotations as written."""
    found = {}
    for name, annotation in inspect.getfullargspec(func).annotations.items():
        bare = type_annotations.maybe_strip_optional_from_annotation(annotation)
        if type_annotations.is_Input_Output_artifact_annotation(
            bare
        ) and type_annotations.is_artifact_wrapped_in_Input(bare):
            found[name] = annotation
    return found


def _func(component: str) -> Any:
    module = importlib.import_module(f"components.{component}")
    return getattr(module, component).python_func


def test_the_components_have_artifact_inputs_to_check() -> None:
    """The check below is not vacuous: the steps that take a table or a model have them."""
    names = {c: set(_artifact_inputs(_func(c))) for c in COMPONENTS}
    assert "data" in names["preprocess"] and "data" in names["fingerprint"], names
    assert sum(len(n) for n in names.values()) >= 5, names


@pytest.mark.parametrize("component", COMPONENTS)
def test_an_untyped_runtime_artifact_becomes_the_annotated_class(
    component: str, tmp_path: Path
) -> None:
    func = _func(component)
    inputs = _artifact_inputs(func)
    executor_input = {
        "inputs": {
            "artifacts": {
                name: {"artifacts": [{"name": str(i + 1), "uri": f"s3://b/{name}", "metadata": {}}]}
                for i, name in enumerate(inputs)
            }
        },
        "outputs": {"outputFile": str(tmp_path / "executor_output.json")},
    }
    executor = Executor(executor_input, function_to_execute=func)
    for name, annotation in inputs.items():
        made = executor.get_input_artifact(name)
        bare = type_annotations.maybe_strip_optional_from_annotation(annotation)
        cls = type_annotations.get_io_artifact_class(bare)
        assert isinstance(made, cls) and isinstance(made, Artifact), (component, name, made)
        assert made.uri == f"s3://b/{name}"
