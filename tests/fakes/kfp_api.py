"""A fake KFP API server (REST v2beta1) on 127.0.0.1 for the ``gpupipe`` cluster commands.

It serves the paths ``pipelines/cluster.py`` calls and checks every JSON body strictly against
the request models of ``kfp_server_api`` (unknown fields and wrong types are a 400, as the real
server's protojson decoding makes them), then lets the client library's own deserializer read
it. Answers are the same models serialized as the API does, errors carry KFP's body shape
(``{"error", "code", "message", "details"}``). Runs follow a script of states (PENDING ->
RUNNING -> FAILED with task details), faults can be injected per path, requests can be made to
stall (a port-forward that accepts and never answers), listings can hand out a script of page
tokens (one repeated for ever, as a broken server might), a bearer token and forbidden
namespaces can be required, it can serve over TLS with a certificate of a private CA, and every
request is recorded.
"""

from __future__ import annotations

import email.parser
import json
import re
import ssl
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kfp_server_api as kapi
import yaml

API = "/apis/v2beta1"
_GRPC = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 500: 13, 503: 14}
_SCALARS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
    "object": (object,),
}


class ApiError(Exception):
    """An error answer: HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def check_model(data: Any, type_name: str, where: str = "body") -> None:
    """Check JSON ``data`` against a ``kfp_server_api`` type strictly.

    Raises:
        ApiError: 400 naming the first unknown field or wrong type.
    """
    if type_name in _SCALARS:
        ok = isinstance(data, _SCALARS[type_name]) and not (
            type_name in ("int", "float") and isinstance(data, bool)
        )
        if not ok:
            raise ApiError(400, f"{where}: expected {type_name}, got {type(data).__name__}")
        return
    if type_name == "datetime":
        if not isinstance(data, str):
            raise ApiError(400, f"{where}: expected an RFC 3339 time, got {data!r}")
        try:
            datetime.fromisoformat(data.replace("Z", "+00:00"))
        except ValueError as e:
            raise ApiError(400, f"{where}: bad time {data!r}") from e
        return
    if m := re.fullmatch(r"list\[(.+)\]", type_name):
        if not isinstance(data, list):
            raise ApiError(400, f"{where}: expected a list")
        for i, item in enumerate(data):
            check_model(item, m.group(1), f"{where}[{i}]")
        return
    if m := re.fullmatch(r"dict\(str, (.+)\)", type_name):
        if not isinstance(data, dict):
            raise ApiError(400, f"{where}: expected an object")
        for k, v in data.items():
            check_model(v, m.group(1), f"{where}.{k}")
        return
    klass = getattr(kapi.models, type_name)
    allowed = getattr(klass, "allowable_values", None)
    if allowed is not None:
        if data not in allowed:
            raise ApiError(400, f"{where}: invalid value {data!r} for enum {type_name}")
        return
    if not isinstance(data, dict):
        raise ApiError(400, f"{where}: expected an object for {type_name}")
    json_to_attr = {v: k for k, v in klass.attribute_map.items()}
    for key, value in data.items():
        if key not in json_to_attr:
            raise ApiError(400, f'{where}: unknown field "{key}" in {type_name}')
        if value is not None:
            check_model(value, klass.openapi_types[json_to_attr[key]], f"{where}.{key}")


_CLIENT = kapi.ApiClient()


def parse_body(raw: bytes, type_name: str) -> Any:
    """Strictly check a JSON body, then deserialize it with the client's own deserializer."""
    try:
        data = json.loads(raw or b"null")
    except ValueError as e:
        raise ApiError(400, f"body is not JSON: {e}") from e
    check_model(data, type_name)
    return _CLIENT._ApiClient__deserialize(data, type_name)  # type: ignore[attr-defined]


def to_json(model: Any) -> Any:
    """A model as the API writes it (JSON names, RFC 3339 times, ``None`` fields left out)."""
    return _CLIENT.sanitize_for_serialization(model)


@dataclass
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class RunScript:
    """The states a run shows on successive GETs (the last one stays)."""

    states: list[str] = field(default_factory=lambda: ["PENDING", "RUNNING", "SUCCEEDED"])
    failed_task: str | None = None
    error: str = "exit status 2"
    pending: dict[str, str] = field(default_factory=dict)
    """Argo node name -> message of a pod node shown Pending while the run is not finished (in
    the Workflow that the v1beta1 API returns)."""


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _id() -> str:
    return str(uuid.uuid4())


class FakeKfp:
    """The server's state and its request handling; :func:`serve` puts it on a port."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Recorded] = []
        self.pipelines: dict[str, kapi.V2beta1Pipeline] = {}
        self.versions: dict[str, list[kapi.V2beta1PipelineVersion]] = {}
        self.experiments: dict[str, kapi.V2beta1Experiment] = {}
        self.runs: dict[str, kapi.V2beta1Run] = {}
        self.run_polls: dict[str, int] = {}
        self.recurring: dict[str, kapi.V2beta1RecurringRun] = {}
        self.stale_mode_reads = 0
        """After an enable or disable, this many reads of that recurring run still give its old
        mode, as KFP's persistence agent puts a copy from before the change back for a while."""
        self._stale: dict[str, tuple[str, str, int]] = {}
        self.run_script = RunScript()
        self.token: str | None = None
        self.forbidden_namespaces: set[str] = set()
        self.faults: list[list[Any]] = []
        self.stalls: list[list[Any]] = []
        self.page_tokens: list[str] = []
        """Next page tokens the listings answer with, one per listing request, before their own;
        while a scripted token is handed out the page served is the first one."""
        self.next_run_id: str | None = None
        """The id the next created run gets (a server's odd answer), instead of a UUID."""
        self.closing = threading.Event()
        self.url = ""

    # -- scripting -------------------------------------------------------------------------------
    def fail(self, method: str, path_pattern: str, status: int, times: int = 1) -> None:
        """Answer the next ``times`` requests matching ``method`` and the regex with ``status``."""
        self.faults.append([method, re.compile(path_pattern), status, times])

    def stall(self, method: str, path_pattern: str, seconds: float, times: int = 1 << 30) -> None:
        """Hold the next ``times`` requests matching ``method`` and the regex ``seconds`` before
        answering them (or until the server stops), as a stalled port-forward does."""
        self.stalls.append([method, re.compile(path_pattern), seconds, times])

    def calls(self, method: str | None = None, path_prefix: str = "") -> list[Recorded]:
        """Recorded requests, optionally filtered."""
        return [
            r
            for r in self.requests
            if (method is None or r.method == method) and r.path.startswith(path_prefix)
        ]

    # -- dispatch --------------------------------------------------------------------------------
    def handle(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        hold = 0.0
        with self.lock:
            self.requests.append(Recorded(method, path, query, headers, body))
            for stall in self.stalls:
                if stall[0] == method and stall[1].search(path) and stall[3] > 0:
                    stall[3] -= 1
                    hold = stall[2]
                    break
        if hold:
            self.closing.wait(hold)  # outside the lock: other requests go on
        with self.lock:
            for fault in self.faults:
                if fault[0] == method and fault[1].search(path) and fault[3] > 0:
                    fault[3] -= 1
                    raise ApiError(fault[2], f"injected {fault[2]}")
            if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
                raise ApiError(401, "Unauthenticated: failed to authenticate the request")
            ns = query.get("namespace")
            if ns in self.forbidden_namespaces:
                self._deny(ns, method)
            return self._route(method, path, query, headers, body)

    def _deny(self, ns: str, method: str) -> None:
        verb = "list" if method == "GET" else "create"
        raise ApiError(
            403,
            "PermissionDenied: User 'system:serviceaccount:team-a:default-editor' is not "
            f"authorized with reason: (request: &ResourceAttributes{{Namespace:{ns},"
            f"Verb:{verb},Group:pipelines.kubeflow.org}})",
        )

    def _route(
        self, method: str, path: str, q: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        if method == "GET" and (v1 := re.fullmatch(r"/apis/v1beta1/runs/([^/:]+)", path)):
            return 200, self._get_run_v1(v1.group(1))
        if not path.startswith(API):
            raise ApiError(404, f"Not Found: {path}")
        rest = path[len(API) :]
        routes: list[tuple[str, str, Any]] = [
            ("GET", r"/healthz", lambda: {"multi_user": bool(self.forbidden_namespaces)}),
            ("GET", r"/pipelines", lambda: self._list("pipelines", self._pipelines(q), q)),
            (
                "POST",
                r"/pipelines",
                lambda: self._create_pipeline(parse_body(body, "V2beta1Pipeline")),
            ),
            ("POST", r"/pipelines/upload", lambda: self._upload(q, headers, body, new=True)),
            (
                "POST",
                r"/pipelines/upload_version",
                lambda: self._upload(q, headers, body, new=False),
            ),
            ("GET", r"/pipelines/([^/]+)/versions", lambda pid: self._list_versions(pid, q)),
            ("GET", r"/pipelines/([^/]+)/versions/([^/:]+)", self._get_version),
            ("GET", r"/pipelines/([^/:]+)", lambda pid: to_json(self._pipeline(pid))),
            ("GET", r"/experiments", lambda: self._list("experiments", self._experiments(q), q)),
            (
                "POST",
                r"/experiments",
                lambda: self._create_experiment(parse_body(body, "V2beta1Experiment")),
            ),
            ("POST", r"/runs", lambda: self._create_run(parse_body(body, "V2beta1Run"))),
            ("GET", r"/runs/([^/:]+)", self._get_run),
            (
                "GET",
                r"/recurringruns",
                lambda: self._list("recurringRuns", self._recurring_runs(q), q),
            ),
            (
                "POST",
                r"/recurringruns",
                lambda: self._create_recurring(parse_body(body, "V2beta1RecurringRun")),
            ),
            ("GET", r"/recurringruns/([^/:]+)", self._get_recurring),
            ("DELETE", r"/recurringruns/([^/:]+)", self._delete_recurring),
            ("POST", r"/recurringruns/([^/:]+):(enable|disable)", self._toggle),
        ]
        for m, pattern, fn in routes:
            match = re.fullmatch(pattern, rest)
            if m == method and match:
                return 200, fn(*match.groups())
        raise ApiError(404 if method == "GET" else 405, f"no route {method} {path}")

    # -- helpers ---------------------------------------------------------------------------------
    @staticmethod
    def _filter(q: dict[str, str]) -> list[tuple[str, str]]:
        if "filter" not in q:
            return []
        try:
            preds = json.loads(q["filter"])["predicates"]
        except (ValueError, KeyError, TypeError) as e:
            raise ApiError(400, f"Invalid input error: bad filter {q['filter']!r}") from e
        out = []
        for p in preds:
            if p.get("operation") not in (1, "EQUALS") or "key" not in p:
                raise ApiError(400, f"Invalid input error: unsupported predicate {p}")
            out.append((p["key"], p.get("stringValue", p.get("string_value"))))
        return out

    def _matches(self, obj: Any, q: dict[str, str]) -> bool:
        return all(getattr(obj, key, None) == value for key, value in self._filter(q))

    def _list(self, key: str, items: list[Any], q: dict[str, str]) -> dict[str, Any]:
        token = q.get("page_token") or "0"
        start = int(token) if token.isdigit() else 0
        size = int(q.get("page_size") or 20)
        page = items[start : start + size]
        out: dict[str, Any] = {"total_size": len(items)}
        if page:
            out[key] = [to_json(x) for x in page]
        if self.page_tokens:
            out["next_page_token"] = self.page_tokens.pop(0)
        elif start + size < len(items):
            out["next_page_token"] = str(start + size)
        return out

    # -- pipelines -------------------------------------------------------------------------------
    def _pipelines(self, q: dict[str, str]) -> list[kapi.V2beta1Pipeline]:
        ns = q.get("namespace") or None
        return [
            p
            for p in self.pipelines.values()
            if (p.namespace or None) in (ns, None) and self._matches(p, q)
        ]

    def _pipeline(self, pid: str) -> kapi.V2beta1Pipeline:
        if pid not in self.pipelines:
            raise ApiError(
                404, f"Failed to get pipeline: ResourceNotFoundError: Pipeline {pid} not found"
            )
        return self.pipelines[pid]

    def _create_pipeline(self, p: kapi.V2beta1Pipeline) -> Any:
        if p.pipeline_id or p.created_at:
            raise ApiError(400, "Invalid input error: pipeline_id and created_at are output only")
        if not p.display_name:
            raise ApiError(400, "Invalid input error: pipeline display_name is empty")
        if p.namespace in self.forbidden_namespaces:
            self._deny(p.namespace, "POST")
        if any(
            x.display_name == p.display_name and x.namespace == p.namespace
            for x in self.pipelines.values()
        ):
            raise ApiError(409, f"Already exist error: pipeline {p.display_name!r} already exists")
        p.pipeline_id, p.created_at = _id(), _now()
        p.name = p.name or p.display_name
        self.pipelines[p.pipeline_id] = p
        self.versions[p.pipeline_id] = []
        return to_json(p)

    def _upload(self, q: dict[str, str], headers: dict[str, str], body: bytes, *, new: bool) -> Any:
        ctype = headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            raise ApiError(400, f"Failed to upload: want multipart/form-data, got {ctype!r}")
        msg = email.parser.BytesParser().parsebytes(
            b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body
        )
        parts = {p.get_param("name", header="content-disposition"): p for p in msg.get_payload()}
        upload = parts.get("uploadfile")
        if upload is None:
            raise ApiError(400, "Failed to upload: missing uploadfile")
        filename = upload.get_filename() or ""
        if not filename.endswith((".yaml", ".yml", ".zip", ".tar.gz")):
            raise ApiError(400, f"Failed to upload: unexpected file name {filename!r}")
        docs = [d for d in yaml.safe_load_all(upload.get_payload(decode=True)) if d]
        if not docs or "pipelineInfo" not in docs[0]:
            raise ApiError(400, "Failed to upload: not a pipeline spec")
        if new:
            name = q.get("display_name") or q.get("name") or filename
            p = kapi.V2beta1Pipeline(
                name=q.get("name") or name, display_name=name, namespace=q.get("namespace")
            )
            self._create_pipeline(p)
            pid, vname = p.pipeline_id, p.name
        else:
            pid = q.get("pipelineid") or ""
            self._pipeline(pid)
            vname = q.get("name") or filename
            if any(v.name == vname for v in self.versions[pid]):
                raise ApiError(
                    409, f"Already exist error: pipeline version {vname!r} already exists"
                )
        v = kapi.V2beta1PipelineVersion(
            pipeline_id=pid,
            pipeline_version_id=_id(),
            name=vname,
            display_name=q.get("display_name") or vname,
            description=q.get("description"),
            created_at=_now(),
            pipeline_spec=docs[0],
        )
        self.versions[pid].append(v)
        return to_json(self.pipelines[pid] if new else v)

    def _get_version(self, pid: str, vid: str) -> Any:
        found = [v for v in self.versions.get(pid, []) if v.pipeline_version_id == vid]
        if not found:
            raise ApiError(404, f"Not found: pipeline version {vid} of pipeline {pid}")
        return to_json(found[0])

    def _list_versions(self, pid: str, q: dict[str, str]) -> Any:
        self._pipeline(pid)
        items = list(self.versions[pid])
        if q.get("sort_by", "").replace("%20", " ") == "created_at desc":
            items.reverse()  # appended in creation order
        return self._list("pipeline_versions", items, q)

    # -- experiments and runs --------------------------------------------------------------------
    def _experiments(self, q: dict[str, str]) -> list[kapi.V2beta1Experiment]:
        ns = q.get("namespace") or None
        return [e for e in self.experiments.values() if e.namespace == ns and self._matches(e, q)]

    def _create_experiment(self, e: kapi.V2beta1Experiment) -> Any:
        if not e.display_name:
            raise ApiError(400, "Invalid input error: experiment display_name is empty")
        if e.namespace in self.forbidden_namespaces:
            self._deny(e.namespace, "POST")
        if any(
            x.display_name == e.display_name and x.namespace == e.namespace
            for x in self.experiments.values()
        ):
            raise ApiError(
                409, f"Already exist error: experiment {e.display_name!r} already exists"
            )
        e.experiment_id, e.created_at, e.storage_state = _id(), _now(), "AVAILABLE"
        self.experiments[e.experiment_id] = e
        return to_json(e)

    def _check_target(self, r: Any) -> None:
        if r.experiment_id not in self.experiments:
            raise ApiError(
                404,
                f"Failed to create: ResourceNotFoundError: Experiment {r.experiment_id} not found",
            )
        ref = r.pipeline_version_reference
        if ref is None and r.pipeline_spec is None:
            raise ApiError(
                400, "Invalid input error: neither pipeline_version_reference nor pipeline_spec"
            )
        if ref is not None:
            versions = self.versions.get(ref.pipeline_id or "", [])
            if not any(v.pipeline_version_id == ref.pipeline_version_id for v in versions):
                raise ApiError(
                    404,
                    f"ResourceNotFoundError: PipelineVersion {ref.pipeline_version_id} not found",
                )

    def _create_run(self, r: kapi.V2beta1Run) -> Any:
        if r.run_id or r.state or r.run_details:
            raise ApiError(
                400, "Invalid input error: run_id, state and run_details are output only"
            )
        self._check_target(r)
        r.run_id, r.created_at, r.state = self.next_run_id or _id(), _now(), "PENDING"
        self.next_run_id = None
        r.storage_state = "AVAILABLE"
        self.runs[r.run_id] = r
        self.run_polls[r.run_id] = 0
        return to_json(r)

    def _get_run(self, run_id: str) -> Any:
        if run_id not in self.runs:
            raise ApiError(404, f"Failed to get run: ResourceNotFoundError: Run {run_id} not found")
        r = self.runs[run_id]
        states = self.run_script.states
        seen = states[: min(self.run_polls[run_id], len(states) - 1) + 1]
        r.state = seen[-1]
        self.run_polls[run_id] += 1
        # As the real server keeps it: each state the run went through, in order.
        r.state_history = [
            kapi.V2beta1RuntimeStatus(state=state, update_time=_now())
            for i, state in enumerate(seen)
            if i == 0 or state != seen[i - 1]
        ]
        tasks = [
            kapi.V2beta1PipelineTaskDetail(
                run_id=run_id,
                task_id=_id(),
                display_name="root",
                state=r.state,
                child_tasks=[kapi.PipelineTaskDetailChildTask(task_id="x")],
            )
        ]
        for name in ("preprocess", "train"):
            failed = r.state == "FAILED" and name == self.run_script.failed_task
            tasks.append(
                kapi.V2beta1PipelineTaskDetail(
                    run_id=run_id,
                    task_id=_id(),
                    display_name=name,
                    state="FAILED"
                    if failed
                    else ("SUCCEEDED" if r.state != "PENDING" else "PENDING"),
                    error=kapi.GoogleRpcStatus(code=2, message=self.run_script.error)
                    if failed
                    else None,
                )
            )
        r.run_details = kapi.V2beta1RunDetails(task_details=tasks)
        return to_json(r)

    def _get_run_v1(self, run_id: str) -> Any:
        """As KFP's v1beta1 API: the run and its Argo Workflow as a JSON string, whose pod nodes
        are the script's ``pending`` ones (while the run goes on) beside a finished one and one
        being created."""
        if run_id not in self.runs:
            raise ApiError(404, f"Failed to get run: ResourceNotFoundError: Run {run_id} not found")
        r = self.runs[run_id]
        wf = f"gpupipe-training-{run_id[:5]}"
        nodes = {
            f"{wf}-1": {"name": f"{wf}.preprocess(0).executor(0)", "type": "Pod",
                        "phase": "Succeeded", "message": ""},
            f"{wf}-2": {"name": f"{wf}.tune-driver(0)", "type": "Pod", "phase": "Pending",
                        "message": "ContainerCreating"},
        }  # fmt: skip
        if r.state not in ("SUCCEEDED", "FAILED", "CANCELED"):
            for i, (name, message) in enumerate(self.run_script.pending.items()):
                nodes[f"{wf}-p{i}"] = {
                    "name": f"{wf}.{name}", "type": "Pod", "phase": "Pending", "message": message
                }  # fmt: skip
        manifest = {"metadata": {"name": wf}, "status": {"phase": "Running", "nodes": nodes}}
        return {
            "run": {"id": run_id, "status": r.state},
            "pipeline_runtime": {"workflow_manifest": json.dumps(manifest)},
        }

    # -- recurring runs --------------------------------------------------------------------------
    def _recurring_runs(self, q: dict[str, str]) -> list[kapi.V2beta1RecurringRun]:
        ns = q.get("namespace") or None
        return [r for r in self.recurring.values() if r.namespace == ns and self._matches(r, q)]

    def _recurring_run(self, rid: str) -> kapi.V2beta1RecurringRun:
        if rid not in self.recurring:
            raise ApiError(404, f"ResourceNotFoundError: RecurringRun {rid} not found")
        return self.recurring[rid]

    def _create_recurring(self, r: kapi.V2beta1RecurringRun) -> Any:
        if r.recurring_run_id or r.status:
            raise ApiError(400, "Invalid input error: recurring_run_id and status are output only")
        if not r.display_name or r.trigger is None:
            raise ApiError(400, "Invalid input error: display_name and trigger are required")
        if r.max_concurrency is not None and not 1 <= int(r.max_concurrency) <= 10:
            raise ApiError(400, "Invalid input error: max concurrency must be in [1, 10]")
        self._check_target(r)
        r.namespace = self.experiments[r.experiment_id].namespace
        r.recurring_run_id, r.created_at, r.updated_at = _id(), _now(), _now()
        r.status = "ENABLED" if r.mode != "DISABLE" else "DISABLED"
        self.recurring[r.recurring_run_id] = r
        return to_json(r)

    def _delete_recurring(self, rid: str) -> Any:
        self._recurring_run(rid)
        del self.recurring[rid]
        return {}

    def _get_recurring(self, rid: str) -> Any:
        out = to_json(self._recurring_run(rid))
        if rid in self._stale:
            mode, status, left = self._stale.pop(rid)
            out.update(mode=mode, status=status)
            if left > 1:
                self._stale[rid] = (mode, status, left - 1)
        return out

    def _toggle(self, rid: str, action: str) -> Any:
        r = self._recurring_run(rid)
        if self.stale_mode_reads:
            self._stale[rid] = (str(r.mode), str(r.status), self.stale_mode_reads)
        r.mode = "ENABLE" if action == "enable" else "DISABLE"
        r.status = "ENABLED" if action == "enable" else "DISABLED"
        return {}


def _handler(fake: FakeKfp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                status, payload = fake.handle(self.command, split.path, query, headers, body)
            except ApiError as e:
                status = e.status
                payload = {
                    "error": e.message,
                    "code": _GRPC.get(e.status, 2),
                    "message": e.message,
                    "details": [],
                }
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped waiting (a stalled answer): nothing to answer

        do_GET = do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def private_ca(folder: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate it signed for ``127.0.0.1`` and ``localhost``, as
    PEM files in ``folder``: (the CA's certificate, the server's certificate, its key)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)

    def cert(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            b = b.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
        else:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = cert("gpupipe test CA", ca_key, "gpupipe test CA", ca_key, ca=True)
    server_cert = cert("localhost", key, "gpupipe test CA", ca_key, ca=False)
    paths = (folder / "ca.pem", folder / "server.pem", folder / "server.key")
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def serve(tls: tuple[Path, Path] | None = None, port: int = 0) -> Iterator[FakeKfp]:
    """Start a fake on a free port (``fake.url``), yield it, stop it. Use as a fixture body.

    Args:
        tls: (certificate, key) PEM files: serve https with them (see :func:`private_ca`).
        port: the port to listen on (0: a free one).
    """
    fake = FakeKfp()
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(fake))
    server.daemon_threads = True
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls[0], tls[1])
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    fake.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
