"""Preprocess by several processes at once: the workers torchrun starts, and the step's launch.

A dataset of many files is split into contiguous groups of files, one per worker
(:func:`~trainer.steps.preprocess.peers.file_groups`); the workers run the streaming path
(:mod:`~trainer.steps.preprocess.stream`) together over torch.distributed (gloo, CPU),
exchanging only partial statistics, the target and the split, and publish exactly what one
process would have (same splits row for row, same features bit for bit).

``python -m trainer.launch --standalone --nproc_per_node=N -m trainer.steps.preprocess.wide
--config <json> --data <uri> --output <uri>`` runs N local workers (what the step does itself
when :func:`workers_for` says so, :func:`run_local`); in N pods of a PyTorchJob, the same module
under torchrun, one process a pod (:func:`cluster_run`, for the launchers of
:mod:`trainer.launch`).
Bad input in any worker's files ends every worker with the same ``ERROR [preprocess] E_...``
line and exit code 2, and nothing is published.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from trainer.base import exitcodes, storage
from trainer.base.errors import EXIT_BAD_INPUT, InputError, error_line, print_error_line
from trainer.base.memory import MIN_BUDGET
from trainer.base.outputs import check_output_location
from trainer.base.typedconfig import from_dict
from trainer.launch import Launcher, TrainingRun
from trainer.steps.preprocess.config import PreprocessConfig
from trainer.steps.preprocess.peers import file_sizes, first_error
from trainer.steps.preprocess.published import PreprocessResult, display_uri

T = TypeVar("T")

BYTES_PER_WORKER = 1 << 30
"""Input bytes (the files' sizes as stored) one worker takes before ``workers: 0`` adds
another: below it, starting torchrun and a process group (a few seconds) and each worker's
interpreter with torch (~250 MiB) cost more than the work shared."""
MAX_WORKERS = 8
"""Most workers ``workers: 0`` starts (and no more than the machine's CPUs, nor the files)."""
WORKER_BUDGET = 512 << 20
"""Least memory budget a local worker is given: ``workers: 0`` starts no more than the step's
budget holds of these. Each worker's interpreter with torch and pyarrow is ~250 MiB besides
(measured: 3 workers, their torchrun and the step, 2.1M rows, 1.35 GB peak in the cgroup
with the page cache), so N workers stay within about 1.5 budgets."""
COLLECTIVE_TIMEOUT_S = 6 * 3600
"""How long a worker waits in an exchange for the others: main appends every rank's rows to
the published files while the others wait, which for a large table takes long. A lost peer
ends an exchange at once (the connection closes); this bounds a hung one."""
STEP = "preprocess"


def workers_for(cfg: PreprocessConfig, data_uri: str, budget: int) -> int:
    """How many processes preprocess ``data_uri`` (1: the one-process paths).

    ``cfg.workers`` when set; else (``0``, auto) one per :data:`BYTES_PER_WORKER` of input,
    rounded up, at most :data:`MAX_WORKERS`, the CPUs, the files and the budget's share of
    :data:`WORKER_BUDGET` each.
    """
    if cfg.workers:
        return cfg.workers
    sizes = file_sizes(data_uri)
    total = sum(sizes)
    wanted = math.ceil(total / BYTES_PER_WORKER)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(wanted, MAX_WORKERS, cpus or 1, len(sizes), budget // WORKER_BUDGET))


def worker_budget(budget: int, workers: int) -> int:
    """Each local worker's share of the step's memory budget."""
    return max(MIN_BUDGET, budget // workers)


def run_local(
    cfg: PreprocessConfig,
    *,
    workers: int,
    data_uri: str,
    output_uri: str,
    fingerprint: str,
    budget: int,
) -> PreprocessResult:
    """Run ``workers`` local worker processes under torchrun and return main's result.

    Args:
        cfg: What to read and how.
        workers: How many processes.
        data_uri: The dataset.
        output_uri: Where the result is published (the caller has checked it may be written).
        fingerprint: The data's fingerprint, recorded in ``schema.json``.
        budget: The step's memory budget, shared among the workers.

    Raises:
        InputError: A worker's bad input, as one process would have reported it.
        RuntimeError: The workers failed otherwise (the message holds their last lines).
    """
    from trainer.launch.local import Child

    with tempfile.TemporaryDirectory(prefix="gpupipe-wide-") as work:
        config = os.path.join(work, "config.json")
        result = os.path.join(work, "result.json")
        storage.write_json(config, _config_dict(cfg))
        cmd = [
            sys.executable, "-m", "trainer.launch", "--standalone",
            f"--nproc_per_node={workers}", "-m", WORKER_MODULE,
            "--config", config, "--data", data_uri, "--output", output_uri,
            "--fingerprint", fingerprint, "--budget", str(worker_budget(budget, workers)),
            "--plan-budget", str(budget), "--result", result,
        ]  # fmt: skip
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        child = Child(cmd, env=env, tail_lines=40, echo=False, step=STEP)
        child.pump()
        code = child.proc.wait()
        if code != 0:
            raise child.failure(f"preprocess workers ({workers})", code)
        out = PreprocessResult(**storage.read_json(result))
    for line in out.notices:  # main printed them into the workers' log, which is not echoed
        print(line, file=sys.stderr, flush=True)
    return out


WORKER_MODULE = "trainer.steps.preprocess.wide"
"""What torchrun runs in each worker process (this module)."""
CONFIG_FILE = "preprocess-config.json"
RESULT_FILE = "preprocess-result.json"


def cluster_run(
    cfg: PreprocessConfig,
    *,
    workers: int,
    data_uri: str,
    output_uri: str,
    fingerprint: str,
    work_uri: str,
    job_name: str,
    timeout_s: int | None = None,
) -> TrainingRun:
    """The run of ``workers`` preprocess pods, one process each, for a cluster launcher
    (:class:`~trainer.launch.pytorchjob.PyTorchJobLauncher`): the pods read the data and write
    the output artifact through the object store; each plans with its own pod's memory
    (``memory_budget``, else the cgroup's limit). The config goes to ``work_uri`` (which the
    pods must reach) and main leaves its result there (:func:`cluster_result`).

    Args:
        cfg: What to read and how.
        workers: Pods (the job's replicas: a master and ``workers - 1`` workers).
        data_uri: The dataset (a store URI).
        output_uri: The output artifact's store URI.
        fingerprint: The data's fingerprint, recorded in ``schema.json``.
        work_uri: A store folder of this step's own for the config and the result.
        job_name: The job's deterministic name (a retried step re-attaches).
        timeout_s: The job's deadline; None: none.
    """
    config_uri = storage.join(work_uri, CONFIG_FILE)
    storage.write_json(config_uri, _config_dict(cfg))
    return TrainingRun(
        job_name=job_name,
        config_uri=config_uri,
        nnodes=workers,
        timeout_s=timeout_s,
        module=WORKER_MODULE,
        step=STEP,
        args=(
            "--data", data_uri, "--output", output_uri, "--fingerprint", fingerprint,
            "--result", storage.join(work_uri, RESULT_FILE),
        ),
    )  # fmt: skip


def run_on_cluster(launcher: Launcher, run: TrainingRun, work_uri: str) -> PreprocessResult:
    """Run a :func:`cluster_run` job with a cluster launcher and return main's result.

    Raises:
        InputError: A worker's bad input (its ``ERROR [preprocess]`` line).
        RuntimeError, TimeoutError: As the launcher's :meth:`~trainer.launch.Launcher.launch`.
    """
    launcher.launch(run)
    return cluster_result(work_uri)


@dataclass(frozen=True, slots=True)
class PodsJob:
    """Where the pods of a ``launcher: pytorchjob`` step find its input and put its output: store
    URIs (the step's own pod may hold local copies; the job's pods see only the store)."""

    name: str
    """The job's deterministic name (a retried step re-attaches to its job)."""
    data_uri: str
    """The dataset in the store."""
    output_uri: str
    """Where main publishes the output, in the store."""
    work_uri: str
    """A store folder of the step's own: the pods' config and main's result."""

    def check(self) -> None:
        """Refuse a local path: the job's pods cannot reach it (``E_CONFIG``)."""
        for name in ("data_uri", "output_uri", "work_uri"):
            uri = getattr(self, name)
            if storage.local_path(uri) is not None:
                raise InputError(
                    "E_CONFIG",
                    f"launcher pytorchjob: the job's pods cannot reach a local path; give "
                    f"the step a store URI (s3://, gs://, minio://) for its {name[:-4]}",
                    uri,
                )


def for_pods(
    cfg: PreprocessConfig,
    *,
    data_uri: str,
    output_uri: str,
    run_id: str,
    task_name: str,
    image: str,
    object_store_secret: str,
    image_pull_secrets: list[str],
) -> tuple[PreprocessConfig, PodsJob | None]:
    """The component's config and job for ``launcher: pytorchjob`` (``cfg`` and None
    otherwise): the pods' image, store secret and pull secrets from the pipeline where
    ``cfg.cluster`` leaves them empty, the job named from the run and task, its work folder
    beside the output."""
    if cfg.launcher != "pytorchjob":
        return cfg, None
    pods = dataclasses.replace(
        cfg.cluster,
        image=cfg.cluster.image or image,
        object_store_secret=cfg.cluster.object_store_secret or object_store_secret or None,
        image_pull_secrets=cfg.cluster.image_pull_secrets or list(image_pull_secrets),
    )
    from trainer.launch import jobspec

    job = PodsJob(
        jobspec.job_name(jobspec.run_id(run_id), task_name),
        data_uri,
        output_uri,
        output_uri.rstrip("/") + "-work",
    )
    return dataclasses.replace(cfg, cluster=pods), job


def pods_for(cfg: PreprocessConfig, data_uri: str) -> int:
    """How many pods a ``launcher: pytorchjob`` step runs: ``cfg.workers`` when set, else one
    per :data:`BYTES_PER_WORKER` of input as stored, at most :data:`MAX_WORKERS` and the files
    (each pod has its own CPUs and memory, so neither caps it)."""
    if cfg.workers:
        return cfg.workers
    sizes = file_sizes(data_uri)
    return max(1, min(math.ceil(sum(sizes) / BYTES_PER_WORKER), MAX_WORKERS, len(sizes)))


def run_pods(
    cfg: PreprocessConfig, job: PodsJob, *, pods: int, fingerprint: str
) -> PreprocessResult:
    """Preprocess ``job``'s data with ``pods`` pods of a PyTorchJob and return main's result.

    The job is created in ``cfg.cluster.namespace`` (else the step's pod's, POD_NAMESPACE),
    owned by the step's pod, and deleted when the step fails or is stopped
    (``cfg.cluster.on_exit``).

    Raises:
        InputError: A pod's bad input (the line one process would print), or no namespace.
        RuntimeError, TimeoutError: The job failed otherwise.
    """
    from trainer.launch.pytorchjob import PyTorchJobLauncher

    job.check()
    namespace = cfg.cluster.namespace or os.environ.get("POD_NAMESPACE")
    if not namespace:
        raise InputError(
            "E_CONFIG",
            "launcher pytorchjob needs a namespace: set cluster.namespace or POD_NAMESPACE "
            "(downward API)",
            "cluster.namespace",
        )
    check_output_location(job.output_uri, STEP, inputs={"data": job.data_uri})
    launcher = PyTorchJobLauncher.from_environment(
        cluster=cfg.cluster, namespace=namespace, on_exit=cfg.cluster.on_exit
    )
    print(
        f"preprocess: {pods} pods (PyTorchJob {namespace}/{job.name}) read "
        f"{display_uri(job.data_uri)}",
        file=sys.stderr,
        flush=True,
    )
    run = cluster_run(
        cfg,
        workers=pods,
        data_uri=job.data_uri,
        output_uri=job.output_uri,
        fingerprint=fingerprint,
        work_uri=job.work_uri,
        job_name=job.name,
    )
    return run_on_cluster(launcher, run, job.work_uri)


def cluster_result(work_uri: str) -> PreprocessResult:
    """What main of a :func:`cluster_run` job left in ``work_uri``, its notes printed."""
    out = PreprocessResult(**storage.read_json(storage.join(work_uri, RESULT_FILE)))
    for line in out.notices:
        print(line, file=sys.stderr, flush=True)
    return out


def _config_dict(cfg: PreprocessConfig) -> dict[str, Any]:
    out = dataclasses.asdict(cfg)
    out["workers"] = 1  # the workers run the streaming path; none starts workers of its own
    out["launcher"] = "local"
    return out


class Group:
    """:class:`~trainer.steps.preprocess.peers.Peers` over torch.distributed: each exchange
    first carries every rank's outcome (its bad input, if any), so all ranks raise together."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.rank = int(ctx.rank)
        self.world = int(ctx.world_size)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @staticmethod
    def _try(work: Callable[[], T]) -> tuple[bool, Any]:
        try:
            return True, work()
        except (ValueError, FileNotFoundError) as e:  # bad input (InputError is a ValueError)
            return False, e

    def all(self, work: Callable[[], T]) -> list[T]:
        from trainer.distributed import dist

        got = dist.all_gather_object(self.ctx, self._try(work))
        first_error(got)
        return [value for _, value in got]

    def gather(self, work: Callable[[], T]) -> list[T] | None:
        from trainer.distributed import dist

        ok, value = self._try(work)
        first_error(dist.all_gather_object(self.ctx, (ok, None if ok else value)))
        return dist.gather_object(self.ctx, value)

    def main(self, work: Callable[[], T]) -> T:
        from trainer.distributed import dist

        ok, value = dist.broadcast_object(self.ctx, self._try(work) if self.is_main else None)
        first_error([(ok, value)])
        return value

    def scatter(self, work: Callable[[], list[T]]) -> T:
        from trainer.distributed import dist

        ok, value = self._try(work) if self.is_main else (True, None)
        first_error([dist.broadcast_object(self.ctx, (ok, None if ok else value))])
        return dist.scatter_object(self.ctx, value)


def main(argv: list[str] | None = None) -> int:
    """One worker: join the group, preprocess its files with the others; the exit code."""
    parser = argparse.ArgumentParser(prog="python -m trainer.steps.preprocess.wide")
    parser.add_argument("--config", required=True, help="PreprocessConfig JSON (any URI)")
    parser.add_argument("--data", required=True, metavar="URI")
    parser.add_argument("--output", required=True, metavar="URI")
    parser.add_argument("--fingerprint", default="")
    parser.add_argument(
        "--budget", type=int, help="this worker's bytes (default: the config's or the pod's)"
    )
    parser.add_argument("--plan-budget", type=int, help="one process's budget (default --budget)")
    parser.add_argument("--result", help="where main writes the result JSON")
    args = parser.parse_args(argv)
    from trainer.distributed import dist
    from trainer.steps.preprocess.stream import preprocess_streaming

    exitcodes.record_started()
    rank: int | None = None
    code = 1  # an exception escaping below is a bug: its traceback, exit 1
    try:
        ctx = dist.init("gloo", timeout_s=COLLECTIVE_TIMEOUT_S)
        rank = ctx.rank
        try:
            cfg = from_dict(PreprocessConfig, storage.read_json(args.config))
            result = preprocess_streaming(
                cfg,
                data_uri=args.data,
                output_uri=args.output,
                fingerprint=args.fingerprint,
                budget=args.budget or cfg.budget(),
                peers=Group(ctx),
                plan_budget=args.plan_budget,
            )
            if ctx.is_main and args.result:
                storage.write_json(args.result, result.to_dict())
            code = 0
        except (ValueError, FileNotFoundError) as e:
            print_error_line(error_line(STEP, e))
            code = EXIT_BAD_INPUT
        finally:
            dist.close(ctx)
        return code
    finally:
        exitcodes.record_exit_code(code, rank)


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # As trainer.__main__ does after a failure: no C++ static destructors racing pyarrow's
    # thread pools (an abort would turn exit 2 into a retryable signal).
    os._exit(status)
