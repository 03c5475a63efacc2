"""Upload, run and schedule the training pipeline on a KFP cluster through its v2beta1 REST API.

The calls go through ``kfp_server_api`` (the client that ``kfp.Client`` wraps) rather than
``kfp.Client`` itself: the client writes ``~/.config/kfp/context.json``, retries health checks
for 25 s on an unreachable host and has no hook for one-line errors. Here every call is one
typed function; :meth:`KfpCluster._call` turns transport and HTTP errors into a
:class:`ClusterError` a person can act on (with credentials redacted) and retries 5xx answers a
bounded number of times. Who is calling is :mod:`pipelines.cluster_auth`'s; what is uploaded,
:mod:`pipelines.cluster_package`'s.
"""

from __future__ import annotations

import json
import math
import re
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kfp_server_api as kapi
import urllib3
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from pipelines.cluster_auth import Auth, base_url, token_safe_over
from pipelines.cluster_package import Compiled, parameter_defaults, version_description
from trainer.base.errors import InputError, printable
from trainer.base.redact import redact

PORT_FORWARD_HINT = (
    "is the port-forward running? kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80"
)
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"})
BACKOFF_S = 1.0
"""First wait between retries of a 5xx answer and between polls of a run; grows 1.5x."""
MAX_POLL_S = 15.0
"""The longest wait between two polls of a run."""
MODE_SETTLE_S = 60.0
"""How long ``set_schedule`` waits for KFP to read back a recurring run's new mode."""
REFUSED_GRACE_S = 10.0
"""How long a client of a host on this machine retries a refused connection, from its first
request: a port-forward started a moment before (`kubectl port-forward ... &` and the next
line at once, as the README's blocks read when pasted) is not listening yet."""
CONNECT_TIMEOUT_S = 10.0
"""How long one request waits for its connection (a port-forward that accepts and then stalls
would otherwise hold a command for ever)."""
READ_TIMEOUT_S = 60.0
"""How long one request waits for the server's answer to go on (an upload included)."""
MAX_PAGES = 1000
"""The most pages one listing reads (100 items each) before it stops with ``E_SERVER``."""
_FILTER_EQUALS = 1
"""``V2beta1PredicateOperation.EQUALS`` as ``kfp.Client`` sends it in list filters."""

T = TypeVar("T")


class ClusterError(RuntimeError):
    """A KFP API call failed: one line naming the host, what was attempted and what to do."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int = 0,
        exit_code: int = 1,
        timed_out: bool = False,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.exit_code = exit_code
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class Uploaded:
    """What :meth:`KfpCluster.upload` did."""

    pipeline_id: str
    version_id: str
    version_name: str
    pipeline_created: bool
    version_created: bool


def _name_filter(key: str, value: str) -> str:
    return json.dumps(
        {"predicates": [{"operation": _FILTER_EQUALS, "key": key, "stringValue": value}]}
    )


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (a base URL) names this machine: localhost, 127.0.0.0/8 or ::1."""
    import ipaddress
    import urllib.parse

    name = urllib.parse.urlsplit(host).hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def server_text(value: object, limit: int = 300) -> str:
    """What a KFP server (or what a run wrote) says, as it may reach a terminal: one line,
    credentials redacted, control characters escaped by the filter of our own error lines
    (:func:`trainer.base.errors.printable`), at most about ``limit`` characters."""
    return printable(redact(" ".join(str(value).split()))[:limit])


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def is_uuid(value: object) -> bool:
    """Whether ``value`` has the shape of the ids KFP gives runs (a UUID)."""
    return isinstance(value, str) and _UUID.fullmatch(value) is not None


def _error_text(e: kapi.ApiException) -> str:
    body = e.body.decode(errors="replace") if isinstance(e.body, bytes) else (e.body or "")
    try:
        data = json.loads(body)
        text = data.get("message") or data.get("error") or body
    except (ValueError, AttributeError):
        text = body or (e.reason or "")
    return server_text(text)


class KfpCluster:
    """One KFP API server: pipelines, versions, experiments, runs and recurring runs.

    Args:
        host: base URL, e.g. ``http://localhost:8080`` (the UI proxy) or the API service.
        auth: where the bearer token comes from.
        namespace: the profile namespace in multi-user KFP (``None``: single-user).
        retries: extra attempts after a 5xx answer.
        backoff_s: first wait between retries and between run polls (default ``BACKOFF_S``).
        max_poll_s: the longest wait between two polls (default ``MAX_POLL_S``).
        sleep: how to wait (default ``time.sleep``).
        insecure: allow sending the bearer token over plain ``http://`` to a host other than
            this machine (``--insecure``); without it such a host is refused before any request.
        timeouts_s: (connect, read) limits of every request (default ``CONNECT_TIMEOUT_S``,
            ``READ_TIMEOUT_S``); a call with a deadline gets no more than the time left.
        ca_cert: PEM file of the CA certificates that an ``https://`` host's certificate is
            checked against (``--ca-cert``: a KFP behind a private CA), instead of the system's.
    """

    def __init__(
        self,
        host: str,
        *,
        auth: Auth,
        namespace: str | None = None,
        retries: int = 3,
        backoff_s: float | None = None,
        max_poll_s: float | None = None,
        sleep: Callable[[float], None] | None = None,
        insecure: bool = False,
        timeouts_s: tuple[float, float] | None = None,
        ca_cert: str | None = None,
    ) -> None:
        host = base_url(host)  # the one reading of --host: where requests and the token go
        if auth.source != "none" and not insecure and not token_safe_over(host):
            raise InputError(
                "E_INSECURE",
                f"refusing to send the bearer token (from {auth.source}) in clear text over "
                "plain http:// to a host other than this machine: use https://, a port-forward "
                "to localhost, or pass --insecure if the network between is yours",
                host,
            )
        self.host = host
        self.auth = auth
        self.namespace = namespace or None
        self.retries = retries
        self.backoff_s = BACKOFF_S if backoff_s is None else backoff_s
        self.max_poll_s = MAX_POLL_S if max_poll_s is None else max_poll_s
        self.sleep = sleep or time.sleep
        self.timeouts_s = timeouts_s or (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
        self._refused_until: float | None = None  # set at the first request (REFUSED_GRACE_S)
        config = kapi.Configuration(host=self.host)
        config.retries = 0
        if ca_cert is not None:
            config.ssl_ca_cert = _checked_ca_cert(ca_cert, self.host)
        if auth.source != "none":
            config.api_key_prefix["authorization"] = "Bearer"
            config.api_key["authorization"] = "unset"
            config.refresh_api_key_hook = self._refresh_token
        client = kapi.ApiClient(config)
        self.client = client
        self.pipelines = kapi.PipelineServiceApi(client)
        self.uploads = kapi.PipelineUploadServiceApi(client)
        self.experiments = kapi.ExperimentServiceApi(client)
        self.runs = kapi.RunServiceApi(client)
        self.recurring = kapi.RecurringRunServiceApi(client)

    def _refresh_token(self, config: kapi.Configuration) -> None:
        config.api_key["authorization"] = self.auth.read() or ""

    def redact(self, text: str) -> str:
        """``text`` with the token (if any) replaced by ``***``."""
        token = self.auth.token
        if token is None and self.auth.path is not None:
            try:
                token = self.auth.read()
            except OSError:
                token = None
        return text.replace(token, "***") if token else text

    # -- links -----------------------------------------------------------------------------------
    # (ids come from the server: they reach the terminal through server_text)
    def pipeline_link(self, pipeline_id: str, version_id: str) -> str:
        """The KFP UI page of a pipeline version."""
        ids = f"{server_text(pipeline_id, 80)}/version/{server_text(version_id, 80)}"
        return f"{self.host}/#/pipelines/details/{ids}"

    def run_link(self, run_id: str) -> str:
        """The KFP UI page of a run."""
        return f"{self.host}/#/runs/details/{server_text(run_id, 80)}"

    def recurring_run_link(self, recurring_run_id: str) -> str:
        """The KFP UI page of a recurring run."""
        return f"{self.host}/#/recurringrun/details/{server_text(recurring_run_id, 80)}"

    # -- the one place API errors are translated -------------------------------------------------
    def _timeouts(self, deadline: float | None) -> tuple[float, float]:
        """(connect, read) limits of the next request: the defaults, or the time left."""
        connect, read = self.timeouts_s
        if deadline is None:
            return connect, read
        left = max(deadline - time.monotonic(), 0.01)
        return min(connect, left), min(read, left)

    def _call(
        self,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        deadline: float | None = None,
        **kwargs: Any,
    ) -> T:
        """``fn(*args, **kwargs)`` with a timeout on every try (bounded by ``deadline``, a
        ``time.monotonic()``), 5xx answers retried; every failure is one :class:`ClusterError`."""
        delay = self.backoff_s
        if self._refused_until is None:
            self._refused_until = time.monotonic() + REFUSED_GRACE_S
        attempt = -1
        while attempt < self.retries:
            attempt += 1
            timeouts = self._timeouts(deadline)
            try:
                return fn(*args, _request_timeout=timeouts, **kwargs)
            except urllib3.exceptions.HTTPError as e:
                reason = getattr(e, "reason", None) or e
                if self._refused_in_grace(reason, deadline):
                    attempt -= 1  # not a try of the server's: nothing listened yet
                    continue
                # (urllib3 makes a refused connection a ConnectTimeoutError too)
                if isinstance(reason, urllib3.exceptions.TimeoutError) and not isinstance(
                    reason, NewConnectionError
                ):
                    waited = timeouts[0 if isinstance(reason, ConnectTimeoutError) else 1]
                    raise ClusterError(
                        "E_UNREACHABLE",
                        f"KFP at {self.host} did not answer within {waited:g} s when asked to "
                        f"{what} ({PORT_FORWARD_HINT})",
                        timed_out=True,
                    ) from e
                raise ClusterError(
                    "E_UNREACHABLE",
                    self.redact(
                        f"cannot reach KFP at {self.host}: {_short(reason)} ({PORT_FORWARD_HINT})"
                    ),
                ) from e
            except kapi.ApiException as e:
                if e.status == 0:
                    raise ClusterError(
                        "E_UNREACHABLE",
                        self.redact(f"cannot reach KFP at {self.host}: {_short(e.reason)}"),
                    ) from e
                if e.status >= 500 and attempt < self.retries:
                    left = math.inf if deadline is None else deadline - time.monotonic()
                    if left > 0:
                        self.sleep(min(delay, left))
                        delay *= 1.5
                        continue
                raise self._api_error(what, e, attempts=attempt + 1) from e
        raise AssertionError("unreachable: the loop returns or raises")

    def _refused_in_grace(self, reason: object, deadline: float | None) -> bool:
        """Whether a refused connection to a host on this machine is waited for (half a second)
        and tried again: within :data:`REFUSED_GRACE_S` of this client's first request."""
        refused = isinstance(reason, NewConnectionError) and "refused" in str(reason).lower()
        now = time.monotonic()
        if not refused or not _is_loopback(self.host) or self._refused_until is None:
            return False
        if now >= self._refused_until or (deadline is not None and now >= deadline):
            return False
        self.sleep(0.5)
        return True

    def _api_error(self, what: str, e: kapi.ApiException, *, attempts: int) -> ClusterError:
        text = _error_text(e)
        ns = self.namespace or "(none: single-user)"
        if e.status == 401:
            how = (
                "no token was sent: pass --token-file FILE (or --token), or set "
                "KF_PIPELINES_SA_TOKEN_PATH"
                if self.auth.source == "none"
                else f"the token from {self.auth.source} was refused (expired, or the wrong "
                "audience: create one with --audience=pipelines.kubeflow.org)"
            )
            code, msg, exit_code = "E_AUTH", f"KFP at {self.host} cannot {what}: 401 {how}", 2
        elif e.status == 403:
            code, exit_code = "E_FORBIDDEN", 2
            msg = (
                f"not allowed to {what} in namespace {ns} (403: {text}); ask the namespace's "
                "owner to add you as a contributor, or pass --namespace of a profile you can edit"
            )
        elif e.status == 404:
            code, msg, exit_code = "E_NOT_FOUND", f"cannot {what}: not found (404: {text})", 2
        elif e.status == 409:
            code, msg, exit_code = "E_CONFLICT", f"cannot {what}: already exists (409: {text})", 2
        elif e.status >= 500:
            code, exit_code = "E_SERVER", 1
            msg = f"KFP at {self.host} failed to {what}: {e.status} {text} (after {attempts} tries)"
        else:
            code, msg, exit_code = "E_REJECTED", f"KFP refused to {what}: {e.status} {text}", 2
        return ClusterError(code, self.redact(msg), status=e.status, exit_code=exit_code)

    # -- pipelines and versions ------------------------------------------------------------------
    def find_pipeline(self, name: str) -> kapi.V2beta1Pipeline | None:
        """The pipeline called ``name`` in this namespace (or the shared ones), if any."""
        kwargs: dict[str, Any] = {"filter": _name_filter("display_name", name), "page_size": 10}
        if self.namespace:
            kwargs["namespace"] = self.namespace
        res = self._call(
            f"list pipelines named {name!r}",
            self.pipelines.pipeline_service_list_pipelines,
            **kwargs,
        )
        matches = [p for p in res.pipelines or [] if name in (p.display_name, p.name)]
        return matches[0] if matches else None

    def _pages(
        self, what: str, items: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Iterator[Any]:
        """Every item (attribute ``items`` of each answer) of a listing, page after page.

        A server that hands back a page token it gave before, or more than ``MAX_PAGES`` pages,
        would keep the listing going for ever: that stops with one ``E_SERVER`` line.
        """
        seen: set[str] = set()
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = {**kwargs, "page_size": 100, **({"page_token": token} if token else {})}
            res = self._call(what, fn, *args, **page)
            yield from getattr(res, items) or []
            token = res.next_page_token
            if not token:
                return
            if token in seen:
                raise ClusterError(
                    "E_SERVER",
                    f"KFP at {self.host} answered a page token it had already given when asked "
                    f"to {what}: stopped rather than read the same pages for ever",
                )
            seen.add(token)
        raise ClusterError(
            "E_SERVER",
            f"KFP at {self.host} still had more pages after {MAX_PAGES} pages of 100 when asked "
            f"to {what}: stopped",
        )

    def _versions(self, pipeline_id: str) -> Iterator[kapi.V2beta1PipelineVersion]:
        return self._pages(
            f"list versions of pipeline {pipeline_id}",
            "pipeline_versions",
            self.pipelines.pipeline_service_list_pipeline_versions,
            pipeline_id,
            sort_by="created_at desc",
        )

    def find_version(self, pipeline_id: str, name: str) -> kapi.V2beta1PipelineVersion | None:
        """The version called ``name`` of a pipeline, if any."""
        return next(
            (v for v in self._versions(pipeline_id) if name in (v.name, v.display_name)), None
        )

    def upload(self, compiled: Compiled, *, pipeline: str, version: str | None = None) -> Uploaded:
        """Create ``pipeline`` if needed and add the compiled YAML as a version, idempotently.

        The version's description records the content digest, so the same YAML under the same
        version name is recognised and left alone.

        Raises:
            InputError: ``E_CONFLICT`` when ``version`` exists with different content.
            ClusterError: the API failed.
        """
        name = version or compiled.version_name
        found = self.find_pipeline(pipeline)
        created = found is None
        if found is None:
            body = kapi.V2beta1Pipeline(
                name=pipeline,
                display_name=pipeline,
                description=compiled.description,
                namespace=self.namespace,
            )
            try:
                found = self._call(
                    f"create pipeline {pipeline!r}",
                    self.pipelines.pipeline_service_create_pipeline,
                    body,
                )
            except ClusterError as e:
                if e.status != 409 or (found := self.find_pipeline(pipeline)) is None:
                    raise
                created = False
        pid = found.pipeline_id
        existing = self.find_version(pid, name)
        if existing is None:
            with tempfile.TemporaryDirectory(prefix="gpupipe-") as tmp:
                path = Path(tmp) / f"{pipeline}.yaml"
                path.write_text(compiled.yaml_text)
                try:
                    v = self._call(
                        f"upload version {name!r} of pipeline {pipeline!r}",
                        self.uploads.upload_pipeline_version,
                        str(path),
                        name=name,
                        display_name=name,
                        pipelineid=pid,
                        description=version_description(compiled),
                    )
                    return Uploaded(pid, v.pipeline_version_id, name, created, True)
                except ClusterError as e:
                    if e.status != 409 or (existing := self.find_version(pid, name)) is None:
                        raise
        if f"sha256:{compiled.digest}" not in (existing.description or ""):
            raise InputError(
                "E_CONFLICT",
                f"version {name!r} of pipeline {pipeline!r} exists with different content; "
                "pick another --version or leave it out (the default is the content hash)",
                "--version",
            )
        return Uploaded(pid, existing.pipeline_version_id, name, created, False)

    def version_defaults(self, pipeline_id: str, version_id: str) -> dict[str, Any]:
        """The defaults of an uploaded version's pipeline parameters (``--set`` at upload)."""
        v = self._call(
            f"get version {version_id} of pipeline {pipeline_id}",
            self.pipelines.pipeline_service_get_pipeline_version,
            pipeline_id,
            version_id,
        )
        spec = v.pipeline_spec if isinstance(v.pipeline_spec, dict) else {}
        return parameter_defaults(spec)

    def resolve_version(self, pipeline: str, version: str | None) -> tuple[str, str]:
        """``(pipeline_id, version_id)`` of ``version`` (default: the newest) of ``pipeline``.

        Raises:
            InputError: ``E_NOT_FOUND`` when the pipeline or version does not exist.
        """
        found = self.find_pipeline(pipeline)
        where = f" in namespace {self.namespace}" if self.namespace else ""
        if found is None:
            raise InputError(
                "E_NOT_FOUND",
                f"no pipeline {pipeline!r}{where} on {self.host}; run `gpupipe upload` first or "
                "pass --compiled",
                "--pipeline",
            )
        if version:
            v = self.find_version(found.pipeline_id, version)
        else:
            v = next(self._versions(found.pipeline_id), None)
        if v is None:
            raise InputError(
                "E_NOT_FOUND",
                f"pipeline {pipeline!r} has no version {version or '(none uploaded)'!r}",
                "--version",
            )
        return found.pipeline_id, v.pipeline_version_id

    # -- experiments and runs --------------------------------------------------------------------
    def experiment_id(self, name: str) -> str:
        """The id of experiment ``name`` in this namespace, created when missing."""
        kwargs: dict[str, Any] = {"filter": _name_filter("display_name", name), "page_size": 10}
        if self.namespace:
            kwargs["namespace"] = self.namespace
        for _ in range(2):
            res = self._call(
                f"list experiments named {name!r}",
                self.experiments.experiment_service_list_experiments,
                **kwargs,
            )
            for e in res.experiments or []:
                if e.display_name == name:
                    return str(e.experiment_id)
            body = kapi.V2beta1Experiment(display_name=name, namespace=self.namespace)
            try:
                made = self._call(
                    f"create experiment {name!r}",
                    self.experiments.experiment_service_create_experiment,
                    body,
                )
                return str(made.experiment_id)
            except ClusterError as e:
                if e.status != 409:
                    raise
        raise ClusterError(
            "E_CONFLICT", f"experiment {name!r} exists but cannot be listed", exit_code=2
        )

    def start_run(
        self,
        *,
        display_name: str,
        experiment_id: str,
        parameters: dict[str, Any],
        version: tuple[str, str] | None = None,
        pipeline_spec: dict[str, Any] | None = None,
    ) -> str:
        """Create a run of an uploaded ``(pipeline_id, version_id)`` or of an inline spec."""
        body = kapi.V2beta1Run(
            display_name=display_name,
            experiment_id=experiment_id,
            runtime_config=kapi.V2beta1RuntimeConfig(parameters=parameters),
        )
        if version is not None:
            body.pipeline_version_reference = kapi.V2beta1PipelineVersionReference(
                pipeline_id=version[0], pipeline_version_id=version[1]
            )
        else:
            body.pipeline_spec = pipeline_spec
        run = self._call(f"start run {display_name!r}", self.runs.run_service_create_run, body)
        if not is_uuid(run.run_id):  # it names the run's folder in the store: nothing else
            raise ClusterError(
                "E_SERVER",
                f"KFP at {self.host} answered the new run's id as "
                f"{server_text(run.run_id, 80)!r}, not a UUID: not followed (the run may have "
                f"started: {self.host}/#/runs)",
            )
        return str(run.run_id)

    def get_run(self, run_id: str, *, deadline: float | None = None) -> kapi.V2beta1Run:
        """The run with its state and task details (asked no longer than ``deadline``)."""
        return self._call(
            f"get run {run_id}", self.runs.run_service_get_run, run_id, deadline=deadline
        )

    def waiting_pods(self, run_id: str, *, deadline: float | None = None) -> dict[str, str]:
        """Step -> why its pod has not started, for each of the run's pods that waits with a
        reason (Argo's, from the pod: ``Unschedulable: 0/1 nodes are available: 1 Insufficient
        nvidia.com/gpu.``, ``ImagePullBackOff: ...``); the ordinary wait of a pod being
        created is left out.

        Read from the run's Workflow, which only KFP's v1beta1 API returns (v2beta1's task
        details carry no message). A diagnosis aid: empty, never an error, when it cannot be read.
        """
        try:
            got = self._call(
                f"get run {run_id} (v1beta1)",
                self.client.call_api,
                "/apis/v1beta1/runs/{run_id}",
                "GET",
                path_params={"run_id": run_id},
                header_params={"Accept": "application/json"},
                response_type="object",
                auth_settings=["Bearer"],
                _return_http_data_only=True,
                deadline=deadline,
            )
            manifest = ((got or {}).get("pipeline_runtime") or {}).get("workflow_manifest")
            nodes = (json.loads(manifest or "{}").get("status") or {}).get("nodes") or {}
        except (ClusterError, ValueError, AttributeError):
            return {}
        out: dict[str, str] = {}
        for node in nodes.values() if isinstance(nodes, dict) else ():
            message = server_text(node.get("message") or "")
            if node.get("type") != "Pod" or node.get("phase") != "Pending" or not message:
                continue
            if message.split(":")[0] in _PENDING_AS_USUAL:
                continue
            name = str(node.get("name") or node.get("displayName") or "?")
            out[server_text(_step_of(name), 100)] = message
        return out

    def wait(
        self,
        run_id: str,
        *,
        timeout_s: float,
        on_state: Callable[[str], None] | None = None,
        on_waiting: Callable[[str, str], None] | None = None,
    ) -> kapi.V2beta1Run:
        """Poll a run (backoff from ``backoff_s`` to ``max_poll_s``) until it finishes.

        ``on_state`` hears each new state; ``on_waiting`` each new (step, reason) for a pod of
        the run that waits with a reason (:meth:`waiting_pods`): a GPU step on a cluster without
        a free GPU would otherwise wait in silence until ``timeout_s``.

        Every request gets no more than the time left, so a server that stops answering (a
        stalled port-forward) cannot hold the command past ``timeout_s`` either.

        Raises:
            ClusterError: ``E_TIMEOUT`` when it is still going (or KFP has not answered) after
                ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        delay, last = self.backoff_s, None
        told: dict[str, str] = {}
        while True:
            bounded = deadline - time.monotonic() < max(self.timeouts_s)
            try:
                run = self.get_run(run_id, deadline=deadline)
            except ClusterError as e:
                if not (e.timed_out and bounded):
                    raise
                seen = f"was last {last}" if last else "was never read"
                raise ClusterError(
                    "E_TIMEOUT",
                    f"run {run_id} {seen}: KFP did not answer within the {timeout_s:g} s of "
                    f"--timeout; the run keeps running: {self.run_link(run_id)}",
                ) from e
            state = server_text(run.state or "PENDING", 40)
            if state != last and on_state is not None:
                on_state(state)
            last = state
            if state in TERMINAL_STATES:
                return run
            if on_waiting is not None:
                for step, why in self.waiting_pods(run_id, deadline=deadline).items():
                    if told.get(step) != why:
                        on_waiting(step, why)
                        told[step] = why
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(
                    "E_TIMEOUT",
                    f"run {run_id} is still {state} after {timeout_s:g} s; it keeps running: "
                    f"{self.run_link(run_id)}",
                )
            self.sleep(min(delay, left))
            delay = min(delay * 1.5, self.max_poll_s)

    # -- recurring runs --------------------------------------------------------------------------
    def list_schedules(self) -> list[kapi.V2beta1RecurringRun]:
        """Every recurring run in this namespace."""
        kwargs: dict[str, Any] = {"namespace": self.namespace} if self.namespace else {}
        return list(
            self._pages(
                "list recurring runs",
                "recurring_runs",
                self.recurring.recurring_run_service_list_recurring_runs,
                **kwargs,
            )
        )

    def find_schedule(self, name: str) -> kapi.V2beta1RecurringRun | None:
        """The recurring run whose display name is ``name``, if any."""
        return next((r for r in self.list_schedules() if r.display_name == name), None)

    def create_schedule(self, body: kapi.V2beta1RecurringRun) -> str:
        """Create a recurring run; returns its id."""
        made = self._call(
            f"create recurring run {body.display_name!r}",
            self.recurring.recurring_run_service_create_recurring_run,
            body,
        )
        return str(made.recurring_run_id)

    def set_schedule(self, recurring_run_id: str, action: str) -> None:
        """``enable``, ``disable`` or ``delete`` a recurring run.

        KFP 2.17 answers enable and disable once it has patched the ScheduledWorkflow (what
        schedules) and its own table; its persistence agent then copies the ScheduledWorkflow back
        into that table, and a copy read before the patch puts the old mode back there for a while
        (CI, 5ccea30: ``DISABLE`` read just after an enable). So this returns once KFP reads back
        the new mode, and a ``--list`` just after shows it.

        Raises:
            ClusterError: ``E_MODE`` when KFP still reads the old mode after ``MODE_SETTLE_S``.
        """
        fn = {
            "enable": self.recurring.recurring_run_service_enable_recurring_run,
            "disable": self.recurring.recurring_run_service_disable_recurring_run,
            "delete": self.recurring.recurring_run_service_delete_recurring_run,
        }[action]
        self._call(f"{action} recurring run {recurring_run_id}", fn, recurring_run_id)
        if action == "delete":
            return
        want = action.upper()
        deadline = time.monotonic() + MODE_SETTLE_S
        delay = self.backoff_s / 4
        while True:
            got = self._call(
                f"get recurring run {recurring_run_id}",
                self.recurring.recurring_run_service_get_recurring_run,
                recurring_run_id,
                deadline=deadline,
            )
            mode = server_text(got.mode or "", 40)
            left = deadline - time.monotonic()
            if mode == want:
                return
            if left <= 0:
                raise ClusterError(
                    "E_MODE",
                    f"KFP accepted '{action}' for recurring run {recurring_run_id} but still "
                    f"reads it as {mode or 'no mode'} after {MODE_SETTLE_S:g} s: check "
                    f"{self.recurring_run_link(recurring_run_id)} and the ml-pipeline-"
                    "persistenceagent's log",
                )
            self.sleep(min(delay, left))
            delay = min(delay * 1.5, self.max_poll_s)


_PENDING_AS_USUAL = frozenset({"ContainerCreating", "PodInitializing"})
"""Reasons of a Pending pod that are its ordinary start, not a wait worth a word."""


def node_task(node_name: str) -> tuple[str, str]:
    """(task, role) of an Argo node of a KFP run: ``run.exit-handler-1.train(0).executor(0)`` is
    the train task's ``executor`` (the step's own pod), ``run.exit-handler-1.train-driver(0)``
    its ``driver``; anything else ``other``."""
    parts = [re.sub(r"\(\d+\)$", "", p) for p in node_name.split(".")]
    if len(parts) >= 2 and parts[-1] == "executor":
        return parts[-2], "executor"
    if parts[-1].endswith("-driver"):
        return parts[-1].removesuffix("-driver"), "driver"
    return parts[-1], "other"


def _step_of(node_name: str) -> str:
    """The step a node belongs to, as ``run --wait`` names it: ``train``, ``train (driver)``."""
    task, role = node_task(node_name)
    return f"{task} (driver)" if role == "driver" else task


def _checked_ca_cert(path: str, host: str) -> str:
    """``path`` when it holds CA certificates (PEM) and ``host`` is https, else one line."""
    if not host.startswith("https://"):
        raise InputError("E_PARAM", f"--ca-cert applies to https:// hosts only, not {host}", path)
    try:
        ssl.create_default_context(cafile=path)
    except OSError as e:  # ssl.SSLError included
        reason = getattr(e, "reason", None) or e.strerror or type(e).__name__
        raise InputError(
            "E_PARAM", f"--ca-cert cannot be read as PEM CA certificates: {reason}", path
        ) from None
    return path


def _short(reason: object) -> str:
    text = " ".join(str(reason).split())
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            "its TLS certificate cannot be verified (a private CA? pass its certificate with "
            "--ca-cert FILE)"
        )
    for known in ("Connection refused", "Name or service not known", "timed out"):
        if known in text:
            return known.lower()
    return server_text(text, limit=200)


def failed_tasks(run: kapi.V2beta1Run) -> list[str]:
    """``"train: <error>"`` for each failed leaf task of a run (DAGs and drivers left out)."""
    tasks = (run.run_details.task_details if run.run_details else None) or []
    failed = [t for t in tasks if str(t.state) == "FAILED"]
    leaves = [t for t in failed if not t.child_tasks] or failed
    out = []
    for t in leaves:
        name = server_text(t.display_name or t.task_id or "?", 100)
        message = server_text(t.error.message) if t.error is not None and t.error.message else ""
        out.append(f"{name}: {message}" if message else name)
    return out
