"""The Kubernetes calls of the launchers (PyTorchJob, TrainJob, Katib): typed, retried when
transient."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from trainer.base.errors import reduce_error

log = logging.getLogger(__name__)

GROUP = "kubeflow.org"
VERSION = "v1"
PLURAL = "pytorchjobs"
CONTAINER = "pytorch"
"""The operator requires this name for the training container."""
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"

TRAINER_GROUP = "trainer.kubeflow.org"
"""Kubeflow Trainer v2's API group (TrainJob, TrainingRuntime, ClusterTrainingRuntime)."""
TRAINER_VERSION = "v1alpha1"
TRAINJOBS = "trainjobs"

KATIB_VERSION = "v1beta1"
EXPERIMENTS = "experiments"
TRIALS = "trials"
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"
"""Label Katib puts on each Trial of an Experiment."""

WORKFLOW_GROUP, WORKFLOW_VERSION, WORKFLOWS = "argoproj.io", "v1alpha1", "workflows"
"""Argo's Workflow, which a KFP run is: the owner of a KFP step's pod."""
RUN_CALLS: list[tuple[str, str, str]] = [
    ("", "pods", "list"),
    (WORKFLOW_GROUP, WORKFLOWS, "get"),
    (WORKFLOW_GROUP, WORKFLOWS, "watch"),
]
"""Every launcher's: its own pod (by name), and the KFP run (Argo Workflow) that owns it, read
and followed (:class:`~trainer.launch.owners.RunFollower`)."""

KATIB_API_CALLS: list[tuple[str, str, str]] = [
    (GROUP, EXPERIMENTS, "create"),
    (GROUP, EXPERIMENTS, "get"),
    (GROUP, EXPERIMENTS, "patch"),
    (GROUP, EXPERIMENTS, "delete"),
    (GROUP, TRIALS, "get"),
    (GROUP, TRIALS, "list"),
    ("", "events", "list"),  # the wait's check for refused pods, every few polls
    *RUN_CALLS,
]
"""The calls of the Katib (tune) launcher: Experiments and their Trials."""


KUEUE_GROUP, KUEUE_VERSION, WORKLOADS = "kueue.x-k8s.io", "v1beta2", "workloads"
"""Kueue's Workload: what it admits for a queued job (trainer/launch/queue.py)."""

CLUSTER_API_CALLS: list[tuple[str, str, str]] = [("", "nodes", "list")]
"""The cluster-scoped calls (a ClusterRole's, not the namespace's Role): the training-job
launchers read the nodes' allocatable GPUs before they create a GPU job
(:func:`~trainer.launch.capacity.gpu_shortfall`); refused, the job is created unchecked."""


def _job_api_calls(group: str, plural: str) -> list[tuple[str, str, str]]:
    """The calls of a training-job launcher: the job, its watched pod, the pod's log, events,
    and the nodes (:data:`CLUSTER_API_CALLS`)."""
    job = [(group, plural, verb) for verb in ("create", "get", "delete", "patch")]
    queue = [(KUEUE_GROUP, WORKLOADS, "list")]  # a queued job's place in its Kueue queue
    return [*job, *RUN_CALLS, ("", "pods/log", "get"), ("", "events", "list"), *queue,
            *CLUSTER_API_CALLS]  # fmt: skip


PYTORCHJOB_API_CALLS = _job_api_calls(GROUP, PLURAL)
"""The calls of the PyTorchJob (train) launcher."""

TRAINJOB_API_CALLS = _job_api_calls(TRAINER_GROUP, TRAINJOBS)
"""The calls of the TrainJob (train) launcher: the job, its node-0 pod, its log, events."""

API_CALLS: list[tuple[str, str, str]] = list(
    dict.fromkeys([*PYTORCHJOB_API_CALLS, *TRAINJOB_API_CALLS, *KATIB_API_CALLS])
)
"""(API group, resource, verb) of every call :class:`KubeApi` makes: what RBAC must grant."""

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
"""Statuses worth repeating: throttling and API server or etcd hiccups."""

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How often and how patiently a transient API failure is repeated."""

    attempts: int = 6
    """Tries per call, the first included."""
    backoff_s: float = 0.5
    """First wait; doubles per attempt (with jitter) up to ``max_backoff_s``."""
    max_backoff_s: float = 10.0
    """Longest exponential wait."""
    max_retry_after_s: float = 60.0
    """Longest wait a 429's ``Retry-After`` may ask for."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.backoff_s < 0 or self.max_backoff_s < 0 or self.max_retry_after_s < 0:
            raise ValueError("backoff_s, max_backoff_s and max_retry_after_s must be >= 0")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based); jittered so that many
        launchers throttled together do not come back together."""
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * random.uniform(0.5, 1.0)


class KubeApiError(RuntimeError):
    """A Kubernetes API call failed for good; the message names the call and ``namespace/name``."""

    def __init__(self, message: str, *, status: int | None) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple:
        return reduce_error(self)


class KubeApi:
    """The few calls the launcher needs, over the official ``kubernetes`` client.

    Every call carries a request timeout, is repeated with backoff on 429 (honouring
    ``Retry-After``), 5xx, timeouts and dropped connections, and otherwise raises
    :class:`KubeApiError` naming the verb, the resource and ``namespace/name``. Objects come back
    as plain dicts with the API's camelCase keys, whatever the resource.
    """

    def __init__(
        self,
        api_client: Any,
        *,
        retry: RetryPolicy | None = None,
        request_timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Wrap ``api_client`` (a ``kubernetes.client.ApiClient``).

        Args:
            api_client: the configured client; its host decides which API server is called.
            retry: attempts and backoff for transient failures.
            request_timeout_s: read timeout of each request, so a hung connection is retried.
            sleep: how to wait between attempts (tests record the waits).
        """
        from kubernetes import client

        self._client = api_client
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self.retry = retry or RetryPolicy()
        self.request_timeout_s = request_timeout_s
        # (connect, read): the client silently ignores a float, and an int is a total timeout
        # that would also cut a long log download short.
        self._timeout = (request_timeout_s, request_timeout_s)
        self._sleep = sleep

    @classmethod
    def from_config(cls, **kwargs: Any) -> KubeApi:
        """A client for the cluster this runs in, else for the current kubeconfig context.

        Raises:
            RuntimeError: neither an in-cluster service account nor a kubeconfig was found.
        """
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            try:
                config.load_kube_config(client_configuration=cfg)
            except (config.ConfigException, OSError) as e:
                raise RuntimeError(
                    "no Kubernetes API to talk to: not in a pod with a service account "
                    f"and no usable kubeconfig ({e})"
                ) from e
        # One retry policy (ours) rather than urllib3's hidden one stacked under it.
        cfg.retries = False
        return cls(client.ApiClient(cfg), **kwargs)

    # Custom objects: one implementation for every verb, for PyTorchJobs, TrainJobs and Katib

    def _custom_call(
        self,
        verb: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        *args: Any,
        group: str,
        absent: Any = None,
        **kwargs: Any,
    ) -> Any:
        """``<verb>_namespaced_custom_object``; ``absent`` when the object is not there (404),
        or for a create, already there (409): both are states of the object, not failures."""
        method = getattr(self._custom, f"{verb}_namespaced_custom_object")
        try:
            return self._call(
                (group, plural, verb),
                namespace,
                name,
                lambda: method(
                    group,
                    version,
                    namespace,
                    plural,
                    *args,
                    _request_timeout=self._timeout,
                    **kwargs,
                ),
            )
        except KubeApiError as e:
            if e.status == (409 if verb == "create" else 404):
                return absent
            raise

    def create_object(
        self,
        version: str,
        plural: str,
        namespace: str,
        body: dict[str, Any],
        *,
        group: str = GROUP,
    ) -> dict[str, Any] | None:
        """Create ``body``; ``None`` when an object of that name already exists (409)."""
        name = str(body.get("metadata", {}).get("name", "?"))
        return self._custom_call("create", version, plural, namespace, name, body, group=group)

    def get_object(
        self, version: str, plural: str, namespace: str, name: str, *, group: str = GROUP
    ) -> dict[str, Any] | None:
        """The object, or ``None`` when there is none of that name (404)."""
        return self._custom_call("get", version, plural, namespace, name, name, group=group)

    def patch_object(
        self,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        group: str = GROUP,
    ) -> dict[str, Any] | None:
        """JSON-merge-patch the object; ``None`` when it is gone (404)."""
        return self._custom_call(
            "patch", version, plural, namespace, name, name, patch, group=group
        )

    def delete_object(
        self, version: str, plural: str, namespace: str, name: str, *, group: str = GROUP
    ) -> bool:
        """Delete the object (dependents in the background); ``False`` if already gone."""
        deleted = self._custom_call(
            "delete", version, plural, namespace, name, name, group=group, absent=False,
            propagation_policy="Background",
        )  # fmt: skip
        return deleted is not False

    def watch_object(
        self,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        *,
        group: str = GROUP,
        timeout_s: int = 300,
    ) -> Watched:
        """Follow the object ``namespace/name`` through the API's watch: its state now (when it
        exists), then each change. The request is made here, so that a refusal (a missing
        ``watch`` permission) raises now; the server ends the watch after ``timeout_s``.

        Raises:
            KubeApiError: the watch could not be opened.
        """
        what = (group, plural, "watch")
        resp = self._call(
            what,
            namespace,
            name,
            lambda: self._custom.list_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                field_selector=f"metadata.name={name}",
                watch=True,
                timeout_seconds=timeout_s,
                _preload_content=False,
                # Read timeout: the server's end of the watch, and a margin.
                _request_timeout=(self.request_timeout_s, timeout_s + self.request_timeout_s),
            ),
        )
        return Watched(resp, f"watch {plural}.{group} {namespace}/{name}")

    def list_trials(self, namespace: str, experiment: str) -> list[dict[str, Any]]:
        """The Trials of ``experiment`` (by Katib's experiment label)."""
        out = self._call(
            (GROUP, TRIALS, "list"),
            namespace,
            experiment,
            lambda: self._custom.list_namespaced_custom_object(
                GROUP,
                KATIB_VERSION,
                namespace,
                TRIALS,
                label_selector=f"{EXPERIMENT_LABEL}={experiment}",
                _request_timeout=self._timeout,
            ),
        )
        return list(out.get("items") or [])

    def list_workloads(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """Kueue's Workloads in ``namespace`` (the queued job ``job``'s, and its neighbours' in
        the queue), for messages."""
        out = self._call(
            (KUEUE_GROUP, WORKLOADS, "list"),
            namespace,
            job,
            lambda: self._custom.list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS, _request_timeout=self._timeout
            ),
        )
        return list(out.get("items") or [])

    def get_trial(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Trial, or ``None`` when there is none of that name."""
        return self.get_object(KATIB_VERSION, TRIALS, namespace, name)

    # Pods, logs, events

    def master_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        """The PyTorchJob's master pods (usually one; two while the operator replaces it)."""
        selector = (
            f"{JOB_NAME_LABEL}={job_name},{REPLICA_TYPE_LABEL}=master,{REPLICA_INDEX_LABEL}=0"
        )
        return self.list_pods(namespace, selector, job_name)

    def list_pods(self, namespace: str, selector: str, job_name: str) -> list[dict[str, Any]]:
        """The pods matching the label ``selector`` (the job ``job_name``'s, for messages)."""
        pods = self._call(
            ("", "pods", "list"),
            namespace,
            job_name,
            lambda: self._core.list_namespaced_pod(
                namespace, label_selector=selector, _request_timeout=self._timeout
            ),
        )
        return list(self._client.sanitize_for_serialization(pods).get("items") or [])

    def list_nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes (cluster-scoped: the ClusterRole of manifests/rbac grants it)."""
        nodes = self._call(
            ("", "nodes", "list"),
            "(cluster)",
            "*",
            lambda: self._core.list_node(_request_timeout=self._timeout),
        )
        return list(self._client.sanitize_for_serialization(nodes).get("items") or [])

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod ``name``, or ``None`` when there is none; read with the ``list`` verb (a
        field selector on its name), which the launcher's Role already grants."""
        pods = self._call(
            ("", "pods", "list"),
            namespace,
            name,
            lambda: self._core.list_namespaced_pod(
                namespace, field_selector=f"metadata.name={name}", _request_timeout=self._timeout
            ),
        )
        items = self._client.sanitize_for_serialization(pods).get("items") or []
        return dict(items[0]) if items else None

    def pod_log(
        self,
        namespace: str,
        pod: str,
        *,
        since_seconds: int | None = None,
        tail_lines: int | None = None,
        timestamps: bool = False,
        container: str = CONTAINER,
    ) -> str | None:
        """The ``container``'s log (a PyTorchJob's training container by default), or ``None``
        while there is none to read.

        ``None`` covers 400 (container still being created) and 404 (pod gone): both are
        states of a job, not failures of the call.
        """
        kwargs: dict[str, Any] = {"container": container, "timestamps": timestamps}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        try:
            # Raw bytes: the client would json-decode a log that happens to be valid JSON.
            resp = self._call(
                ("", "pods/log", "get"),
                namespace,
                pod,
                lambda: self._core.read_namespaced_pod_log(
                    pod,
                    namespace,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                    **kwargs,
                ),
            )
        except KubeApiError as e:
            if e.status in (400, 404):
                return None
            raise
        return bytes(resp.data).decode("utf-8", errors="replace")

    def events(self, namespace: str, involved_name: str) -> list[dict[str, Any]]:
        """Events about the object named ``involved_name`` (the job or one of its pods)."""
        events = self._call(
            ("", "events", "list"),
            namespace,
            involved_name,
            lambda: self._core.list_namespaced_event(
                namespace,
                field_selector=f"involvedObject.name={involved_name}",
                _request_timeout=self._timeout,
            ),
        )
        return list(self._client.sanitize_for_serialization(events).get("items") or [])

    # Retries

    def _call(
        self, call: tuple[str, str, str], namespace: str, name: str, fn: Callable[[], T]
    ) -> T:
        """``fn()``, repeated while it fails transiently; otherwise a named KubeApiError.

        ``call`` is the call's entry in :data:`API_CALLS`, which names it in messages.
        """
        import urllib3
        from kubernetes.client.exceptions import ApiException

        assert call in API_CALLS, call
        group, resource, verb = call
        what = f"{verb} {resource}{'.' + group if group else ''} {namespace}/{name}"
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return fn()
            except ApiException as e:
                status = int(e.status or 0)
                detail = _status_message(e)
                if status not in TRANSIENT_STATUS:
                    raise KubeApiError(
                        f"Kubernetes API: {what} failed: {status} {e.reason}: {detail}"
                        + _rbac_hint(call, namespace, status),
                        status=status,
                    ) from e
                if attempt == self.retry.attempts:
                    raise KubeApiError(
                        f"Kubernetes API: {what} still failing after {attempt} attempts: "
                        f"{status} {e.reason}: {detail}",
                        status=status,
                    ) from e
                wait = _retry_after(e, self.retry.max_retry_after_s)
                if wait is None:
                    wait = self.retry.delay(attempt)
                log.warning("%s: %s %s, retrying in %.1f s", what, status, e.reason, wait)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                # Timeouts, resets and refused connections: the API server may be restarting.
                if attempt == self.retry.attempts:
                    raise KubeApiError(
                        f"Kubernetes API: {what} still failing after {attempt} attempts: {e}",
                        status=None,
                    ) from e
                wait = self.retry.delay(attempt)
                log.warning("%s: %s, retrying in %.1f s", what, type(e).__name__, wait)
            self._sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")


class Watched:
    """An open watch of one object (:meth:`KubeApi.watch_object`); iterating yields the object
    on each ADDED or MODIFIED event and ``None`` once it is DELETED, and ends when the server
    ends the watch. :meth:`close` (from any thread) ends it early."""

    def __init__(self, resp: Any, what: str) -> None:
        self._resp = resp
        self.what = what

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        import urllib3

        pending = b""
        try:
            for chunk in self._resp.stream(4096, decode_content=True):
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        yield self._event(line)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            # The connection dropped or was shut down (close()), or the server sent half a
            # line: the watch has ended.
            log.debug("%s ended: %s", self.what, e)
        finally:
            # Not reused: a watch's connection ends with the watch (closed by this thread, the
            # one that reads: close() from another would wait for the read to return).
            self._resp.close()
            self._resp.release_conn()

    def _event(self, line: bytes) -> dict[str, Any] | None:
        event = json.loads(line)
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            # A Status: most often 410 Gone (the version the watch resumed from is too old).
            raise KubeApiError(
                f"Kubernetes API: {self.what}: {obj.get('code')} {obj.get('message')}",
                status=obj.get("code"),
            )
        return None if kind == "DELETED" else dict(obj)

    def close(self) -> None:
        """End the watch from another thread: shut its socket down, which ends the read that
        waits on it (closing the response would wait for that read instead)."""
        import socket

        sock = getattr(getattr(self._resp, "connection", None), "sock", None)
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError as e:  # already closed by the reader
            log.debug("closing %s: %s", self.what, e)


def _status_message(e: Any) -> str:
    """The ``message`` of the API's Status body, else the raw body."""
    body = e.body.decode("utf-8", "replace") if isinstance(e.body, bytes) else e.body
    try:
        return str(json.loads(body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(body or "").strip()[:500]


def _retry_after(e: Any, cap_s: float) -> float | None:
    """Seconds a 429 or 503 asks us to wait (``Retry-After``), capped; ``None`` when absent."""
    value = (e.headers or {}).get("Retry-After")
    if value is None:
        return None
    try:
        return min(cap_s, max(0.0, float(value)))
    except ValueError:
        return None  # The HTTP-date form: the API server sends seconds, fall back to backoff.


def _rbac_hint(call: tuple[str, str, str], namespace: str, status: int) -> str:
    """For a 403, the permission that is missing, in the terms a Role is written in."""
    if status != 403:
        return ""
    group, resource, verb = call
    return (
        f" (the pod's service account needs RBAC verb {verb!r} on {resource!r} in API group "
        f"{group!r} in namespace {namespace!r})"
    )
