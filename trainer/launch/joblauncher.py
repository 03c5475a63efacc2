"""What the PyTorchJob and TrainJob launchers share: cluster settings in, one job spec, one run."""

from __future__ import annotations

import abc

from trainer.launch.jobspec import ClusterConfig, JobSpec
from trainer.launch.kube import KubeApi
from trainer.launch.watch import OnExit, PodRef, ResourceLauncher


class ClusterJobLauncher(ResourceLauncher, abc.ABC):
    """A launcher of one training-job resource built from the step's :class:`ClusterConfig`.

    Subclasses say how a :class:`JobSpec` becomes their resource and how it is watched
    (:meth:`run`); the spec itself, the arguments and the ``launch`` entry point are common.

    Args:
        namespace: namespace of the job (the launcher pod's, for the ownerReference).
        cluster: the step's cluster settings, which :meth:`launch` turns into a
            :class:`JobSpec`; :meth:`run` takes a :class:`JobSpec` as it is.
        api: the Kubernetes API; ``None``: in-cluster config, else the kubeconfig.
        on_exit: what to do with the job on failure, deadline and cancellation.
        poll_s: seconds between looks at the job and its log.
        log_tail: log lines of the watched pod kept for a failure's message.
        own_pod: the launcher's pod; the job gets an ownerReference to it.

    Raises:
        ValueError: an argument is out of range.
    """

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

    def job_spec(
        self,
        *,
        job_name: str,
        config_uri: str,
        nproc_per_node: int,
        nnodes: int,
        timeout_s: int | None,
    ) -> JobSpec:
        """The job spec of one run: the cluster settings, in this launcher's namespace."""
        return self.cluster.job_spec(
            name=job_name,
            namespace=self.namespace,
            config_uri=config_uri,
            nnodes=nnodes,
            nproc_per_node=nproc_per_node,
            timeout_s=timeout_s,
        )

    def launch(
        self,
        *,
        job_name: str,
        config_uri: str,
        nproc_per_node: int,
        nnodes: int,
        timeout_s: int | None,
    ) -> None:
        """Create (or re-attach to) the job ``job_name`` and return when it succeeded.

        Raises:
            InputError: the job failed on bad input (the worker's ``ERROR [train] E_...`` line),
                or the cluster settings make no valid job.
            RuntimeError: the job failed (conditions, events and the watched pod's last log
                lines in the message), the API refused a call, or the step was cancelled
                (:class:`~trainer.launch.watch.LaunchCancelled`).
            TimeoutError: ``timeout_s`` passed before the job finished.
        """
        spec = self.job_spec(
            job_name=job_name,
            config_uri=config_uri,
            nproc_per_node=nproc_per_node,
            nnodes=nnodes,
            timeout_s=timeout_s,
        )
        self.run(spec, timeout_s=timeout_s)

    def check_namespace(self, spec: JobSpec) -> None:
        """Refuse a spec made for another namespace than this launcher's."""
        if spec.namespace != self.namespace:
            raise ValueError(
                f"the job spec is for namespace {spec.namespace!r}, not {self.namespace!r}"
            )

    @abc.abstractmethod
    def run(self, spec: JobSpec, *, timeout_s: float | None) -> None:
        """Create (or re-attach to) the job of ``spec``; return when it succeeded."""
