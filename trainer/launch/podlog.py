"""A pod's log, followed by polling: what a launcher streams into the step's log while it waits."""

from __future__ import annotations

import collections
import logging
import math
import re
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from trainer.base.errors import InputError, StepFailure, parse_error_line
from trainer.base.redact import redact
from trainer.launch.kube import CONTAINER, KubeApi, KubeApiError

log = logging.getLogger(__name__)

_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")
_LOG_OVERLAP_S = 5
"""Extra seconds each log poll reaches back: lines seen twice are dropped, lines missed are not."""


def _ts_key(stamp: str) -> tuple[int, int] | None:
    """An RFC 3339 timestamp (nanoseconds, as kubelet writes them) as a sortable pair."""
    m = _TIMESTAMP.match(stamp)
    if not m:
        return None
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    seconds = int(datetime.fromisoformat(m.group(1) + tz).timestamp())
    return seconds, int((m.group(2) or "").ljust(9, "0"))


class PodLog:
    """Follows a pod's log by polling with timestamps: reconnects and pod restarts neither
    repeat nor lose lines, and no thread is left blocked on a stream when the step ends."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        *,
        tail: int,
        reattached: bool,
        container: str = CONTAINER,
        step: str = "train",
    ) -> None:
        self.api = api
        self.step = step
        self.namespace = namespace
        self.container = container
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)
        self.errors: list[InputError | StepFailure] = []
        # A re-attached launcher shows the recent past, not hours of an earlier attempt's log.
        self._first_tail: int | None = tail if reattached else None
        self._last: tuple[int, int] | None = None
        self._same = 0  # lines printed with timestamp == self._last
        self._fetched_at: float | None = None
        self._unreadable: str | None = None  # the pod whose log could not be read, said once

    def pump(self, pod: Mapping[str, Any] | None) -> None:
        """Print the lines the pod logged since the last call."""
        if pod is None or (pod.get("status") or {}).get("phase") == "Pending":
            return
        since = None
        if self._fetched_at is not None:
            since = math.ceil(time.monotonic() - self._fetched_at) + _LOG_OVERLAP_S
        started = time.monotonic()
        name = pod["metadata"]["name"]
        try:
            text = self.api.pod_log(
                self.namespace,
                name,
                since_seconds=since,
                tail_lines=self._first_tail if since is None else None,
                timestamps=True,
                container=self.container,
            )
        except KubeApiError as e:
            # The API server reads a log from the pod's kubelet: a 5xx or no answer is that node
            # not answering (lost, or cut off), not the job failing. The job is followed by its
            # status meanwhile; the log goes on, from where it stopped, when the node answers.
            if e.status is not None and e.status < 500:
                raise
            if self._unreadable != name:
                log.warning(
                    "the log of pod %s/%s cannot be read now (its node does not answer?): %s; "
                    "the job is followed by its status, its log resumes when the node answers",
                    self.namespace, name, " ".join(str(e).split())[:300],
                )  # fmt: skip
                self._unreadable = name
            return
        self._unreadable = None
        if text is None:
            return
        self._fetched_at = started
        self._first_tail = None
        # The overlap re-sends lines stamped self._last that were printed already.
        dups = self._same
        for raw in text.splitlines():
            stamp, _, line = raw.partition(" ")
            key = _ts_key(stamp)
            if key is None:  # Not timestamped after all: show it; it cannot be deduplicated.
                line = raw
            elif self._last is not None and key < self._last:
                continue
            elif key == self._last:
                if dups > 0:
                    dups -= 1
                    continue
                self._same += 1
            else:
                self._last, self._same, dups = key, 1, 0
            self._emit(line)
        sys.stdout.flush()

    def _emit(self, line: str) -> None:
        line = redact(line)
        sys.stdout.write(line + "\n")
        self.tail.append(line)
        if err := parse_error_line(line, self.step):
            self.errors.append(err)

    def last_lines(self, pod: Mapping[str, Any] | None) -> list[str]:
        """The pod's last lines: those streamed, else (an object found finished) from the API."""
        if self.tail or pod is None:
            return list(self.tail)
        text = self.api.pod_log(
            self.namespace,
            pod["metadata"]["name"],
            tail_lines=self.tail.maxlen,
            container=self.container,
        )
        for line in (text or "").splitlines():
            self.tail.append(line)
            if err := parse_error_line(line, self.step):
                self.errors.append(err)
        return list(self.tail)
