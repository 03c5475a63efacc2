"""The training pipeline's parameters: one parser and one check for every front door.

``gpupipe run --local``, ``gpupipe run --host``, ``gpupipe schedule`` and ``gpupipe render`` all
read ``--param name=value`` through :func:`typed_parameters` (types from the pipeline's own
signature) and then :func:`check_parameters`, which builds every step's typed config from the
values the way the components do. A bad value therefore fails here, before any step runs or
any request is sent, with one line that names the pipeline parameter (``E_PARAM``).
"""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from trainer.base.errors import InputError
from trainer.base.typedconfig import json_object

ALIASES_SEPARATOR = "."
"""``tune.enabled`` is accepted for ``tune_enabled`` (and so on)."""

JSON_OBJECT_PARAMS = (
    "hyperparams_json",
    "train_config_json",
    "tune_space_json",
    "column_roles_json",
    "preprocess_config_json",
)
"""String parameters that must hold a JSON object."""

_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def pipeline_parameters() -> dict[str, Any]:
    """Names and defaults of the training pipeline's parameters (``None``: required)."""
    from pipelines.training import training_pipeline

    spec = training_pipeline.component_spec
    return {name: getattr(inp, "default", None) for name, inp in spec.inputs.items()}


def parameter_types() -> dict[str, tuple[str, Any, bool]]:
    """Each pipeline parameter's KFP type (``String``, ``Integer`` ...), default and optionality."""
    from pipelines.training import training_pipeline

    inputs = training_pipeline.component_spec.inputs
    return {
        name: (str(inputs[name].type), default, bool(inputs[name].optional))
        for name, default in pipeline_parameters().items()
    }


def parameter_table() -> str:
    """The table of the pipeline's parameters: name, type, default and description, as the
    pipeline's signature and docstring give them (KFP compiles the same into the YAML). The
    documentation's parameter reference is this table (``pipelines/reference.py``)."""
    from pipelines.training import training_pipeline

    rows = ["| parameter | type | default | what it does |", "|---|---|---|---|"]
    for name, inp in training_pipeline.component_spec.inputs.items():
        default = "(required)" if inp.default is None else f"`{json.dumps(inp.default)}`"
        text = " ".join(str(inp.description or "").split()).replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{name}` | {str(inp.type).lower()} | {default} | {text} |")
    return "\n".join(rows) + "\n"


def unknown_parameter(key: str, known: dict[str, Any] | set[str]) -> InputError:
    """E_PARAM for an unknown parameter name: the nearest names, or every name when none is near."""
    alias = key.replace(ALIASES_SEPARATOR, "_")
    close = difflib.get_close_matches(alias, sorted(known), n=3, cutoff=0.6)
    if close:
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? (gpupipe run --help lists all)"
    else:
        hint = f"known: {', '.join(sorted(known))}"
    return InputError("E_PARAM", f"unknown pipeline parameter {key!r}; {hint}", "--param")


def canonical_name(key: str, known: dict[str, Any] | set[str]) -> str:
    """``tune.enabled`` -> ``tune_enabled`` when only the latter is a parameter."""
    alias = key.replace(ALIASES_SEPARATOR, "_")
    return alias if key not in known and alias in known else key


def _typed(name: str, kind: str, text: str) -> Any:
    """``text`` converted to the pipeline parameter's KFP type, or E_PARAM naming ``name``."""
    try:
        if kind == "Integer":
            value = float(text) if "." in text or "e" in text.lower() else int(text)
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError(text)
                value = int(value)
            return value
        if kind == "Float":
            number = float(text)
            if number != number or number in (float("inf"), float("-inf")):
                raise ValueError(text)
            return number
        if kind == "Boolean":
            lowered = text.strip().lower()
            if lowered not in _BOOL_WORDS:
                raise ValueError(text)
            return _BOOL_WORDS[lowered]
        if kind in ("Dict", "Struct"):
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError(text)
            return value
        if kind in ("List", "JsonArray"):
            value = json.loads(text)
            if not isinstance(value, list):
                raise ValueError(text)
            return value
    except ValueError as e:
        kinds = {"Struct": "a JSON object", "Dict": "a JSON object", "JsonArray": "a JSON list"}
        want = kinds.get(kind, f"{'an' if kind[0] in 'AEIOU' else 'a'} {kind.lower()}")
        raise InputError("E_PARAM", f"parameter {name} must be {want}, got {text!r}", name) from e
    return text


def typed_value(name: str, value: Any, kind: str) -> Any:
    """A value given in Python (not text) checked against the parameter's KFP type."""
    if isinstance(value, str):
        return _typed(name, kind, value)
    ok = {
        "Integer": isinstance(value, int) and not isinstance(value, bool),
        "Float": isinstance(value, int | float) and not isinstance(value, bool),
        "Boolean": isinstance(value, bool),
        "Dict": isinstance(value, dict),
        "Struct": isinstance(value, dict),
        "List": isinstance(value, list),
        "JsonArray": isinstance(value, list),
    }.get(kind, False)
    if not ok:
        raise InputError("E_PARAM", f"parameter {name} must be {kind.lower()}, got {value!r}", name)
    return float(value) if kind == "Float" else value


def split_pair(pair: str) -> tuple[str, str]:
    """``"epochs=3"`` -> ``("epochs", "3")``; anything else is E_PARAM."""
    key, sep, value = pair.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError("E_PARAM", f"parameter must look like name=value, got {pair!r}", "--param")
    return key, value


def typed_parameters(pairs: list[str], *, require: bool = True) -> dict[str, Any]:
    """``["epochs=3"]`` -> ``{"epochs": 3}``, checked and typed against the compiled pipeline.

    Args:
        pairs: ``name=value`` strings from ``--param``; ``tune.enabled`` is read as
            ``tune_enabled``.
        require: also insist on every parameter without a default (``data_uri``).

    Raises:
        InputError: ``E_PARAM`` for a malformed pair, an unknown name (listing the valid ones),
            a value of the wrong type, a repeated parameter, or a missing required parameter.
    """
    types = parameter_types()
    out: dict[str, Any] = {}
    for pair in pairs:
        key, value = split_pair(pair)
        key = canonical_name(key, types)
        if key not in types:
            raise unknown_parameter(key, types)
        if key in out:
            raise InputError("E_PARAM", f"parameter {key} is given twice", key)
        out[key] = _typed(key, types[key][0], value)
    missing = [n for n, (_, default, optional) in types.items() if default is None and not optional]
    if require and (absent := sorted(set(missing) - set(out))):
        raise InputError("E_PARAM", f"missing required pipeline parameter {absent[0]!r}", "--param")
    return out


# --- the steps' mappings, called with pipeline parameters as the components call them --------


def step_mappings() -> dict[str, Callable[..., Any]]:
    """Each step's one mapping from pipeline parameters (its arguments carry their names) to
    its config, by step; the components call the same functions."""
    from trainer.steps.evaluate import evaluate_config
    from trainer.steps.preprocess import config_from_parameters
    from trainer.steps.register import register_config
    from trainer.steps.train import step_settings

    return {
        "preprocess": config_from_parameters,
        "train": step_settings,
        "evaluate": evaluate_config,
        "register": register_config,
    }


def mapping_arguments(mapping: Callable[..., Any], p: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``mapping`` that are pipeline parameters, taken from ``p``."""
    return {name: p[name] for name in inspect.signature(mapping).parameters if name in p}


def step_arguments(p: dict[str, Any], launcher: str | None = None) -> dict[str, Any]:
    """Keyword arguments of :func:`trainer.steps.train.step_settings` for parameters ``p`` (all
    present), with the images the pipeline passes to the train step; ``launcher`` instead of
    the ``launcher`` parameter where given."""
    from components.images import CPU_IMAGE, CUDA_IMAGE

    args = mapping_arguments(step_mappings()["train"], p)
    args |= {"cuda_image": CUDA_IMAGE, "cpu_image": CPU_IMAGE}
    return args if launcher is None else {**args, "launcher": launcher}


def with_defaults(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` over the pipeline's defaults (not checked: :func:`check_parameters` does)."""
    return {**pipeline_parameters(), **params}


def train_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The train step's settings for ``params`` over the pipeline's defaults, as the train
    component makes them (not checked: ``from_dict(TrainStepConfig, ...)`` does that)."""
    return step_mappings()["train"](**step_arguments(with_defaults(params)))  # type: ignore[no-any-return]


def preprocess_config(p: dict[str, Any]) -> Any:
    """The preprocess step's ``PreprocessConfig`` for parameters ``p`` (all present), built by
    the component's own mapping."""
    mapping = step_mappings()["preprocess"]
    return mapping(**mapping_arguments(mapping, p))


# Which pipeline parameter sets which step field: errors name the parameter a person set.
_TRAIN_FIELDS = {
    "learning_rate": ("optim.lr",),
    "epochs": ("train.epochs",),
    "seed": ("train.seed",),
    "batch_size": ("train.global_batch_size",),
    "nodes": ("nnodes", "train.nnodes"),
    "gpus_per_node": ("gpus_per_node", "train.gpus_per_node"),
    "model_name": ("model.name",),
    "gpu_type": ("cluster.gpu_resource",),
    "gpu_hour_usd": ("watch.gpu_hour_usd",),
    "gpu_prices": ("watch.gpu_prices",),
    "gpu_node_selector": ("cluster.node_selector",),
    "trainer_runtime": ("cluster.runtime",),
    "image_pull_secrets": ("cluster.image_pull_secrets",),
    "job_labels": ("cluster.labels",),
    "job_annotations": ("cluster.annotations",),
    "job_env": ("cluster.env",),
    "gang_queue": ("cluster.gang_queue",),
    "gang_priority_class": ("cluster.gang_priority_class",),
    "one_worker_per_node": ("cluster.one_worker_per_node",),
    "object_store_secret": ("cluster.object_store_secret",),
}
_EVALUATE_FIELDS = {
    "gate.metric": "gate_metric",
    "gate.threshold": "gate_threshold",
    "gate.baseline": "gate_baseline",
    "model_plugins": "model_name",
    "max_champion_bytes": "max_champion_bytes",
}
_PREPROCESS_FIELDS = {
    "column_roles": "column_roles_json",
    "csv_delimiter": "csv_delimiter",
    "csv_header": "csv_header",
    "csv_encoding": "csv_encoding",
    "csv_null_values": "csv_null_values",
    "csv_decimal": "csv_decimal",
    "task": "task",
    "seed": "seed",
}
"""Preprocess fields set by a plain parameter; the rest come from ``preprocess_config_json``."""


def _owner(where: str, p: dict[str, Any]) -> str:
    """The pipeline parameter that a train-step field error ``where`` comes from."""
    where = where.removeprefix("train.") if where.startswith("train.optim") else where
    short = where.removeprefix("train.")  # train.cluster.env: set as cluster.env(.NAME) there
    for name in ("hyperparams_json", "train_config_json"):
        keys = _flat_keys(json_object(p.get(name), name))
        if any(
            where == k or where.endswith("." + k) or k.startswith(where) or k == short
            or k.startswith(short + ".")
            for k in keys
        ):  # fmt: skip
            return name
    field = where.split("[")[0]  # cluster.labels[team]: the labels' owner
    for name, fields in _TRAIN_FIELDS.items():
        if any(field == f or field.endswith("." + f) for f in fields):
            return name
    return "train_config_json"


def _flat_keys(d: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        out += _flat_keys(v, key + ".") if isinstance(v, dict) and v else [key]
    return out


def _reraise(param: str, e: ValueError) -> None:
    """Raise ``e`` again as E_PARAM naming pipeline parameter ``param``.

    A field set through a JSON parameter keeps its key (``hyperparams_json: optim.lr ...``);
    a field a plain parameter sets is called by the parameter's name.
    """
    where = getattr(e, "where", "")
    message = getattr(e, "message", None) or str(e)
    if param in JSON_OBJECT_PARAMS:
        message = f"{param}: {message}"
    elif where:
        message = message.replace(where.split("[")[0], param)  # keeps a [key] after it
    raise InputError("E_PARAM", message, param) from None


def _check_train(p: dict[str, Any]) -> None:
    """The train step's config, and with ``launcher=local`` the cluster job's too: the
    parameters that only a cluster job reads would fail a cluster run of the same pipeline."""
    from trainer.base.typedconfig import from_dict
    from trainer.steps.train import TrainStepConfig

    launchers = [p.get("launcher", "local")]
    if launchers == ["local"]:
        launchers.append("pytorchjob")
    for launcher in launchers:
        try:
            from_dict(TrainStepConfig, step_mappings()["train"](**step_arguments(p, launcher)))
        except ValueError as e:
            _reraise(_owner(getattr(e, "where", ""), p), e)


def _check_step(step: str, p: dict[str, Any], owner: Callable[[str], str]) -> None:
    """Build ``step``'s config with its mapping; a bad value is E_PARAM naming ``owner(where)``."""
    mapping = step_mappings()[step]
    try:
        mapping(**mapping_arguments(mapping, p))
    except ValueError as e:
        _reraise(owner(str(getattr(e, "where", ""))), e)


def _check_evaluate(p: dict[str, Any]) -> None:
    _check_step("evaluate", p, lambda where: _EVALUATE_FIELDS.get(where, "gate_metric"))


def _check_register(p: dict[str, Any]) -> None:
    def owner(where: str) -> str:
        return "registry_uri" if "tracking_uri" in where else "registered_model_name"

    _check_step("register", p, owner)
    uri = str(p.get("registry_uri") or "")
    if uri and "://" not in uri:
        raise InputError(
            "E_PARAM",
            f"registry_uri must be a URI such as http://host:5000 or sqlite:///path/mlflow.db, "
            f"got {uri!r}",
            "registry_uri",
        )


def _check_choices(p: dict[str, Any]) -> None:
    choices = {
        "launcher": ("local", "pytorchjob", "trainjob"),
        "tune_engine": ("local", "katib"),
        "task": ("auto", "classification", "regression"),
    }
    for name, allowed in choices.items():
        if name in p and p[name] not in allowed:
            raise InputError(
                "E_PARAM", f"{name} must be one of {', '.join(allowed)}, got {p[name]!r}", name
            )
    if "nodes" in p and int(p["nodes"]) <= 0:
        raise InputError("E_PARAM", f"nodes must be > 0, got {p['nodes']!r}", "nodes")
    for name in ("epochs", "batch_size", "tune_trial_epochs"):  # 0: chosen from the data
        if name in p and int(p[name]) < 0:
            raise InputError(
                "E_PARAM", f"{name} must be >= 0 (0: chosen from the data), got {p[name]!r}", name
            )
    if "gpus_per_node" in p and int(p["gpus_per_node"]) < 0:
        raise InputError(
            "E_PARAM", f"gpus_per_node must be >= 0, got {p['gpus_per_node']!r}", "gpus_per_node"
        )
    if "learning_rate" in p and not float(p["learning_rate"]) > 0:
        raise InputError(
            "E_PARAM", f"learning_rate must be > 0, got {p['learning_rate']!r}", "learning_rate"
        )
    if not str(p.get("target", "x")).strip():
        raise InputError("E_PARAM", "target must name a column, got ''", "target")
    for name, value in dict(p.get("gpu_node_selector") or {}).items():
        if not isinstance(value, str | int | float | bool):
            raise InputError(
                "E_PARAM",
                f"gpu_node_selector values must be strings, got {value!r} for {name!r}",
                "gpu_node_selector",
            )


def _check_tune(p: dict[str, Any]) -> None:
    from trainer.base.typedconfig import config_fields
    from trainer.config import WorkerConfig
    from trainer.tune.space import load_space

    space = json_object(p.get("tune_space_json"), "tune_space_json")
    if not space:
        return
    try:
        load_space(space, config_fields=config_fields(WorkerConfig))
    except ValueError as e:
        _reraise("tune_space_json", e)


def _check_preprocess(p: dict[str, Any]) -> None:
    config = json_object(p.get("preprocess_config_json"), "preprocess_config_json")

    def owner(where: str) -> str:
        field = where.split(".")[0]
        if field in config or any(k.split(".")[0] == field for k in config):
            return "preprocess_config_json"
        return _PREPROCESS_FIELDS.get(field) or where or "preprocess_config_json"

    _check_step("preprocess", p, owner)


CHECKS: list[Callable[[dict[str, Any]], None]] = [
    _check_choices,
    lambda p: [json_object(p[name], name) for name in JSON_OBJECT_PARAMS if name in p],
    _check_train,
    _check_evaluate,
    _check_register,
    _check_tune,
    _check_preprocess,
]
"""Each check takes every parameter (defaults filled in) and raises E_PARAM naming one."""


_SECRET_ELSEWHERE = (
    "KFP stores parameters with the run and shows them in pod arguments and pod specs; a secret "
    "goes in a Kubernetes Secret that the steps read through secretKeyRef"
)
_NO_SECRETS_BY_DESIGN = frozenset({"column_roles_json"})
"""Parameters whose values come from a fixed vocabulary (a column's role), so a secret's name
among their keys is a column's name, not a secret."""


def _refuse_secrets(full: dict[str, Any]) -> None:
    """A credential in any parameter, before KFP stores it: the data's keys (``KEY:SECRET@``
    in ``data_uri``) and whatever :func:`~trainer.base.redact.redact` would mask (a
    ``"password": ...`` in a JSON parameter). The line names the parameter and never the
    secret. (A secret-named variable of the job's environment, which would land as a plain
    ``value:`` in the pod spec, is the train step's config check: the job's ``cluster`` section
    refuses it in the step too, for a run started from the UI.)"""
    from trainer.base.redact import has_userinfo, redact

    data_uri = str(full.get("data_uri") or "")
    if has_userinfo(data_uri):
        secret = full.get("object_store_secret") or "the store's secret"
        raise InputError(
            "E_PARAM",
            f"data_uri must not hold the store's keys (KEY:SECRET@ in {redact(data_uri)!r}): "
            f"{_SECRET_ELSEWHERE}: put them in the Secret that object_store_secret names "
            f"({secret!r}, keys accesskey and secretkey) and drop them from the URI",
            "data_uri",
        )
    for name, value in full.items():
        text = value if isinstance(value, str) else json.dumps(value)
        if name not in _NO_SECRETS_BY_DESIGN and value is not None and redact(text) != text:
            raise InputError(
                "E_PARAM",
                f"{name} holds a credential ({redact(text)[:200]!r}): {_SECRET_ELSEWHERE} "
                "(object_store_secret for the store's keys, registry_secret for the registry's "
                "account) and never in a parameter",
                name,
            )


def check_cluster_parameters(full: dict[str, Any]) -> None:
    """What a run on KFP must not be given, beyond :func:`check_parameters` (``full``: its
    result). KFP stores every parameter with the run and passes it in pod arguments, which
    anyone who can list pods reads: an account inside ``registry_uri`` is refused, in one line
    that names the secret to put it in (the URI's password is never repeated); so are the
    store's keys in ``data_uri``, a secret-named variable of the job's environment and any
    other credential (:func:`_refuse_secrets`)."""
    uri = str(full.get("registry_uri") or "")
    parts = urlsplit(uri)
    if parts.username is not None or parts.password is not None:
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        secret = full.get("registry_secret") or "mlflow-auth"
        raise InputError(
            "E_PARAM",
            f"registry_uri must not hold an account (user:password@ in {shown!r}): KFP stores "
            f"parameters with the run and shows them in pod arguments; put it in the Kubernetes "
            f"secret {secret!r} (keys username and password) that registry_secret names",
            "registry_uri",
        )
    _refuse_secrets(full)


def check_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """Every parameter with defaults filled in, after checking what each step will make of it.

    Args:
        params: typed pipeline parameters (from :func:`typed_parameters`), some or all.

    Returns:
        All parameters, the given ones over the pipeline's defaults.

    Raises:
        InputError: ``E_PARAM`` naming the first bad parameter (and, for JSON parameters,
            the key inside it).
    """
    types = parameter_types()
    unknown = sorted(set(params) - set(types))
    if unknown:
        raise unknown_parameter(unknown[0], types)
    full = {name: default for name, (_, default, _) in types.items()}
    for name, value in params.items():
        full[name] = typed_value(name, value, types[name][0]) if value is not None else None
    for check in CHECKS:
        check(full)
    return full
