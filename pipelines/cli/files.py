"""The commands that need no cluster: ``demo-data``, ``compile`` and ``render``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from trainer.base.errors import InputError

DEFAULT_COMPILED = "pipelines/compiled"
DEFAULT_COMPONENTS = "components"


def cmd_demo_data(args: argparse.Namespace) -> int:
    from trainer.steps.preprocess import write_demo_data

    uri = write_demo_data(args.out, rows=args.rows, task=args.task, seed=args.seed)
    print(f"wrote {args.rows} rows ({args.task}) to {uri}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from pipelines.cluster_package import baked_defaults, set_values
    from pipelines.compile import compile_all

    out, components_dir = args.out, args.components_dir
    values = baked_defaults(list(args.set)) if args.set else {}
    if values and (out is None or Path(out).absolute() == Path(DEFAULT_COMPILED).absolute()):
        raise InputError(
            "E_PARAM",
            "--set bakes a platform's defaults into a package of its own: give --out FOLDER "
            f"(the golden files in {DEFAULT_COMPILED}/ keep the pipeline's own defaults)",
            "--set",
        )
    if out is None and components_dir is None:  # `gpupipe compile`: the golden files
        out, components_dir = DEFAULT_COMPILED, DEFAULT_COMPONENTS
    for flag, value in (("--out", out), ("--components-dir", components_dir)):
        if value is not None and Path(value).exists() and not Path(value).is_dir():
            raise InputError("E_PATH", f"{flag} must be a folder, but a file is there", value)
    written = compile_all(
        Path(out) if out is not None else None,
        components_dir=Path(components_dir) if components_dir is not None else None,
        defaults=values,
    )
    for path in written:
        print(f"wrote {path}")
    if values:
        print(f"  defaults     {', '.join(set_values(values))}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from pipelines.params import check_parameters, typed_parameters
    from pipelines.render import render_experiment, render_pytorchjob, render_trainjob

    params = typed_parameters(args.param, require=False)
    check_parameters({"data_uri": "<data>", **params})
    render = {
        "pytorchjob": render_pytorchjob,
        "trainjob": render_trainjob,
        "experiment": render_experiment,
    }[args.kind]
    print(render(params, namespace=args.namespace), end="")
    return 0


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    """The ``demo-data``, ``compile`` and ``render`` subcommands, through ``add`` (a
    subparser maker)."""
    p = add("demo-data", help="write a realistic synthetic table")
    p.add_argument(
        "--out",
        required=True,
        help="file to write (.parquet or .csv; any URI); an existing file is replaced only if "
        "gpupipe wrote it",
    )
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--task", choices=["classification", "regression"], default="classification")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo_data)

    p = add(
        "compile",
        help="compile every pipeline and component to YAML",
        description="Compile the pipeline and its components to YAML. With neither flag: the "
        f"golden files ({DEFAULT_COMPILED}/ and {DEFAULT_COMPONENTS}/<name>/component.yaml); "
        "with one, only that output. A file gpupipe did not write is never overwritten.",
    )
    p.add_argument("--out", help=f"folder for pipeline YAML (default {DEFAULT_COMPILED})")
    p.add_argument(
        "--components-dir",
        help="folder whose <name>/component.yaml files are (re)written "
        f"(default {DEFAULT_COMPONENTS}, only when --out is not given either)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --out: make VALUE the compiled pipeline's default for parameter NAME "
        "(repeatable), typed and checked as --param is, listed in the pipeline's description: "
        "the package `gpupipe upload --set` would upload, e.g. registry_uri=http://mlflow."
        "kubeflow:5000, gpus_per_node=0",
    )
    p.set_defaults(func=cmd_compile)

    p = add("render", help="print a resource the pipeline would create, as YAML")
    p.add_argument(
        "kind",
        choices=["pytorchjob", "trainjob", "experiment"],
        help="pytorchjob or trainjob: the train step's job with that launcher; experiment: the "
        "tune step's Katib Experiment",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="pipeline parameter, e.g. nodes=2 (repeatable)",
    )
    p.add_argument("--namespace", default="kubeflow", help="namespace of the resource")
    p.set_defaults(func=cmd_render)
