"""The PyTorchJob launcher: create or re-attach to the job, stream its log, end with its outcome."""

from __future__ import annotations

import collections
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from trainer.errors import InputError, StepFailure, parse_error_line
from trainer.launchers.kube import PYTORCHJOB_API_CALLS as API_CALLS
from trainer.launchers.kube import KubeApi, KubeApiError
from trainer.redact import redact

__all__ = ["API_CALLS", "LaunchCancelled", "PodRef", "PyTorchJobLauncher", "job_state"]

log = logging.getLogger(__name__)

SpecFactory = Callable[[str, str, int, int], dict[str, Any]]
"""``(job_name, config_uri, nproc_per_node, nnodes) -> PyTorchJob dict``."""
OnExit = Literal["delete", "keep", "suspend"]

TERMINAL = ("Succeeded", "Failed")
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")
_LOG_OVERLAP_S = 5
"""Extra seconds each log poll reaches back: lines seen twice are dropped, lines missed are not."""
_EVENTS_SHOWN = 10
_GONE_WAIT_S = 600.0
"""Longest wait for an earlier attempt's job to finish being deleted (a stuck finalizer)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PodRef:
    """The launcher's own pod, as the downward API tells it (POD_NAME, POD_NAMESPACE, POD_UID)."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PodRef | None:
        """The pod from the downward API's variables, or ``None`` when any of them is unset."""
        env = os.environ if env is None else env
        name, namespace, uid = (env.get(k, "") for k in ("POD_NAME", "POD_NAMESPACE", "POD_UID"))
        if not (name and namespace and uid):
            return None
        return cls(name=name, namespace=namespace, uid=uid)

    def owner_reference(self) -> dict[str, Any]:
        """An ownerReference to this pod: deleting the pod (with the run) deletes the job.

        Neither controller (the pod does not reconcile the job) nor blocking (that would need
        ``update`` on ``pods/finalizers``); the garbage collector deletes the job either way.
        """
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": self.name,
            "uid": self.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }


class LaunchCancelled(RuntimeError):
    """The step was cancelled (SIGTERM) while its job ran; ``on_exit`` has been applied."""


class _Stop(Exception):
    """Internal: leave the wait loop because of a deadline or a cancellation."""

    def __init__(self, why: Literal["deadline", "cancelled"]) -> None:
        super().__init__(why)
        self.why = why


def job_state(job: Mapping[str, Any]) -> str:
    """The job's state: the type of its last condition whose status is ``"True"``.

    ``Created``, ``Running``, ``Restarting``, ``Suspended``, ``Succeeded`` or ``Failed``;
    ``Pending`` before the operator has written any condition.
    """
    state = "Pending"
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True":
            state = str(cond.get("type"))
    return state


def _ts_key(stamp: str) -> tuple[int, int] | None:
    """An RFC 3339 timestamp (nanoseconds, as kubelet writes them) as a sortable pair."""
    m = _TIMESTAMP.match(stamp)
    if not m:
        return None
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    seconds = int(datetime.fromisoformat(m.group(1) + tz).timestamp())
    return seconds, int((m.group(2) or "").ljust(9, "0"))


class _MasterLog:
    """Follows the master's log by polling with timestamps: reconnects and pod restarts neither
    repeat nor lose lines, and no thread is left blocked on a stream when the step ends."""

    def __init__(self, api: KubeApi, namespace: str, *, tail: int, reattached: bool) -> None:
        self.api = api
        self.namespace = namespace
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)
        self.errors: list[InputError | StepFailure] = []
        # A re-attached launcher shows the recent past, not hours of an earlier attempt's log.
        self._first_tail: int | None = tail if reattached else None
        self._last: tuple[int, int] | None = None
        self._same = 0  # lines printed with timestamp == self._last
        self._fetched_at: float | None = None

    def pump(self, pod: Mapping[str, Any] | None) -> None:
        """Print the lines the pod logged since the last call."""
        if pod is None or (pod.get("status") or {}).get("phase") == "Pending":
            return
        since = None
        if self._fetched_at is not None:
            since = math.ceil(time.monotonic() - self._fetched_at) + _LOG_OVERLAP_S
        started = time.monotonic()
        text = self.api.pod_log(
            self.namespace,
            pod["metadata"]["name"],
            since_seconds=since,
            tail_lines=self._first_tail if since is None else None,
            timestamps=True,
        )
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
        if err := parse_error_line(line):
            self.errors.append(err)

    def last_lines(self, pod: Mapping[str, Any] | None) -> list[str]:
        """The master's last lines: those streamed, else (a job found finished) from the API."""
        if self.tail or pod is None:
            return list(self.tail)
        text = self.api.pod_log(
            self.namespace, pod["metadata"]["name"], tail_lines=self.tail.maxlen
        )
        for line in (text or "").splitlines():
            self.tail.append(line)
            if err := parse_error_line(line):
                self.errors.append(err)
        return list(self.tail)


class PyTorchJobLauncher:
    """Runs the training job as a Training Operator PyTorchJob and waits for its outcome.

    The job is named by the caller from the KFP run and task, so a retried or restarted step
    finds its job and re-attaches instead of creating a second one (a finished job is reported,
    not re-run; a suspended one is resumed). While waiting it streams the master's log into
    this step's stdout. When the job fails, the deadline passes or the step is cancelled
    (SIGTERM), ``on_exit`` decides what happens to the job: ``delete`` it (and its pods),
    ``keep`` it for inspection, or ``suspend`` it (pods go, the job and its state stay).
    """

    def __init__(
        self,
        *,
        namespace: str,
        spec_factory: SpecFactory,
        api: KubeApi | None = None,
        on_exit: OnExit = "delete",
        poll_s: float = 2.0,
        log_tail: int = 50,
        own_pod: PodRef | None = None,
    ) -> None:
        """Configure the launcher; nothing is called on the cluster until :meth:`launch`.

        Args:
            namespace: namespace of the job (the launcher pod's, for the ownerReference).
            spec_factory: ``(job_name, config_uri, nproc_per_node, nnodes)`` -> PyTorchJob dict,
                e.g. built on :func:`trainer.launchers.jobspec.build_pytorchjob`.
            api: the Kubernetes API; ``None``: in-cluster config, else the kubeconfig.
            on_exit: what to do with the job on failure, deadline and cancellation.
            poll_s: seconds between looks at the job and its log.
            log_tail: master log lines kept for a failure's message.
            own_pod: the launcher's pod; the job gets an ownerReference to it.

        Raises:
            ValueError: an argument is out of range.
        """
        if not namespace:
            raise ValueError("namespace must be set, got ''")
        if on_exit not in ("delete", "keep", "suspend"):
            raise ValueError(f"on_exit must be delete, keep or suspend, got {on_exit!r}")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        if log_tail < 1:
            raise ValueError(f"log_tail must be >= 1, got {log_tail}")
        if own_pod is not None and own_pod.namespace != namespace:
            # Owner references cannot cross namespaces: the garbage collector would delete the
            # job at once, believing its owner gone.
            log.warning(
                "launcher pod %s/%s is not in the job's namespace %s: no ownerReference",
                own_pod.namespace,
                own_pod.name,
                namespace,
            )
            own_pod = None
        self.namespace = namespace
        self.spec_factory = spec_factory
        self.on_exit: OnExit = on_exit
        self.poll_s = poll_s
        self.log_tail = log_tail
        self.own_pod = own_pod
        self._api = api

    @classmethod
    def from_environment(
        cls,
        *,
        spec_factory: SpecFactory,
        namespace: str | None = None,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> PyTorchJobLauncher:
        """A launcher that knows its own pod from the downward API (POD_NAME, POD_NAMESPACE,
        POD_UID), creating the job in the pod's namespace unless ``namespace`` is given.

        Raises:
            ValueError: no namespace given and POD_NAMESPACE is unset.
        """
        env = os.environ if env is None else env
        namespace = namespace or env.get("POD_NAMESPACE")
        if not namespace:
            raise ValueError("namespace must be given or POD_NAMESPACE set (downward API)")
        return cls(
            namespace=namespace, spec_factory=spec_factory, own_pod=PodRef.from_env(env), **kwargs
        )

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            self._api = KubeApi.from_config()
        return self._api

    def launch(
        self,
        *,
        job_name: str,
        config_uri: str,
        nproc_per_node: int,
        nnodes: int,
        timeout_s: int | None,
    ) -> None:
        """Create (or re-attach to) the PyTorchJob ``job_name`` and return when it succeeded.

        Raises:
            InputError: the job failed on bad input (the worker's ``ERROR [train] E_...`` line).
            RuntimeError: the job failed (conditions, events and the master's last log lines in
                the message), the API refused a call, or the step was cancelled
                (:class:`LaunchCancelled`).
            TimeoutError: ``timeout_s`` passed before the job finished.
        """
        body = self._job_body(job_name, config_uri, nproc_per_node, nnodes)
        run = _Run(self, job_name, timeout_s)
        previous = None
        if threading.current_thread() is threading.main_thread():

            def on_sigterm(signum: int, frame: Any) -> None:
                # Only a flag: the wait loop stops the job between API calls, never mid-request.
                run.cancelled = True

            previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            run.execute(body)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _job_body(self, job_name: str, config_uri: str, nproc: int, nnodes: int) -> dict[str, Any]:
        """The factory's PyTorchJob, checked to be ``namespace/job_name``, owned by our pod."""
        body = self.spec_factory(job_name, config_uri, nproc, nnodes)
        meta = body.setdefault("metadata", {})
        if meta.get("name") != job_name:
            raise ValueError(f"spec_factory named the job {meta.get('name')!r}, not {job_name!r}")
        if meta.setdefault("namespace", self.namespace) != self.namespace:
            raise ValueError(
                f"spec_factory put the job in namespace {meta['namespace']!r}, "
                f"not {self.namespace!r}"
            )
        if self.own_pod is not None:
            owners = meta.setdefault("ownerReferences", [])
            if all(o.get("uid") != self.own_pod.uid for o in owners):
                owners.append(self.own_pod.owner_reference())
        return body


class _Run:
    """One launch: its job, deadline, cancellation flag and log follower."""

    def __init__(self, launcher: PyTorchJobLauncher, name: str, timeout_s: int | None) -> None:
        self.launcher = launcher
        self.api = launcher.api
        self.ns = launcher.namespace
        self.name = name
        self.ref = f"{self.ns}/{name}"
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.cancelled = False
        self.have_job = False
        self.state = "Pending"
        self.pod: dict[str, Any] | None = None
        self.master = _MasterLog(self.api, self.ns, tail=launcher.log_tail, reattached=False)

    def execute(self, body: dict[str, Any]) -> None:
        """Start or re-attach, wait, and turn the job's outcome into a return or an error."""
        try:
            job = self.wait(self.start(body))
        except _Stop as stop:
            done = self.apply_on_exit() if self.have_job else "no job had been created"
            if stop.why == "deadline":
                raise TimeoutError(
                    f"PyTorchJob {self.ref} did not finish within {self.timeout_s} s "
                    f"(train.timeout_s; it was {self.state}); {done}"
                ) from None
            raise LaunchCancelled(
                f"PyTorchJob {self.ref}: the step was cancelled (SIGTERM); {done}"
            ) from None
        except (KubeApiError, KeyboardInterrupt):
            # Nobody will watch the job once this step ends: do not leave it running unseen.
            if self.have_job:
                log.warning("PyTorchJob %s: %s", self.ref, self.apply_on_exit())
            raise
        if self.state == "Succeeded":
            log.info("PyTorchJob %s succeeded", self.ref)
            return
        diagnosis = self.diagnose(job)
        done = self.apply_on_exit()
        if self.master.errors:
            log.error("%s\n%s", diagnosis, done)
            raise self.master.errors[0]
        raise RuntimeError(f"{diagnosis}\n{done}")

    # Phases

    def start(self, body: dict[str, Any]) -> dict[str, Any]:
        """The job: the existing one of that name (re-attached), else a new one."""
        races = 0
        gone_by = time.monotonic() + _GONE_WAIT_S
        while True:
            self.check()
            job = self.api.get_job(self.ns, self.name)
            if job is None:
                job = self.api.create_job(self.ns, body)
                if job is not None:
                    self.have_job = True
                    log.info("created PyTorchJob %s", self.ref)
                    return job
                # 409: another launcher of this task created it between our get and create.
                races += 1
                if races > 3:
                    raise RuntimeError(f"PyTorchJob {self.ref} keeps appearing and vanishing")
                continue
            if (job.get("metadata") or {}).get("deletionTimestamp"):
                # An earlier attempt's job on its way out: wait, then start afresh.
                log.info("PyTorchJob %s is being deleted; creating it anew once gone", self.ref)
                if time.monotonic() > gone_by:
                    raise RuntimeError(
                        f"PyTorchJob {self.ref} has been deleting for over {_GONE_WAIT_S:.0f} s "
                        "(a finalizer that nothing removes?); the step cannot start its job"
                    )
                self.sleep(self.launcher.poll_s)
                continue
            self.have_job = True
            return self.adopt(job)

    def adopt(self, job: dict[str, Any]) -> dict[str, Any]:
        """Re-attach to a job: own it too; resume it if an earlier attempt suspended it."""
        self.state = job_state(job)
        self.master = _MasterLog(self.api, self.ns, tail=self.launcher.log_tail, reattached=True)
        log.info(
            "PyTorchJob %s exists (%s): re-attaching instead of creating another",
            self.ref,
            self.state,
        )
        if self.state in TERMINAL:
            return job
        patch: dict[str, Any] = {}
        own = self.launcher.own_pod
        owners = list((job.get("metadata") or {}).get("ownerReferences") or [])
        if own is not None and all(o.get("uid") != own.uid for o in owners):
            # A merge patch replaces lists whole: send the earlier owners along.
            patch["metadata"] = {"ownerReferences": [*owners, own.owner_reference()]}
        if ((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"):
            log.info("PyTorchJob %s was suspended by an earlier attempt: resuming it", self.ref)
            patch["spec"] = {"runPolicy": {"suspend": False}}
        if patch:
            job = self.api.patch_job(self.ns, self.name, patch) or job
        return job

    def wait(self, job: dict[str, Any]) -> dict[str, Any]:
        """Stream the master's log until the job succeeds or fails; the finished job."""
        reported = None
        while True:
            self.state = job_state(job)
            if self.state != reported:
                log.info("PyTorchJob %s: %s", self.ref, self.state)
                reported = self.state
            self.pod = self.master_pod()
            self.master.pump(self.pod)
            if self.state in TERMINAL:
                return job
            self.sleep(self.launcher.poll_s)
            got = self.api.get_job(self.ns, self.name)
            if got is None:
                self.have_job = False
                raise RuntimeError(
                    f"PyTorchJob {self.ref} disappeared while the step waited for it "
                    "(deleted by someone else?)"
                )
            job = got

    def master_pod(self) -> dict[str, Any] | None:
        """The live master pod (the newest, while the operator replaces one)."""
        pods = self.api.master_pods(self.ns, self.name)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")] or pods
        if not live:
            return None
        return max(live, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))

    def apply_on_exit(self) -> str:
        """Delete, keep or suspend the job; what was done, for the step's message."""
        how = self.launcher.on_exit
        try:
            if how == "keep":
                return (
                    f"it was kept (on_exit=keep): kubectl delete pytorchjob -n {self.ns} "
                    + self.name
                )
            if how == "suspend":
                patch = {"spec": {"runPolicy": {"suspend": True}}}
                if self.api.patch_job(self.ns, self.name, patch) is None:
                    return "it was already gone"
                return "it was suspended (on_exit=suspend); a retry of the step resumes it"
            if not self.api.delete_job(self.ns, self.name):
                return "it was already gone"
            return "it was deleted (on_exit=delete)"
        except KubeApiError as e:
            # The job's outcome matters more than the clean-up's: report both, raise the first.
            log.error("%s", e)
            return f"on_exit={how} failed: {e}"

    def diagnose(self, job: Mapping[str, Any]) -> str:
        """Why the job failed: conditions, the master's exit code, recent events, last lines."""
        conds = (job.get("status") or {}).get("conditions") or []
        failed: Mapping[str, Any] = next(
            (c for c in reversed(conds) if c.get("type") == "Failed"), {}
        )
        parts = [
            f"PyTorchJob {self.ref} failed: "
            f"{failed.get('reason', 'Failed')}: {failed.get('message', '(no message)')}",
            "conditions: " + "; ".join(_condition(c) for c in conds),
        ]
        if (exit_line := _exit_code(self.pod)) is not None:
            parts.append(exit_line)
        parts.append(self._events())
        try:
            lines = self.master.last_lines(self.pod)
        except KubeApiError as e:
            lines = [f"(log unavailable: {e})"]
        pod = self.pod["metadata"]["name"] if self.pod else "gone"
        parts.append(f"last {len(lines)} lines of the master's log (pod {pod}):")
        parts += [f"  {line}" for line in lines]
        return redact("\n".join(parts))

    def _events(self) -> str:
        names = [self.name] + ([self.pod["metadata"]["name"]] if self.pod else [])
        try:
            events = [e for n in names for e in self.api.events(self.ns, n)]
        except KubeApiError as e:
            return f"recent events: unavailable ({e})"
        events.sort(key=_event_time)
        shown = [
            f"  {e.get('type', '')} {e.get('reason', '')} "
            f"{(e.get('involvedObject') or {}).get('kind', '')}/"
            f"{(e.get('involvedObject') or {}).get('name', '')}: {e.get('message', '')}"
            for e in events[-_EVENTS_SHOWN:]
        ]
        return "\n".join(["recent events:", *shown] if shown else ["recent events: none"])

    # Waiting

    def check(self) -> None:
        """Leave the wait (via :class:`_Stop`) on cancellation or past the deadline."""
        if self.cancelled:
            log.warning(
                "SIGTERM: stopping PyTorchJob %s (on_exit=%s)", self.ref, self.launcher.on_exit
            )
            raise _Stop("cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise _Stop("deadline")

    def sleep(self, seconds: float) -> None:
        """Sleep in slices, so that a SIGTERM or the deadline is acted on within 0.1 s."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.check()
            time.sleep(min(left, 0.1))
        self.check()


def _condition(cond: Mapping[str, Any]) -> str:
    text = f"{cond.get('type')}={cond.get('status')}"
    if cond.get("status") == "True" and (cond.get("reason") or cond.get("message")):
        text += f" ({cond.get('reason', '')}: {cond.get('message', '')})"
    return text


def _exit_code(pod: Mapping[str, Any] | None) -> str | None:
    """How the master's training container ended, if it has."""
    if pod is None:
        return None
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != "pytorch":
            continue
        for key in ("state", "lastState"):
            ended = (status.get(key) or {}).get("terminated")
            if ended:
                return (
                    f"master pod {pod['metadata']['name']}: container pytorch exited with "
                    f"code {ended.get('exitCode')} ({ended.get('reason', 'no reason')})"
                )
    return None


def _event_time(event: Mapping[str, Any]) -> str:
    meta = event.get("metadata") or {}
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or meta.get("creationTimestamp")
        or ""
    )
