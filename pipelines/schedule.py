"""Recurring runs on a KFP cluster: the request body of a cron schedule, and when two are the same.

``gpupipe schedule`` builds a body with :func:`schedule_body`, compares it with an existing
recurring run of the same name (:func:`same_schedule`: an unchanged schedule is left alone, a
changed one is replaced) and reads ``--start``/``--end`` times with :func:`parse_time` (UTC
unless a zone is given). The cron text itself is checked in :mod:`pipelines.cron`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import kfp_server_api as kapi

from trainer.base.errors import InputError


def schedule_body(
    *,
    name: str,
    cron: str,
    experiment_id: str,
    version: tuple[str, str],
    parameters: dict[str, Any],
    max_concurrency: int,
    no_catchup: bool,
    start: datetime | None,
    end: datetime | None,
) -> kapi.V2beta1RecurringRun:
    """The request body of a cron-triggered recurring run of an uploaded version."""
    return kapi.V2beta1RecurringRun(
        display_name=name,
        description=f"gpupipe schedule: {cron} (UTC)",
        experiment_id=experiment_id,
        pipeline_version_reference=kapi.V2beta1PipelineVersionReference(
            pipeline_id=version[0], pipeline_version_id=version[1]
        ),
        runtime_config=kapi.V2beta1RuntimeConfig(parameters=parameters),
        max_concurrency=str(max_concurrency),
        no_catchup=no_catchup,
        mode="ENABLE",
        trigger=kapi.V2beta1Trigger(
            cron_schedule=kapi.V2beta1CronSchedule(cron=cron, start_time=start, end_time=end)
        ),
    )


def same_schedule(a: kapi.V2beta1RecurringRun, b: kapi.V2beta1RecurringRun) -> bool:
    """Whether two recurring runs would start the same runs at the same times."""

    def key(r: kapi.V2beta1RecurringRun) -> tuple[Any, ...]:
        cs = r.trigger.cron_schedule if r.trigger else None
        ref = r.pipeline_version_reference
        return (
            cs.cron if cs else None,
            as_utc(cs.start_time) if cs else None,
            as_utc(cs.end_time) if cs else None,
            ref.pipeline_id if ref else None,
            ref.pipeline_version_id if ref else None,
            json.dumps(
                (r.runtime_config.parameters if r.runtime_config else None) or {}, sort_keys=True
            ),
            str(r.max_concurrency or "1"),
            bool(r.no_catchup),
            r.experiment_id,
        )

    return key(a) == key(b)


def as_utc(t: datetime | str | None) -> datetime | None:
    """``t`` (a datetime or ISO 8601 text; without a zone: UTC) in UTC; ``None`` stays ``None``.

    Raises:
        ValueError: text that is not ISO 8601.
    """
    if isinstance(t, str):
        t = datetime.fromisoformat(t.replace("Z", "+00:00"))
    if t is None:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def parse_time(text: str, flag: str) -> datetime:
    """An ISO 8601 time; without a zone it is UTC.

    Raises:
        InputError: ``E_TIME`` when it does not parse.
    """
    try:
        return as_utc(text) or datetime.now(UTC)
    except ValueError as e:
        raise InputError(
            "E_TIME",
            f"{flag} must be an ISO 8601 time like 2026-12-01T02:00:00Z, got {text!r}",
            flag,
        ) from e
