"""The ``gpupipe`` command: demo data, compile, run locally (``kfp.local``) or on a KFP cluster."""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.base.errors import InputError, error_line

if TYPE_CHECKING:
    from pipelines.cluster import KfpCluster

DEFAULT_ROOT = ".runs/local"
DEFAULT_COMPILED = "pipelines/compiled"
DEFAULT_COMPONENTS = "components"
DEFAULT_TIMEOUT_S = 6 * 3600.0
"""How long ``run --host --wait`` waits by default."""
DEFAULT_EXPERIMENT = "gpupipe"
DEFAULT_REGISTRY_TIMEOUT_S = 5.0

# ``gpupipe run`` serves two front doors with one parser: each flag belongs to one of them, and a
# flag given to the other is refused rather than silently ignored. (dest, flag) pairs; the
# parser's default for each is None (or an empty list / False), so "given" means "not that".
CLUSTER_ONLY_FLAGS = (
    ("token", "--token"),
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
)


def _params(pairs: list[str]) -> dict[str, Any]:
    """``["epochs=3", "tune.enabled=true"]`` -> ``{"epochs": 3, "tune_enabled": True}``.

    Typed against the pipeline's signature, the same parser for local and cluster runs.
    """
    from pipelines.params import typed_parameters

    return typed_parameters(pairs, require=False)


def cmd_demo_data(args: argparse.Namespace) -> int:
    from trainer.steps.preprocess import write_demo_data

    uri = write_demo_data(args.out, rows=args.rows, task=args.task, seed=args.seed)
    print(f"wrote {args.rows} rows ({args.task}) to {uri}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from pipelines.compile import compile_all

    out, components_dir = args.out, args.components_dir
    if out is None and components_dir is None:  # `gpupipe compile`: the golden files
        out, components_dir = DEFAULT_COMPILED, DEFAULT_COMPONENTS
    for flag, value in (("--out", out), ("--components-dir", components_dir)):
        if value is not None and Path(value).exists() and not Path(value).is_dir():
            raise InputError("E_PATH", f"{flag} must be a folder, but a file is there", value)
    written = compile_all(
        Path(out) if out is not None else None,
        components_dir=Path(components_dir) if components_dir is not None else None,
    )
    for path in written:
        print(f"wrote {path}")
    return 0


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
        _print_summary(summary)
    sys.stdout.flush()
    if summary["state"] != "SUCCEEDED":
        # The failed step's own one-line error is the last thing on stderr.
        print(summary["error"], file=sys.stderr, flush=True)
    return int(summary["exit_code"])


def _cluster(args: argparse.Namespace) -> KfpCluster:
    from pipelines.cluster import KfpCluster, resolve_auth

    return KfpCluster(
        args.host,
        auth=resolve_auth(args.token),
        namespace=args.namespace,
        insecure=bool(args.insecure),
    )


def _default_pipeline() -> str:
    from pipelines.training import PIPELINE_NAME

    return PIPELINE_NAME


def cmd_upload(args: argparse.Namespace) -> int:
    from pipelines.cluster import compile_training_pipeline, read_package

    compiled = read_package(Path(args.package)) if args.package else compile_training_pipeline()
    cluster = _cluster(args)
    pipeline = args.pipeline or compiled.name
    up = cluster.upload(compiled, pipeline=pipeline, version=args.version)
    if up.version_created:
        what = "created pipeline and version" if up.pipeline_created else "added version"
    else:
        what = "unchanged: this YAML is already uploaded as version"
    print(f"{what} {up.version_name!r} of pipeline {pipeline!r}")
    print(f"  pipeline id  {up.pipeline_id}")
    print(f"  version id   {up.version_id}")
    print(f"  {cluster.pipeline_link(up.pipeline_id, up.version_id)}")
    return 0


def _cluster_params(args: argparse.Namespace) -> dict[str, Any]:
    """``--param`` (plus ``--data``/``--target``), typed and checked before any API call."""
    from pipelines.params import check_cluster_parameters, check_parameters, typed_parameters

    pairs = list(args.param)
    if getattr(args, "data", None):
        pairs.append(f"data_uri={args.data}")
    if getattr(args, "target", None):
        pairs.append(f"target={args.target}")
    params = typed_parameters(pairs)
    # Every step's config, and what KFP must not store, before any request is sent.
    check_cluster_parameters(check_parameters(params))
    return params


def _run_on_cluster(args: argparse.Namespace) -> int:
    from pipelines.cluster import compile_training_pipeline

    params = _cluster_params(args)
    if args.compiled and args.version:
        raise InputError(
            "E_PARAM", "--version names an uploaded version: drop --compiled", "--version"
        )
    timeout_s = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
    if timeout_s <= 0:
        raise InputError("E_PARAM", f"--timeout must be > 0, got {args.timeout}", "--timeout")
    experiment = args.experiment or DEFAULT_EXPERIMENT
    compiled = compile_training_pipeline() if args.compiled else None
    cluster = _cluster(args)
    pipeline = args.pipeline or _default_pipeline()
    version = None if compiled else cluster.resolve_version(pipeline, args.version)
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
    print(f"started run {run_id} of {source} in experiment {experiment!r}")
    print(f"  {cluster.run_link(run_id)}")
    if not args.wait:
        return 0
    run = cluster.wait(
        run_id, timeout_s=timeout_s, on_state=lambda s: print(f"  run {run_id}: {s}", flush=True)
    )
    from pipelines.cluster_summary import run_summary

    summary = run_summary(run, pipeline_name=_default_pipeline(), link=cluster.run_link(run_id))
    _print_summary(summary)
    if summary.get("artifacts_error"):
        print(f"  artifacts      {summary['artifacts_error']}")
    sys.stdout.flush()
    if run.state == "SUCCEEDED":
        print(f"run {run_id} SUCCEEDED")
        return 0
    print(f"ERROR [gpupipe run] {_run_failure(run, summary)} ({cluster.run_link(run_id)})",
          file=sys.stderr)  # fmt: skip
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


def cmd_schedule(args: argparse.Namespace) -> int:
    from pipelines import cron as cronlib
    from pipelines.schedule import parse_time, same_schedule, schedule_body

    for action in ("enable", "disable", "delete"):
        if name := getattr(args, action):
            cluster = _cluster(args)
            found = cluster.find_schedule(name)
            if found is None:
                raise InputError(
                    "E_NOT_FOUND", f"no recurring run named {name!r} on {args.host}", f"--{action}"
                )
            cluster.set_schedule(found.recurring_run_id, action)
            print(f"{action}d recurring run {name!r} ({found.recurring_run_id})")
            return 0
    if args.list:
        _print_schedules(_cluster(args).list_schedules())
        return 0
    # Create or update: everything a person can get wrong is checked before the first call.
    if not args.cron:
        raise InputError("E_CRON", "--cron is required to create a schedule", "--cron")
    cronlib.parse(args.cron)
    params = _cluster_params(args)
    if args.max_concurrency < 1:
        raise InputError(
            "E_PARAM",
            f"--max-concurrency must be >= 1, got {args.max_concurrency}",
            "--max-concurrency",
        )
    start = parse_time(args.start, "--start") if args.start else None
    end = parse_time(args.end, "--end") if args.end else None
    if start and end and end <= start:
        raise InputError("E_TIME", f"--end {args.end} is not after --start {args.start}", "--end")
    cluster = _cluster(args)
    pipeline = args.pipeline or _default_pipeline()
    name = args.name or f"{pipeline}-schedule"
    body = schedule_body(
        name=name,
        cron=args.cron,
        experiment_id=cluster.experiment_id(args.experiment),
        version=cluster.resolve_version(pipeline, args.version),
        parameters=params,
        max_concurrency=args.max_concurrency,
        no_catchup=args.no_catchup,
        start=start,
        end=end,
    )
    old = cluster.find_schedule(name)
    if old is not None and same_schedule(old, body):
        print(
            f"unchanged: recurring run {name!r} ({old.recurring_run_id}) already has these settings"
        )
        return 0
    # KFP v2beta1 cannot update a recurring run: create the new one, then delete the old one,
    # so a schedule exists at every moment.
    new_id = cluster.create_schedule(body)
    if old is not None:
        cluster.set_schedule(old.recurring_run_id, "delete")
    print(f"{'replaced' if old else 'created'} recurring run {name!r} ({new_id}): {args.cron} UTC")
    print(f"  {cluster.recurring_run_link(new_id)}")
    return 0


def _print_schedules(runs: list[Any]) -> None:
    from pipelines import cron as cronlib
    from pipelines.schedule import as_utc

    now = datetime.now(UTC)
    rows = [("NAME", "MODE", "CRON", "NEXT FIRE (UTC)", "ID")]
    for r in runs:
        cs = r.trigger.cron_schedule if r.trigger else None
        mode = str(r.mode or "ENABLE")
        if cs is None or not cs.cron:
            expr, nxt = "(periodic)", "-"
        else:
            expr = cs.cron
            start, end = as_utc(cs.start_time), as_utc(cs.end_time)
            try:
                t = cronlib.next_fire(cronlib.parse(cs.cron), max(now, start or now))
            except ValueError:
                t = None
            if mode != "ENABLE":
                nxt = "- (disabled)"
            elif t is None or (end is not None and t > end):
                nxt = "- (no more runs)"
            else:
                nxt = t.strftime("%Y-%m-%dT%H:%M:%SZ")
        rows.append((str(r.display_name), mode, expr, nxt, str(r.recurring_run_id)))
    if len(rows) == 1:
        print("no recurring runs")
        return
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def cmd_render(args: argparse.Namespace) -> int:
    from pipelines.params import check_parameters
    from pipelines.render import render_experiment, render_pytorchjob, render_trainjob

    params = _params(args.param)
    check_parameters({"data_uri": "<data>", **params})
    render = {
        "pytorchjob": render_pytorchjob,
        "trainjob": render_trainjob,
        "experiment": render_experiment,
    }[args.kind]
    print(render(params, namespace=args.namespace), end="")
    return 0


def _print_summary(s: dict[str, Any]) -> None:
    from trainer.base.cost import summary_lines

    print()
    print(f"pipeline run {s['run_dir']}: {s['state']}")
    if s["state"] != "SUCCEEDED":
        print(f"  failed step    {s.get('failed_step')}")
    metrics = s.get("metrics", {})
    for name, value in sorted(metrics.items()):
        if not name.startswith("baseline_"):
            print(f"  {name:<14} {value:.4f}")
    # evaluate logs each baseline's scores as baseline_<name>_<metric>: one line per baseline
    baselines: dict[str, list[str]] = {}
    for key, value in sorted(metrics.items()):
        if key.startswith("baseline_"):
            name, _, metric = key.removeprefix("baseline_").partition("_")
            baselines.setdefault(name, []).append(f"{metric} {value:.4f}")
    for name in sorted(baselines, key=lambda n: (n != "trivial", n)):
        print(f"  {'vs ' + name:<14} {', '.join(baselines[name])}")
    print(
        f"  gate           {'passed' if s.get('gate_passed') else 'failed'}: "
        f"{s.get('gate_reason', '')}"
    )
    for line in s.get("data_warnings", []):
        print(f"  data           {line}")
    if s.get("tuned_hyperparams"):
        print(f"  tuned          {json.dumps(s['tuned_hyperparams'], sort_keys=True)}")
    run_cost = s.get("cost") or {}
    for line in summary_lines(run_cost.get("estimate"), run_cost.get("actual")):
        print(f"  cost {line}")
    if s.get("metrics_url"):
        print(f"  metrics        {s['metrics_url']} (Prometheus, while train ran)")
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


def plain_text(text: str) -> str:
    """``text`` without the docstring markup that help texts inherit from docstrings:
    ``:func:`x```, ````x```` and ```x``` all become ``x``, so ``--help`` reads as plain text."""
    text = re.sub(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`", r"\1", text)
    return re.sub(r"`{1,2}([^`]+)`{1,2}", r"\1", text)


class _PlainHelp(argparse.HelpFormatter):
    """Help with :func:`plain_text` applied to descriptions, epilogs and each flag's help,
    before argparse wraps them."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action))


class _PlainRawHelp(_PlainHelp, argparse.RawDescriptionHelpFormatter):
    """:class:`_PlainHelp` that keeps the description's and epilog's own line breaks."""


def version_text() -> str:
    """``gpupipe --version``: the package version and the image each step is compiled with."""
    from components import ALL
    from components.images import REGISTRY
    from trainer.base.version import __version__

    steps: dict[str, list[str]] = {}
    for name, component in ALL.items():
        image = component.component_spec.implementation.container.image
        steps.setdefault(str(image), []).append(name)
    width = max(len(image) for image in steps)
    lines = [
        f"gpupipe {__version__}",
        f"images compiled into pipelines (registry {REGISTRY}, GPUPIPE_IMAGE_REGISTRY):",
    ]
    lines += [f"  {image:<{width}}  {', '.join(names)}" for image, names in steps.items()]
    return "\n".join(lines)


class _Version(argparse.Action):
    """``--version``: print :func:`version_text` and exit 0 (kfp is imported only then)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupipe", description=__doc__, formatter_class=_PlainHelp
    )
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print the version and the container images it compiles into pipelines",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("formatter_class", _PlainHelp)
        return sub.add_parser(name, **kwargs)

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

    p = add(
        "run",
        help="run the training pipeline",
        description="Run the training pipeline here (--local, kfp.local) or on a KFP cluster "
        "(--host URL). Flags of the other kind of run are refused.",
        formatter_class=_PlainRawHelp,
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
    _cluster_args(p, required=False)
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

    p = add("upload", help="upload the training pipeline to KFP (idempotent)")
    _cluster_args(p, required=True)
    p.add_argument("--version", help="version name (default: v-<sha256 of the YAML>[:12])")
    p.add_argument(
        "--package",
        metavar="FILE",
        help="upload this compiled pipeline YAML (e.g. from `gpupipe compile`) instead of "
        "compiling the training pipeline now",
    )
    p.set_defaults(func=cmd_upload)

    p = add("schedule", help="create, update, list, enable, disable or delete schedules")
    _cluster_args(p, required=True)
    p.add_argument("--cron", help="six fields, UTC: 'sec min hour day-of-month month day-of-week'")
    p.add_argument("--name", help="display name (default: <pipeline>-schedule)")
    p.add_argument("--version", help="uploaded version name (default: the newest)")
    p.add_argument("--experiment", default="gpupipe", help="experiment (created when missing)")
    p.add_argument("--max-concurrency", type=int, default=1, help="runs at once (default 1)")
    p.add_argument("--no-catchup", action="store_true", help="skip runs missed while paused")
    p.add_argument("--start", help="ISO 8601 time of the first possible run (UTC if no zone)")
    p.add_argument("--end", help="ISO 8601 time after which nothing runs")
    p.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE", help="pipeline parameter"
    )
    action = p.add_mutually_exclusive_group()
    action.add_argument("--enable", metavar="NAME", help="enable the recurring run NAME")
    action.add_argument("--disable", metavar="NAME", help="disable the recurring run NAME")
    action.add_argument("--delete", metavar="NAME", help="delete the recurring run NAME")
    action.add_argument("--list", action="store_true", help="list schedules and next fire times")
    p.set_defaults(func=cmd_schedule)
    return parser


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


def _cluster_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument(
        "--host",
        required=required,
        help="KFP endpoint, e.g. http://localhost:8080 (a port-forward of svc/ml-pipeline-ui)",
    )
    p.add_argument(
        "--token",
        help="bearer token (default: $KF_PIPELINES_SA_TOKEN_PATH, then the in-cluster token)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow sending the token over plain http:// to a host other than localhost "
        "(refused otherwise)",
    )
    p.add_argument("--namespace", help="profile namespace (multi-user KFP)")
    p.add_argument("--pipeline", help="pipeline name (default: gpupipe-training)")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpupipe`` console script."""
    args = build_parser().parse_args(argv)
    step = f"gpupipe {args.command}"
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        # run_local has already stopped the steps it started.
        print(f"ERROR [{step}] E_INTERRUPTED: interrupted; steps stopped", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        print(error_line(step, e), file=sys.stderr)
        return 2
    except (PermissionError, IsADirectoryError, NotADirectoryError) as e:
        print(error_line(step, e, default_code="E_PATH"), file=sys.stderr)
        return 2
    except RuntimeError as e:
        from pipelines.cluster import ClusterError

        if not isinstance(e, ClusterError):  # a bug or an unexpected failure: keep the trace
            raise
        print(error_line(step, e, default_code=e.code), file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
