"""The import picture: layers point down only, no circles, torch only where it belongs.

The layers, lowest first; a module may import its own layer and those below it:

    0  trainer.base        torch-free: errors, exit codes, redaction, storage, outputs, version,
                           the typed-config machinery. Imports nothing else of the project.
    1  trainer.config      the worker's config schema; trainer.entry, trainer.registry (front
                           doors that components and the steps name; torch-free) and its
                           bounded download, trainer.registry_files
    2  trainer.data, trainer.distributed        the data path; processes and devices
    3  trainer.checkpoint, trainer.models       checkpoints; models and the model artifact
    4  trainer.training    the run loop and its state
    5  trainer.worker, trainer.demo             what torchrun and ``make train-demo`` run
    6  trainer.launch      how a run is started and watched. It may import only trainer.base
                           (and itself): it runs where the engine's dependencies may be absent.
    7  trainer.steps, trainer.tune
    8  components, trainer.__main__ (``python -m trainer <step>`` runs the steps as a
                           component does)
    9  pipelines

Inside layer 7, each step with parts of its own is a folder (``trainer.steps.preprocess``,
``.train``, ``.tune``, ``.evaluate``; ``register`` and the shared ``figures`` are modules). A
step folder's ``__init__`` exports on purpose what other code may use; from outside the folder
(another step, a component, a pipeline, ``python -m trainer``) only the folder itself is
imported, never a module inside it, and inside the folder its modules import each other by
module, never through the ``__init__`` that imports them. The steps use each other without
circles (preprocess reads the gate's minimum rows from evaluate; evaluate and register read the
files train writes into the model; tune runs train's worker config).

In layer 9, the ``gpupipe`` command is a folder too (``pipelines.cli``): a module a subcommand,
its flags beside its handler, over the two shared ones (``help``, ``host``); from outside the
folder only the package itself is imported.

Every import counts, the lazy ones inside functions too; only imports under
``if TYPE_CHECKING:`` are left out (they never run). ``trainer`` never imports kfp; the base and
the launchers never import torch, and importing every module of ``trainer.launch`` and
``pipelines`` leaves torch unloaded.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "components", "pipelines")
LAYERS = {
    "trainer.base": 0,
    "trainer.config": 1,
    "trainer.entry": 1,
    "trainer.registry": 1,
    "trainer.registry_files": 1,
    "trainer.data": 2,
    "trainer.distributed": 2,
    "trainer.checkpoint": 3,
    "trainer.models": 3,
    "trainer.training": 4,
    "trainer.worker": 5,
    "trainer.demo": 5,
    "trainer.launch": 6,
    "trainer.steps": 7,
    "trainer.tune": 7,
    "trainer.__main__": 8,
    "components": 8,
    "pipelines": 9,
}
"""Each module's layer is that of the longest prefix here that names it (the package itself too)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def layer(module: str) -> int:
    """The layer of ``module`` (see the table above); ``trainer`` itself sits with the base."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:n])) in LAYERS:
            return LAYERS[prefix]
    assert module == "trainer", f"{module} has no layer: add it to LAYERS"
    return 0


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            skip |= {id(n) for n in ast.walk(node)}
    return skip


def imports(module: str, *, typing_too: bool = False) -> set[str]:
    """Modules of this project (and ``kfp``, ``torch``) that ``module`` imports when it runs;
    with ``typing_too``, also those it imports for type annotations only."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    skip = set() if typing_too else _type_checking_nodes(tree)
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
    # ``from pipelines.cli import run`` in pipelines/cli/__init__.py names its own submodule.
    found.discard(module)
    return {m for m in found if m.split(".")[0] in (*PACKAGES, "kfp", "torch")}


GRAPH = {m: imports(m) for m in MODULES}
TYPING_GRAPH = {m: imports(m, typing_too=True) for m in MODULES}


def test_the_tree_is_found() -> None:
    assert {"trainer.training.loop", "trainer.launch.watch", "trainer.steps.train"} <= set(MODULES)
    assert "trainer.launch.torchrun" in GRAPH["trainer.launch.local"]
    assert "torch" in GRAPH["trainer.distributed.dist"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_has_a_layer(module: str) -> None:
    assert layer(module) >= 0


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


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("trainer.base")))
def test_the_base_imports_only_itself_and_never_torch(module: str) -> None:
    """The base stands on nothing else of the project, and loads without torch."""
    assert sorted(m for m in GRAPH[module] if not m.startswith("trainer.base")) == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("trainer.launch")))
def test_launch_imports_only_the_base(module: str) -> None:
    """The launchers run where only the base is sure to load (torch-free, no engine)."""
    allowed = ("trainer.base", "trainer.launch")
    found = {m for m in GRAPH[module] if m.split(".")[0] in ("trainer", "torch")}
    assert sorted(m for m in found if not m.startswith(allowed)) == []


def test_launch_and_pipelines_load_without_torch() -> None:
    """Importing every launcher and every pipelines module leaves torch unloaded."""
    names = sorted(m for m in MODULES if m.startswith(("trainer.launch", "pipelines")))
    code = (
        "import importlib, sys\n"
        f"for name in {[m for m in names if not m.endswith('__main__')]!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
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
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH) or [])


def test_no_import_circles_even_for_types() -> None:
    """Two modules that need each other's types are one job split in two: no circles at all."""
    found = _cycle(TYPING_GRAPH)
    assert found is None, " -> ".join(found or [])


STEPS = "trainer.steps"
STEP_FOLDERS = sorted(
    m for m, p in MODULES.items() if m.startswith(f"{STEPS}.") and p.name == "__init__.py"
)
"""The steps with parts of their own: one folder each."""


def step_folder(module: str) -> str | None:
    """The step folder ``module`` is (or is inside), or ``None``."""
    return next((f for f in STEP_FOLDERS if module == f or module.startswith(f"{f}.")), None)


def test_the_step_folders_are_found() -> None:
    steps = ("evaluate", "preprocess", "train", "tune")
    assert [f"{STEPS}.{s}" for s in steps] == STEP_FOLDERS
    assert f"{STEPS}.evaluate.gate" in MODULES and f"{STEPS}.register" in MODULES


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_step_folder_is_reached_only_through_its_exports(module: str) -> None:
    """From outside a step folder, only the folder (its ``__init__``) is imported; inside it,
    the modules import each other directly (the ``__init__`` imports them: no half-made
    package). Imports for types count too."""
    own = step_folder(module)
    wrong = sorted(
        f"{module} imports {m}"
        for m in TYPING_GRAPH[module]
        if (folder := step_folder(m)) is not None
        and (m != folder if folder != own else m == folder and module != folder)
    )
    assert wrong == []


@pytest.mark.parametrize("folder", STEP_FOLDERS)
def test_a_step_folder_exports_on_purpose(folder: str) -> None:
    """Each step folder names its exports in ``__all__``, and each of them is there."""
    package = importlib.import_module(folder)
    exported = getattr(package, "__all__", None)
    assert exported, f"{folder}/__init__.py has no __all__"
    assert sorted(n for n in exported if not hasattr(package, n)) == []


def _step(module: str) -> str | None:
    """The step a module belongs to: its folder, or a module directly in ``trainer.steps``."""
    if (folder := step_folder(module)) is not None:
        return folder
    return module if module.startswith(f"{STEPS}.") else None


def test_the_steps_use_each_other_without_circles() -> None:
    """One graph node per step: a circle between two steps' folders would pass through their
    ``__init__`` files, which the module-level check does not follow into their own modules."""
    graph: dict[str, set[str]] = {}
    for module, found in TYPING_GRAPH.items():
        if (step := _step(module)) is not None:
            graph.setdefault(step, set()).update(
                s for m in found if (s := _step(m)) is not None and s != step
            )
    assert graph[f"{STEPS}.tune"] >= {f"{STEPS}.train"}, graph
    found = _cycle(graph)
    assert found is None, " -> ".join(found or [])


CLI = "pipelines.cli"
CLI_SHARED = {f"{CLI}.help", f"{CLI}.host"}
"""What the ``gpupipe`` subcommands share: help formatting, the ``--host`` flags and client."""


def test_the_cli_commands_are_found() -> None:
    commands = ("files", "run", "upload", "schedule")
    assert {f"{CLI}.{c}" for c in commands} | CLI_SHARED <= set(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_cli_is_reached_only_through_its_package(module: str) -> None:
    """Each ``gpupipe`` subcommand is a module of ``pipelines/cli/`` (its flags beside its
    handler). From outside the folder only the package (``main``, ``build_parser``) is
    imported; inside it, a command uses the shared modules only, never another command nor the
    package that puts them together. Imports for types count too."""
    found = {m for m in TYPING_GRAPH[module] if m == CLI or m.startswith(f"{CLI}.")}
    if module in (CLI, f"{CLI}.__main__"):
        wrong: set[str] = set()
    elif module.startswith(f"{CLI}."):
        wrong = found - CLI_SHARED
    else:
        wrong = found - {CLI}
    assert sorted(f"{module} imports {m}" for m in wrong) == []


TORCH_STEPS = {"evaluate"}
"""The components whose work needs torch as soon as they start (evaluate loads models). Train
imports it only where it trains in its own process; the others never."""


COMPONENTS = sorted(p.parent.name for p in (ROOT / "components").glob("*/__init__.py"))


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_step_that_needs_no_torch_starts_without_it(component: str) -> None:
    """Issue 65, item 6: register imported torch (1.6 s of its 2.6 s start, in every run's pod)
    for two constants, through ``trainer.models`` and ``trainer.steps.evaluate``, whose faces
    now load each name with its module on first use."""
    from benchmarks.step_start import body_imports

    statements = body_imports(component)
    assert statements or component == "notify", f"components/{component}: no imports found"
    code = "\n".join([*statements, "import sys", "print('torch' in sys.modules)"])
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(component in TORCH_STEPS), (component, statements)


@pytest.mark.parametrize(
    "package", ["trainer.models", "trainer.steps.evaluate", "trainer.steps.preprocess"]
)
def test_a_lazy_face_exports_exactly_its_names(package: str) -> None:
    """Each name in ``__all__`` loads from the submodule the face names (and is that module's
    own object); ``dir()`` shows them before they are used; a wrong name is an AttributeError."""
    code = f"""
import importlib, sys
face = importlib.import_module({package!r})
names = face.__all__
assert set(names) <= set(dir(face)), sorted(set(names) - set(dir(face)))
for name in names:
    value = getattr(face, name)
    assert value is not None, name
try:
    face.no_such_name
except AttributeError as e:
    assert "no_such_name" in str(e), e
else:
    raise SystemExit("a wrong name was found")
print(len(names))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) == len(importlib.import_module(package).__all__)
