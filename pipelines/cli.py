"""The ``gpupipe`` command: demo data, compile, and run the pipeline locally (``kfp.local``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainer.config import parse_value
from trainer.errors import InputError, error_line

DEFAULT_ROOT = ".runs/local"


def _params(pairs: list[str]) -> dict[str, Any]:
    """``["epochs=3", "tune.enabled=true"]`` -> ``{"epochs": 3, "tune.enabled": True}``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(
                "E_PARAM", f"parameter must look like name=value, got {pair!r}", "--param"
            )
        out[key.strip()] = parse_value(value)
    return out


def cmd_demo_data(args: argparse.Namespace) -> int:
    from trainer.steps.demo_data import write_demo_data

    uri = write_demo_data(args.out, rows=args.rows, task=args.task, seed=args.seed)
    print(f"wrote {args.rows} rows ({args.task}) to {uri}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from pipelines.compile import compile_all

    for path in compile_all(Path(args.out), components_dir=Path(args.components_dir)):
        print(f"wrote {path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if not args.local:
        raise InputError(
            "E_PARAM", "only local runs are available in this version: add --local", "gpupipe run"
        )
    from pipelines.local import run_local

    summary = run_local(
        data=args.data,
        target=args.target,
        params=_params(args.param),
        root=Path(args.root),
        quiet=args.json,
    )
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _print_summary(summary)
    return 0 if summary["state"] == "SUCCEEDED" else 1


def cmd_render(args: argparse.Namespace) -> int:
    from pipelines.render import render_pytorchjob

    print(render_pytorchjob(_params(args.param), namespace=args.namespace), end="")
    return 0


def _print_summary(s: dict[str, Any]) -> None:
    print()
    print(f"pipeline run {s['run_dir']}: {s['state']}")
    for name, value in sorted(s.get("metrics", {}).items()):
        print(f"  {name:<14} {value:.4f}")
    print(
        f"  gate           {'passed' if s.get('gate_passed') else 'failed'}: "
        f"{s.get('gate_reason', '')}"
    )
    print(f"  model          {s.get('model_uri')}")
    print(f"  report         {s.get('report')}")
    version = s.get("registered_version")
    print(
        f"  registry       {s.get('registry_uri')} "
        + (
            f"(model {s.get('registered_model_name')} version {version})"
            if version
            else "(not registered)"
        )
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo-data", help="write a realistic synthetic table")
    p.add_argument("--out", required=True, help="file to write (.parquet or .csv; any URI)")
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--task", choices=["classification", "regression"], default="classification")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo_data)

    p = sub.add_parser("compile", help="compile every pipeline and component to YAML")
    p.add_argument("--out", default="pipelines/compiled", help="folder for pipeline YAML")
    p.add_argument(
        "--components-dir",
        default="components",
        help="folder whose <name>/component.yaml files are (re)written",
    )
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("render", help="print a resource the pipeline would create, as YAML")
    p.add_argument("kind", choices=["pytorchjob"], help="what to render")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="pipeline parameter, e.g. nodes=2 (repeatable)",
    )
    p.add_argument("--namespace", default="kubeflow", help="namespace of the resource")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("run", help="run the training pipeline")
    p.add_argument("--local", action="store_true", help="run here with kfp.local (no cluster)")
    p.add_argument("--data", help="data URI (default: a generated demo table)")
    p.add_argument("--target", help="target column (default: the demo table's)")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="pipeline parameter, e.g. epochs=3 (repeatable)",
    )
    p.add_argument("--root", default=DEFAULT_ROOT, help="where outputs, cache and registry go")
    p.add_argument("--json", action="store_true", help="last stdout line: the summary as JSON")
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpupipe`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as e:
        print(error_line(f"gpupipe {args.command}", e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
