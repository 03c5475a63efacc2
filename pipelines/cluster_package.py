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
        text = path.read_text()
    info = (next(yaml.safe_load_all(text)) or {}).get("pipelineInfo", {})
    return Compiled(
        name=PIPELINE_NAME,
        yaml_text=text,
        digest=content_digest(text),
        description=str(info.get("description", "")),
    )


def read_package(path: Path) -> Compiled:
    """A compiled pipeline YAML file, as ``gpupipe upload --package`` sends it.

    Only what must hold for the request to make sense is checked here (a readable YAML
    mapping); whether it is a valid pipeline is the API server's call, and its reason is what
    the user sees.

    Raises:
        InputError: ``E_PACKAGE`` naming the file when it cannot be read or is not YAML.
    """
    try:
        text = path.read_text()
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
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
