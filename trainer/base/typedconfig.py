"""The typed-config machinery every layer uses: checks, parsing, serialisation, overrides.

Configs are keyword-only dataclasses whose fields carry their own documentation and whose
``__post_init__`` rejects bad values through :func:`require` with a message naming the field
(``train.epochs must be > 0, got -3``). :func:`from_dict` rejects unknown keys and wrong types
with the dotted path of the key, so a bad config fails where it is written, before any GPU is
requested; :func:`to_json` is the form components hand to a training job. The worker's own
schema is :mod:`trainer.config`; the steps, the launchers and the search declare theirs with
the same helpers.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from trainer.base.errors import InputError

T = TypeVar("T")


def require(ok: bool, name: str, rule: str, value: Any) -> None:
    """Raise a one-line error naming the field, the rule and the offending value.

    Raises:
        InputError: ``E_CONFIG`` naming ``name`` when ``ok`` is false.
    """
    if not ok:
        raise InputError("E_CONFIG", f"{name} {rule}, got {value!r}", name)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against the annotation ``tp``; build nested dataclasses; name ``path``."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            require(type(None) in options, path, "must not be null", value)
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, path)
            except ValueError as e:
                errors.append(str(e))
        if len(errors) == 1:
            raise InputError("E_CONFIG", errors[0].rsplit(" (", 1)[0], path)
        names = " or ".join(_type_name(o) for o in options)
        raise InputError("E_CONFIG", f"{path} must be {names}, got {value!r}", path)
    if origin is Literal:
        require(value in get_args(tp), path, f"must be one of {list(get_args(tp))}", value)
        return value
    if dataclasses.is_dataclass(tp):
        require(isinstance(value, dict), path or "config", "must be a mapping", value)
        return _from_dict(tp, value, path)  # type: ignore[arg-type]
    if origin is list:
        require(isinstance(value, list), path, "must be a list", value)
        (item_tp,) = get_args(tp)
        return [coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        require(isinstance(value, dict), path, "must be a mapping", value)
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        require(isinstance(value, bool), path, "must be true or false", value)
        return value
    if tp is int:
        # KFP hands ints inside ParallelFor items over as floats: accept integral floats.
        if isinstance(value, float) and value.is_integer():
            return int(value)
        require(
            isinstance(value, int) and not isinstance(value, bool),
            path,
            "must be an integer",
            value,
        )
        return value
    if tp is float:
        require(
            isinstance(value, int | float) and not isinstance(value, bool),
            path,
            "must be a number",
            value,
        )
        return float(value)
    if tp is str:
        require(isinstance(value, str), path, "must be a string", value)
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {path}")  # internal: a field we declared


def _from_dict(cls: type[T], data: dict[str, Any], path: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    prefix = f"{path}." if path else ""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(fields), n=3, cutoff=0.6)
        mean = f"did you mean {' or '.join(prefix + c for c in close)}? " if close else ""
        raise InputError(
            "E_CONFIG",
            f"unknown config key {prefix}{unknown[0]}; {mean}known keys: "
            f"{', '.join(sorted(fields))}",
            f"{prefix}{unknown[0]}",
        )
    kwargs = {name: coerce(value, hints[name], prefix + name) for name, value in data.items()}
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise InputError(
            "E_CONFIG", f"missing required config key {prefix}{missing[0]}", f"{prefix}{missing[0]}"
        )
    return cls(**kwargs)


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build config ``cls`` from plain data, rejecting unknown keys and wrong types.

    Raises:
        ValueError: one line naming the dotted key and the bad value.
    """
    return coerce(data, cls, "")


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-JSON form of a config dataclass (round-trips through ``from_dict``)."""
    return dataclasses.asdict(cfg)


def to_json(cfg: Any) -> str:
    """Canonical JSON (sorted keys) of a config dataclass."""
    return json.dumps(to_dict(cfg), indent=2, sort_keys=True) + "\n"


def config_hash(cfg: Any) -> str:
    """Short, stable hash of a config, recorded in checkpoints to catch a resumed run's drift."""
    return hashlib.sha256(json.dumps(to_dict(cfg), sort_keys=True).encode()).hexdigest()[:16]


def parse_value(text: str) -> Any:
    """Parse an override's value as JSON (numbers, true/false/null, lists), else keep the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str] | dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted ``key=value`` overrides applied.

    ``["optim.lr=0.01", "train.early_stopping.patience=5"]`` or the same as a dict. Intermediate
    sections are created when missing; unknown keys are caught later by ``from_dict``.

    Raises:
        ValueError: an override without ``=`` or one that descends into a non-mapping value.
    """
    out = json.loads(json.dumps(data))
    items: list[tuple[str, Any]]
    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        items = []
        for text in overrides:
            key, sep, value = text.partition("=")
            if not sep or not key.strip():
                raise InputError(
                    "E_CONFIG", f"override must look like section.key=value, got {text!r}", "--set"
                )
            items.append((key.strip(), parse_value(value)))
    for key, value in items:
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                raise InputError("E_CONFIG", f"override {key}: {where} is not a section", where)
            node = nxt
        node[parts[-1]] = value
    return out


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass that annotation ``tp`` holds (directly or as ``X | None``), if any."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg) and isinstance(arg, type):
            return arg
    return None


def config_fields(cls: type) -> set[str]:
    """Every dotted leaf path of config dataclass ``cls`` (``optim.lr``, ``train.epochs``, ...).

    Nested sections (also optional ones such as ``train.early_stopping``) are walked; dicts and
    lists are leaves.
    """
    out: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = _dataclass_in(hints[f.name])
        if sub is None:
            out.add(f.name)
        else:
            out.update(f"{f.name}.{leaf}" for leaf in config_fields(sub))
    return out


def json_object(value: str | dict[str, Any] | None, name: str, code: str = "E_PARAM") -> dict:
    """The JSON object that parameter ``name`` holds: as given when already a dict, ``{}`` when
    empty. The one parser of the pipeline's JSON-object parameters.

    Raises:
        InputError: ``code`` naming ``name`` when the text is not a JSON object.
    """
    if isinstance(value, dict):
        return value
    try:
        data = json.loads(value or "{}")
    except json.JSONDecodeError as e:
        raise InputError(code, f"{name} must be a JSON object: {e}", name) from None
    if not isinstance(data, dict):
        raise InputError(code, f"{name} must be a JSON object, got {value!r}", name)
    return data
