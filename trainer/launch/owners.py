"""Who owns what a launcher creates: the launcher's own pod (from the downward API) and, when
the pod is a KFP run's step, the run's Argo Workflow; whether that run goes on after a SIGTERM.

An object owned by the pod goes when the pod goes (a deleted run leaves nothing behind); one
owned by the run too outlives a pod that Argo replaces, so the step's retry re-attaches to it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer.launch.kube import WORKFLOW_GROUP, WORKFLOW_VERSION, WORKFLOWS, KubeApi

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


def run_goes_on(wf: Mapping[str, Any] | None, owner: Mapping[str, Any]) -> bool:
    """Whether the run ``wf`` (read after a SIGTERM) goes on, so that Argo retries the step:
    not when it is gone or replaced (another uid), being terminated (KFP sets
    ``activeDeadlineSeconds: 0``, Argo's own stop and terminate set ``shutdown``), deleted, or
    ended."""
    if wf is None:
        return False
    meta, spec = wf.get("metadata") or {}, wf.get("spec") or {}
    ending = (
        meta.get("uid") != owner["uid"]
        or meta.get("deletionTimestamp")
        or spec.get("shutdown")
        or spec.get("activeDeadlineSeconds") == 0
        or (wf.get("status") or {}).get("phase") in WORKFLOW_DONE
    )
    return not ending


def missing_owners(
    owners: list[dict[str, Any]], own_pod: PodRef | None, run: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The launcher's pod and its run, as ownerReferences, that ``owners`` lacks."""
    refs = [] if own_pod is None else [own_pod.owner_reference(), run]
    return [r for r in refs if r is not None and all(o.get("uid") != r["uid"] for o in owners)]
