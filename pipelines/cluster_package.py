"""What ``gpupipe`` uploads and runs on a KFP cluster: the training pipeline compiled to YAML (or
a compiled package read from a file), named by a digest of its content."""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer.base.errors import InputError


@dataclass(frozen=True, slots=True)
class Compiled:
    """The training pipeline compiled to YAML, with the digest of its canonical form."""

    name: str
    yaml_text: str
    digest: str
    description: str
    baked: tuple[str, ...] = ()
    """``name=value`` of each default set with ``--set`` (empty: the compiled defaults)."""

    @property
    def version_name(self) -> str:
        """The default version name: the same YAML always gets the same name."""
        return f"v-{self.digest[:12]}"

    def pipeline_spec(self) -> dict[str, Any]:
        """The ``pipeline_spec`` of a run body, as ``kfp.Client`` builds it from a package."""
        docs = [d for d in yaml.safe_load_all(self.yaml_text) if d]
        platform: dict[str, Any] = {}
        for doc in docs[1:]:
            platform.update(doc)
        return {"pipeline_spec": docs[0], "platform_spec": platform} if platform else docs[0]


def parameter_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """Each pipeline parameter's default in a compiled pipeline spec (the first YAML document,
    or a run body's ``pipeline_spec`` with its ``platform_spec``); absent: no default."""
    if "root" not in spec and isinstance(spec.get("pipeline_spec"), dict):
        spec = spec["pipeline_spec"]
    params = ((spec.get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}
    return {
        name: p["defaultValue"]
        for name, p in params.items()
        if isinstance(p, dict) and "defaultValue" in p
    }


def baked_defaults(pairs: list[str]) -> dict[str, Any]:
    """``--set name=value`` pairs, typed and checked as ``--param`` values are (what KFP must not
    store included), for a package's defaults: ``gpupipe upload --set`` and ``compile --set``.

    Raises:
        InputError: ``E_PARAM`` naming ``--set`` (or the parameter) for a pair without ``=``, a
            name the pipeline does not have, or a value its type or its step refuses.
    """
    from pipelines.params import check_cluster_parameters, check_parameters, typed_parameters

    try:
        values = typed_parameters(pairs, require=False)
    except InputError as e:
        where = "--set" if e.where == "--param" else e.where
        raise InputError(e.code, e.message.replace("name=value", "NAME=VALUE"), where) from None
    # Checked over the pipeline's defaults, with a stand-in table where none is baked: the
    # values' own checks (their types, their steps' configs) do not depend on which table.
    check_cluster_parameters(check_parameters({"data_uri": "s3://bucket/table.parquet", **values}))
    return values


def with_defaults(compiled: Compiled, values: dict[str, Any]) -> Compiled:
    """``compiled`` with ``values`` as its parameters' defaults (``--set``): what the KFP UI's
    Create run form opens with, and what a run given no value takes. The values are listed in
    the pipeline's description, so a person reading the version sees what the platform team
    baked in.

    Raises:
        InputError: ``E_PARAM`` for a name that is not a parameter of this pipeline.
    """
    if not values:
        return compiled
    docs = [d for d in yaml.safe_load_all(compiled.yaml_text) if d]
    params = ((docs[0].get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}
    baked = set_values(values)
    for name, value in sorted(values.items()):
        if name not in params:
            raise InputError(
                "E_PARAM", f"--set {name}: the pipeline has no parameter {name!r}", "--set"
            )
        params[name]["defaultValue"] = value
        params[name]["isOptional"] = True
    info = docs[0].setdefault("pipelineInfo", {})
    note = "Defaults set by the platform team (gpupipe --set): " + ", ".join(baked) + "."
    description = f"{compiled.description.rstrip()}\n\n{note}".lstrip()
    info["description"] = description
    text = yaml.safe_dump_all(docs, sort_keys=False)
    return Compiled(
        name=compiled.name,
        yaml_text=text,
        digest=content_digest(text),
        description=description,
        baked=tuple(baked),
    )


def set_values(values: dict[str, Any]) -> list[str]:
    """``name=<JSON value>`` of each ``--set`` value, by name: how packages and commands list
    them."""
    return [f"{name}={json.dumps(value)}" for name, value in sorted(values.items())]


def version_description(compiled: Compiled) -> str:
    """An uploaded version's description: its content digest (how a repeated upload is
    recognised) and the defaults set with ``--set``, for a person reading the version."""
    text = f"sha256:{compiled.digest} (uploaded by gpupipe)"
    return f"{text}; defaults set: {', '.join(compiled.baked)}" if compiled.baked else text


def content_digest(yaml_text: str) -> str:
    """sha256 of the YAML's documents as sorted JSON: formatting and key order do not count."""
    docs = list(yaml.safe_load_all(yaml_text))
    canonical = json.dumps(docs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def compile_training_pipeline() -> Compiled:
    """Compile ``pipelines.training.training_pipeline`` (the cluster build) in a temp folder."""
    from kfp import compiler

    from pipelines.training import PIPELINE_NAME, training_pipeline

    with tempfile.TemporaryDirectory(prefix="gpupipe-") as tmp:
        path = Path(tmp) / f"{PIPELINE_NAME}.yaml"
        compiler.Compiler().compile(training_pipeline, str(path))
        return compiled_package(PIPELINE_NAME, path.read_text())


def compiled_package(name: str, yaml_text: str) -> Compiled:
    """The YAML that KFP's compiler wrote for pipeline ``name``, as a :class:`Compiled`."""
    info = (next(yaml.safe_load_all(yaml_text)) or {}).get("pipelineInfo", {})
    return Compiled(
        name=name,
        yaml_text=yaml_text,
        digest=content_digest(yaml_text),
        description=str(info.get("description", "")),
    )


MAX_PACKAGE_BYTES = 32 * 1024 * 1024
"""The largest YAML ``upload --package`` reads (KFP's upload takes at most 32 MiB)."""


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: ``*name`` expands without bound (a few hundred
    bytes of nested aliases make gigabytes: a "billion laughs"), and KFP's compiler writes none."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(
                f"an alias (*{event.anchor}) at line {event.start_mark.line + 1}: a compiled "
                "pipeline has none, and aliases can expand without bound"
            )
        return super().compose_node(parent, index)


def read_package(path: Path) -> Compiled:
    """A compiled pipeline YAML file, as ``gpupipe upload --package`` sends it.

    Only what must hold for the request to make sense is checked here (a readable YAML
    mapping); whether it is a valid pipeline is the API server's call, and its reason is what
    the user sees.

    Raises:
        InputError: ``E_PACKAGE`` naming the file when it cannot be read or is not YAML, is
            larger than :data:`MAX_PACKAGE_BYTES`, or uses YAML aliases.
    """
    try:
        size = path.stat().st_size
        if size > MAX_PACKAGE_BYTES:
            raise InputError(
                "E_PACKAGE",
                f"{path} is {size} bytes, over the {MAX_PACKAGE_BYTES} a compiled pipeline may "
                "be (KFP's API server refuses more than 32 MB)",
                "--package",
            )
        text = path.read_text()
        docs = [d for d in yaml.load_all(text, Loader=_NoAliasLoader) if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        reason = " ".join(str(e).split())[:200]
        raise InputError("E_PACKAGE", f"cannot read {path} as YAML: {reason}", "--package") from e
    if not docs or not isinstance(docs[0], dict):
        raise InputError("E_PACKAGE", f"{path} holds no YAML mapping", "--package")
    info = docs[0].get("pipelineInfo") or {}
    return Compiled(
        name=str(info.get("name") or path.stem) if isinstance(info, dict) else path.stem,
        yaml_text=text,
        digest=content_digest(text),
        description=str(info.get("description", "")) if isinstance(info, dict) else "",
    )
