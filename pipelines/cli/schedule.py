"""``gpupipe schedule``: create, update, list, enable, disable or delete recurring runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pipelines.cli.host import (
    add_cluster_args,
    cluster_params,
    connect,
    default_pipeline,
    refuse_unnamed_registry,
)
from trainer.base.errors import InputError


def cmd_schedule(args: argparse.Namespace) -> int:
    from pipelines import cron as cronlib
    from pipelines.cluster import server_text
    from pipelines.schedule import parse_time, same_schedule, schedule_body

    for action in ("enable", "disable", "delete"):
        if name := getattr(args, action):
            cluster = connect(args)
            found = cluster.find_schedule(name)
            if found is None:
                raise InputError(
                    "E_NOT_FOUND",
                    f"no recurring run named {name!r} on {cluster.host}",
                    f"--{action}",
                )
            cluster.set_schedule(found.recurring_run_id, action)
            print(f"{action}d recurring run {name!r} ({server_text(found.recurring_run_id, 80)})")
            return 0
    if args.list:
        _print_schedules(connect(args).list_schedules())
        return 0
    # Create or update: everything a person can get wrong is checked before the first call.
    if not args.cron:
        raise InputError("E_CRON", "--cron is required to create a schedule", "--cron")
    cronlib.parse(args.cron)
    params = cluster_params(args)
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
    cluster = connect(args)
    pipeline = args.pipeline or default_pipeline()
    name = args.name or f"{pipeline}-schedule"
    version = cluster.resolve_version(pipeline, args.version)
    refuse_unnamed_registry(params, cluster.version_defaults(*version))
    body = schedule_body(
        name=name,
        cron=args.cron,
        experiment_id=cluster.experiment_id(args.experiment),
        version=version,
        parameters=params,
        max_concurrency=args.max_concurrency,
        no_catchup=args.no_catchup,
        start=start,
        end=end,
    )
    old = cluster.find_schedule(name)
    if old is not None and same_schedule(old, body):
        print(
            f"unchanged: recurring run {name!r} ({server_text(old.recurring_run_id, 80)}) already "
            "has these settings"
        )
        return 0
    # KFP v2beta1 cannot update a recurring run: create the new one, then delete the old one,
    # so a schedule exists at every moment.
    new_id = cluster.create_schedule(body)
    if old is not None:
        cluster.set_schedule(old.recurring_run_id, "delete")
    new = server_text(new_id, 80)
    print(f"{'replaced' if old else 'created'} recurring run {name!r} ({new}): {args.cron} UTC")
    print(f"  {cluster.recurring_run_link(new_id)}")
    return 0


def _print_schedules(runs: list[Any]) -> None:
    from pipelines import cron as cronlib
    from pipelines.cluster import server_text
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
        row = (str(r.display_name), mode, expr, nxt, str(r.recurring_run_id))
        rows.append(tuple(server_text(cell, 100) for cell in row))
    if len(rows) == 1:
        print("no recurring runs")
        return
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    """The ``schedule`` subcommand, through ``add`` (a subparser maker)."""
    p = add("schedule", help="create, update, list, enable, disable or delete schedules")
    add_cluster_args(p, required=True)
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
