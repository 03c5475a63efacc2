"""A fake Kubernetes API server on 127.0.0.1 that plays the Training Operator for PyTorchJobs,
Kubeflow Trainer v2 (with JobSet) for TrainJobs, and Katib for Experiments (with their Trials).

It serves the REST paths the PyTorchJob launcher calls with the JSON a real API server returns
(Status bodies for errors, text/plain logs), so the real ``kubernetes`` client can be pointed at
it. The operator is simulated lazily from each job's age: Created, a Pending master pod, Running
with log lines appearing over time, then Succeeded or Failed as the job's :class:`Scenario`
says. A TrainJob follows the same :class:`Scenario` the way Trainer reports it: conditions
``Complete``/``Failed``/``Suspended`` only, ``status.jobsStatus`` while it runs, and JobSet's pods
(``<job>-node-0-<index>-<suffix>``, JobSet's labels, the Indexed Job's completion index) with a
``node`` container. Faults (error statuses with ``Retry-After``, slow answers) can be injected
per path, and every request is recorded. Katib is simulated the same way: an Experiment's trials
start and end on a clock from its creation as its :class:`ExperimentScenario` says, and its
status (conditions, trial counts, ``currentOptimalTrial``) follows Katib's own rules.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from trainer.tune.space import failure_budget_spent

_JOBS = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/pytorchjobs$")
_JOB = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/pytorchjobs/([^/]+)$")
_TRAINJOBS = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs$")
_TRAINJOB = re.compile(
    r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/([^/]+)$"
)
_POD_NAME = re.compile(r"^(?P<job>.+?)(?:-master-0|-node-0-(?P<index>\d+)-[a-z0-9]{5})$")
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
_LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")
_EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
_WORKFLOW = re.compile(r"^/apis/argoproj\.io/v1alpha1/namespaces/([^/]+)/workflows/([^/]+)$")
_WORKFLOWS = re.compile(r"^/apis/argoproj\.io/v1alpha1/namespaces/([^/]+)/workflows$")
_EXPS = re.compile(r"^/apis/kubeflow\.org/v1beta1/namespaces/([^/]+)/experiments$")
_EXP = re.compile(r"^/apis/kubeflow\.org/v1beta1/namespaces/([^/]+)/experiments/([^/]+)$")
_WORKLOADS = re.compile(r"^/apis/kueue\.x-k8s\.io/v1beta2/namespaces/([^/]+)/workloads$")
_TRIALS = re.compile(r"^/apis/kubeflow\.org/v1beta1/namespaces/([^/]+)/trials$")
_TRIAL = re.compile(r"^/apis/kubeflow\.org/v1beta1/namespaces/([^/]+)/trials/([^/]+)$")
NODE = "node"
"""Trainer's torch runtimes: the trainer's replicated job and container."""
TRAINJOBS_RESOURCE = "trainjobs.trainer.kubeflow.org"
_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "AlreadyExists",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def rfc3339(t: float, *, nanos: bool = False) -> str:
    """``t`` (epoch seconds) as the API writes times: seconds, or nanoseconds for log lines."""
    dt = datetime.fromtimestamp(t, UTC)
    if not nanos:
        return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{round((t % 1) * 1e9) % 10**9:09d}Z"


@dataclass(kw_only=True)
class Scenario:
    """What the simulated operator does with a job, on a clock that starts at its creation."""

    pending_s: float = 0.05
    """The master pod is Pending (container creating, no log) until then, then Running."""
    unschedulable: str | None = None
    """While Pending, the master pod has no node, for this reason of the scheduler's."""
    peer_unschedulable: str | None = None
    """Another replica's pod (a PyTorchJob's worker, a TrainJob's node 1) waits for a node, for
    this reason of the scheduler's, while the main pod runs."""
    peer_lost_on: str | None = None
    """Another replica's pod was evicted from this node, which stopped answering: Terminating,
    with the taint-eviction controller's ``DisruptionTarget`` condition, while the main pod runs."""
    lines: list[str] = field(default_factory=lambda: [f"step {i} loss {1 / i:.3f}" for i in (1, 2)])
    """The master's log, one line per ``line_every_s`` once Running."""
    line_every_s: float = 0.03
    outcome: Literal["Succeeded", "Failed"] | None = "Succeeded"
    """``None``: the job runs forever."""
    finish_s: float | None = None
    """When the outcome arrives; ``None``: just after the last line."""
    reason: str | None = None
    """Reason of the final condition; ``None``: the operator's (``PyTorchJobFailed`` ...)."""
    message: str | None = None
    exit_code: int | None = None
    """The master container's exit code; ``None``: 0 on success, 1 on failure."""
    pod_events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) events about the master pod, emitted as it is created."""
    job_events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) events about the job itself (the operator's), at its creation."""
    min_reads: int = 0
    """The job runs on (its outcome does not arrive) until it has been read (``GET``) this many
    times: what a launcher must see of a running job, or does every few polls, happens whatever
    the machine's load."""

    def finish_at(self) -> float:
        if self.finish_s is not None:
            return self.finish_s
        return self.pending_s + len(self.lines) * self.line_every_s + 0.05

    def line_times(self) -> list[float]:
        """Seconds after creation at which each line is logged."""
        return [self.pending_s + (i + 0.5) * self.line_every_s for i in range(len(self.lines))]


@dataclass
class Request:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]


@dataclass
class _Fault:
    method: str
    path: re.Pattern[str]
    status: int | None
    times: int
    retry_after: str | None = None
    delay_s: float = 0.0
    message: str | None = None


@dataclass
class _Job:
    body: dict[str, Any]
    scenario: Scenario
    created: float
    frozen_at: float | None = None
    gone_at: float | None = None
    resumed: bool = False
    reads: int = 0

    @property
    def kind(self) -> str:
        return str(self.body.get("kind") or "PyTorchJob")

    @property
    def suspended(self) -> bool:
        spec = self.body.get("spec") or {}
        if self.kind == "TrainJob":
            return bool(spec.get("suspend"))
        return bool((spec.get("runPolicy") or {}).get("suspend"))

    def set_suspended(self, value: bool) -> None:
        if self.kind == "TrainJob":
            self.body["spec"]["suspend"] = value
        else:
            self.body["spec"].setdefault("runPolicy", {})["suspend"] = value

    @property
    def nodes(self) -> int:
        if self.kind == "TrainJob":
            return int(((self.body.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1)
        return 1

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    def age(self, now: float) -> float:
        return (self.frozen_at if self.frozen_at is not None else now) - self.created

    def finished(self, now: float) -> bool:
        sc = self.scenario
        if sc.outcome is None or self.reads < sc.min_reads:
            return False
        return self.age(now) >= sc.finish_at()


@dataclass(kw_only=True)
class TrialPlan:
    """One trial of a simulated Experiment; ``None`` fields are filled in from the Experiment."""

    outcome: Literal["Succeeded", "Failed", "EarlyStopped"] = "Succeeded"
    value: float | None = None
    """The objective metric it reports; ``None``: ``1 / (index + 2)``."""
    assignments: dict[str, str] | None = None
    """Katib parameter name -> value; ``None``: spread over each parameter's feasible space."""
    start_s: float | None = None
    """Seconds after the Experiment's creation; ``None``: in waves of ``parallelTrialCount``."""
    duration_s: float | None = None
    """``None``: the scenario's ``trial_s``."""
    message: str = ""


@dataclass(kw_only=True)
class ExperimentScenario:
    """What the simulated Katib does with an Experiment."""

    trials: list[TrialPlan] | None = None
    """``None``: ``maxTrialCount`` successful trials."""
    trial_s: float = 0.03
    outcome: Literal["auto", "Failed"] | None = "auto"
    """``auto``: Katib's rules (failed >= maxFailedTrialCount fails it, all trials done succeeds
    it); ``Failed``: fails once the trials are done; ``None``: runs forever."""
    reason: str = "ExperimentFailed"
    message: str = "Experiment has failed because max failed count has reached"
    min_reads: int = 0
    """The Experiment runs on (no trial ends it) until it has been read this many times: a
    launcher's calls made every few polls happen whatever the machine's load."""


@dataclass
class _Experiment:
    body: dict[str, Any]
    scenario: ExperimentScenario
    created: float
    gone_at: float | None = None
    reads: int = 0

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    def plans(self) -> list[tuple[str, TrialPlan, float, float]]:
        """(trial name, plan, start, end) in seconds after creation, filled in."""
        spec = self.body.get("spec") or {}
        n = int(spec.get("maxTrialCount") or 3)
        par = int(spec.get("parallelTrialCount") or 1)
        sc = self.scenario
        plans = sc.trials if sc.trials is not None else [TrialPlan() for _ in range(n)]
        out = []
        for i, plan in enumerate(plans):
            start = plan.start_s if plan.start_s is not None else (i // par) * sc.trial_s
            end = start + (plan.duration_s if plan.duration_s is not None else sc.trial_s)
            name = f"{self.name}-{uuid.uuid5(uuid.NAMESPACE_URL, f'{self.name}/{i}').hex[:8]}"
            out.append((name, plan, start, end))
        return out

    def finish_at(self) -> float | None:
        sc = self.scenario
        if sc.outcome is None or self.reads < sc.min_reads:
            return None
        plans = self.plans()
        ends = sorted(end for *_, end in plans)
        if sc.outcome == "auto":
            max_failed = int(self.body["spec"].get("maxFailedTrialCount") or 0)
            failed = sorted(end for _, p, _, end in plans if p.outcome == "Failed")
            if failure_budget_spent(len(failed), max_failed):
                return failed[max(max_failed, 1) - 1]
        return (ends[-1] if ends else 0.0) + 0.01

    def failed_early(self) -> bool:
        max_failed = int(self.body["spec"].get("maxFailedTrialCount") or 0)
        failed = sum(p.outcome == "Failed" for _, p, *_ in self.plans())
        return failure_budget_spent(failed, max_failed)


def _assignments(spec: dict[str, Any], i: int, n: int) -> dict[str, str]:
    out = {}
    for p in spec.get("parameters") or []:
        fs = p.get("feasibleSpace") or {}
        if fs.get("list"):
            out[p["name"]] = str(fs["list"][i % len(fs["list"])])
        else:
            lo, hi = float(fs["min"]), float(fs["max"])
            v = lo + (hi - lo) * (i + 1) / (n + 1)
            out[p["name"]] = str(round(v)) if p["parameterType"] == "int" else f"{v:.6g}"
    return out


class _HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class FakeKubeApi:
    """The fake API server; use as a context manager or call :meth:`start` and :meth:`stop`."""

    def __init__(self, scenario: Scenario | None = None) -> None:
        self.scenario = scenario or Scenario()
        """What jobs created through the API do."""
        self.requests: list[Request] = []
        self.created: list[str] = []
        """``namespace/name`` of every job created through the API (409s excluded)."""
        self._jobs: dict[tuple[str, str], _Job] = {}
        self.experiment_scenario = ExperimentScenario()
        """What Experiments created through the API do."""
        self.created_experiments: list[str] = []
        """``namespace/name`` of every Experiment created through the API (409s excluded)."""
        self._experiments: dict[tuple[str, str], _Experiment] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        """Pods other than the jobs' (a launcher's own), served by name (``fieldSelector``)."""
        self.workflows: dict[tuple[str, str], dict[str, Any]] = {}
        """Argo Workflows (KFP runs), served by name."""
        self.workloads: dict[str, dict[str, Any]] = {}
        """Kueue's Workloads (namespace team-a), by the name of the job each is for: the live
        job's UID is filled into its ``kueue.x-k8s.io/job-uid`` label when served; one under a
        name no job has (a neighbour in the queue) is served as it is."""
        self.nodes: list[dict[str, Any]] | None = None
        """The cluster's nodes; ``None``: listing them is forbidden (403), as for an account
        without manifests/rbac's ClusterRole."""
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._stopping = threading.Event()

    # Life cycle

    def start(self) -> FakeKubeApi:
        fake = self

        class Handler(_Handler):
            api = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits for it, once per test.
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # ends the watches being served
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeKubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # Arranging

    def add_job(
        self,
        name: str,
        *,
        namespace: str = "team-a",
        scenario: Scenario | None = None,
        age_s: float = 0.0,
        suspended: bool = False,
        deleting_for_s: float | None = None,
        owners: list[dict[str, Any]] | None = None,
        kind: Literal["PyTorchJob", "TrainJob"] = "PyTorchJob",
    ) -> None:
        """A job that exists already (an earlier attempt's), ``age_s`` seconds into its life."""
        now = time.time()
        body = minimal_job(name, namespace) if kind == "PyTorchJob" else minimal_trainjob(name)
        body["metadata"]["namespace"] = namespace
        if owners:
            body["metadata"]["ownerReferences"] = owners
        job = self._store(body, scenario or self.scenario, now - age_s)
        if suspended:
            job.set_suspended(True)
            job.frozen_at = now
        if deleting_for_s is not None:
            job.body["metadata"]["deletionTimestamp"] = rfc3339(now)
            job.gone_at = now + deleting_for_s

    def fail(
        self,
        method: str,
        path: str,
        status: int,
        *,
        times: int = 1,
        retry_after: float | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next ``times`` requests matching ``method`` and regex ``path`` with
        ``status`` (a Status body; ``Retry-After`` when given)."""
        self._faults.append(
            _Fault(
                method,
                re.compile(path),
                status,
                times,
                None if retry_after is None else f"{retry_after:g}",
                message=message,
            )
        )

    def delay(self, method: str, path: str, seconds: float, *, times: int = 1) -> None:
        """Answer the next ``times`` matching requests only after ``seconds`` (but do serve
        them: a create the client gave up on still creates, as on a real server)."""
        self._faults.append(_Fault(method, re.compile(path), None, times, delay_s=seconds))

    def add_kfp_step_pod(
        self, pod: str, workflow: str, namespace: str = "team-a", **spec: Any
    ) -> dict[str, Any]:
        """A KFP step's pod ``pod`` owned by the Workflow ``workflow`` (which gets ``spec``)."""
        uid = f"wf-{len(self.workflows)}-{workflow}"
        self.workflows[(namespace, workflow)] = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": workflow, "namespace": namespace, "uid": uid},
            "spec": dict(spec),
            "status": {"phase": "Running"},
        }
        ref = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": workflow,
               "uid": uid, "controller": True, "blockOwnerDeletion": True}  # fmt: skip
        self.pods[(namespace, pod)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace, "ownerReferences": [ref]},
        }
        return self.workflows[(namespace, workflow)]

    def add_experiment(
        self,
        body: dict[str, Any],
        *,
        scenario: ExperimentScenario | None = None,
        age_s: float = 0.0,
        deleting_for_s: float | None = None,
    ) -> None:
        """An Experiment that exists already (an earlier attempt's), ``age_s`` into its life."""
        now = time.time()
        body = copy.deepcopy(body)
        meta = body["metadata"]
        meta.update(uid=str(uuid.uuid4()), resourceVersion="1", creationTimestamp=rfc3339(now))
        exp = _Experiment(body, scenario or self.experiment_scenario, now - age_s)
        if deleting_for_s is not None:
            meta["deletionTimestamp"] = rfc3339(now)
            exp.gone_at = now + deleting_for_s
        with self._lock:
            self._experiments[(meta["namespace"], meta["name"])] = exp

    # Inspecting

    def experiment(self, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
        """The Experiment as ``GET`` would return it, or ``None``."""
        with self._lock:
            exp = self._live_experiment(namespace, name)
            return None if exp is None else self._render_experiment(exp, time.time())

    def trainjob(self, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
        """The TrainJob as ``GET`` would return it, or ``None``."""
        got = self.job(name, namespace)
        return got if got is not None and got["kind"] == "TrainJob" else None

    def job(self, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
        """The job as ``GET`` would return it, or ``None``."""
        with self._lock:
            job = self._live(namespace, name)
            return None if job is None else self._render(job, time.time())

    def calls(self, method: str, path: str = "") -> list[Request]:
        """Recorded requests with ``method`` whose path matches regex ``path``."""
        with self._lock:
            return [r for r in self.requests if r.method == method and re.search(path, r.path)]

    def wait_for_calls(
        self, method: str, path: str = "", count: int = 1, timeout: float = 60
    ) -> bool:
        """Wait until ``count`` requests match (as :meth:`calls`), for ``timeout`` s at most;
        whether they did. Tests wait on what a client did, never on the clock."""
        end = time.monotonic() + timeout
        while len(self.calls(method, path)) < count:
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)
        return True

    # Serving

    def handle(
        self, method: str, raw_path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, str, bytes | Iterator[bytes], dict[str, str]]:
        """One request -> (status, content type, body, extra headers); a watch's body is an
        iterator of its events, one JSON line each, sent as they come."""
        url = urlsplit(raw_path)
        query = parse_qs(url.query)
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        with self._lock:
            self.requests.append(Request(method, url.path, query, body, headers))
            fault = next(
                (f for f in self._faults if f.method == method and f.path.search(url.path)), None
            )
            if fault is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
        try:
            if fault is not None:
                time.sleep(fault.delay_s)
                if fault.status is not None:
                    extra = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                    raise _HttpError(
                        fault.status, fault.message or f"injected {fault.status}", extra
                    )
            watch = query.get("watch", [""])[0].lower() in ("true", "1")
            if method == "GET" and watch and (m := _WORKFLOWS.match(url.path)):
                return 200, "application/json", self._watch_workflow(m.group(1), query), {}
            with self._lock:
                return self._route(method, url.path, query, headers, body)
        except _HttpError as e:
            status_body = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": e.message,
                "reason": _REASONS.get(e.status, "Unknown"),
                "code": e.status,
            }
            return e.status, "application/json", json.dumps(status_body).encode(), e.headers

    def _route(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: dict[str, str],
        body: Any,
    ) -> tuple[int, str, bytes, dict[str, str]]:
        now = time.time()
        for many, one, kind, resource in (
            (_JOBS, _JOB, "PyTorchJob", "pytorchjobs.kubeflow.org"),
            (_TRAINJOBS, _TRAINJOB, "TrainJob", "trainjobs.trainer.kubeflow.org"),
        ):
            if (m := many.match(path)) and method == "POST":
                return self._json(201, self._create(m.group(1), body, now, kind))
            if m := one.match(path):
                ns, name = m.groups()
                job = self._live(ns, name)
                if job is None or job.kind != kind:
                    raise _HttpError(404, f'{resource} "{name}" not found')
                if method == "GET":
                    job.reads += 1
                    return self._json(200, self._render(job, now))
                if method == "DELETE":
                    del self._jobs[(ns, name)]
                    return self._json(
                        200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
                    )
                if method == "PATCH":
                    if headers.get("content-type") != "application/merge-patch+json":
                        raise _HttpError(
                            415, f"unsupported patch type {headers.get('content-type')}"
                        )
                    return self._json(200, self._patch(job, body, now))
        if (m := _WORKLOADS.match(path)) and method == "GET":
            return self._json(200, {"kind": "WorkloadList", "items": self._workloads(m.group(1))})
        if path == "/api/v1/nodes" and method == "GET":
            if self.nodes is None:
                raise _HttpError(
                    403,
                    'nodes is forbidden: User "system:serviceaccount:team-a:runner" cannot list '
                    'resource "nodes" in API group "" at the cluster scope',
                )
            return self._json(200, {"kind": "NodeList", "apiVersion": "v1", "items": self.nodes})
        if (m := _PODS.match(path)) and method == "GET":
            return self._json(200, self._pods(m.group(1), query, now))
        if (m := _LOG.match(path)) and method == "GET":
            return 200, "text/plain", self._log(*m.groups(), query, now).encode(), {}
        if (m := _EVENTS.match(path)) and method == "GET":
            return self._json(200, self._events(m.group(1), query, now))
        if (m := _WORKFLOW.match(path)) and method == "GET":
            if (wf := self.workflows.get((m.group(1), m.group(2)))) is None:
                raise _HttpError(404, f'workflows.argoproj.io "{m.group(2)}" not found')
            return self._json(200, wf)
        if _EXPS.match(path) or _EXP.match(path) or _TRIALS.match(path) or _TRIAL.match(path):
            return self._katib(method, path, query, headers, body, now)
        raise _HttpError(404, "the server could not find the requested resource")

    def _workloads(self, ns: str) -> list[dict[str, Any]]:
        out = []
        for name, workload in self.workloads.items():
            w = copy.deepcopy(workload)
            w.setdefault("metadata", {}).setdefault("name", f"pytorchjob-{name}")
            if (job := self._live(ns, name)) is not None:
                w["metadata"].setdefault("labels", {})["kueue.x-k8s.io/job-uid"] = job.body[
                    "metadata"
                ]["uid"]
            out.append(w)
        return out

    def _watch_workflow(self, ns: str, query: dict[str, list[str]]) -> Iterator[bytes]:
        """A watch of one Workflow (``fieldSelector=metadata.name=...``), as the API server
        serves it: the Workflow now (ADDED), then each change (MODIFIED, DELETED), until
        ``timeoutSeconds`` or the fake stops. Tests change :attr:`workflows` in place."""
        selector = query.get("fieldSelector", [""])[0]
        assert selector.startswith("metadata.name="), f"a watch of one Workflow, not {selector!r}"
        key = (ns, selector.removeprefix("metadata.name="))
        end = time.monotonic() + float(query.get("timeoutSeconds", ["300"])[0])
        last: dict[str, Any] | None = None
        while not self._stopping.is_set() and time.monotonic() < end:
            try:
                with self._lock:
                    now = copy.deepcopy(self.workflows.get(key))
            except RuntimeError:  # a test changing it at that moment: look again
                now = last
            if now != last:
                if now is None:
                    yield json.dumps({"type": "DELETED", "object": last}).encode() + b"\n"
                else:
                    kind = "ADDED" if last is None else "MODIFIED"
                    yield json.dumps({"type": kind, "object": now}).encode() + b"\n"
                last = now
            time.sleep(0.02)

    @staticmethod
    def _json(status: int, obj: Any) -> tuple[int, str, bytes, dict[str, str]]:
        return status, "application/json", json.dumps(obj).encode(), {}

    # The simulated operator

    def _store(self, body: dict[str, Any], scenario: Scenario, created: float) -> _Job:
        body = copy.deepcopy(body)
        meta = body["metadata"]
        meta.update(uid=str(uuid.uuid4()), resourceVersion="1", creationTimestamp=rfc3339(created))
        job = _Job(body, scenario, created)
        self._jobs[(job.namespace, job.name)] = job
        return job

    def _live(self, namespace: str, name: str) -> _Job | None:
        job = self._jobs.get((namespace, name))
        if job is not None and job.gone_at is not None and time.time() >= job.gone_at:
            del self._jobs[(namespace, name)]
            return None
        return job

    def _create(self, namespace: str, body: Any, now: float, kind: str) -> dict[str, Any]:
        name = str(((body or {}).get("metadata") or {}).get("name") or "")
        resource = "pytorchjobs.kubeflow.org" if kind == "PyTorchJob" else TRAINJOBS_RESOURCE
        if not name:
            raise _HttpError(
                422, f"{kind}.{resource.split('.', 1)[1]} is invalid: metadata.name: Required"
            )
        if (body or {}).get("kind") != kind:
            raise _HttpError(400, f"the body is a {(body or {}).get('kind')}, not a {kind}")
        if self._live(namespace, name) is not None:
            raise _HttpError(409, f'{resource} "{name}" already exists')
        body = copy.deepcopy(body)
        body["metadata"]["namespace"] = namespace
        if kind == "TrainJob":
            # Trainer's defaulting webhook stamps each runtime patch with the time it was made.
            for patch in (body.get("spec") or {}).get("runtimePatches") or []:
                patch.setdefault("time", rfc3339(now))
        job = self._store(body, self.scenario, now)
        self.created.append(f"{namespace}/{name}")
        return self._render(job, now)

    def _patch(self, job: _Job, patch: Any, now: float) -> dict[str, Any]:
        was = job.suspended
        _merge(job.body, patch)
        suspended = job.suspended
        if suspended and not was:
            job.frozen_at = now
        elif was and not suspended and job.frozen_at is not None:
            # Resuming restarts the clock where it stopped (a real job restarts its pods).
            job.created += now - job.frozen_at
            job.frozen_at = None
            job.resumed = True
        return self._render(job, now)

    def _render(self, job: _Job, now: float) -> dict[str, Any]:
        if job.kind == "TrainJob":
            return self._render_trainjob(job, now)
        out = copy.deepcopy(job.body)
        age, sc, name = job.age(now), job.scenario, job.name
        stamp = rfc3339(job.created)
        conds: list[dict[str, Any]] = [
            _cond("Created", "True", "PyTorchJobCreated", f"PyTorchJob {name} is created.", stamp)
        ]
        finished = job.finished(now)
        if age >= sc.pending_s:
            running = "False" if finished or job.frozen_at is not None else "True"
            conds.append(
                _cond(
                    "Running", running, "PyTorchJobRunning", f"PyTorchJob {name} is running.", stamp
                )
            )
        if job.frozen_at is not None and not finished:
            conds.append(
                _cond(
                    "Suspended",
                    "True",
                    "PyTorchJobSuspended",
                    f"PyTorchJob {name} is suspended.",
                    stamp,
                )
            )
        if finished and sc.outcome is not None:
            default = (
                f"PyTorchJob {job.namespace}/{name} successfully completed."
                if sc.outcome == "Succeeded"
                else f"PyTorchJob {job.namespace}/{name} is failed because 1 Master replica(s) "
                "failed."
            )
            conds.append(
                _cond(
                    sc.outcome,
                    "True",
                    sc.reason or f"PyTorchJob{sc.outcome}",
                    sc.message or default,
                    stamp,
                )
            )
        out["status"] = {"conditions": conds, "startTime": stamp}
        return out

    def _render_trainjob(self, job: _Job, now: float) -> dict[str, Any]:
        """A TrainJob as Trainer reports it: Complete/Failed/Suspended and jobsStatus."""
        out = copy.deepcopy(job.body)
        out["spec"].setdefault("suspend", False)
        out["spec"].setdefault("managedBy", "trainer.kubeflow.org/trainjob-controller")
        age, sc = job.age(now), job.scenario
        stamp = rfc3339(job.created)
        finished = job.finished(now)
        conds: list[dict[str, Any]] = []
        if job.frozen_at is not None and not finished:
            conds.append(_cond("Suspended", "True", "Suspended", "TrainJob is suspended", stamp))
        elif job.resumed:
            conds.append(_cond("Suspended", "False", "Resumed", "TrainJob is resumed", stamp))
        if finished and sc.outcome is not None:
            if sc.outcome == "Succeeded":
                reason, message = "AllJobsCompleted", "jobset completed successfully"
            else:
                reason, message = "FailedJobs", "jobset failed due to one or more job failures"
            conds.append(
                _cond(
                    "Complete" if sc.outcome == "Succeeded" else "Failed",
                    "True",
                    sc.reason or reason,
                    sc.message or message,
                    stamp,
                )
            )
        running = age >= sc.pending_s and not finished and job.frozen_at is None
        status: dict[str, Any] = {
            "jobsStatus": [
                {
                    "name": NODE,
                    "active": 1 if running or (not finished and job.frozen_at is None) else 0,
                    "ready": 1 if running else 0,
                    "succeeded": 1 if finished and sc.outcome == "Succeeded" else 0,
                    "failed": 1 if finished and sc.outcome == "Failed" else 0,
                    "suspended": 1 if job.frozen_at is not None and not finished else 0,
                }
            ]
        }
        if conds:
            status["conditions"] = conds
        out["status"] = status
        return out

    def _node_pods(self, job: _Job, now: float) -> list[dict[str, Any]]:
        """The pods of a job: a PyTorchJob's master (and its worker, when the scenario has one
        held), or every node of a TrainJob's JobSet."""
        pods = self._replica_pods(job, now)
        if job.finished(now) or len(pods) < 2:
            return pods
        peer, sc = pods[1], job.scenario
        if sc.peer_unschedulable:
            peer["status"] = {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": sc.peer_unschedulable,
                    }
                ],
            }
        elif sc.peer_lost_on:
            peer["metadata"]["deletionTimestamp"] = rfc3339(job.created)
            peer["spec"]["nodeName"] = sc.peer_lost_on
            peer["status"]["conditions"] = [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByTaintManager",
                    "message": "Taint manager: deleting due to NoExecute taint",
                }
            ]
        return pods

    def _replica_pods(self, job: _Job, now: float) -> list[dict[str, Any]]:
        master = self._master(job, now)
        if master is None:
            return []
        if job.kind != "TrainJob":
            if not (job.scenario.peer_unschedulable or job.scenario.peer_lost_on):
                return [master]
            worker = copy.deepcopy(master)
            worker["metadata"]["name"] = f"{job.name}-worker-0"
            worker["metadata"]["uid"] = str(
                uuid.uuid5(uuid.NAMESPACE_URL, worker["metadata"]["name"])
            )
            worker["metadata"]["labels"]["training.kubeflow.org/replica-type"] = "worker"
            del worker["metadata"]["labels"]["training.kubeflow.org/job-role"]  # the master's
            return [master, worker]
        pods = []
        for index in range(job.nodes):
            pod = copy.deepcopy(master)
            suffix = uuid.uuid5(uuid.NAMESPACE_URL, f"{job.body['metadata']['uid']}/{index}").hex
            pod["metadata"]["name"] = f"{job.name}-{NODE}-0-{index}-{suffix[:5]}"
            # As observed on JobSet v0.12 / Trainer v2.3 (Kubernetes 1.34): JobSet's keys are
            # both labels and annotations, the completion index both (the label since 1.28), and
            # Trainer's ancestor label stays on the Job: it is not a pod label.
            jobset = {
                "jobset.sigs.k8s.io/jobset-name": job.name,
                "jobset.sigs.k8s.io/replicatedjob-name": NODE,
                "jobset.sigs.k8s.io/job-index": "0",
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "batch.kubernetes.io/job-completion-index": str(index),
            }
            pod["metadata"]["labels"] = {
                **jobset,
                "batch.kubernetes.io/job-name": f"{job.name}-{NODE}-0",
            }
            pod["metadata"]["annotations"] = dict(jobset)
            pod["spec"]["containers"][0]["name"] = NODE
            for container in pod["status"].get("containerStatuses") or []:
                container["name"] = NODE
            pods.append(pod)
        return pods

    def _master(self, job: _Job, now: float) -> dict[str, Any] | None:
        if job.frozen_at is not None and not job.finished(now):
            return None  # Suspended: the operator deleted the pods.
        age, sc = job.age(now), job.scenario
        if job.finished(now):
            code = sc.exit_code if sc.exit_code is not None else int(sc.outcome == "Failed")
            phase, state = (
                "Succeeded" if code == 0 else "Failed",
                {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}},
            )
        elif age >= sc.pending_s:
            phase, state = "Running", {"running": {"startedAt": rfc3339(job.created)}}
        else:
            phase, state = "Pending", {"waiting": {"reason": "ContainerCreating"}}
        status: dict[str, Any] = {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "pytorch",
                    "image": "gpupipe:test",
                    "imageID": "",
                    "ready": phase == "Running",
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        if phase == "Pending" and sc.unschedulable:
            # No node yet: no container statuses, the scheduler's condition instead.
            status = {
                "phase": phase,
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": sc.unschedulable,
                    }
                ],
            }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job.name}-master-0",
                "namespace": job.namespace,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, job.body["metadata"]["uid"])),
                "creationTimestamp": rfc3339(job.created),
                "labels": {
                    "training.kubeflow.org/job-name": job.name,
                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                    "training.kubeflow.org/replica-type": "master",
                    "training.kubeflow.org/replica-index": "0",
                    "training.kubeflow.org/job-role": "master",
                },
            },
            "spec": {"containers": [{"name": "pytorch", "image": "gpupipe:test"}]},
            "status": status,
        }

    def _pods(self, ns: str, query: dict[str, list[str]], now: float) -> dict[str, Any]:
        by_name = (query.get("fieldSelector") or [""])[0]
        if by_name.startswith("metadata.name="):
            pod = self.pods.get((ns, by_name.split("=", 1)[1]))
            return {"apiVersion": "v1", "kind": "PodList", "items": [pod] if pod else []}
        want = dict(
            kv.split("=", 1) for kv in (query.get("labelSelector") or [""])[0].split(",") if kv
        )
        items = []
        for (job_ns, name), _ in list(self._jobs.items()):
            job = self._live(job_ns, name)
            pods = [] if job is None or job_ns != ns else self._node_pods(job, now)
            for pod in pods:
                if all(pod["metadata"]["labels"].get(k) == v for k, v in want.items()):
                    items.append(pod)
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}

    def _log(self, ns: str, pod_name: str, query: dict[str, list[str]], now: float) -> str:
        m = _POD_NAME.match(pod_name)
        job = None if m is None else self._live(ns, m.group("job"))
        pods = {} if job is None else {p["metadata"]["name"]: p for p in self._node_pods(job, now)}
        pod = pods.get(pod_name)
        if job is None or pod is None:
            raise _HttpError(404, f'pods "{pod_name}" not found')
        (container,) = pod["spec"]["containers"]
        if query.get("container", [container["name"]])[0] != container["name"]:
            raise _HttpError(
                400,
                f"container {query['container'][0]} is not valid for pod {pod_name}",
            )
        if pod["status"]["phase"] == "Pending":
            raise _HttpError(
                400,
                f'container "{container["name"]}" in pod "{pod_name}" is waiting to start: '
                "ContainerCreating",
            )
        age = job.age(now)
        index = int(m.group("index") or 0) if m else 0
        lines = [
            (job.created + t, line if index == 0 else f"[node {index}] {line}")
            for t, line in zip(job.scenario.line_times(), job.scenario.lines, strict=True)
            if t <= age
        ]
        if "sinceSeconds" in query:
            cutoff = now - int(query["sinceSeconds"][0])
            lines = [(t, line) for t, line in lines if t >= cutoff]
        if "tailLines" in query:
            lines = lines[len(lines) - int(query["tailLines"][0]) :] if lines else []
        # Like the API server (Go strconv.ParseBool), "True" counts: the Python client sends that.
        stamps = (query.get("timestamps") or ["false"])[0].lower() in ("true", "1", "t")
        return "".join(
            (f"{rfc3339(t, nanos=True)} " if stamps else "") + line + "\n" for t, line in lines
        )

    def _events(self, ns: str, query: dict[str, list[str]], now: float) -> dict[str, Any]:
        selector = (query.get("fieldSelector") or [""])[0]
        want = selector.removeprefix("involvedObject.name=")
        items = []
        for (job_ns, name), _ in list(self._jobs.items()):
            job = self._live(job_ns, name)
            if job is None or job_ns != ns:
                continue
            pods = self._node_pods(job, now)
            pod = pods[0]["metadata"]["name"] if pods else f"{name}-master-0"
            if job.kind == "TrainJob":
                created = (
                    "JobSet",
                    name,
                    "Normal",
                    "SuccessfulCreate",
                    f"Created job {name}-node-0",
                )
            else:
                created = (
                    "PyTorchJob",
                    name,
                    "Normal",
                    "SuccessfulCreatePod",
                    f"Created pod: {pod}",
                )
            happened = [
                (*created, 0.0),
                *(("Pod", pod, *e, 0.01) for e in job.scenario.pod_events),
                *((job.kind, name, *e, 0.01) for e in job.scenario.job_events),
            ]
            if job.finished(now) and job.scenario.outcome == "Failed" and job.kind == "TrainJob":
                happened.append(
                    (
                        "JobSet",
                        name,
                        "Warning",
                        "FailedJobs",
                        f"job {name}-node-0 failed: BackoffLimitExceeded",
                        job.scenario.finish_at(),
                    )
                )
            elif job.finished(now) and job.scenario.outcome == "Failed":
                happened.append(
                    (
                        "PyTorchJob",
                        name,
                        "Warning",
                        "PyTorchJobFailed",
                        f"PyTorchJob {name} is failed because 1 Master replica(s) failed.",
                        job.scenario.finish_at(),
                    )
                )
            for i, (kind, obj, typ, reason, message, at) in enumerate(happened):
                if obj != want:
                    continue
                stamp = rfc3339(job.created + at)
                items.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Event",
                        "metadata": {
                            "name": f"{obj}.{i}",
                            "namespace": ns,
                            "creationTimestamp": stamp,
                        },
                        "involvedObject": {"kind": kind, "name": obj, "namespace": ns},
                        "type": typ,
                        "reason": reason,
                        "message": message,
                        "count": 1,
                        "firstTimestamp": stamp,
                        "lastTimestamp": stamp,
                        "source": {"component": "pytorchjob-controller"},
                    }
                )
        return {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": items}

    # The simulated Katib

    def _live_experiment(self, namespace: str, name: str) -> _Experiment | None:
        exp = self._experiments.get((namespace, name))
        if exp is not None and exp.gone_at is not None and time.time() >= exp.gone_at:
            del self._experiments[(namespace, name)]
            return None
        return exp

    def _katib(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: dict[str, str],
        body: Any,
        now: float,
    ) -> tuple[int, str, bytes, dict[str, str]]:
        if (m := _EXPS.match(path)) and method == "POST":
            ns = m.group(1)
            name = str(((body or {}).get("metadata") or {}).get("name") or "")
            if not name:
                raise _HttpError(422, "Experiment.kubeflow.org is invalid: metadata.name: Required")
            if self._live_experiment(ns, name) is not None:
                raise _HttpError(409, f'experiments.kubeflow.org "{name}" already exists')
            body = copy.deepcopy(body)
            meta = body["metadata"]
            meta.update(
                namespace=ns,
                uid=str(uuid.uuid4()),
                resourceVersion="1",
                creationTimestamp=rfc3339(now),
            )
            exp = _Experiment(body, self.experiment_scenario, now)
            self._experiments[(ns, name)] = exp
            self.created_experiments.append(f"{ns}/{name}")
            return self._json(201, self._render_experiment(exp, now))
        if m := _EXP.match(path):
            ns, name = m.groups()
            exp = self._live_experiment(ns, name)
            if exp is None:
                raise _HttpError(404, f'experiments.kubeflow.org "{name}" not found')
            if method == "GET":
                exp.reads += 1
                return self._json(200, self._render_experiment(exp, now))
            if method == "DELETE":
                del self._experiments[(ns, name)]
                return self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
            if method == "PATCH":
                if headers.get("content-type") != "application/merge-patch+json":
                    raise _HttpError(415, f"unsupported patch type {headers.get('content-type')}")
                _merge(exp.body, body)
                return self._json(200, self._render_experiment(exp, now))
        if (m := _TRIALS.match(path)) and method == "GET":
            ns = m.group(1)
            selector = (query.get("labelSelector") or [""])[0]
            want = selector.removeprefix("katib.kubeflow.org/experiment=")
            items = []
            for (exp_ns, name), _ in list(self._experiments.items()):
                exp = self._live_experiment(exp_ns, name)
                if exp is not None and exp_ns == ns and name == want:
                    items += self._trials(exp, now)
            return self._json(
                200,
                {
                    "apiVersion": "kubeflow.org/v1beta1",
                    "kind": "TrialList",
                    "metadata": {},
                    "items": items,
                },
            )
        if (m := _TRIAL.match(path)) and method == "GET":
            ns, name = m.groups()
            for (exp_ns, exp_name), _ in list(self._experiments.items()):
                exp = self._live_experiment(exp_ns, exp_name)
                if exp is None or exp_ns != ns:
                    continue
                for trial in self._trials(exp, now):
                    if trial["metadata"]["name"] == name:
                        return self._json(200, trial)
            raise _HttpError(404, f'trials.kubeflow.org "{name}" not found')
        raise _HttpError(405, f"method {method} not allowed")

    def _trials(self, exp: _Experiment, now: float) -> list[dict[str, Any]]:
        age = now - exp.created
        finish = exp.finish_at()
        spec = exp.body["spec"]
        metric = spec["objective"]["objectiveMetricName"]
        plans = exp.plans()
        out = []
        for i, (name, plan, start, end) in enumerate(plans):
            if start > age or (finish is not None and start >= finish):
                continue
            assignments = plan.assignments or _assignments(spec, i, len(plans))
            stamp = rfc3339(exp.created + start)
            conds = [_cond("Created", "True", "TrialCreated", "Trial is created", stamp)]
            observation = None
            if age >= end:
                state = plan.outcome
                reason = {
                    "Succeeded": "TrialSucceeded",
                    "Failed": "TrialFailed",
                    "EarlyStopped": "TrialEarlyStopped",
                }[state]
                conds.append(_cond("Running", "False", reason, "", stamp))
                conds.append(_cond(state, "True", reason, plan.message or f"Trial {state}", stamp))
                if state != "Failed":
                    value = plan.value if plan.value is not None else 1 / (i + 2)
                    v = f"{value}"
                    observation = {"metrics": [{"name": metric, "min": v, "max": v, "latest": v}]}
            elif finish is not None and age >= finish:
                conds.append(_cond("Killed", "True", "TrialKilled", "Trial is killed", stamp))
            else:
                conds.append(_cond("Running", "True", "TrialRunning", "Trial is running", stamp))
            trial = {
                "apiVersion": "kubeflow.org/v1beta1",
                "kind": "Trial",
                "metadata": {
                    "name": name,
                    "namespace": exp.body["metadata"]["namespace"],
                    "labels": {"katib.kubeflow.org/experiment": exp.name},
                    "creationTimestamp": stamp,
                },
                "spec": {
                    "objective": spec["objective"],
                    "parameterAssignments": [
                        {"name": k, "value": v} for k, v in assignments.items()
                    ],
                },
                "status": {"conditions": conds},
            }
            if observation is not None:
                trial["status"]["observation"] = observation
            out.append(trial)
        return out

    def _render_experiment(self, exp: _Experiment, now: float) -> dict[str, Any]:
        out = copy.deepcopy(exp.body)
        stamp = rfc3339(exp.created)
        trials = self._trials(exp, now)
        lists: dict[str, list[str]] = {
            k: [] for k in ("Succeeded", "Failed", "EarlyStopped", "Killed", "Running")
        }
        minimize = out["spec"]["objective"].get("type") != "maximize"
        best: dict[str, Any] | None = None
        for t in trials:
            state = next(
                c["type"] for c in reversed(t["status"]["conditions"]) if c["status"] == "True"
            )
            lists.setdefault(state, []).append(t["metadata"]["name"])
            obs = t["status"].get("observation")
            if obs is None:
                continue
            v = float(obs["metrics"][0]["latest"])
            if best is None or (v < best["v"] if minimize else v > best["v"]):
                best = {"v": v, "t": t}
        conds = [_cond("Created", "True", "ExperimentCreated", "Experiment is created", stamp)]
        finish = exp.finish_at()
        if finish is not None and now - exp.created >= finish:
            conds.append(_cond("Running", "False", "ExperimentRunning", "", stamp))
            sc = exp.scenario
            if sc.outcome == "Failed" or exp.failed_early():
                conds.append(_cond("Failed", "True", sc.reason, sc.message, stamp))
            else:
                conds.append(
                    _cond(
                        "Succeeded",
                        "True",
                        "ExperimentMaxTrialsReached",
                        "Experiment has succeeded because max trial count has reached",
                        stamp,
                    )
                )
        else:
            conds.append(
                _cond("Running", "True", "ExperimentRunning", "Experiment is running", stamp)
            )
        status: dict[str, Any] = {
            "startTime": stamp,
            "conditions": conds,
            "trials": len(trials),
            "trialsSucceeded": len(lists["Succeeded"]),
            "trialsFailed": len(lists["Failed"]),
            "trialsEarlyStopped": len(lists["EarlyStopped"]),
            "trialsKilled": len(lists["Killed"]),
            "trialsRunning": len(lists["Running"]),
            "trialsPending": 0,
            "succeededTrialList": lists["Succeeded"],
            "failedTrialList": lists["Failed"],
            "runningTrialList": lists["Running"],
        }
        if best is not None:
            t = best["t"]
            status["currentOptimalTrial"] = {
                "bestTrialName": t["metadata"]["name"],
                "parameterAssignments": t["spec"]["parameterAssignments"],
                "observation": t["status"]["observation"],
            }
        out["status"] = status
        return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: FakeKubeApi

    def _serve(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k.lower(): v.split(";")[0].strip() for k, v in self.headers.items()}
        status, ctype, body, extra = self.api.handle(self.command, self.path, headers, raw)
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            if isinstance(body, bytes):
                self.send_header("Content-Length", str(len(body)))
            else:
                self.send_header("Transfer-Encoding", "chunked")
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            if isinstance(body, bytes):
                self.wfile.write(body)
                return
            for chunk in body:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # The client gave up (a request timeout): as on a real server, no matter.

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


def minimal_job(name: str, namespace: str = "team-a") -> dict[str, Any]:
    """A small valid PyTorchJob (tests that do not need the full spec builder)."""
    template = {
        "spec": {"containers": [{"name": "pytorch", "image": "gpupipe:test", "command": ["true"]}]}
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nprocPerNode": "1",
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}
            },
            "runPolicy": {"cleanPodPolicy": "None"},
        },
    }


def minimal_trainjob(name: str, namespace: str = "team-a") -> dict[str, Any]:
    """A small valid TrainJob (tests that do not need the full spec builder)."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"image": "gpupipe:test", "command": ["true"], "numNodes": 1},
        },
    }


def _cond(kind: str, status: str, reason: str, message: str, stamp: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastUpdateTime": stamp,
        "lastTransitionTime": stamp,
    }


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def rbac_call(method: str, path: str, query: dict[str, list[str]]) -> tuple[str, str, str]:
    """(API group, resource, verb) that RBAC must grant for a request the fake recorded."""
    m = re.match(r"^/apis/([^/]+)/", path)
    group = m.group(1) if m else ""
    if "/namespaces/" not in path:  # cluster-scoped: /api/v1/nodes
        parts = path.split("?", 1)[0].split("/")[4 if group else 3 :]
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}.get(method)
        return group, parts[0], verb or ("get" if len(parts) >= 2 else "list")
    parts = path.split("/namespaces/", 1)[1].split("?", 1)[0].split("/")[1:]
    resource = "/".join(parts[::2])
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}.get(method)
    if query.get("watch", [""])[0].lower() in ("true", "1"):
        verb = "watch"
    return group, resource, verb or ("get" if len(parts) >= 2 else "list")
