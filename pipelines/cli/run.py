"""``gpupipe run``: the training pipeline here (``--local``, ``kfp.local``) or on a KFP cluster
(``--host``), one parser for both, and the summary either prints."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.cli.help import PlainRawHelp
from pipelines.cli.host import (
    add_cluster_args,
    cluster_params,
    connect,
    default_pipeline,
    refuse_unnamed_registry,
)
from trainer.base.errors import InputError, error_line, printable

DEFAULT_ROOT = ".runs/local"
DEFAULT_TIMEOUT_S = 6 * 3600.0
"""How long ``run --host --wait`` waits by default."""
DEFAULT_EXPERIMENT = "gpupipe"
DEFAULT_REGISTRY_TIMEOUT_S = 5.0

# ``gpupipe run`` serves two front doors with one parser: each flag belongs to one of them, and a
# flag given to the other is refused rather than silently ignored. (dest, flag) pairs; the
# parser's default for each is None (or an empty list / False), so "given" means "not that".
CLUSTER_ONLY_FLAGS = (
    ("token", "--token"),
    ("token_file", "--token-file"),
    ("ca_cert", "--ca-cert"),
    ("insecure", "--insecure"),
    ("namespace", "--namespace"),
    ("pipeline", "--pipeline"),
    ("version", "--version"),
    ("compiled", "--compiled"),
    ("experiment", "--experiment"),
    ("run_name", "--run-name"),
    ("wait", "--wait"),
    ("timeout", "--timeout"),
)
LOCAL_ONLY_FLAGS = (
    ("root", "--root"),
    ("json", "--json"),
    ("registry_timeout", "--registry-timeout"),
    ("runner", "--runner"),
    ("image_override", "--image-override"),
    ("metrics_port", "--metrics-port"),
    ("verbose", "--verbose"),
)


def _params(pairs: list[str]) -> dict[str, Any]:
    """``["epochs=3", "tune.enabled=true"]`` -> ``{"epochs": 3, "tune_enabled": True}``.

    Typed against the pipeline's signature, the same parser for local and cluster runs.
    """
    from pipelines.params import typed_parameters

    return typed_parameters(pairs, require=False)


def _given(args: argparse.Namespace, flags: tuple[tuple[str, str], ...]) -> list[str]:
    """The flags among ``flags`` that were given on the command line."""
    return [flag for dest, flag in flags if getattr(args, dest, None) not in (None, False, [])]


def _refuse_flags_of_the_other_mode(args: argparse.Namespace) -> None:
    """A flag that only the other kind of run reads is an error, never silently ignored."""
    if args.local:
        stray, mode, other = _given(args, CLUSTER_ONLY_FLAGS), "--local", "cluster runs (--host)"
    else:
        stray, mode, other = _given(args, LOCAL_ONLY_FLAGS), "--host", "local runs (--local)"
    if stray:
        verb = "applies" if len(stray) == 1 else "apply"
        raise InputError(
            "E_PARAM",
            f"{', '.join(stray)} only {verb} to {other}, not to a {mode} run: drop "
            f"{'it' if len(stray) == 1 else 'them'}",
            stray[0],
        )


def _with_metrics_port(params: dict[str, Any], port: int | None) -> dict[str, Any]:
    """``params`` with the train step's ``watch.metrics_port`` set (``--metrics-port``)."""
    if port is None:
        return params
    from trainer.base.typedconfig import json_object

    if not 1 <= port <= 65535:
        raise InputError("E_PARAM", f"must be 1 to 65535, got {port}", "--metrics-port")
    extra = json_object(params.get("train_config_json", "{}"), "train_config_json")
    extra["watch.metrics_port"] = port  # dotted: keeps the rest of watch (the price)
    return {**params, "train_config_json": json.dumps(extra)}


def cmd_run(args: argparse.Namespace) -> int:
    if args.local and args.host:
        raise InputError("E_PARAM", "pick one of --local and --host", "gpupipe run")
    if args.local or args.host:
        _refuse_flags_of_the_other_mode(args)
    if args.host:
        return _run_on_cluster(args)
    if not args.local:
        raise InputError(
            "E_PARAM",
            "only local runs (--local, kfp.local here) or cluster runs (--host URL) exist: add one",
            "gpupipe run",
        )
    from pipelines.local import RunInterrupted, run_local
    from pipelines.local_docker import parse_image_overrides

    try:
        summary = run_local(
            data=args.data,
            target=args.target,
            params=_with_metrics_port(_params(args.param), args.metrics_port),
            root=Path(args.root or DEFAULT_ROOT),
            quiet=args.json,
            registry_timeout_s=(
                DEFAULT_REGISTRY_TIMEOUT_S
                if args.registry_timeout is None
                else args.registry_timeout
            ),
            runner=args.runner or "subprocess",
            image_overrides=parse_image_overrides(args.image_override),
            verbose=args.verbose,
        )
    except RunInterrupted as e:
        if args.json:  # every exit prints the JSON line, a stopped run too
            print(json.dumps(e.summary, sort_keys=True), flush=True)
        raise
    except (ValueError, FileNotFoundError) as e:
        if args.json:  # refused before any step: the JSON line says so too
            line = error_line("gpupipe run", e)
            print(json.dumps({"state": "REJECTED", "error": line, "exit_code": 2}))
        raise
    if args.metrics_port:
        summary["metrics_url"] = f"http://127.0.0.1:{args.metrics_port}/metrics"
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print_summary(summary)
    sys.stdout.flush()
    if summary["state"] != "SUCCEEDED":
        # The failed step's own one-line error is the last thing on stderr.
        print(summary["error"], file=sys.stderr, flush=True)
    return int(summary["exit_code"])


def _run_on_cluster(args: argparse.Namespace) -> int:
    from pipelines.cluster_package import compile_training_pipeline, parameter_defaults

    params = cluster_params(args)
    if args.compiled and args.version:
        raise InputError(
            "E_PARAM", "--version names an uploaded version: drop --compiled", "--version"
        )
    timeout_s = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
    if timeout_s <= 0:
        raise InputError("E_PARAM", f"--timeout must be > 0, got {args.timeout}", "--timeout")
    experiment = args.experiment or DEFAULT_EXPERIMENT
    compiled = compile_training_pipeline() if args.compiled else None
    cluster = connect(args)
    pipeline = args.pipeline or default_pipeline()
    version = None if compiled else cluster.resolve_version(pipeline, args.version)
    refuse_unnamed_registry(
        params,
        parameter_defaults(compiled.pipeline_spec())
        if compiled
        else cluster.version_defaults(*version),
    )
    experiment_id = cluster.experiment_id(experiment)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_id = cluster.start_run(
        display_name=args.run_name or f"{pipeline}-{stamp}",
        experiment_id=experiment_id,
        parameters=params,
        version=version,
        pipeline_spec=compiled.pipeline_spec() if compiled else None,
    )
    source = "freshly compiled YAML" if compiled else f"pipeline {pipeline!r} version {version[1]}"
    print(printable(f"started run {run_id} of {source} in experiment {experiment!r}"))
    print(f"  {cluster.run_link(run_id)}")
    if not args.wait:
        return 0
    run = cluster.wait(
        run_id,
        timeout_s=timeout_s,
        on_state=lambda s: print(f"  run {run_id}: {s}", flush=True),
        on_waiting=lambda step, why: print(f"  step {step} waits: {why}", flush=True),
    )
    from pipelines.cluster_summary import run_summary

    summary = run_summary(run, pipeline_name=default_pipeline(), link=cluster.run_link(run_id))
    print_summary(summary)
    if summary.get("artifacts_error"):
        print(printable(f"  artifacts      {summary['artifacts_error']}"))
    sys.stdout.flush()
    if run.state == "SUCCEEDED":
        print(f"run {run_id} SUCCEEDED")
        return 0
    failure = printable(f"{_run_failure(run, summary)} ({cluster.run_link(run_id)})")
    print(f"ERROR [gpupipe run] {failure}", file=sys.stderr)
    return 1


def _run_failure(run: Any, summary: dict[str, Any]) -> str:
    """``E_RUN_<STATE>: run <id> ...`` for a run that did not succeed. A run someone terminated
    (in the UI or by the API) says so: KFP 2.17 passes it through CANCELING and may end it
    FAILED, not CANCELED, when a step was running."""
    from pipelines.cluster import failed_tasks

    state = str(run.state)
    if state == "CANCELED" or any(str(h.state) == "CANCELING" for h in run.state_history or []):
        ended = "" if state == "CANCELED" else f" (KFP ended it {state})"
        return f"E_RUN_CANCELED: run {run.run_id} was terminated{ended}"
    tasks = failed_tasks(run)
    detail = f"failed task: {'; '.join(tasks)}" if tasks else "no failed task reported"
    if summary.get("error"):  # the step's own line, from its archived log
        detail = f"failed step: {summary['error']}"
    return f"E_RUN_{state}: run {run.run_id} {state}, {detail}"


def print_summary(s: dict[str, Any]) -> None:
    """A run's summary as a person reads it, for a local and a cluster run alike. What the
    steps wrote (a gate's reason, a metric's name) reaches the terminal through the filter of
    our own error lines: a file in a store cannot send control sequences to it."""
    from trainer.base.cost import summary_lines

    def say(line: str = "") -> None:
        print(printable(line))

    say()
    say(f"pipeline run {s['run_dir']}: {s['state']}")
    if s["state"] != "SUCCEEDED":
        say(f"  failed step    {s.get('failed_step')}")
    metrics = s.get("metrics", {})
    for name, value in sorted(metrics.items()):
        if not name.startswith("baseline_"):
            say(f"  {name:<14} {value:.4f}")
    # the summaries list evaluate's baselines artifact as baseline_<name>_<metric>: one line a
    # baseline
    baselines: dict[str, list[str]] = {}
    for key, value in sorted(metrics.items()):
        if key.startswith("baseline_"):
            name, _, metric = key.removeprefix("baseline_").partition("_")
            baselines.setdefault(name, []).append(f"{metric} {value:.4f}")
    for name in sorted(baselines, key=lambda n: (n != "trivial", n)):
        say(f"  {'vs ' + name:<14} {', '.join(baselines[name])}")
    say(
        f"  gate           {'passed' if s.get('gate_passed') else 'failed'}: "
        f"{s.get('gate_reason', '')}"
    )
    for line in s.get("data_warnings", []):
        say(f"  data           {line}")
    if s.get("tuned_hyperparams"):
        say(f"  tuned          {json.dumps(s['tuned_hyperparams'], sort_keys=True)}")
    run_cost = s.get("cost") or {}
    for line in summary_lines(run_cost.get("estimate"), run_cost.get("actual")):
        say(f"  cost {line}")
    if s.get("metrics_url"):
        say(f"  metrics        {s['metrics_url']} (Prometheus, while train ran)")
    say(f"  model          {s.get('model_uri')}")
    say(f"  report         {s.get('report')}")
    if s.get("log"):
        say(f"  log            {s['log']}")
    version = s.get("registered_version")
    say(
        f"  registry       {s.get('registry_uri')} "
        + (
            f"(model {s.get('registered_model_name')} version {version})"
            if version
            else "(not registered)"
        )
    )


class _RunHelp(argparse.Action):
    """``gpupipe run --help``: the flags, then every pipeline parameter with its default.

    The parameters come from the pipeline's own signature (importing kfp), so they are read
    only when help is asked for.
    """

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser.epilog = parameters_help()
        parser.print_help()
        parser.exit()


def parameters_help() -> str:
    """The pipeline parameters as ``--help`` lists them: name, type, default, what it is."""
    import textwrap

    from pipelines.training import training_pipeline

    lines = ["pipeline parameters (--param NAME=VALUE; tune.enabled means tune_enabled):"]
    for name, spec in training_pipeline.component_spec.inputs.items():
        if spec.default is None and not spec.optional:
            default = "required (--data)" if name == "data_uri" else "required"
        else:
            default = f"default {json.dumps(spec.default)}"
        lines.append(f"  {name} ({str(spec.type).lower()}, {default})")
        text = " ".join((spec.description or "").replace("``", "").split())
        lines += textwrap.wrap(text, 96, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    """The ``run`` subcommand, through ``add`` (a subparser maker)."""
    p = add(
        "run",
        help="run the training pipeline",
        description="Run the training pipeline here (--local, kfp.local) or on a KFP cluster "
        "(--host URL). Flags of the other kind of run are refused.",
        formatter_class=PlainRawHelp,
        add_help=False,
    )
    p.add_argument(
        "-h", "--help", action=_RunHelp, nargs=0, help="show this help and the pipeline parameters"
    )
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
    p.add_argument(
        "--root", help=f"--local: where outputs, cache and registry go (default {DEFAULT_ROOT})"
    )
    p.add_argument(
        "--json", action="store_true", help="--local: last stdout line: the summary as JSON"
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="--local: print every step's output as it comes (default: a line per step as it "
        "starts and ends; the output goes to the run's log, <root>/runs/<run id>/run.log)",
    )
    p.add_argument(
        "--registry-timeout",
        type=float,
        metavar="SECONDS",
        help="how long --local waits for a registry server to answer before any step runs "
        f"(default {DEFAULT_REGISTRY_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--runner",
        choices=["subprocess", "docker"],
        help="--local: run the steps as host processes (default: subprocess), or each in its "
        "image (Docker engine, the pod's security settings; make images first)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="--local: the training job serves Prometheus metrics on this port while it runs "
        "(http://127.0.0.1:PORT/metrics; the summary says where)",
    )
    p.add_argument(
        "--image-override",
        action="append",
        default=[],
        metavar="ORIGINAL=REPLACEMENT",
        help="--runner docker: run the steps of image ORIGINAL in REPLACEMENT, e.g. the CUDA "
        "image's steps in the CPU image on a machine without a GPU (repeatable)",
    )
    add_cluster_args(p, required=False)
    p.add_argument("--version", help="uploaded version name (default: the newest)")
    p.add_argument(
        "--compiled",
        action="store_true",
        help="run freshly compiled YAML (sent inline) instead of an uploaded version",
    )
    p.add_argument(
        "--experiment", help=f"experiment (created when missing; default {DEFAULT_EXPERIMENT})"
    )
    p.add_argument("--run-name", help="display name of the run (default: <pipeline>-<UTC time>)")
    p.add_argument("--wait", action="store_true", help="follow the run; exit 1 if it fails")
    p.add_argument("--timeout", type=float, help="seconds --wait waits (default 6 h)")
    p.set_defaults(func=cmd_run)
