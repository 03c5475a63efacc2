"""Benchmark: how long each step takes to start, against KFP's own start in the same image.

A component's container runs ``python -m kfp.dsl.executor_main``, which imports kfp, the
component's module, and then calls the function, whose first statements are its imports; only
then does the step's work begin. What that costs on every run of every step:

- **floor**: a fresh ``python -c "import kfp.dsl.executor_main"``, KFP's own part of the start;
- **each step**: the same, plus the component's module and its function's own imports (read
  from ``components/<step>/__init__.py``), in a fresh interpreter; whether torch got loaded.

The runs are interleaved (floor, then each step, repeated), each a fresh process, and the
medians reported. ``import torch`` alone is shown for scale. The last line is the slowest step
that needs no torch (every step but evaluate) over the floor: what our imports add to KFP's start
in the steps that only move data, read a registry or launch a job. Run from the repo root:

    .venv/bin/python benchmarks/step_start.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOOR = "import kfp.dsl.executor_main"
TORCH_STEPS = ("evaluate",)
"""Steps whose work needs torch from their first line (evaluate loads models)."""
GOAL = 1.5


def body_imports(component: str) -> list[str]:
    """The import statements a component's function runs first (its body's own imports)."""
    tree = ast.parse((ROOT / "components" / component / "__init__.py").read_text())
    (func,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    return [ast.unparse(n) for n in func.body if isinstance(n, ast.Import | ast.ImportFrom)]


def steps() -> dict[str, str]:
    """Each component -> the code its container runs before the step's first line of work."""
    names = sorted(p.parent.name for p in (ROOT / "components").glob("*/__init__.py"))
    return {
        name: "\n".join([FLOOR, f"import components.{name}", *body_imports(name)]) for name in names
    }


def timed(code: str) -> tuple[float, bool]:
    """Seconds a fresh interpreter takes to run ``code``, and whether it loaded torch."""
    probe = f"{code}\nimport sys\nprint('torch' in sys.modules)"
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return time.perf_counter() - start, out.stdout.strip() == "True"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes per row")
    args = parser.parse_args(argv)
    rows = {"floor (kfp's executor)": FLOOR, "import torch": "import torch", **steps()}
    seconds: dict[str, list[float]] = {name: [] for name in rows}
    torch_loaded: dict[str, bool] = {}
    for _ in range(args.repeats):
        for name, code in rows.items():
            s, loaded = timed(code)
            seconds[name].append(s)
            torch_loaded[name] = loaded
    median = {name: statistics.median(v) for name, v in seconds.items()}
    floor = median["floor (kfp's executor)"]
    print(f"{'start':<24} {'median s':>9} {'over floor':>11}  torch")
    for name in rows:
        over = median[name] / floor
        torch = "yes" if torch_loaded[name] else "no"
        print(f"{name:<24} {median[name]:>9.2f} {over:>10.2f}x  {torch}")
    light = [name for name in steps() if name not in TORCH_STEPS]
    wrong = [name for name in light if torch_loaded[name]]
    if wrong:
        print(f"TORCH LOADED by {', '.join(wrong)}, which need none")
        return 1
    worst = max(light, key=median.__getitem__)
    ratio = median[worst] / floor
    print(
        f"step_start ratio: {ratio:.2f} ({worst}, the slowest start without torch, "
        f"over KFP's own; goal <= {GOAL})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
