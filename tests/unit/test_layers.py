"""The import picture: layers point down only, no circles, and the trainer never imports kfp.

pipelines <- components <- (trainer.steps, trainer.tune) <- trainer.launch <- the engine.
Every import counts, the lazy ones inside functions too; only imports under
``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "components", "pipelines")
ENTRY_POINTS = {"trainer.__main__": 3}
"""``python -m trainer <step>`` runs the steps as a component does: it sits with components."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def layer(module: str) -> int:
    """0 engine, 1 launch, 2 steps and tune, 3 components, 4 pipelines."""
    if module in ENTRY_POINTS:
        return ENTRY_POINTS[module]
    parts = module.split(".")
    top = {"pipelines": 4, "components": 3}.get(parts[0])
    if top is not None:
        return top
    sub = parts[1] if len(parts) > 1 else ""
    return {"steps": 2, "tune": 2, "launch": 1}.get(sub, 0)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            skip |= {id(n) for n in ast.walk(node)}
    return skip


def imports(module: str) -> set[str]:
    """Modules of this project (and ``kfp``) that ``module`` imports when it runs."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package[: len(package) - (node.level - 1)]
                base = ".".join([*head, base] if base else head)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
    return {m for m in found if m.split(".")[0] in (*PACKAGES, "kfp")}


GRAPH = {m: imports(m) for m in MODULES}


def test_the_tree_is_found() -> None:
    assert {"trainer.loop", "trainer.launch.watch", "trainer.steps.train"} <= set(MODULES)
    assert "trainer.launch.torchrun" in GRAPH["trainer.launch.local"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("trainer")))
def test_trainer_never_imports_kfp(module: str) -> None:
    assert not {m for m in GRAPH[module] if m.split(".")[0] == "kfp"}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_only(module: str) -> None:
    upward = sorted(
        f"{module} (layer {layer(module)}) imports {m} (layer {layer(m)})"
        for m in GRAPH[module]
        if m in MODULES and layer(m) > layer(module)
    )
    assert upward == []


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(GRAPH.get(m, ())):
            # A package imports its own submodules to re-export them: not a circle.
            if n not in MODULES or n.startswith(f"{m}."):
                continue
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(MODULES):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circles() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])
