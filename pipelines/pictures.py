"""The documentation's pictures, taken from the real things, never drawn by hand.

``make docs-images`` runs ``python -m pipelines.pictures``, which writes into ``docs/images/``:

- ``pipeline.png``: the training pipeline's graph, read from the compiled pipeline YAML
  (``pipelines/compiled/gpupipe-training.yaml``): every task KFP runs, the conditions and the
  exit handler around them, which steps are cached and which retried;
- ``report-<name>.png``: the plots of a real run's HTML report (``--report``, or the run a
  ``gpupipe run --local --json`` summary names: ``--summary``), as evaluate embedded them;
- ``layers.png``: the code's layers, read from its imports (:func:`import_graph`): each part of
  the project in the row of the longest chain of parts it imports, an arrow per import.
"""

from __future__ import annotations

import argparse
import ast
import base64
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

COMPILED = Path("pipelines/compiled/gpupipe-training.yaml")
OUT = Path("docs/images")


@dataclass(slots=True)
class Task:
    """One task of the compiled pipeline that runs a container."""

    name: str
    """The task's key in the YAML (``train-2``)."""
    label: str
    """Its display name (``train``)."""
    groups: list[str] = field(default_factory=list)
    """The condition groups and exit handler it sits in, outermost first (``gate-passed``)."""
    after: set[str] = field(default_factory=set)
    """The keys of the container tasks it waits for."""
    notes: list[str] = field(default_factory=list)
    """Cached, retried."""


def pipeline_tasks(compiled: dict[str, Any]) -> dict[str, Task]:
    """The container tasks of a compiled pipeline, with what each waits for.

    A dependency on a group (a condition, the exit handler's DAG) is a dependency on every task
    inside it, and a task inside a group waits for what the group waits for.
    """
    components = compiled["components"]
    tasks: dict[str, Task] = {}
    leaves: dict[str, set[str]] = {}

    def walk(dag: dict[str, Any], groups: list[str], inherited: set[str]) -> set[str]:
        inside: set[str] = set()
        for name, spec in dag["tasks"].items():
            comp = components[spec["componentRef"]["name"]]
            label = spec.get("taskInfo", {}).get("name", name)
            deps = inherited | set(spec.get("dependentTasks", []))
            if "dag" in comp:
                # KFP's own wrapper of an If/Else pair (named launcher-choice for the UI): not a
                # condition of its own, its branches are.
                shown = [] if name.startswith("condition-branches-") else [label]
                leaves[name] = walk(comp["dag"], [*groups, *shown], deps)
                inside |= leaves[name]
                continue
            task = Task(name, label, list(groups), deps)
            if spec.get("cachingOptions", {}).get("enableCache"):
                task.notes.append("cached")
            if retries := spec.get("retryPolicy", {}).get("maxRetryCount"):
                task.notes.append(f"retried x{retries}")
            tasks[name] = task
            leaves[name] = {name}
            inside.add(name)
        return inside

    walk(compiled["root"]["dag"], [], set())
    for task in tasks.values():
        task.after = set().union(*(leaves.get(d, {d}) for d in task.after)) & set(tasks)
    for task in tasks.values():  # the transitive reduction: an arrow per direct dependency only
        task.after -= set().union(*(_upstream(tasks, d) for d in task.after))
    return tasks


def _upstream(tasks: dict[str, Task], name: str) -> set[str]:
    """Every task ``name`` waits for, directly or through others."""
    seen: set[str] = set()
    todo = list(tasks[name].after)
    while todo:
        if (dep := todo.pop()) not in seen:
            seen.add(dep)
            todo += tasks[dep].after
    return seen


def _levels(tasks: dict[str, Task]) -> dict[str, int]:
    """Each task's column: the longest chain of tasks it waits for."""
    level: dict[str, int] = {}

    def depth(name: str) -> int:
        if name not in level:
            level[name] = 1 + max((depth(d) for d in tasks[name].after), default=-1)
        return level[name]

    for name in tasks:
        depth(name)
    return level


def draw_pipeline(compiled: dict[str, Any], out: Path) -> Path:
    """Draw the pipeline's graph as a PNG: one box per task, an arrow per dependency."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    tasks = pipeline_tasks(compiled)
    level = _levels(tasks)
    columns: dict[int, list[str]] = {}
    for name in sorted(tasks, key=lambda n: (level[n], tasks[n].label)):
        columns.setdefault(level[name], []).append(name)
    width, height = 2.3, 1.0
    pos = {
        name: (col * (width + 0.7), (len(names) - 1) / 2 * (height + 0.6) - i * (height + 0.6))
        for col, names in columns.items()
        for i, name in enumerate(names)
    }
    fig = Figure(figsize=(2.2 * len(columns), 1.2 + 1.3 * max(map(len, columns.values()))))
    ax = fig.add_subplot()
    ax.set_axis_off()
    for name, (x, y) in pos.items():
        task = tasks[name]
        inner = [g for g in task.groups if g != "training"]
        ax.add_patch(
            FancyBboxPatch(
                (x - width / 2, y - height / 2),
                width,
                height,
                boxstyle="round,pad=0.02,rounding_size=0.12",
                facecolor="#e8f0fe" if not inner else "#fff4e0",
                edgecolor="#3a5a99",
            )
        )
        ax.text(x, y + 0.15, task.label, ha="center", va="center", fontsize=10, weight="bold")
        sub = ", ".join([*(f"if {g}" for g in inner), *task.notes])
        ax.text(x, y - 0.2, sub, ha="center", va="center", fontsize=7, color="#444444")
        for dep in task.after:
            (x0, y0) = pos[dep]
            ax.add_patch(
                FancyArrowPatch(
                    (x0 + width / 2, y0),
                    (x - width / 2, y),
                    arrowstyle="-|>",
                    mutation_scale=12,
                    color="#555555",
                    linestyle="--" if "training" not in task.groups else "-",
                )
            )
    xs = [x for x, _ in pos.values()]
    ys = [y for _, y in pos.values()]
    ax.set_xlim(min(xs) - width, max(xs) + width)
    ax.set_ylim(min(ys) - height * 1.2, max(ys) + height * 1.2)
    title = (
        f"{compiled['pipelineInfo']['name']}: orange steps run only under their condition; "
        "the dashed arrow is the exit handler (it runs whatever happened)"
    )
    return _save(fig, ax, title, out)


def _save(fig: Any, ax: Any, title: str, out: Path) -> Path:
    """Title the drawing and write it to ``out`` as a PNG."""
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


PARTS = ("trainer", "components", "pipelines")
"""The project's top-level packages; ``trainer``'s subpackages and modules are parts too."""


def _part(module: str) -> str | None:
    """The part a module belongs to: ``trainer.<name>``, ``components`` or ``pipelines``."""
    bits = module.split(".")
    if bits[0] not in PARTS:
        return None
    if bits[0] == "trainer":
        return ".".join(bits[:2]) if len(bits) > 1 else None
    return bits[0]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each part of the project -> the other parts its modules import (any import statement,
    read from the source with ``ast``; ``trainer/__init__.py`` belongs to none)."""
    graph: dict[str, set[str]] = {}
    for top in PARTS:
        for path in sorted((root / top).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            module = module.removesuffix(".__init__")
            part = _part(module)
            if part is None:
                continue
            deps = graph.setdefault(part, set())
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                for name in names:
                    if (other := _part(name)) is not None and other != part:
                        deps.add(other)
    # ``from trainer import x`` names trainer.x, a function or a part: only parts are kept.
    return {k: {d for d in v if d in graph} for k, v in graph.items()}


def layer_of(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each part's layer: 0 for a part that imports no other, else one above the highest it
    imports (the graph has no cycles: tests/unit/test_layers.py)."""
    layers: dict[str, int] = {}

    def visit(part: str, seen: tuple[str, ...] = ()) -> int:
        if part in seen:
            raise ValueError(f"an import cycle: {' -> '.join((*seen, part))}")
        if part not in layers:
            below = [visit(d, (*seen, part)) for d in graph[part]]
            layers[part] = 1 + max(below) if below else 0
        return layers[part]

    for part in graph:
        visit(part)
    return layers


def draw_layers(root: Path, out: Path) -> Path:
    """Draw the layers as a PNG: one row per layer (the base at the bottom), one box per part,
    an arrow from each part to every part it imports."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    graph = import_graph(root)
    layers = layer_of(graph)
    rows: dict[int, list[str]] = {}
    for part in sorted(graph, key=lambda p: (layers[p], p)):
        rows.setdefault(layers[part], []).append(part)
    width, height, gap = 2.4, 0.6, 1.1
    widest = max(map(len, rows.values()))
    pos = {
        part: ((i - (len(parts) - 1) / 2) * (width + 0.4), layer * gap)
        for layer, parts in rows.items()
        for i, part in enumerate(parts)
    }
    fig = Figure(figsize=(1.0 + 2.3 * widest, 1.0 + 0.95 * len(rows)))
    ax = fig.add_subplot()
    ax.set_axis_off()
    for part, (x, y) in pos.items():
        for dep in sorted(graph[part]):
            (x1, y1) = pos[dep]
            ax.add_patch(
                FancyArrowPatch(
                    (x, y - height / 2), (x1, y1 + height / 2), arrowstyle="-|>",
                    mutation_scale=8, color="#9aa5b8", linewidth=0.6, zorder=1,
                )
            )  # fmt: skip
        ax.add_patch(
            FancyBboxPatch(
                (x - width / 2, y - height / 2), width, height,
                boxstyle="round,pad=0.02,rounding_size=0.1", facecolor="#e8f0fe",
                edgecolor="#3a5a99", zorder=2,
            )
        )  # fmt: skip
        ax.text(x, y, part, ha="center", va="center", fontsize=8, zorder=3)
    xs = [x for x, _ in pos.values()]
    ax.set_xlim(min(xs) - width, max(xs) + width)
    ax.set_ylim(-gap, max(rows) * gap + gap)
    title = (
        "gpupipe's layers, read from its imports: each part sits one row above the highest part "
        "it imports; arrows point at what is imported"
    )
    return _save(fig, ax, title, out)


_IMG = re.compile(
    r'<img src="data:image/png;base64,(?P<png>[A-Za-z0-9+/=]+)" alt="(?P<alt>[^"]*)">'
)


def report_images(report_html: str) -> dict[str, bytes]:
    """The PNG plots an evaluate report embeds, by a file-name-safe form of their alt text."""
    images = {}
    for m in _IMG.finditer(report_html):
        slug = re.sub(r"[^a-z0-9]+", "-", html.unescape(m.group("alt")).lower()).strip("-")
        images[slug or f"figure-{len(images) + 1}"] = base64.b64decode(m.group("png"))
    return images


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m pipelines.pictures", description=__doc__)
    parser.add_argument("--compiled", type=Path, default=COMPILED, help="compiled pipeline YAML")
    parser.add_argument("--report", type=Path, help="a run's evaluate report (HTML)")
    parser.add_argument(
        "--summary",
        type=Path,
        help="the output of gpupipe run --local --json: the report of the run it names",
    )
    parser.add_argument("out", type=Path, nargs="?", default=OUT, help="folder for the pictures")
    args = parser.parse_args(argv)
    compiled = next(yaml.safe_load_all(args.compiled.read_text()))
    written = [
        draw_pipeline(compiled, args.out / "pipeline.png"),
        draw_layers(Path("."), args.out / "layers.png"),
    ]
    report = args.report
    if args.summary is not None:  # the last line of gpupipe run --json is the summary
        summary = json.loads(args.summary.read_text().strip().splitlines()[-1])
        if summary.get("state") != "SUCCEEDED":
            parser.error(f"the run in {args.summary} did not succeed: {summary.get('error')}")
        report = Path(summary["report"])
    if report is not None:
        for name, png in report_images(report.read_text()).items():
            path = args.out / f"report-{name}.png"
            path.write_bytes(png)
            written.append(path)
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
