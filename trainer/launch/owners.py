"""Who owns what a launcher creates: the launcher's own pod (from the downward API) and, when
the pod is a KFP run's step, the run's Argo Workflow; whether that run goes on, read after a
SIGTERM and followed while the step waits (:class:`RunFollower`).

An object owned by the pod goes when the pod goes (a deleted run leaves nothing behind); one
owned by the run too outlives a pod that Argo replaces, so the step's retry re-attaches to it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer.launch.kube import (
    WORKFLOW_GROUP,
    WORKFLOW_VERSION,
    WORKFLOWS,
    KubeApi,
    Watched,
)

log = logging.getLogger(__name__)

WORKFLOW_DONE = ("Succeeded", "Failed", "Error")
"""Phases of a Workflow that has ended."""


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
        """An ownerReference to this pod: deleting the pod (with the run) deletes the object.

        Neither controller (the pod does not reconcile the object) nor blocking (that would need
        ``update`` on ``pods/finalizers``); the garbage collector deletes it either way.
        """
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": self.name,
            "uid": self.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }


def workflow(api: KubeApi, namespace: str, name: str) -> dict[str, Any] | None:
    """The Argo Workflow ``namespace/name`` (a KFP run), or ``None`` when there is none."""
    return api.get_object(WORKFLOW_VERSION, WORKFLOWS, namespace, name, group=WORKFLOW_GROUP)


def run_owner(api: KubeApi, pod: PodRef, namespace: str) -> dict[str, Any] | None:
    """An ownerReference to the Argo Workflow in ``namespace`` that owns ``pod`` (a KFP run's
    step), or ``None``: no such owner, or the run is gone. The run is read here too, so that a
    missing permission shows at the start, not only when a SIGTERM needs it.

    Raises:
        KubeApiError: the pod or the run cannot be read.
    """
    found = api.get_pod(pod.namespace, pod.name)
    for ref in ((found or {}).get("metadata") or {}).get("ownerReferences") or []:
        version = str(ref.get("apiVersion") or "")
        if ref.get("kind") != "Workflow" or not version.startswith(f"{WORKFLOW_GROUP}/"):
            continue
        if workflow(api, namespace, str(ref["name"])) is None:
            return None
        return {
            "apiVersion": version,
            "kind": "Workflow",
            "name": ref["name"],
            "uid": ref["uid"],
            "controller": False,
            "blockOwnerDeletion": False,
        }
    return None


def run_stops(wf: Mapping[str, Any] | None, owner: Mapping[str, Any]) -> str | None:
    """Why the run ``wf`` stops, in words (``its run X is being terminated``), or ``None`` while
    it goes on: it is gone or replaced (another uid), deleted, being terminated (KFP sets
    ``activeDeadlineSeconds: 0``, Argo's own stop and terminate set ``shutdown``), or ended."""
    run = f"its run {owner['name']}"
    if wf is None:
        return f"{run} was deleted"
    meta, spec = wf.get("metadata") or {}, wf.get("spec") or {}
    phase = (wf.get("status") or {}).get("phase")
    if meta.get("uid") != owner["uid"]:
        return f"{run} was deleted (another run of that name replaced it)"
    if meta.get("deletionTimestamp"):
        return f"{run} is being deleted"
    if spec.get("shutdown") or spec.get("activeDeadlineSeconds") == 0:
        return f"{run} is being terminated"
    if phase in WORKFLOW_DONE:
        return f"{run} has ended ({phase})"
    return None


def run_goes_on(wf: Mapping[str, Any] | None, owner: Mapping[str, Any]) -> bool:
    """Whether the run ``wf`` (read after a SIGTERM) goes on, so that Argo retries the step
    (:func:`run_stops` says why not)."""
    return run_stops(wf, owner) is None


class RunFollower:
    """Follows the KFP run (Argo Workflow) that owns a launcher's pod, in a thread, through the
    API's watch; :attr:`stopped` is set (and :attr:`why` says why) once the run stops going on.

    The step's SIGTERM alone cannot be relied on to stop the job of a terminated run: Argo
    signals the whole process group of the step's container, KFP's launcher (the container's
    command, with the step as its child) exits on it at once, and the container ends within a
    second, taking the step with it. On a busy node that was too little time to delete the job
    (seen in CI: a terminated run's PyTorchJob trained on). KFP marks the run terminated before
    Argo signals the pod, so the watch sees it first, and the launcher stops the job then.

    A watch that ends (the server closes it every ``timeout_s``) or breaks is opened again; its
    first event is the run's state then, so nothing is missed in between.
    """

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        owner: Mapping[str, Any],
        *,
        timeout_s: int = 300,
        retry_s: float = 5.0,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.owner = dict(owner)
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.stopped = threading.Event()
        """Set once the run stops going on."""
        self.why = ""
        """Why the run stops (:func:`run_stops`), once :attr:`stopped` is set."""
        self._done = threading.Event()
        self._watched: Watched | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Open the watch (here, so that a refusal raises now) and follow it in a daemon thread.

        Raises:
            KubeApiError: the watch could not be opened (a missing ``watch`` permission).
        """
        self._watched = self._open()
        threading.Thread(target=self._follow, name="run-follower", daemon=True).start()

    def close(self) -> None:
        """Stop following (the launcher is done with its object)."""
        self._done.set()
        with self._lock:
            if self._watched is not None:
                self._watched.close()

    def _open(self) -> Watched:
        return self.api.watch_object(
            WORKFLOW_VERSION, WORKFLOWS, self.namespace, str(self.owner["name"]),
            group=WORKFLOW_GROUP, timeout_s=self.timeout_s,
        )  # fmt: skip

    def _follow(self) -> None:
        watched = self._watched
        while not self._done.is_set():
            try:
                if watched is None:
                    watched = self._open()
                    with self._lock:
                        self._watched = watched
                    if self._done.is_set():
                        watched.close()
                for wf in watched:
                    if (why := run_stops(wf, self.owner)) is not None:
                        self.why = why
                        self.stopped.set()
                        return
                watched = None  # the server ended the watch: open it again
            except Exception as e:  # a follower that dies would leave only the SIGTERM path
                if self._done.is_set():
                    return
                name = self.owner["name"]
                log.warning("following run %s: %s; again in %.0f s", name, e, self.retry_s)
                watched = None
                self._done.wait(self.retry_s)


def missing_owners(
    owners: list[dict[str, Any]], own_pod: PodRef | None, run: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The launcher's pod and its run, as ownerReferences, that ``owners`` lacks."""
    refs = [] if own_pod is None else [own_pod.owner_reference(), run]
    return [r for r in refs if r is not None and all(o.get("uid") != r["uid"] for o in owners)]
