"""How a training run is started and watched: the one layer between the steps and the engine.

The job is always ``python -m trainer.launch ... -m trainer.worker --config <uri>``; a
:class:`Launcher` decides where it runs. Modules, each of one job:

- :mod:`~trainer.launch.torchrun`: the ``python -m trainer.launch`` wrapper around torchrun
  (exit codes the operator can act on) and :func:`~trainer.launch.torchrun.torchrun_command`;
- :mod:`~trainer.launch.local`: :class:`~trainer.launch.local.LocalLauncher` (a child process
  here) and the one child-process output pump, shared with the tune trial runner;
- :mod:`~trainer.launch.jobspec`: the cluster settings and :class:`~trainer.launch.jobspec.JobSpec`
  (a :class:`TrainingRun` with those settings in a namespace), without a client (field checks
  in :mod:`~trainer.launch.kubefields`); the pod pieces built from a spec in
  :mod:`~trainer.launch.podspec`;
- :mod:`~trainer.launch.kube`: the Kubernetes calls, typed, retried and named;
- :mod:`~trainer.launch.watch`: the one create-or-adopt / wait / deadline / cancel / diagnose
  loop for any custom resource (a PyTorchJob, a Katib Experiment), with a small adapter each;
  a failure's message is put together in :mod:`~trainer.launch.diagnosis`, who owns the
  object (the launcher's pod, its KFP run) is :mod:`~trainer.launch.owners`'s, and what every
  launcher of such a resource has is :mod:`~trainer.launch.resourcelauncher`'s;
- :mod:`~trainer.launch.joblauncher`: what the PyTorchJob and TrainJob launchers share;
- :mod:`~trainer.launch.podlog`: a pod's log, followed by polling, streamed into the step's log;
- :mod:`~trainer.launch.pytorchjob`: a :class:`JobSpec` as a Training Operator PyTorchJob, and
  its launcher on that loop;
- :mod:`~trainer.launch.trainjob`: the same :class:`JobSpec` as a Kubeflow Trainer v2 TrainJob,
  and its launcher on the same loop.

This package imports neither :mod:`trainer.steps` nor :mod:`trainer.tune`: they import it.
Importing it is cheap (no ``torch``, no ``kubernetes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


def processes_per_node(gpus_per_node: int) -> int:
    """Training processes per node: one per GPU, and one (gloo) on a node without GPUs."""
    return max(gpus_per_node, 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingRun:
    """One training run as every launcher gets it: the one route of its name, config and shape.

    The train step makes it from its config (``TrainStepConfig.training_run``); a cluster
    launcher adds its cluster settings to make the job (:class:`~trainer.launch.jobspec.JobSpec`).
    """

    job_name: str
    """Deterministic name of the job (a retried step re-attaches to it)."""
    config_uri: str
    """URI of the worker config; a cluster job's pods read it, so never a launcher-local path."""
    gpus_per_node: int = 0
    """GPUs per node, one process each; 0: one process per node (gloo)."""
    nnodes: int = 1
    """Nodes; the local launcher runs one."""
    timeout_s: int | None = None
    """The launcher stops the job after this many seconds; ``None``: no deadline."""
    metrics_port: int | None = None
    """Port of the job's Prometheus endpoint (the worker's ``metrics.port``); a cluster job's
    pods declare it and carry the scrape annotations. ``None``: no endpoint."""
    module: str = "trainer.worker"
    """The module torchrun runs in every process (``--config <config_uri>`` follows): the
    training worker, or another job of the suite's (the preprocess workers,
    :mod:`trainer.steps.preprocess.wide`)."""
    args: tuple[str, ...] = ()
    """Arguments of :attr:`module` after ``--config <config_uri>``."""
    step: str = "train"
    """The step whose ``ERROR [<step>] E_...`` line the job's processes print on bad input
    (the launcher raises it as the step's own error)."""

    @property
    def procs_per_node(self) -> int:
        """Processes per node (:func:`processes_per_node`)."""
        return processes_per_node(self.gpus_per_node)


class Launcher(Protocol):
    """Runs ``torchrun ... -m trainer.worker --config <config_uri>`` somewhere and waits."""

    def launch(self, run: TrainingRun) -> None:
        """Return when the job succeeded.

        Raises:
            InputError: the job rejected its input (the worker's ``ERROR [train] E_...`` line).
            RuntimeError: the job failed, naming the job and its last log lines.
            TimeoutError: the deadline passed (the job has been stopped).
        """
        ...


__all__ = ["Launcher", "TrainingRun", "processes_per_node"]
