"""The pipeline's parameters are written once: its signature and docstring. Everything else
follows that list or is checked against it here, so that a parameter added, renamed or given a
new default anywhere fails until every copy agrees: the components' defaults and types, the
arguments of each step's mapping and what the components pass them, and the tables that let the
parameter check name the parameter behind a bad value. The documentation's parameter table is
generated from the same list (tests/unit/test_reference.py checks that it is not stale)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines import params
from pipelines.params import (
    JSON_OBJECT_PARAMS,
    pipeline_parameters,
    step_mappings,
)

ROOT = Path(__file__).resolve().parents[2]

DIFFERENT_ON_PURPOSE = {
    ("tune", "enabled"): "alone, a tune component is there to search; in the pipeline the search "
    "is opt-in (tune_enabled)",
    ("train", "object_store_secret"): "alone, a component assumes no object-store secret; the "
    "pipeline's default is KFP's artifact-store secret",
    ("tune", "object_store_secret"): "as for train",
    ("preprocess", "object_store_secret"): "as for train (read only with launcher pytorchjob)",
    ("preprocess", "data_uri"): "alone, a component may take the table as its Dataset artifact "
    "input data instead (a user's own pipeline); the pipeline requires data_uri",
    ("fingerprint", "data_uri"): "as for preprocess",
}
"""Component inputs whose default differs from the pipeline parameter wired into them."""


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    text = (ROOT / "pipelines/compiled/gpupipe-training.yaml").read_text()
    return dict(next(yaml.safe_load_all(text)))


def _wiring(compiled: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(pipeline parameter, component, input) for every component input a parameter feeds."""
    comps = compiled["components"]
    out = []
    for comp in comps.values():
        for task in (comp.get("dag") or {}).get("tasks", {}).values():
            ref = task["componentRef"]["name"]
            for name, value in (task.get("inputs") or {}).get("parameters", {}).items():
                source = value.get("componentInputParameter", "")
                param = source.removeprefix("pipelinechannel--")
                if source != param and param in pipeline_parameters() and "dag" not in comps[ref]:
                    out.append((param, ref, name))
    return out


def test_every_parameter_is_documented_in_the_pipelines_docstring() -> None:
    from pipelines.training import training_pipeline

    undocumented = [
        n for n, i in training_pipeline.component_spec.inputs.items() if not i.description
    ]
    assert undocumented == []


def _platform_only() -> set[str]:
    """Parameters that only a task's Kubernetes settings read (a secret's name), none of the
    components' inputs: their channels in the compiled platform spec."""
    text = (ROOT / "pipelines/compiled/gpupipe-training.yaml").read_text()
    platform = list(yaml.safe_load_all(text))[1]
    names = set(re.findall(r"pipelinechannel--(\w+)", yaml.safe_dump(platform)))
    return names & set(pipeline_parameters())


def test_every_parameter_reaches_a_component_with_its_type_and_default(
    compiled: dict[str, Any],
) -> None:
    root = compiled["root"]["inputDefinitions"]["parameters"]
    wiring = _wiring(compiled)
    read = {p for p, _, _ in wiring}
    # The registry's account: a secret the evaluate and register pods read, not an input.
    assert _platform_only() - read == {"registry_secret"}
    assert read | _platform_only() == set(root), "a parameter that no step reads"
    drifted = []
    for param, ref, name in wiring:
        spec = compiled["components"][ref]["inputDefinitions"]["parameters"].get(name)
        if spec is None:  # a channel KFP passes for a task setting (the accelerator)
            continue
        assert spec["parameterType"] == root[param]["parameterType"], (param, ref, name)
        component = re.sub(r"^comp-|-\d+$", "", ref)
        differs = "defaultValue" in spec and spec["defaultValue"] != root[param].get("defaultValue")
        if differs != ((component, name) in DIFFERENT_ON_PURPOSE):
            drifted.append(f"{component}.{name} <- {param}")
    assert drifted == [], "component defaults drifted from the pipeline's (or now agree)"


@pytest.mark.parametrize("step", list(step_mappings()), ids=str)
def test_each_steps_mapping_takes_pipeline_parameters_without_defaults(step: str) -> None:
    known = set(pipeline_parameters())
    for name, arg in inspect.signature(step_mappings()[step]).parameters.items():
        assert arg.kind is inspect.Parameter.KEYWORD_ONLY, name
        if arg.default is inspect.Parameter.empty:
            assert name in known, f"{step}: {name} is not a pipeline parameter"
        else:
            assert name not in known, f"{step}: {name} repeats the pipeline's default"


MAPPING_CALLS = {
    "preprocess": ("config_from_parameters",),
    "train": ("step_settings",),
    "tune": ("step_settings",),
    "evaluate": ("evaluate_config",),
    "register": ("register_config",),
}


@pytest.mark.parametrize("component", list(MAPPING_CALLS), ids=str)
def test_each_component_passes_its_mapping_every_parameter(component: str) -> None:
    source = (ROOT / "components" / component / "__init__.py").read_text()
    (called,) = MAPPING_CALLS[component]
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == called
    ]
    assert len(calls) == 1, f"{component} calls {called} once"
    given = {k.arg for k in calls[0].keywords}
    mapping = next(m for m in step_mappings().values() if m.__name__ == called)
    required = {n for n, a in inspect.signature(mapping).parameters.items() if a.default is a.empty}
    assert required - given == set()


def test_the_parameter_check_names_pipeline_parameters_only() -> None:
    known = set(pipeline_parameters())
    owners = {
        *params._TRAIN_FIELDS,
        *params._EVALUATE_FIELDS.values(),
        *params._PREPROCESS_FIELDS.values(),
    }
    assert owners - known == set()
    assert set(JSON_OBJECT_PARAMS) == {n for n in known if n.endswith("_json")}
    train_args = inspect.signature(step_mappings()["train"]).parameters
    plain = {n for n, a in train_args.items() if a.default is a.empty} - set(JSON_OBJECT_PARAMS)
    assert plain - {"launcher"} - set(params._TRAIN_FIELDS) == set(), (
        "a train parameter whose bad values the check cannot name"
    )


TRAIN_ONLY = {
    "model": "the trained model (tune outputs parameters)",
    "epochs": "tune's trials take trial_epochs instead",
    "nnodes": "trials run on one node",
    "launcher": "tune's engine decides where trials run",
    "trainer_runtime": "trials are PyTorchJobs or processes, never TrainJobs",
    "tuned_hyperparams_json": "tune's own output",
    "gpu_limit": "tune's own output (train_gpu_limit), the train pod's GPU limit as text",
}
"""Inputs of the train component that the tune component does not take, and why."""
SAME_INPUT = {"train_config_json": "config_json"}
"""A tune input and the train input it is (tune's ``config_json`` configures the search)."""
DIFFERENT_DEFAULT = {"task_name": "each step's own task, which names its jobs"}
"""Inputs both take whose defaults differ on purpose."""


def test_train_and_tune_take_the_train_settings_alike() -> None:
    """The train and tune components both list the train step's settings, with literal
    defaults. They stay two written signatures: KFP runs each function's own source in the pod
    and compiles its signature into the component's YAML, so a default must be a literal in
    that source; generating the lists into the two hand-written modules at ``make compile``
    would leave half of each file generated, and the lists are not one list (tune adds its
    search's inputs, train its launcher, nodes and the tuned parameters). Instead they are held
    together here: every train setting is a tune input too (or named in ``TRAIN_ONLY``), of the
    same type and default; ``test_every_parameter_reaches_a_component_with_its_type_and_default``
    holds both to the pipeline's parameters."""
    from components import train, tune

    train_args = inspect.signature(train.python_func).parameters
    tune_args = inspect.signature(tune.python_func).parameters
    pairs = {SAME_INPUT.get(name, name): name for name in tune_args}
    assert set(train_args) - set(pairs) == set(TRAIN_ONLY)
    drifted = []
    for name, a in train_args.items():
        if name not in pairs or name in DIFFERENT_DEFAULT:
            continue
        b = tune_args[pairs[name]]
        if (a.annotation, a.default) != (b.annotation, b.default):
            drifted.append(f"train.{name} {a.default!r} vs tune.{pairs[name]} {b.default!r}")
    assert drifted == []
    assert all(train_args[n].default != tune_args[n].default for n in DIFFERENT_DEFAULT)
