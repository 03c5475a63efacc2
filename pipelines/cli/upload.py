"""``gpupipe upload``: the training pipeline (or a compiled package) to KFP, idempotent."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from pipelines.cli.host import add_cluster_args, connect


def cmd_upload(args: argparse.Namespace) -> int:
    from pipelines.cluster import server_text
    from pipelines.cluster_package import (
        baked_defaults,
        compile_training_pipeline,
        read_package,
        with_defaults,
    )

    values = baked_defaults(list(args.set)) if args.set else {}
    compiled = read_package(Path(args.package)) if args.package else compile_training_pipeline()
    compiled = with_defaults(compiled, values)
    cluster = connect(args)
    pipeline = args.pipeline or compiled.name
    up = cluster.upload(compiled, pipeline=pipeline, version=args.version)
    if up.version_created:
        what = "created pipeline and version" if up.pipeline_created else "added version"
    else:
        what = "unchanged: this YAML is already uploaded as version"
    print(f"{what} {up.version_name!r} of pipeline {pipeline!r}")
    print(f"  pipeline id  {server_text(up.pipeline_id, 80)}")
    print(f"  version id   {server_text(up.version_id, 80)}")
    print(f"  {cluster.pipeline_link(up.pipeline_id, up.version_id)}")
    if compiled.baked:
        print(f"  defaults     {', '.join(compiled.baked)}")
    return 0


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    """The ``upload`` subcommand, through ``add`` (a subparser maker)."""
    p = add("upload", help="upload the training pipeline to KFP (idempotent)")
    add_cluster_args(p, required=True)
    p.add_argument("--version", help="version name (default: v-<sha256 of the YAML>[:12])")
    p.add_argument(
        "--package",
        metavar="FILE",
        help="upload this compiled pipeline YAML (e.g. from `gpupipe compile`) instead of "
        "compiling the training pipeline now",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="make VALUE the version's default for pipeline parameter NAME (repeatable): what the "
        "UI's Create run form opens with, e.g. registry_uri=http://mlflow.kubeflow:5000, "
        "gpus_per_node=0; listed in the version's description",
    )
    p.set_defaults(func=cmd_upload)
