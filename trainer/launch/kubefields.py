"""Checks of Kubernetes field values (names, labels, quantities, runtimes) for the job specs.

Each check raises :class:`~trainer.errors.InputError` naming the spec's field, so a value the API
server or an operator would refuse fails in the step, with the field a user can fix.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from trainer.base.typedconfig import require

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY = re.compile(
    r"^(?P<num>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(text: str, name: str) -> Decimal:
    """The value of a Kubernetes quantity (``500m``, ``4``, ``16Gi``, ``1e3``).

    Raises:
        InputError: ``text`` is not a non-negative Kubernetes quantity (names ``name``).
    """
    m = _QUANTITY.match(text) if isinstance(text, str) else None
    require(m is not None, name, "must be a Kubernetes quantity like 500m, 4 or 16Gi", text)
    assert m is not None
    number, suffix = Decimal(m.group("num")), m.group("suffix") or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    return number.scaleb(int(suffix[1:]))


def check_dns(value: str, name: str, pattern: re.Pattern[str], what: str, max_len: int) -> None:
    require(
        isinstance(value, str) and len(value) <= max_len and bool(pattern.match(value)),
        name,
        f"must be {what} (at most {max_len} characters)",
        value,
    )


def check_label_key(key: str, name: str) -> None:
    prefix, _, local = key.rpartition("/")
    ok = (
        bool(QUALIFIED_NAME.match(local))
        and len(local) <= 63
        and (not prefix or (len(prefix) <= 253 and bool(DNS1123_SUBDOMAIN.match(prefix))))
    )
    require(ok, name, "has an invalid key (expected [prefix/]name, name <= 63 characters)", key)


def check_labels(labels: dict[str, str], name: str, reserved: Collection[str] = ()) -> None:
    for key, value in labels.items():
        check_label_key(key, name)
        require(
            isinstance(value, str)
            and len(value) <= 63
            and (not value or bool(QUALIFIED_NAME.match(value))),
            f"{name}[{key}]",
            "must be a label value (alphanumerics, '-', '_', '.'; at most 63 characters)",
            value,
        )
        require(
            key not in reserved,
            name,
            "must not set a label gpupipe sets itself",
            key,
        )


DEFAULT_RUNTIME = "torch-distributed"
"""The ClusterTrainingRuntime a default Trainer install ships."""
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeRef:
    """The training runtime a TrainJob runs on: cluster-wide or in the job's namespace."""

    name: str = DEFAULT_RUNTIME
    """Name of the runtime."""
    kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = "ClusterTrainingRuntime"
    """``ClusterTrainingRuntime`` (cluster-scoped) or ``TrainingRuntime`` (the job's namespace)."""

    def __post_init__(self) -> None:
        check_dns(self.name, "job.runtime.name", DNS1123_SUBDOMAIN, "a runtime name", 253)
        require(
            self.kind in RUNTIME_KINDS,
            "job.runtime.kind",
            f"must be one of {', '.join(RUNTIME_KINDS)}",
            self.kind,
        )

    @classmethod
    def parse(cls, text: str, where: str = "train.cluster.runtime") -> RuntimeRef:
        """``name`` (a ClusterTrainingRuntime) or ``<kind>/<name>``.

        Raises:
            InputError: an unknown kind or a bad name (names ``where``).
        """
        kind, _, name = text.rpartition("/")
        require(
            kind in ("", *RUNTIME_KINDS),
            where,
            f"must be <name> or <kind>/<name> with kind one of {', '.join(RUNTIME_KINDS)}",
            text,
        )
        require(bool(name), where, "must name a runtime", text)
        check_dns(name, where, DNS1123_SUBDOMAIN, "a runtime name", 253)
        return cls(name=name, kind=kind or "ClusterTrainingRuntime")  # type: ignore[arg-type]
