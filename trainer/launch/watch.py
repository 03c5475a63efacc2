"""One loop that runs a custom resource to its end, for every launcher that makes one.

A launcher (the PyTorchJob and TrainJob ones, Katib's Experiment one) hands :class:`Watch`
the object to create and a small :class:`Resource` adapter that says how to read the object's
state, what to print while it runs, how to resume and suspend it. The loop is the same for all:

- **create or adopt**: the name is deterministic, so a retried or restarted step finds the object
  of an earlier attempt and re-attaches (also after a 409 race), gives it an ownerReference to
  this launcher's pod, and resumes it if that attempt suspended it; an object still being
  deleted is waited for, then created anew;
- **wait**: poll every ``poll_s``, letting the adapter stream logs or report progress, until the
  adapter says the object is done;
- **deadline and cancellation**: past ``timeout_s`` (:class:`TimeoutError`) or on SIGTERM
  (:class:`LaunchCancelled`), between API calls, never mid-request;
- **on_exit**: when the step fails, times out or is cancelled, ``delete`` the object, ``keep`` it
  for inspection, or ``suspend`` it (where the resource can be suspended);
- **a KFP run's step**: when an Argo Workflow (a KFP run) owns the launcher's pod, the object is
  owned by that Workflow too, and the launcher follows the run while it waits: once the run is
  terminated, deleted or ended, ``on_exit`` is applied at once, before the step's own SIGTERM
  (which may leave it too little time). A SIGTERM while the run goes on (the pod alone was
  deleted or evicted: Argo retries the step) keeps the object running for the retry to
  re-attach to; a SIGTERM of a run that stops applies ``on_exit`` as always (who owns what, and
  whether the run goes on: :mod:`trainer.launch.owners`);
- **diagnose**: a failed object's conditions, recent events, a container's exit code and the
  last log lines of its main pod, in one message (:mod:`trainer.launch.diagnosis`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, Literal

from trainer.base.errors import InputError, StepFailure
from trainer.launch.diagnosis import diagnose, event_time
from trainer.launch.kube import GROUP, KubeApi, KubeApiError
from trainer.launch.owners import (
    PodRef,
    RunFollower,
    missing_owners,
    run_goes_on,
    run_owner,
    workflow,
)
from trainer.launch.podlog import PodLog

log = logging.getLogger(__name__)

OnExit = Literal["delete", "keep", "suspend"]
TERMINAL = ("Succeeded", "Failed")
"""Condition types that end a Training Operator job or a Katib Experiment."""
REFUSAL_CHECK_POLLS = 5
"""Every this many polls the wait looks for a Pod Security refusal of the object's pods."""
GONE_WAIT_S = 600.0
"""Longest wait for an earlier attempt's object to finish being deleted (a stuck finalizer)."""


class LaunchCancelled(StepFailure):
    """The step was cancelled (SIGTERM), or its KFP run stopped, while its object ran;
    ``on_exit`` has been applied. Its error line reads ``E_STOPPED``: nothing failed."""

    def __init__(self, message: str) -> None:
        super().__init__("E_STOPPED", message)


class _Stop(Exception):
    """Internal: leave the wait loop because of a deadline, a cancellation or the run's stop."""

    def __init__(self, why: Literal["deadline", "cancelled", "run stopped"]) -> None:
        super().__init__(why)
        self.why = why


def job_state(obj: Mapping[str, Any]) -> str:
    """The object's state: the type of its last condition whose status is ``"True"``.

    ``Created``, ``Running``, ``Restarting``, ``Suspended``, ``Succeeded`` or ``Failed``;
    ``Pending`` before the controller has written any condition.
    """
    state = "Pending"
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True":
            state = str(cond.get("type"))
    return state


class Resource:
    """What :class:`Watch` needs to know about one kind of custom resource.

    Subclasses set the class attributes and override the hooks whose defaults do not fit.
    """

    kind: str = ""
    """How messages name it: ``PyTorchJob``, ``Katib Experiment``."""
    kubectl: str = ""
    """Its name for ``kubectl delete``: ``pytorchjob``, ``experiment``."""
    group: str = GROUP
    """API group: ``kubeflow.org`` (Training Operator, Katib), ``trainer.kubeflow.org``."""
    version: str = ""
    """API version in ``group``."""
    plural: str = ""
    """Resource name in the API's paths."""
    noun: str = "job"
    """What the step calls it: "no job had been created"."""
    deleted: str = "it was deleted (on_exit=delete)"
    creation_failed: tuple[str, ...] = ()
    """Reasons of the controller's events saying it could not create the object's children
    (Trainer's ``TrainJobResourcesCreationFailed``): with a webhook's denial, permanent."""
    """What ``on_exit=delete`` did, for the step's message."""

    def state(self, obj: Mapping[str, Any]) -> str:
        """The object's state, in the loop's words: ``Succeeded`` and ``Failed`` end it
        (:data:`TERMINAL`), ``Suspended`` is resumable; default :func:`job_state`."""
        return job_state(obj)

    def observe(self, obj: dict[str, Any], state: str) -> bool:
        """Called after every read of the object (stream a log, report progress); whether the
        object is done, so that the wait ends."""
        return state in TERMINAL

    def before_create(self) -> None:
        """Called before the object is created (never when an earlier attempt's is adopted):
        checks that refuse an object that could never run."""

    def refused(self) -> tuple[str, str, str] | None:
        """(error code, message, where) when what :meth:`observe` saw says the object can
        never run (the wait then applies ``on_exit`` and fails the step); None otherwise."""
        return None

    def on_adopt(self) -> None:
        """Called when the object existed already (an earlier attempt's)."""

    def describe(self, state: str) -> str:
        """The object's progress in a deadline's message."""
        return f"it was {state}"

    def resume_patch(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The patch that resumes an object an earlier attempt suspended; ``None``: none needed."""
        return None

    def suspend_patch(self) -> dict[str, Any] | None:
        """The patch that suspends the object (``on_exit=suspend``); ``None``: cannot."""
        return None


class Watch:
    """One run of one object: its deadline, cancellation flag and ``on_exit``."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        *,
        namespace: str,
        name: str,
        timeout_s: float | None,
        poll_s: float,
        on_exit: OnExit,
        own_pod: PodRef | None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.resource = resource
        self.ns = namespace
        self.name = name
        self.ref = f"{namespace}/{name}"
        self.what = f"{resource.kind} {self.ref}"
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.poll_s = poll_s
        self.on_exit: OnExit = on_exit
        self.own_pod = own_pod
        self.report: Callable[[str], None] = report or log.info
        """Where progress lines go (default: this module's log, as the step shows them)."""
        self.cancelled = False
        self.have = False
        self.state = "Pending"
        self.run_owner: dict[str, Any] | None = None
        """An ownerReference to the Argo Workflow (KFP run) that owns the launcher's pod."""
        self.follower: RunFollower | None = None
        """Follows that run while the object runs: its stop stops the object."""

    def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create (or adopt) ``body``'s object and wait until the resource says it is done.

        Returns:
            The finished object; what its state means is the caller's to decide (and to call
            :meth:`apply_on_exit` on failure).

        Raises:
            TimeoutError: the deadline passed (``on_exit`` applied).
            LaunchCancelled: SIGTERM arrived (``on_exit`` applied).
            KubeApiError: the API refused a call (``on_exit`` applied to a created object).
            RuntimeError: the object vanished, or would not stop being deleted.
        """
        meta = body.setdefault("metadata", {})
        if meta.get("name") != self.name:
            raise ValueError(
                f"the {self.resource.noun} is named {meta.get('name')!r}, not {self.name!r}"
            )
        if meta.setdefault("namespace", self.ns) != self.ns:
            raise ValueError(
                f"the {self.resource.noun} is in {meta['namespace']!r}, not {self.ns!r}"
            )
        if self.own_pod is not None:
            self.run_owner = self._find_run_owner(self.own_pod)
            owners = meta.setdefault("ownerReferences", [])
            owners.extend(self._missing_owners(owners))
        previous = None
        if threading.current_thread() is threading.main_thread():

            def on_sigterm(signum: int, frame: FrameType | None) -> None:
                # Only a flag: the loop stops the object between API calls, never mid-request.
                self.cancelled = True

            previous = signal.signal(signal.SIGTERM, on_sigterm)
        self.follower = self._follow_run()
        try:
            return self._run(body)
        finally:
            if self.follower is not None:
                self.follower.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _run(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._wait(self._start(body))
        except _Stop as stop:
            if not self.have:
                done = f"no {self.resource.noun} had been created"
            elif stop.why == "cancelled" and (run := self._run_going_on()):
                done = self._keep_for_retry(run)
            else:
                done = self.apply_on_exit()
            if stop.why == "deadline":
                raise TimeoutError(
                    f"{self.what} did not finish within {self.timeout_s} s "
                    f"({self.resource.describe(self.state)}); {done}"
                ) from None
            if stop.why == "run stopped" and self.follower is not None:
                raise LaunchCancelled(
                    f"{self.what}: the step was stopped: {self.follower.why}; {done}"
                ) from None
            raise LaunchCancelled(
                f"{self.what}: the step was cancelled (SIGTERM); {done}"
            ) from None
        except (KubeApiError, KeyboardInterrupt):
            # Nobody will watch the object once this step ends: do not leave it running unseen.
            if self.have:
                log.warning("%s: %s", self.what, self.apply_on_exit())
            raise

    def _find_run_owner(self, pod: PodRef) -> dict[str, Any] | None:
        """The run that owns this launcher's pod (:func:`~trainer.launch.owners.run_owner`);
        ``None`` also when the pod or the run cannot be read: then only the pod owns the
        object, and a SIGTERM applies ``on_exit``."""
        try:
            return run_owner(self.api, pod, self.ns)
        except KubeApiError as e:
            log.warning(
                "%s: which run owns this step cannot be read (%s): a SIGTERM applies on_exit=%s",
                self.what, e, self.on_exit,
            )  # fmt: skip
        return None

    def _follow_run(self) -> RunFollower | None:
        """A follower of the run that owns this launcher's pod, started; ``None`` when there is
        no such run, or it cannot be watched (then only the step's SIGTERM stops the object)."""
        if self.run_owner is None:
            return None
        follower = RunFollower(self.api, self.ns, self.run_owner)
        try:
            follower.start()
        except KubeApiError as e:
            log.warning(
                "%s: run %s cannot be followed (%s): only the step's SIGTERM stops the %s "
                "when the run is terminated",
                self.what, self.run_owner["name"], e, self.resource.noun,
            )  # fmt: skip
            return None
        return follower

    def _missing_owners(self, owners: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """This launcher's pod and its run, as ownerReferences, that ``owners`` lacks."""
        return missing_owners(owners, self.own_pod, self.run_owner)

    def _run_going_on(self) -> str | None:
        """The name of the Workflow (KFP run) that owns the launcher's pod when that run goes on
        after this SIGTERM (so Argo retries the step); ``None`` when there is no such run, it
        ends (:func:`~trainer.launch.owners.run_goes_on`), or it cannot be read."""
        if self.run_owner is None:
            return None
        name = str(self.run_owner["name"])
        try:
            wf = workflow(self.api, self.ns, name)
        except KubeApiError as e:
            log.warning("%s: run %s cannot be read (%s); applying on_exit", self.what, name, e)
            return None
        return name if run_goes_on(wf, self.run_owner) else None

    def _keep_for_retry(self, run: str) -> str:
        """Leave the object running for the step's next attempt: only this pod stops owning it
        (the run's Workflow still does, so deleting the run deletes it)."""
        try:
            if (release := self._release()) is not None:
                self._patch(release)
        except KubeApiError as e:
            log.error("%s", e)
        return (
            f"it was kept running: only this step's pod was stopped, its run {run} goes on, "
            "and the step's retry re-attaches to it"
        )

    def _get(self) -> dict[str, Any] | None:
        r = self.resource
        return self.api.get_object(r.version, r.plural, self.ns, self.name, group=r.group)

    def _release(self) -> dict[str, Any] | None:
        """The patch that drops this launcher pod from the object's owners, or None.

        A kept or suspended job must outlive the launcher: KFP cancels a step by deleting its
        pod, and the garbage collector then deletes what the pod owns (seen on the cluster: a
        TrainJob suspended on SIGTERM was gone a moment later). A retry adopts it again.
        """
        if self.own_pod is None or (obj := self._get()) is None:
            return None
        owners = list((obj.get("metadata") or {}).get("ownerReferences") or [])
        kept = [o for o in owners if o.get("uid") != self.own_pod.uid]
        return {"metadata": {"ownerReferences": kept}} if len(kept) != len(owners) else None

    def _patch(self, patch: dict[str, Any]) -> dict[str, Any] | None:
        r = self.resource
        return self.api.patch_object(r.version, r.plural, self.ns, self.name, patch, group=r.group)

    def _start(self, body: dict[str, Any]) -> dict[str, Any]:
        """The object: the existing one of that name (adopted), else a new one."""
        races = 0
        gone_by = time.monotonic() + GONE_WAIT_S
        while True:
            self.check()
            obj = self._get()
            if obj is None:
                r = self.resource
                r.before_create()
                obj = self.api.create_object(r.version, r.plural, self.ns, body, group=r.group)
                if obj is not None:
                    self.have = True
                    self.report(f"created {self.what}")
                    return obj
                # 409: another launcher of this task created it between our get and create.
                races += 1
                if races > 3:
                    raise RuntimeError(f"{self.what} keeps appearing and vanishing")
                continue
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                # An earlier attempt's object on its way out: wait, then start afresh.
                self.report(f"{self.what} is being deleted; creating it anew once gone")
                if time.monotonic() > gone_by:
                    raise RuntimeError(
                        f"{self.what} has been deleting for over {GONE_WAIT_S:.0f} s (a finalizer "
                        f"that nothing removes?); the step cannot start its {self.resource.noun}"
                    )
                self.sleep(self.poll_s)
                continue
            self.have = True
            return self._adopt(obj)

    def _adopt(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Re-attach to an object: own it too; resume it if an earlier attempt suspended it."""
        self.resource.on_adopt()
        self.state = self.resource.state(obj)
        self.report(f"{self.what} exists ({self.state}): re-attaching instead of creating another")
        if self.state in TERMINAL:
            return obj
        patch: dict[str, Any] = {}
        owners = list((obj.get("metadata") or {}).get("ownerReferences") or [])
        if missing := self._missing_owners(owners):
            # A merge patch replaces lists whole: send the earlier owners along.
            patch["metadata"] = {"ownerReferences": [*owners, *missing]}
        if resume := self.resource.resume_patch(obj):
            self.report(f"{self.what} was suspended by an earlier attempt: resuming it")
            patch |= resume
        if patch:
            obj = self._patch(patch) or obj
        return obj

    def _wait(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Poll until the resource says the object is done; the finished object.

        Raises:
            InputError: ``E_POD_SECURITY`` when the namespace's Pod Security refuses the
                object's pods, ``E_JOB_REFUSED`` when a webhook denies what the controller
                creates for it (the controller would retry either forever).
        """
        polls = 0
        while True:
            self.state = self.resource.state(obj)
            if self.resource.observe(obj, self.state):
                return obj
            if (held := self.resource.refused()) is not None:
                code, why, where = held
                raise InputError(code, f"{why}; {self.apply_on_exit()}", where)
            polls += 1
            if polls % REFUSAL_CHECK_POLLS == 0 and (refused := self._refused()):
                code, why = refused
                done = self.apply_on_exit()
                raise InputError(code, f"{why}; {done}", f"namespace {self.ns}")
            self.sleep(self.poll_s)
            got = self._get()
            if got is None:
                self.have = False
                raise RuntimeError(
                    f"{self.what} disappeared while the step waited for it "
                    "(deleted by someone else?)"
                )
            obj = got

    def _refused(self) -> tuple[str, str] | None:
        """The error code and message of a Warning event on the object that no retry of the
        controller's can change: Pod Security refusing one of its pods, or an admission webhook
        denying what the controller creates for it (:attr:`Resource.creation_failed`). A webhook
        that could not be reached is not a refusal: the controller tries again."""
        try:
            events = self.api.events(self.ns, self.name)
        except KubeApiError:
            return None  # events are a diagnosis aid: their absence must not fail the wait
        for e in sorted(events, key=event_time, reverse=True):
            if e.get("type") != "Warning":
                continue
            message = " ".join(str(e.get("message") or "").split())
            if "violates PodSecurity" in message:
                return "E_POD_SECURITY", f"the namespace refuses the pods of {self.what}: {message}"
            denied = "denied the request" in message or " is invalid" in message
            if e.get("reason") in self.resource.creation_failed and denied:
                return "E_JOB_REFUSED", f"the cluster refuses what {self.what} needs: {message}"
        return None

    def apply_on_exit(self) -> str:
        """Delete, keep or suspend the object; what was done, for the step's message."""
        how = self.on_exit
        r = self.resource
        try:
            if how == "keep":
                if (release := self._release()) is not None:
                    self._patch(release)
                how_to = f"kubectl delete {r.kubectl} -n {self.ns} {self.name}"
                return f"it was kept (on_exit=keep): {how_to}"
            if how == "suspend" and (patch := r.suspend_patch()) is not None:
                if self._patch(patch | (self._release() or {})) is None:
                    return "it was already gone"
                return "it was suspended (on_exit=suspend); a retry of the step resumes it"
            if not self.api.delete_object(r.version, r.plural, self.ns, self.name, group=r.group):
                return "it was already gone"
            return r.deleted
        except KubeApiError as e:
            # The object's outcome matters more than the clean-up's: report both, raise the first.
            log.error("%s", e)
            return f"on_exit={how} failed: {e}"

    def diagnose(
        self,
        obj: Mapping[str, Any],
        *,
        pod: Mapping[str, Any] | None,
        pod_log: PodLog,
        container: str,
        role: str = "master",
    ) -> str:
        """Why the object failed (:func:`trainer.launch.diagnosis.diagnose`)."""
        return diagnose(
            self.api, self.ns, self.name, self.what, obj,
            pod=pod, pod_log=pod_log, container=container, role=role,
        )  # fmt: skip

    def check(self) -> None:
        """Leave the wait (via :class:`_Stop`) on cancellation or past the deadline."""
        if self.cancelled:
            log.warning("SIGTERM: stopping %s (on_exit=%s)", self.what, self.on_exit)
            raise _Stop("cancelled")
        if self.follower is not None and self.follower.stopped.is_set():
            log.warning("%s: stopping %s (on_exit=%s)", self.follower.why, self.what, self.on_exit)
            raise _Stop("run stopped")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise _Stop("deadline")

    def sleep(self, seconds: float) -> None:
        """Sleep in slices, so that a SIGTERM or the deadline is acted on within 0.1 s."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.check()
            time.sleep(min(left, 0.1))
        self.check()
