"""Compile every pipeline and component to YAML (the golden files under version control)."""

from __future__ import annotations

from pathlib import Path

from kfp import compiler

from components import ALL as COMPONENTS
from pipelines.training import PIPELINES


def compile_all(out_dir: Path, *, components_dir: Path) -> list[Path]:
    """Write ``<out_dir>/<pipeline>.yaml`` and ``<components_dir>/<name>/component.yaml``.

    Returns:
        The written paths, pipelines first.
    """
    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, pipeline in sorted(PIPELINES.items()):
        path = out_dir / f"{name}.yaml"
        compiler.Compiler().compile(pipeline, str(path))
        written.append(path)
    for name, component in sorted(COMPONENTS.items()):
        path = components_dir / name / "component.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(component, str(path))
        written.append(path)
    return written
