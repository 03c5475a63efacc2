"""What the PyTorchJob and TrainJob launchers share: a run and the cluster settings in, one job
spec, one resource on the watch loop with its main pod's log streamed, one outcome."""

from __future__ import annotations

import abc
import logging
from typing import Any

from trainer.launch import TrainingRun
from trainer.launch.capacity import check_gpu_nodes
from trainer.launch.diagnosis import lost_with_its_node, unscheduled
from trainer.launch.jobspec import ClusterConfig, JobSpec
from trainer.launch.kube import KubeApi, KubeApiError
from trainer.launch.owners import PodRef
from trainer.launch.podlog import PodLog
from trainer.launch.queue import QueueWait, queue_of, queue_wait
from trainer.launch.resourcelauncher import ResourceLauncher
from trainer.launch.watch import TERMINAL, OnExit, Resource

log = logging.getLogger(__name__)


class JobResource(Resource, abc.ABC):
    """A training job on the watch loop: its state is logged and its main pod's log streamed.

    Subclasses name the resource (the :class:`Resource` attributes), the container whose log is
    streamed, and how the main pod is found (:meth:`main_pod`).
    """

    container: str = ""
    """The training container of the job's pods."""

    def __init__(
        self, api: KubeApi, namespace: str, name: str, log_tail: int, step: str = "train"
    ) -> None:
        self.api = api
        self.step = step
        self.namespace = namespace
        self.name = name
        self.log_tail = log_tail
        self.reported: str | None = None
        self.unscheduled: str | None = None
        """The scheduler's last reason, already logged, why one of the job's pods has no node."""
        self.unscheduled_pod: str | None = None
        """The pod that ``unscheduled`` is about."""
        self.lost: str | None = None
        """The last lost-node report, already logged: which of the job's pods wait for a lost
        node to let them go."""
        self.pod: dict[str, Any] | None = None
        self.pod_log = self._log(reattached=False)
        self.spec: JobSpec | None = None
        """The job's spec, for the checks before it is created."""
        self.queued: QueueWait | None = None
        """Where the job last stood in its Kueue queue (logged once per change)."""

    def before_create(self) -> None:
        if self.spec is not None:
            check_gpu_nodes(self.api, self.spec)

    def _log(self, *, reattached: bool) -> PodLog:
        return PodLog(
            self.api,
            self.namespace,
            tail=self.log_tail,
            reattached=reattached,
            container=self.container,
            step=self.step,
        )

    def observe(self, obj: dict[str, Any], state: str) -> bool:
        if state != self.reported:
            log.info("%s %s/%s: %s", self.kind, self.namespace, self.name, state)
            self.reported = state
        self.pod = self.main_pod()
        if state not in TERMINAL and (queue := queue_of(obj)) is not None:
            self._say_where_it_waits_in_its_queue(obj, queue)
        if state not in TERMINAL:
            self._say_what_holds_the_pods(self.all_pods())
        self.pod_log.pump(self.pod)
        return state in TERMINAL

    def _say_what_holds_the_pods(self, pods: list[dict[str, Any]]) -> None:
        """Log, once per reason, what keeps the job's pods from running: a pod that waits for a
        node (a GPU the cluster lacks, a taint, a node selector, no node left beside its peers),
        and a pod stuck on a node that was lost (its replacement waits for it): the job would
        otherwise sit, silent, until its deadline. The deadline's message repeats it."""
        waiting = [(p["metadata"]["name"], w) for p in pods if (w := unscheduled(p)) is not None]
        pod, why = waiting[0] if waiting else (None, None)
        if why and why != self.unscheduled:
            log.warning(
                "%s %s/%s: its pod %s cannot be scheduled yet: %s",
                self.kind, self.namespace, self.name, pod, why,
            )  # fmt: skip
        self.unscheduled, self.unscheduled_pod = why, pod
        lost = [line for p in pods if (line := lost_with_its_node(p)) is not None]
        report = "; ".join(lost) if lost else None
        if report and report != self.lost:
            log.warning("%s %s/%s: %s", self.kind, self.namespace, self.name, report)
        self.lost = report

    def _say_where_it_waits_in_its_queue(self, obj: dict[str, Any], queue: str) -> None:
        """While Kueue holds the job (not admitted yet), log where it stands in its queue and
        Kueue's reason, once per change; :meth:`refused` ends the wait when Kueue says it can
        never be admitted."""
        if self.queued is not None and self.queued.admitted:
            return
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        try:
            wait = queue_wait(self.api.list_workloads(self.namespace, self.name), uid, queue)
        except KubeApiError as e:
            if self.queued is None:
                log.warning("%s %s/%s: its place in queue %s cannot be read: %s",
                            self.kind, self.namespace, self.name, queue, e)  # fmt: skip
                self.queued = QueueWait(queue, admitted=False, position=None, reason="")
            return
        if wait == self.queued:
            return
        if wait.admitted:
            # After a wait it said, at the wait's level: where only warnings are shown (the train
            # step's pod), the wait would otherwise seem to go on under the training's lines.
            waited = self.queued is not None and bool(self.queued.reason)
            log.log(logging.WARNING if waited else logging.INFO, "%s %s/%s: admitted by queue %s",
                    self.kind, self.namespace, self.name, queue)  # fmt: skip
        elif wait.reason:
            # Only once Kueue says why: a Workload it has not looked at yet is admitted a moment
            # later when its quota is free (seen live: "waiting" then "admitted" in one second).
            log.warning("%s %s/%s: %s", self.kind, self.namespace, self.name, wait.line())
        self.queued = wait

    def refused(self) -> tuple[str, str, str] | None:
        wait = self.queued
        if wait is None or wait.admitted or not wait.never:
            return None
        where = f"{self.spec.cluster.SECTION if self.spec else 'train.cluster'}.gang_queue"
        return (
            "E_QUEUE_REFUSED",
            f"Kueue can never admit {self.kind} {self.namespace}/{self.name} in queue "
            f"{wait.queue}: {wait.reason}",
            where,
        )

    def on_adopt(self) -> None:
        # A re-attached launcher shows the recent past, not hours of an earlier attempt's log.
        self.pod_log = self._log(reattached=True)

    def describe(self, state: str) -> str:
        why = ""
        if self.queued is not None and not self.queued.admitted:
            why = f", {self.queued.line()}"
        if self.unscheduled:
            why = f", its pod {self.unscheduled_pod} unscheduled: {self.unscheduled}"
        if self.lost:
            why += f"; {self.lost}"
        return f"train.timeout_s; it was {state}{why}"

    def main_pod(self) -> dict[str, Any] | None:
        """The live main pod (the newest, while a controller replaces one)."""
        pods = self.pods()
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")] or pods
        if not live:
            return None
        return max(live, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))

    @abc.abstractmethod
    def pods(self) -> list[dict[str, Any]]:
        """The pods that may be the job's main pod (the master, node 0)."""

    @abc.abstractmethod
    def all_pods(self) -> list[dict[str, Any]]:
        """Every pod of the job (each replica's, each node's), by its controller's label."""


class ClusterJobLauncher(ResourceLauncher, abc.ABC):
    """A launcher of one training-job resource built from the step's :class:`ClusterConfig`.

    The job is named by the caller from the KFP run and task, so a retried or restarted step
    finds its job and re-attaches instead of creating a second one (a finished job is reported,
    not re-run; a suspended one is resumed). While waiting it streams the main pod's log into
    this step's stdout. When the job fails, the deadline passes or the step is cancelled
    (SIGTERM), ``on_exit`` decides what happens to the job: ``delete`` it (and its pods),
    ``keep`` it for inspection, or ``suspend`` it (pods go, the job and its state stay).

    Subclasses say how a :class:`JobSpec` becomes their resource (:meth:`build`) and which
    :class:`JobResource` watches it (:attr:`resource`).

    Args:
        namespace: namespace of the job (the launcher pod's, for the ownerReference).
        cluster: the step's cluster settings; :meth:`launch` adds a run to them to make the
            :class:`JobSpec`, :meth:`run` takes a :class:`JobSpec` as it is.
        api: the Kubernetes API; ``None``: in-cluster config, else the kubeconfig.
        on_exit: what to do with the job on failure, deadline and cancellation.
        poll_s: seconds between looks at the job and its log.
        log_tail: log lines of the watched pod kept for a failure's message.
        own_pod: the launcher's pod; the job gets an ownerReference to it.

    Raises:
        ValueError: an argument is out of range.
    """

    resource: type[JobResource]
    """The watch loop's adapter of this launcher's resource."""
    role: str = "master"
    """How a failure's message calls the main pod."""

    def __init__(
        self,
        *,
        namespace: str,
        cluster: ClusterConfig,
        api: KubeApi | None = None,
        on_exit: OnExit = "delete",
        poll_s: float = 2.0,
        log_tail: int = 50,
        own_pod: PodRef | None = None,
    ) -> None:
        super().__init__(
            namespace=namespace, api=api, own_pod=own_pod, poll_s=poll_s, on_exit=on_exit
        )
        if log_tail < 1:
            raise ValueError(f"log_tail must be >= 1, got {log_tail}")
        self.cluster = cluster
        self.log_tail = log_tail

    def launch(self, run: TrainingRun) -> None:
        """Create (or re-attach to) the job of ``run`` and return when it succeeded.

        Raises:
            InputError: the job failed on bad input (the worker's ``ERROR [train] E_...`` line),
                or the run makes no valid job.
            RuntimeError: the job failed (conditions, events and the watched pod's last log
                lines in the message), the API refused a call, or the step was cancelled
                (:class:`~trainer.launch.watch.LaunchCancelled`).
            TimeoutError: the run's ``timeout_s`` passed before the job finished.
        """
        self.run(JobSpec(namespace=self.namespace, run=run, cluster=self.cluster))

    def run(self, spec: JobSpec) -> None:
        """Create (or re-attach to) the job of ``spec``; return when it succeeded.

        Raises:
            ValueError: ``spec`` is for another namespace.
            InputError, RuntimeError, TimeoutError: as :meth:`launch`.
        """
        if spec.namespace != self.namespace:
            raise ValueError(
                f"the job spec is for namespace {spec.namespace!r}, not {self.namespace!r}"
            )
        body = self.build(spec)
        job = self.resource(self.api, self.namespace, spec.name, self.log_tail, spec.run.step)
        job.spec = spec
        watch = self.watch(job, spec.name, spec.run.timeout_s)
        found = watch.run(body)
        if watch.state == "Succeeded":
            log.info("%s %s succeeded", job.kind, watch.ref)
            return
        diagnosis = watch.diagnose(
            found, pod=job.pod, pod_log=job.pod_log, container=job.container, role=self.role
        )
        done = watch.apply_on_exit()
        if job.pod_log.errors:
            log.error("%s\n%s", diagnosis, done)
            raise job.pod_log.errors[0]
        raise RuntimeError(f"{diagnosis}\n{done}")

    @abc.abstractmethod
    def build(self, spec: JobSpec) -> dict[str, Any]:
        """The resource of ``spec``, as the dict to send to the API server."""
