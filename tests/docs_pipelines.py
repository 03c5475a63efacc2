"""The pipelines that docs/kfp.md shows, as code the tests run: each ```python block that defines
a pipeline (``@dsl.pipeline``), loaded as a module, so that the page cannot show a pipeline that
does not compile (tests/unit/test_docs_pipelines.py), nor its own-pipeline example one that does
not run (tests/integration/test_docs_pipeline_run.py under kfp.local, tests/cluster/test_kfp.py on
KFP's real backend)."""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KFP_PAGE = ROOT / "docs" / "kfp.md"
OWN_PIPELINE = "my_pipeline"
"""The name of the "Using the components in your own pipeline" example's pipeline function."""
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True, slots=True)
class Block:
    """A ```python block of a page: its first code line's number (1-based) and its text."""

    page: Path
    line: int
    source: str

    @property
    def where(self) -> str:
        """``docs/kfp.md:LINE``, for a failure's message."""
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def python_blocks(page: Path = KFP_PAGE) -> list[Block]:
    """Every ```python block of ``page``, in order."""
    text = page.read_text()
    return [
        Block(page, text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)
    ]


def pipeline_blocks(page: Path = KFP_PAGE) -> list[Block]:
    """The ```python blocks of ``page`` that define a pipeline (``@dsl.pipeline``)."""
    return [b for b in python_blocks(page) if re.search(r"^@dsl\.pipeline\b", b.source, re.M)]


def load_block(block: Block, folder: Path) -> ModuleType:
    """Run ``block`` as a module from the repository's root (its relative paths resolve there).

    The block is written to a file in ``folder`` first, padded so that its lines keep the page's
    numbers: KFP reads a component's source with ``inspect``, which needs a file, and a
    traceback then points at the page's line.
    """
    name = f"docs_block_{block.page.stem}_{block.line}"
    path = folder / f"{name}.py"
    path.write_text("\n" * (block.line - 1) + block.source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # KFP's component decorator looks its module up
    with contextlib.chdir(ROOT):
        spec.loader.exec_module(module)
    return module


def pipelines_of(module: ModuleType) -> dict[str, Any]:
    """The pipelines a loaded block defines, by name of their function."""
    from kfp.dsl.graph_component import GraphComponent

    return {k: v for k, v in vars(module).items() if isinstance(v, GraphComponent)}


def compile_block(block: Block, package: Path) -> dict[str, Any]:
    """Compile each pipeline of ``block`` into ``package`` (the last one wins); the pipelines by
    function name. Raises what KFP's compiler raises."""
    from kfp import compiler

    with tempfile.TemporaryDirectory() as tmp:
        found = pipelines_of(load_block(block, Path(tmp)))
        for pipeline in found.values():
            compiler.Compiler().compile(pipeline, str(package))
    return found


def own_pipeline_block(page: Path = KFP_PAGE) -> Block:
    """The block of the own-pipeline example (the one that defines :data:`OWN_PIPELINE`)."""
    (block,) = [
        b for b in pipeline_blocks(page) if re.search(rf"^def {OWN_PIPELINE}\(", b.source, re.M)
    ]
    return block


def compile_own_pipeline(package: Path) -> Path:
    """docs/kfp.md's own-pipeline example compiled into ``package`` (a YAML file), as a user
    compiles it; for the cluster test, which uploads and runs it."""
    compile_block(own_pipeline_block(), package)
    return package
