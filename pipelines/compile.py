"""Compile every pipeline and component to YAML (the golden files under version control).

Each YAML file is written only where asked and only over a file the suite wrote before (its
``.<name>.gpupipe-output.json`` marker, :mod:`trainer.base.outputs`) or one with the same bytes: a
person's own file of that name is refused, never overwritten.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from kfp import compiler

from components import ALL as COMPONENTS
from pipelines.cluster_package import compiled_package, with_defaults
from pipelines.training import PIPELINES
from trainer.base import outputs, storage

STEP = "compile"
"""The producer recorded in the markers of compiled YAML."""


def _compiled(obj: object) -> bytes:
    """The YAML KFP's compiler writes for a pipeline or component, as bytes."""
    with tempfile.TemporaryDirectory(prefix="gpupipe-compile-") as tmp:
        path = Path(tmp) / "out.yaml"
        compiler.Compiler().compile(obj, str(path))  # type: ignore[arg-type]
        return path.read_bytes()


def compile_all(
    out_dir: Path | None,
    *,
    components_dir: Path | None,
    defaults: dict[str, Any] | None = None,
) -> list[Path]:
    """Write ``<out_dir>/<pipeline>.yaml`` and ``<components_dir>/<name>/component.yaml``.

    Args:
        out_dir: folder for the pipeline YAML; None writes none.
        components_dir: folder for the components' YAML; None writes none.
        defaults: pipeline parameters' defaults to bake into the pipeline YAML (``--set``,
            checked by :func:`pipelines.cluster_package.baked_defaults`), listed in its
            description: the package ``gpupipe upload --set`` would upload.

    Returns:
        The written paths, pipelines first.

    Raises:
        InputError: ``E_OUTPUT`` naming a file that is there and was not written by gpupipe;
            checked for every file before any is written.
    """
    planned: list[tuple[Path, bytes]] = []
    if out_dir is not None:
        for name, pipeline in sorted(PIPELINES.items()):
            data = _compiled(pipeline)
            if defaults:
                package = with_defaults(compiled_package(name, data.decode()), defaults)
                data = package.yaml_text.encode()
            planned.append((out_dir / f"{name}.yaml", data))
    if components_dir is not None:
        for name, component in sorted(COMPONENTS.items()):
            planned.append((components_dir / name / "component.yaml", _compiled(component)))
    for path, data in planned:  # all refusals before the first write
        if not (path.is_file() and path.read_bytes() == data):
            outputs.check_output_location(str(path), STEP, kind="file")
    for path, data in planned:
        path.parent.mkdir(parents=True, exist_ok=True)
        outputs.claim_output_file(str(path), STEP, same_as=data)
        storage.write_bytes(str(path), data)
    return [path for path, _ in planned]
