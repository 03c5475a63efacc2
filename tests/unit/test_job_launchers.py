"""The PyTorchJob and TrainJob launchers against a fake API server that plays the Training
Operator, Kubeflow Trainer and JobSet: every scenario of the one watch loop runs against both
launchers; what the loop does the same whatever the resource runs once, with the PyTorchJob."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from kubernetes import client

from tests.fakes.kube_api import FakeKubeApi, Scenario, rbac_call
from tests.unit.specs import job_spec
from trainer.base.errors import InputError, error_line
from trainer.launch import TrainingRun
from trainer.launch.joblauncher import ClusterJobLauncher
from trainer.launch.jobspec import ClusterConfig, job_name
from trainer.launch.kube import (
    PYTORCHJOB_API_CALLS,
    TRAINJOB_API_CALLS,
    KubeApi,
    KubeApiError,
    RetryPolicy,
)
from trainer.launch.owners import PodRef
from trainer.launch.pytorchjob import PyTorchJobLauncher, job_state
from trainer.launch.trainjob import MANAGER, TrainJobLauncher, trainjob_state
from trainer.launch.watch import REFUSAL_CHECK_POLLS, LaunchCancelled

NS = "team-a"
JOB = job_name("run-0f3c9a", "train")
REF = f"{NS}/{JOB}"
LINES = [f"epoch {i} loss {1 / i:.4f}" for i in range(1, 7)]
POD = PodRef(name="train-launcher-abc12", namespace=NS, uid="3f0e6a52-9a0c-4c2e-8f4e-0c7f7b1d2a11")
CLUSTER = ClusterConfig(image="gpupipe:test")
"""What the train step passes: its cluster settings (with the pod's defaults)."""
RUN = TrainingRun(
    job_name=JOB, config_uri="s3://bucket/work/worker-config.json", gpus_per_node=2, nnodes=2
)


@dataclass(frozen=True)
class Kind:
    """One launcher and what differs about its resource."""

    name: str
    launcher: type[ClusterJobLauncher]
    plural: str
    container: str
    api_calls: list[tuple[str, str, str]]
    failure: tuple[str, ...]
    """Lines of a failed job's message that only this resource's controller writes."""

    def get(self, fake: FakeKubeApi) -> dict[str, Any] | None:
        return fake.job(JOB) if self.name == "PyTorchJob" else fake.trainjob(JOB)

    def state(self, job: dict[str, Any]) -> str:
        return job_state(job) if self.name == "PyTorchJob" else trainjob_state(job)

    def suspended(self, job: dict[str, Any]) -> bool:
        spec = job["spec"]["runPolicy"] if self.name == "PyTorchJob" else job["spec"]
        return bool(spec.get("suspend"))

    def nodes(self, job: dict[str, Any]) -> int:
        if self.name == "PyTorchJob":
            return 1 + job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
        return int(job["spec"]["trainer"]["numNodes"])

    def deadline(self, job: dict[str, Any]) -> int | None:
        spec = job["spec"]["runPolicy"] if self.name == "PyTorchJob" else job["spec"]
        return spec.get("activeDeadlineSeconds")

    @property
    def path(self) -> str:
        return rf"/{self.plural}/{JOB}$"


PYTORCHJOB = Kind(
    "PyTorchJob",
    PyTorchJobLauncher,
    "pytorchjobs",
    "pytorch",
    PYTORCHJOB_API_CALLS,
    (f"PyTorchJob {REF} failed: PyTorchJobFailed", "1 Master replica(s) failed", "Running=False"),
)
TRAINJOB = Kind(
    "TrainJob",
    TrainJobLauncher,
    "trainjobs",
    "node",
    TRAINJOB_API_CALLS,
    (
        f"TrainJob {REF} failed: FailedJobs: jobset failed",
        "node 0 pod",
        f"job {JOB}-node-0 failed: BackoffLimitExceeded",
    ),
)


@pytest.fixture(params=[PYTORCHJOB, TRAINJOB], ids=["pytorchjob", "trainjob"])
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def fake() -> Iterator[FakeKubeApi]:
    with FakeKubeApi(Scenario(lines=list(LINES))) as server:
        yield server


@pytest.fixture
def waits() -> list[float]:
    """Seconds the API wrapper waited between attempts (recorded, not slept)."""
    return []


REQUEST_TIMEOUT_S = 10.0
"""The tests' client gives up on a request after this: only a hung request should, never one
slowed by a loaded machine (a timed-out request is retried, and a retry is what tests count)."""


def make_api(fake: FakeKubeApi, waits: list[float], request_timeout_s: float) -> KubeApi:
    cfg = client.Configuration(host=fake.url)
    cfg.retries = False
    return KubeApi(
        client.ApiClient(cfg),
        retry=RetryPolicy(attempts=4, backoff_s=0.01, max_backoff_s=0.02),
        request_timeout_s=request_timeout_s,
        sleep=waits.append,
    )


@pytest.fixture
def api(fake: FakeKubeApi, waits: list[float]) -> KubeApi:
    return make_api(fake, waits, REQUEST_TIMEOUT_S)


@pytest.fixture
def launcher(api: KubeApi, kind: Kind) -> Callable[..., ClusterJobLauncher]:
    def make(**kwargs: Any) -> ClusterJobLauncher:
        kwargs = {"namespace": NS, "cluster": CLUSTER, "api": api, "poll_s": 0.05, **kwargs}
        return kind.launcher(**kwargs)

    return make


@pytest.fixture
def pytorchjob_launcher(api: KubeApi) -> Callable[..., ClusterJobLauncher]:
    """The PyTorchJob launcher, for what the loop does the same whatever the resource."""

    def make(**kwargs: Any) -> ClusterJobLauncher:
        kwargs = {"namespace": NS, "cluster": CLUSTER, "api": api, "poll_s": 0.05, **kwargs}
        return PyTorchJobLauncher(**kwargs)

    return make


def launch(launcher: ClusterJobLauncher, timeout_s: int | None = 20) -> None:
    launcher.launch(dataclasses.replace(RUN, timeout_s=timeout_s))


# --------------------------------------------------------------------------------------------
# Every scenario, against both launchers
# --------------------------------------------------------------------------------------------


def test_success_streams_the_main_pods_log_once_in_order(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    capsys: pytest.CaptureFixture[str],
) -> None:
    launch(launcher())

    # Every poll reaches back a few seconds: without dedupe each line would print many times;
    # a TrainJob's node-1 pod carries the same JobSet labels, yet only node 0's lines show.
    assert capsys.readouterr().out.splitlines() == LINES
    assert fake.created == [REF]
    job = kind.get(fake)
    assert job is not None and kind.state(job) == "Succeeded"
    assert kind.nodes(job) == 2
    if job["kind"] == "TrainJob":
        (patch,) = job["spec"]["runtimePatches"]
        assert patch["manager"] == MANAGER and patch["time"]  # Trainer's defaulter stamps it
    assert fake.calls("DELETE") == []
    logs = fake.calls("GET", "/log$")
    assert logs and all(r.query["container"] == [kind.container] for r in logs)


def test_run_takes_a_job_spec_as_it_is(
    launcher: Callable[..., ClusterJobLauncher], kind: Kind, fake: FakeKubeApi
) -> None:
    spec = job_spec(job_name=JOB, image="other:1", config_uri="s3://b/c.json", gpus_per_node=3)

    launcher().run(spec)

    (post,) = fake.calls("POST", rf"/{kind.plural}$")
    assert ("other:1", "s3://b/c.json") in {
        (c.get("image"), (c.get("command") or [""])[-1]) for c in _containers(post.body)
    }
    with pytest.raises(ValueError, match="namespace 'team-b'"):
        launcher().run(job_spec(job_name=JOB, namespace="team-b"))


def _containers(job: dict[str, Any]) -> list[dict[str, Any]]:
    if job["kind"] == "TrainJob":
        return [job["spec"]["trainer"]]
    return [
        c
        for r in job["spec"]["pytorchReplicaSpecs"].values()
        for c in r["template"]["spec"]["containers"]
    ]


def _failed(kind: Kind) -> Scenario:
    return Scenario(
        lines=[f"line-{c}" for c in "abcdefgh"],
        outcome="Failed",
        pod_events=[
            ("Warning", "BackOff", f"Back-off restarting failed container {kind.container}")
        ],
    )


@pytest.mark.parametrize(
    ("on_exit", "job_left"),
    [("delete", None), ("keep", False), ("suspend", True)],
    ids=["delete", "keep", "suspend"],
)
def test_failure_names_conditions_events_and_last_lines_then_applies_on_exit(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    on_exit: str,
    job_left: bool | None,
) -> None:
    fake.scenario = _failed(kind)

    with pytest.raises(RuntimeError) as info:
        launch(launcher(on_exit=on_exit, log_tail=3))

    message = str(info.value)
    for line in kind.failure:
        assert line in message
    assert "conditions: " in message
    assert "exited with code 1" in message
    assert f"Back-off restarting failed container {kind.container}" in message
    assert "  line-f\n  line-g\n  line-h" in message
    assert "line-e" not in message  # log_tail=3
    job = kind.get(fake)
    if job_left is None:
        assert job is None
        assert "it was deleted (on_exit=delete)" in message
    else:
        assert job is not None
        assert kind.suspended(job) is job_left
        assert fake.calls("DELETE") == []


@pytest.mark.parametrize("on_exit", ["keep", "suspend"])
def test_a_kept_or_suspended_job_is_released_by_the_launcher_pod(
    launcher: Callable[..., ClusterJobLauncher], kind: Kind, fake: FakeKubeApi, on_exit: str
) -> None:
    # Seen on the cluster: KFP cancels by deleting the launcher pod, and the garbage collector
    # deleted the TrainJob the pod owned, suspended or not.
    fake.scenario = _failed(kind)
    with pytest.raises(RuntimeError):
        launch(launcher(on_exit=on_exit, own_pod=POD))
    job = kind.get(fake)
    assert job is not None
    owners = job["metadata"].get("ownerReferences") or []
    assert all(o["uid"] != POD.uid for o in owners), owners
    assert kind.suspended(job) is (on_exit == "suspend")


def test_the_workers_bad_input_line_fails_the_step_as_bad_input(
    launcher: Callable[..., ClusterJobLauncher], kind: Kind, fake: FakeKubeApi
) -> None:
    fake.scenario = Scenario(
        lines=["loading config", "ERROR [train] E_CONFIG: must be > 0, got -1 (optim.lr)"],
        outcome="Failed",
    )

    with pytest.raises(InputError) as info:
        launch(launcher())

    assert (info.value.code, info.value.message, info.value.where) == (
        "E_CONFIG",
        "must be > 0, got -1",
        "optim.lr",
    )
    assert kind.get(fake) is None


def test_a_preprocess_jobs_bad_input_line_fails_the_step_as_bad_input(
    launcher: Callable[..., ClusterJobLauncher], kind: Kind, fake: FakeKubeApi
) -> None:
    """A job of another step's workers (wide preprocess) is read for that step's line."""
    line = "ERROR [preprocess] E_TARGET: target 'y' is missing in row 41 (s3://b/d/part-02.csv)"
    fake.scenario = Scenario(lines=["reading", line], outcome="Failed")

    with pytest.raises(InputError) as info:
        launcher().launch(dataclasses.replace(RUN, step="preprocess", timeout_s=20))

    assert (info.value.code, info.value.where) == ("E_TARGET", "s3://b/d/part-02.csv")


def test_deadline_stops_the_job_and_raises_timeout(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake.scenario = Scenario(lines=LINES, outcome=None)
    started = time.monotonic()

    # 3 s: time for a loaded machine to create the job and stream its log before the deadline.
    with pytest.raises(
        TimeoutError,
        match=rf"{kind.name} {REF} did not finish within 3 s .*it was Running.*deleted",
    ):
        launch(launcher(), timeout_s=3)

    assert time.monotonic() - started < 3 + 5  # at the deadline (a delete), not the job's end
    assert kind.get(fake) is None
    (post,) = fake.calls("POST")
    assert kind.deadline(post.body) == 3
    assert capsys.readouterr().out.splitlines() == LINES


def test_a_pod_without_a_node_is_named_with_the_schedulers_reason_once(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A GPU the cluster does not have: the job sits Created while its pod waits for a node. The
    # step says why as soon as it sees it (once, not every poll), and the deadline repeats it.
    why = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes"
    fake.scenario = Scenario(lines=LINES, outcome=None, pending_s=60, unschedulable=why)

    # 3 s: time for a loaded machine to create the job and look at its pod before the deadline.
    deadline = rf"its pod {JOB}-\S+ unscheduled: {re.escape(why)}.*deleted"
    with pytest.raises(TimeoutError, match=deadline):
        launch(launcher(), timeout_s=3)

    said = [r.getMessage() for r in caplog.records if "cannot be scheduled" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(f"{kind.name} {REF}: its pod {JOB}-")
    assert said[0].endswith(f"cannot be scheduled yet: {why}")
    assert kind.get(fake) is None


def _node(name: str, gpus: int | None, **labels: str) -> dict[str, Any]:
    allocatable = {"cpu": "8", "memory": "32Gi"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"allocatable": allocatable},
    }


@pytest.mark.parametrize(
    ("nodes", "selector", "said"),
    [
        (
            [_node("cpu-a", None), _node("gpu-a", 1)],
            {},
            "the pods ask 2 nvidia.com/gpu each, but the most a node has is 1 (gpu-a)",
        ),
        (
            [_node("cpu-a", None), _node("cpu-b", 0)],
            {},
            "the pods ask 2 nvidia.com/gpu each, but none of its 2 node(s) has any",
        ),
        (
            [_node("gpu-a", 8, pool="a100")],
            {"pool": "h100"},
            "the pods ask 2 nvidia.com/gpu each on a node with the labels {'pool': 'h100'}, but "
            "none of the cluster's 1 node(s) has those labels",
        ),
    ],
    ids=["too-few", "none", "no-such-label"],
)
def test_a_gpu_job_no_node_can_hold_is_refused_before_it_is_created(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    nodes: list[dict[str, Any]],
    selector: dict[str, str],
    said: str,
) -> None:
    """Issue 64 item 3: not Pending until the deadline; the nodes' allocatable, read first."""
    fake.nodes = nodes
    cluster = dataclasses.replace(CLUSTER, node_selector=selector)
    with pytest.raises(InputError) as refused:
        launch(launcher(cluster=cluster), timeout_s=3600)
    assert refused.value.code == "E_NO_GPU_NODE"
    assert refused.value.where == "train.gpus_per_node"
    assert refused.value.message.startswith(said + ": the job would wait for ever"), refused.value
    line = error_line("train", refused.value)
    assert "\n" not in line and line.startswith("ERROR [train] E_NO_GPU_NODE: the pods ask 2")
    assert fake.created == [] and fake.calls("POST") == []


@pytest.mark.parametrize(
    "nodes",
    [
        [_node("gpu-a", 1), _node("gpu-b", 8, pool="h100")],  # GPUs held by others come back
        None,  # the account may not list nodes: created unchecked, as before
    ],
    ids=["one-node-has-enough", "nodes-forbidden"],
)
def test_a_gpu_job_a_node_can_hold_or_that_cannot_be_checked_is_created(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    nodes: list[dict[str, Any]] | None,
) -> None:
    fake.nodes = nodes
    launch(launcher())
    assert fake.created == [REF]
    assert len(fake.calls("GET", "^/api/v1/nodes$")) == 1


@pytest.mark.parametrize(
    ("cluster", "gpus"),
    [
        (dataclasses.replace(CLUSTER, gpu_node_check=False), 2),  # an autoscaler adds nodes
        (CLUSTER, 0),  # a CPU job
    ],
    ids=["check-off", "cpu-job"],
)
def test_the_nodes_are_not_read_for_a_cpu_job_or_with_the_check_off(
    api: KubeApi, fake: FakeKubeApi, cluster: ClusterConfig, gpus: int
) -> None:
    fake.nodes = [_node("cpu-a", None)]
    launcher = PyTorchJobLauncher(namespace=NS, cluster=cluster, api=api, poll_s=0.05)
    launcher.launch(dataclasses.replace(RUN, gpus_per_node=gpus, timeout_s=20))
    assert fake.created == [REF]
    assert fake.calls("GET", "^/api/v1/nodes$") == []


def test_an_adopted_job_is_not_refused_for_the_nodes(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher], fake: FakeKubeApi
) -> None:
    """A retried step whose job exists (finished, or its nodes gone meanwhile) re-attaches: the
    check is for a job about to be created."""
    fake.nodes = [_node("cpu-a", None)]
    fake.add_job(JOB, scenario=Scenario(lines=LINES), kind="PyTorchJob")
    launch(pytorchjob_launcher())
    assert fake.calls("GET", "^/api/v1/nodes$") == []


def _workload(queue: str, created: str, message: str, priority: int = 0) -> dict[str, Any]:
    """A Kueue Workload pending in ``queue``, as Kueue writes it (QuotaReserved false, with the
    flavor assigner's message)."""
    return {
        "metadata": {"creationTimestamp": created},
        "spec": {"queueName": queue, "priority": priority},
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": message,
                }
            ]
        },
    }


WAITING = "couldn't assign flavors to pod set master: insufficient unused quota for cpu in flavor default, 1 more needed"  # noqa: E501
NEVER = (
    "couldn't assign flavors to pod set master: insufficient quota for cpu in flavor default, "
    "previously considered podsets requests (0) + current podset request (6) > maximum "
    "capacity (4)"
)


def test_a_queued_job_says_where_it_waits_in_its_queue_once_and_in_the_deadline(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 64 item 6: while Kueue holds a job (gang_queue), the step says where it stands:
    second in the queue behind an older job, with Kueue's reason; once, not every poll."""
    fake.scenario = Scenario(lines=LINES, outcome=None, pending_s=60)
    fake.workloads = {
        "older-job": _workload("gpupipe", "2026-12-07T10:00:00Z", WAITING),
        JOB: _workload("gpupipe", "2026-12-07T10:05:00Z", WAITING),
        "other-queue": _workload("other", "2026-12-07T09:00:00Z", WAITING),
    }
    cluster = dataclasses.replace(CLUSTER, gang_queue="gpupipe")
    line = f"waiting for admission in queue gpupipe (position 2): {WAITING}"
    with pytest.raises(TimeoutError, match=re.escape(line)):
        launch(launcher(cluster=cluster), timeout_s=3)
    said = [r.getMessage() for r in caplog.records if "waiting for admission" in r.getMessage()]
    assert said == [f"{kind.name} {REF}: {line}"], said
    (post,) = fake.calls("POST")
    assert post.body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpupipe"


class _AdmittedOnceRead(dict):  # type: ignore[type-arg]
    """``fake.workloads`` whose job's Workload is ``first`` for the launcher's first read and
    admitted from then on: the change comes between two polls, not at a time a loaded machine
    may miss."""

    ADMITTED: ClassVar[dict[str, Any]] = {
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}]}
    }

    def items(self):  # type: ignore[no-untyped-def]
        seen = list(super().items())
        self[JOB] = self.ADMITTED
        return seen


def test_the_admission_that_ends_a_said_wait_is_said_at_the_waits_level(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found on the test cluster: the train step's pod shows warnings only, so after its
    "waiting for admission" the admission (logged at INFO) never showed and the wait seemed to
    go on under the training's lines. After a wait it said, the admission is a warning too."""
    fake.scenario = Scenario(lines=LINES, outcome="Succeeded", pending_s=5.0)
    fake.workloads = _AdmittedOnceRead({JOB: _workload("gpupipe", "2026-12-07T10:05:00Z", WAITING)})
    launch(launcher(cluster=dataclasses.replace(CLUSTER, gang_queue="gpupipe")))
    said = [
        (r.levelno, r.getMessage()) for r in caplog.records if "queue gpupipe" in r.getMessage()
    ]
    assert [m for _, m in said] == [
        f"{kind.name} {REF}: waiting for admission in queue gpupipe (position 1): {WAITING}",
        f"{kind.name} {REF}: admitted by queue gpupipe",
    ], said
    assert {level for level, _ in said} == {logging.WARNING}


def test_a_workload_kueue_has_not_looked_at_yet_is_no_wait_to_say(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen live: the first of two jobs logged "waiting for admission (position 1)" and was
    admitted a second later. A Workload without Kueue's reason yet is not a wait."""
    # On the launcher's own logger: a test before it in the suite may leave a level on a parent.
    caplog.set_level(logging.INFO, logger="trainer.launch.joblauncher")
    fake.scenario = Scenario(lines=LINES, outcome="Succeeded", pending_s=5.0)
    fresh = {"metadata": {"creationTimestamp": "2026-12-07T10:05:00Z"},
             "spec": {"queueName": "gpupipe"}}  # fmt: skip
    fake.workloads = _AdmittedOnceRead({JOB: fresh})
    launch(launcher(cluster=dataclasses.replace(CLUSTER, gang_queue="gpupipe")))
    said = [
        (r.levelno, r.getMessage()) for r in caplog.records if "queue gpupipe" in r.getMessage()
    ]
    assert said == [(logging.INFO, f"{kind.name} {REF}: admitted by queue gpupipe")], said


def test_a_job_its_queue_can_never_admit_fails_at_once_and_is_deleted(
    launcher: Callable[..., ClusterJobLauncher], kind: Kind, fake: FakeKubeApi
) -> None:
    fake.scenario = Scenario(lines=LINES, outcome=None, pending_s=600)
    fake.workloads = {JOB: _workload("gpupipe", "2026-12-07T10:05:00Z", NEVER)}
    cluster = dataclasses.replace(CLUSTER, gang_queue="gpupipe")
    started = time.monotonic()
    with pytest.raises(InputError) as refused:
        launch(launcher(cluster=cluster), timeout_s=3600)
    assert time.monotonic() - started < 60  # not the deadline's hour
    assert refused.value.code == "E_QUEUE_REFUSED"
    assert refused.value.where == "train.cluster.gang_queue"
    assert f"Kueue can never admit {kind.name} {REF} in queue gpupipe: {NEVER}" in str(
        refused.value
    )
    assert "deleted (on_exit=delete)" in str(refused.value)
    assert kind.get(fake) is None


def test_a_queued_job_kueue_holds_suspended_is_not_resumed_past_its_queue(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher], fake: FakeKubeApi
) -> None:
    """A retried step re-attaching to its queued job leaves its suspension to Kueue (it resumes
    a job an earlier attempt suspended only when no queue holds it)."""
    fake.add_job(JOB, scenario=Scenario(lines=LINES, outcome=None), suspended=True)
    fake._jobs[(NS, JOB)].body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpupipe"}
    fake.workloads = {JOB: _workload("gpupipe", "2026-12-07T10:05:00Z", WAITING)}
    cluster = dataclasses.replace(CLUSTER, gang_queue="gpupipe")
    with pytest.raises(TimeoutError, match="waiting for admission in queue gpupipe"):
        launch(pytorchjob_launcher(cluster=cluster), timeout_s=3)
    assert not [p for p in fake.calls("PATCH") if "suspend" in json.dumps(p.body)]


@pytest.mark.parametrize("held", ["unschedulable", "lost"])
def test_a_replica_held_off_its_node_is_named_with_why_once_and_in_the_deadline(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
    held: str,
) -> None:
    # The main pod runs; another replica's pod cannot run: no node left for it beside its peers
    # (a node lost, none to take its place), or stuck Terminating on the lost node, which a
    # replacement of the same name waits for. The step says so once, and its deadline again.
    why = (
        "0/2 nodes are available: 1 node(s) didn't match pod anti-affinity rules, "
        "1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }"
    )
    if held == "unschedulable":
        fake.scenario = Scenario(lines=LINES, outcome=None, peer_unschedulable=why)
        expect = rf"its pod {JOB}-\S+ cannot be scheduled yet: {re.escape(why)}$"
        deadline = rf"its pod {JOB}-\S+ unscheduled: {re.escape(why)}.*deleted"
    else:
        fake.scenario = Scenario(lines=LINES, outcome=None, peer_lost_on="gpupipe-node-2")
        expect = (
            rf"its pod {JOB}-\S+ was evicted from node gpupipe-node-2, which stopped answering, "
            r"and stays Terminating until that node comes back or is marked "
            r"node\.kubernetes\.io/out-of-service"
        )
        deadline = rf"it was \w+; its pod {JOB}-\S+ was evicted from node gpupipe-node-2.*deleted"
    with pytest.raises(TimeoutError, match=deadline):
        launch(launcher(), timeout_s=3)
    said = [
        r.getMessage()
        for r in caplog.records
        if "cannot be scheduled" in r.getMessage() or "evicted from node" in r.getMessage()
    ]
    assert len(said) == 1, said
    assert said[0].startswith(f"{kind.name} {REF}: its pod "), said
    assert re.search(expect, said[0]), said
    main = f"{JOB}-master-0" if kind.name == "PyTorchJob" else f"{JOB}-node-0-0-"
    assert main not in said[0], said  # the held replica is named, not the running main pod
    assert kind.get(fake) is None


@pytest.fixture
def sigterm_guard() -> Iterator[Callable[[int, Any], None]]:
    """A SIGTERM handler of the test's own, so a stray signal cannot kill pytest."""
    stray: list[int] = []

    def guard(signum: int, frame: Any) -> None:
        stray.append(signum)

    previous = signal.signal(signal.SIGTERM, guard)
    yield guard
    signal.signal(signal.SIGTERM, previous)
    assert stray == [], "SIGTERM arrived outside the launcher"


def test_sigterm_deletes_the_job_and_fails_the_step(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    sigterm_guard: Callable[[int, Any], None],
) -> None:
    fake.scenario = Scenario(lines=LINES, outcome=None)

    def cancel_once_streaming() -> None:
        fake.wait_for_calls("GET", "/log$")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=cancel_once_streaming, daemon=True).start()
    with pytest.raises(LaunchCancelled, match=rf"{REF}: the step was cancelled .*deleted"):
        launch(launcher(), timeout_s=None)

    assert kind.get(fake) is None
    assert signal.getsignal(signal.SIGTERM) is sigterm_guard


def _sigterm_once_streaming(fake: FakeKubeApi, first: Callable[[], None] | None = None) -> None:
    """SIGTERM this process (the launcher's step) once the job's log is being streamed (a log
    read beyond those made so far); ``first`` is done just before."""
    before = len(fake.calls("GET", "/log$"))

    def cancel() -> None:
        fake.wait_for_calls("GET", "/log$", count=before + 1)
        if first is not None:
            first()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=cancel, daemon=True).start()


@pytest.mark.parametrize(
    ("run", "kept"),
    [
        ({}, True),
        ({"activeDeadlineSeconds": 0}, False),  # KFP's terminate
        ({"shutdown": "Terminate"}, False),  # Argo's own terminate (and stop)
        (None, False),  # the run (Workflow) was deleted
    ],
    ids=["pod-deleted-run-goes-on", "run-terminated", "workflow-shutdown", "run-deleted"],
)
def test_a_kfp_step_keeps_its_job_for_the_retry_only_while_its_run_goes_on(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    sigterm_guard: Callable[[int, Any], None],
    run: dict[str, Any] | None,
    kept: bool,
) -> None:
    # Seen on the test cluster's KFP: the step's pod deleted, KFP retried the step, and the retry
    # made a second job because the first had been deleted on SIGTERM (and owned by the pod).
    # The SIGTERM path alone: this run cannot be followed (a Role without `watch`), which the
    # step says; the test below has the run followed.
    workflow = fake.add_kfp_step_pod(POD.name, "run-wf")
    fake.fail("GET", r"/workflows$", 403)
    fake.scenario = Scenario(lines=LINES, outcome=None)
    if run is None:
        # Deleted between the start (which saw it: the log streams) and the SIGTERM.
        def delete_the_run() -> None:
            with fake._lock:
                fake.workflows.clear()

        _sigterm_once_streaming(fake, first=delete_the_run)
    else:
        workflow["spec"].update(run)
        _sigterm_once_streaming(fake)
    with pytest.raises(LaunchCancelled) as cancelled:
        launch(launcher(own_pod=POD), timeout_s=None)

    (create,) = fake.calls("POST")  # the start saw the run: the job was made for it
    assert "run-wf" in {o["name"] for o in create.body["metadata"]["ownerReferences"]}
    job = kind.get(fake)
    if not kept:
        assert job is None and "deleted (on_exit=delete)" in str(cancelled.value)
        return
    assert job is not None and fake.calls("DELETE") == []
    assert "kept running: only this step's pod was stopped, its run run-wf goes on" in str(
        cancelled.value
    )
    # The run's Workflow owns it (deleting the run deletes it); the stopped pod no longer does.
    owners = job["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [
        ("Workflow", "run-wf", workflow["metadata"]["uid"])
    ]
    assert not owners[0]["blockOwnerDeletion"] and not owners[0]["controller"]

    # The retry's pod re-attaches to the same job and owns it too; nothing is created.
    retry = PodRef(name="train-launcher-retry", namespace=NS, uid="0d4c1c9e-retry")
    fake.pods[(NS, retry.name)] = {
        **fake.pods[(NS, POD.name)],
        "metadata": {**fake.pods[(NS, POD.name)]["metadata"], "name": retry.name},
    }
    uid, creates = job["metadata"]["uid"], len(fake.calls("POST"))
    _sigterm_once_streaming(fake)  # stopped again, its run still going on: kept again
    with pytest.raises(LaunchCancelled, match="re-attaches"):
        launch(launcher(own_pod=retry), timeout_s=None)
    assert len(fake.calls("POST")) == creates
    job = kind.get(fake)
    assert job is not None and job["metadata"]["uid"] == uid
    adopted = fake.calls("PATCH")[-2].body["metadata"]["ownerReferences"]  # then the release
    assert {o["uid"] for o in adopted} == {workflow["metadata"]["uid"], retry.uid}


@pytest.mark.parametrize(
    ("stop", "why"),
    [
        ({"spec": {"activeDeadlineSeconds": 0}}, "is being terminated"),  # KFP's terminate
        ({"spec": {"shutdown": "Stop"}}, "is being terminated"),  # Argo's own stop
        ({"metadata": {"deletionTimestamp": "2026-11-27T15:00:00Z"}}, "is being deleted"),
        ({"status": {"phase": "Failed"}}, "has ended (Failed)"),
        (None, "was deleted"),
    ],
    ids=["terminated", "argo-stop", "being-deleted", "ended", "deleted"],
)
def test_a_kfp_step_stops_its_job_as_soon_as_its_run_stops_without_waiting_for_a_sigterm(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
    stop: dict[str, dict[str, Any]] | None,
    why: str,
) -> None:
    # CI (4d2d602): a terminated run's PyTorchJob trained on. Argo's SIGTERM to the step's pod
    # also ends KFP's launcher, the container's command, and with it the container, within a
    # second: too soon, on a busy node, for the step to delete its job. The step follows its run
    # instead and stops the job once KFP marks the run terminated, with no SIGTERM at all here.
    workflow = fake.add_kfp_step_pod(POD.name, "run-wf")
    fake.scenario = Scenario(lines=LINES, outcome=None)

    def stop_the_run() -> None:
        fake.wait_for_calls("GET", "/log$")  # the job runs, its log streams
        with fake._lock:
            if stop is None:
                fake.workflows.clear()
            for part, values in (stop or {}).items():
                workflow.setdefault(part, {}).update(values)

    threading.Thread(target=stop_the_run, daemon=True).start()
    with pytest.raises(LaunchCancelled) as stopped:
        launch(launcher(own_pod=POD), timeout_s=None)

    assert str(stopped.value) == (
        f"{kind.name} {REF}: the step was stopped: its run run-wf {why}; "
        "it was deleted (on_exit=delete)"
    )
    assert error_line("train", stopped.value).split(":")[0] == "ERROR [train] E_STOPPED"
    assert kind.get(fake) is None
    assert "cannot be followed" not in caplog.text
    (watch,) = fake.calls("GET", r"/workflows$")
    assert watch.query["fieldSelector"] == ["metadata.name=run-wf"]


def test_a_run_that_goes_on_is_followed_across_ended_watches_until_it_stops(
    api: KubeApi, fake: FakeKubeApi
) -> None:
    from trainer.launch.owners import RunFollower, run_owner

    workflow = fake.add_kfp_step_pod(POD.name, "run-wf")
    owner = run_owner(api, POD, NS)
    assert owner is not None
    follower = RunFollower(api, NS, owner, timeout_s=1)  # the server ends each watch after 1 s
    follower.start()
    try:
        time.sleep(0.3)
        workflow["status"] = {"phase": "Running", "progress": "3/7"}  # a change; it goes on
        # Past the end of the first watch: the follower opened another, however late the first
        # one came and ended on a loaded machine (a fixed sleep could end before it did).
        assert fake.wait_for_calls("GET", r"/workflows$", count=2), "the first watch never ended"
        assert not follower.stopped.is_set()
        workflow["spec"]["activeDeadlineSeconds"] = 0
        assert follower.stopped.wait(60)
    finally:
        follower.close()
    assert follower.why == "its run run-wf is being terminated"
    assert len(fake.calls("GET", r"/workflows$")) >= 2


def test_a_run_that_cannot_be_watched_is_said_and_the_sigterm_path_remains(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.add_kfp_step_pod(POD.name, "run-wf")
    fake.fail("GET", r"/workflows$", 403, message="workflows.argoproj.io is forbidden")
    launch(launcher(own_pod=POD))

    assert (
        f"{kind.name} {REF}: run run-wf cannot be followed (Kubernetes API: watch "
        "workflows.argoproj.io team-a/run-wf failed: 403 Forbidden"
    ) in caplog.text
    assert "needs RBAC verb 'watch' on 'workflows'" in caplog.text
    assert "only the step's SIGTERM stops the" in caplog.text


@pytest.mark.parametrize(
    ("scenario", "age_s", "fails"),
    [
        # Running when adopted and for a poll after, however slowly the test gets there.
        (Scenario(lines=LINES, line_every_s=0.1, min_reads=3), 0.4, False),
        (Scenario(lines=LINES), 3600, False),
        (Scenario(lines=LINES, outcome="Failed"), 3600, True),
    ],
    ids=["running-waits-for-it", "succeeded-is-reported", "failed-is-reported"],
)
def test_a_retried_launcher_reattaches_to_its_job(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    capsys: pytest.CaptureFixture[str],
    scenario: Scenario,
    age_s: float,
    fails: bool,
) -> None:
    fake.add_job(JOB, scenario=scenario, age_s=age_s, kind=kind.name)  # type: ignore[arg-type]

    if fails:
        with pytest.raises(RuntimeError, match=rf"(?s){REF} failed.*{re.escape(LINES[-1])}"):
            launch(launcher())
        assert kind.get(fake) is None
    else:
        launch(launcher())
        assert fake.calls("DELETE") == []
    assert fake.calls("POST") == []
    # A re-attached launcher still shows the main pod's log, each line once.
    assert capsys.readouterr().out.splitlines() == LINES


def test_a_job_created_between_get_and_create_is_adopted(
    launcher: Callable[..., ClusterJobLauncher], kind: Kind, fake: FakeKubeApi
) -> None:
    fake.add_job(JOB, kind=kind.name)  # type: ignore[arg-type]
    fake.fail("GET", kind.path, 404)  # The first look misses the other launcher's job.

    launch(launcher())

    assert len(fake.calls("POST")) == 1  # answered 409 AlreadyExists
    assert fake.created == []


def test_a_suspended_job_is_resumed_and_owned_by_the_new_launcher_pod(
    launcher: Callable[..., ClusterJobLauncher], kind: Kind, fake: FakeKubeApi
) -> None:
    earlier = PodRef(
        name="train-launcher-old", namespace=NS, uid="0b1c2d3e-aaaa-bbbb-cccc-000000000001"
    )
    fake.add_job(
        JOB,
        age_s=0.2,
        suspended=True,
        owners=[earlier.owner_reference()],
        kind=kind.name,  # type: ignore[arg-type]
    )
    job = kind.get(fake)
    assert job is not None and kind.state(job) == "Suspended"

    launch(launcher(own_pod=POD))

    job = kind.get(fake)
    assert job is not None and kind.state(job) == "Succeeded"
    assert kind.suspended(job) is False
    assert [o["uid"] for o in job["metadata"]["ownerReferences"]] == [earlier.uid, POD.uid]


@pytest.mark.parametrize(
    ("method", "path", "status", "times", "retry_after"),
    [
        ("POST", "create", 429, 1, 1.5),
        ("POST", "create", 500, 2, None),
        ("POST", "create", 503, 3, None),
        ("GET", "get", 429, 2, None),
        ("GET", "get", 503, 3, None),
        ("GET", r"/pods$", 500, 2, None),
        ("GET", r"/log$", 503, 3, None),
    ],
    ids=[
        "create-429-retry-after",
        "create-500",
        "create-503",
        "get-429-no-retry-after",
        "get-503",
        "list-pods-500",
        "log-503",
    ],
)
def test_transient_api_errors_are_retried(
    launcher: Callable[..., ClusterJobLauncher],
    kind: Kind,
    fake: FakeKubeApi,
    waits: list[float],
    capsys: pytest.CaptureFixture[str],
    method: str,
    path: str,
    status: int,
    times: int,
    retry_after: float | None,
) -> None:
    path = {"create": rf"/{kind.plural}$", "get": kind.path}.get(path, path)
    fake.fail(method, path, status, times=times, retry_after=retry_after)

    launch(launcher())

    assert fake.created == [REF]
    assert len(waits) == times
    if retry_after is not None:
        assert waits == [retry_after]
    assert capsys.readouterr().out.splitlines() == LINES


def test_api_calls_lists_exactly_the_calls_the_launcher_makes(
    launcher: Callable[..., ClusterJobLauncher], kind: Kind, fake: FakeKubeApi
) -> None:
    fake.scenario = _failed(kind)
    queued = dataclasses.replace(CLUSTER, gang_queue="gpupipe")  # its place in the queue read
    with pytest.raises(RuntimeError):
        launch(launcher(cluster=queued))  # create, get, list pods, log, events, delete
    # Still running when adopted, however slowly the test gets there (the pod and run look-ups
    # come first): a finished job is only read, never patched.
    running = Scenario(lines=LINES, min_reads=2)
    fake.add_job(JOB, scenario=running, kind=kind.name)  # type: ignore[arg-type]
    fake.add_kfp_step_pod(POD.name, "run-wf")  # its own pod, then the run that owns it
    launch(launcher(own_pod=POD))  # adopt: patch the ownerReference

    assert {rbac_call(r.method, r.path, r.query) for r in fake.requests} == set(kind.api_calls)


@pytest.mark.parametrize("module", ["pytorchjob", "trainjob"])
def test_importing_the_launcher_does_not_import_kubernetes(module: str) -> None:
    code = f"import sys, trainer.launch.{module}; print('kubernetes' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


# --------------------------------------------------------------------------------------------
# What the loop does the same whatever the resource: once, with the PyTorchJob
# --------------------------------------------------------------------------------------------


def test_pods_refused_by_pod_security_fail_the_step_at_once_and_delete_the_job(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher], fake: FakeKubeApi
) -> None:
    # What the real cluster showed: the operator retries creating a refused pod forever, so the
    # job never fails on its own; the launcher reads the refusal in the job's events.
    refusal = (
        f'Error creating: pods "{JOB}-worker-0" is forbidden: violates PodSecurity '
        '"restricted:latest": allowPrivilegeEscalation != false (container "init-pytorch" '
        "must set securityContext.allowPrivilegeEscalation=false)"
    )
    fake.scenario = Scenario(outcome=None, job_events=[("Warning", "FailedCreatePod", refusal)])

    with pytest.raises(InputError) as info:
        launch(pytorchjob_launcher())

    assert info.value.code == "E_POD_SECURITY"
    assert 'violates PodSecurity "restricted:latest"' in str(info.value)
    assert f"(namespace {NS})" in str(info.value)
    assert fake.job(JOB) is None, "the refused job was left behind"


JOBSET_DENIAL = (
    'Error creating JobSet: admission webhook "vjobset.kb.io" denied the request: '
    "spec.replicatedJobs[0]: pod names generated for this JobSet will exceed 63 characters"
)


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        (JOBSET_DENIAL, True),
        # A webhook that could not be reached: Trainer tries again, and so does the step.
        (
            "Error creating JobSet: Internal error occurred: failed calling webhook "
            '"mjobset.kb.io": connect: connection refused',
            False,
        ),
    ],
    ids=["denied", "webhook-unreachable"],
)
def test_a_trainjob_whose_jobset_a_webhook_denies_fails_at_once_and_is_deleted(
    api: KubeApi, fake: FakeKubeApi, message: str, refused: bool
) -> None:
    # Seen on the test cluster: Trainer admitted the TrainJob, JobSet's webhook denied its
    # JobSet, and Trainer retried forever: the TrainJob stayed without pods.
    events = [("Warning", "TrainJobResourcesCreationFailed", message)]
    launcher = TrainJobLauncher(namespace=NS, cluster=CLUSTER, api=api, poll_s=0.05)

    if refused:
        fake.scenario = Scenario(outcome=None, job_events=events)
        with pytest.raises(InputError) as info:
            launch(launcher)
        assert info.value.code == "E_JOB_REFUSED"
        assert "pod names generated for this JobSet will exceed 63 characters" in str(info.value)
        assert fake.trainjob(JOB) is None, "the refused TrainJob was left behind"
    else:
        # It runs on for as many polls as it takes the wait to read its events, however slowly
        # the machine polls, then succeeds: the wait read them and went on.
        fake.scenario = Scenario(job_events=events, min_reads=REFUSAL_CHECK_POLLS + 1)
        launch(launcher)
        assert fake.calls("GET", "/events$"), "the wait never looked for a refusal"
        job = fake.trainjob(JOB)
        assert job is not None and trainjob_state(job) == "Succeeded"


def test_a_job_still_being_deleted_is_created_anew_once_gone(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher], fake: FakeKubeApi
) -> None:
    fake.add_job(JOB, deleting_for_s=0.3)

    launch(pytorchjob_launcher())

    assert fake.created == [REF]


def test_a_create_that_timed_out_is_retried_without_a_second_job(
    fake: FakeKubeApi, waits: list[float]
) -> None:
    # The client gives up on the create after 2 s, the server makes the job only after 8 s: the
    # retry makes it first. Each margin is wide: a request slowed by a loaded machine must not
    # time out too (a third create), nor a starved client miss its timeout (no retry at all).
    api = make_api(fake, waits, request_timeout_s=2.0)
    fake.delay("POST", r"/pytorchjobs$", 8.0)

    launch(PyTorchJobLauncher(namespace=NS, cluster=CLUSTER, api=api, poll_s=0.05))

    assert len(fake.calls("POST")) == 2
    assert fake.created == [REF]


@pytest.mark.parametrize(
    ("method", "path", "status", "message", "expected"),
    [
        (
            "POST",
            r"/pytorchjobs$",
            403,
            'pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:kubeflow:'
            'pipeline-runner" cannot create resource "pytorchjobs" in API group "kubeflow.org" '
            'in the namespace "team-a"',
            "needs RBAC verb 'create' on 'pytorchjobs' in API group 'kubeflow.org' in namespace "
            "'team-a'",
        ),
        (
            "POST",
            r"/pytorchjobs$",
            422,
            "PyTorchJob.kubeflow.org is invalid: spec.nprocPerNode: Invalid value",
            "422 Unprocessable Entity",
        ),
        ("GET", PYTORCHJOB.path, 401, "Unauthorized", "401 Unauthorized"),
    ],
    ids=["create-forbidden", "create-invalid", "get-unauthorized"],
)
def test_a_permanent_api_error_names_the_job_without_retrying(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher],
    fake: FakeKubeApi,
    method: str,
    path: str,
    status: int,
    message: str,
    expected: str,
) -> None:
    fake.fail(method, path, status, times=5, message=message)

    with pytest.raises(KubeApiError) as info:
        launch(pytorchjob_launcher())

    assert REF in str(info.value)
    assert message in str(info.value) and expected in str(info.value)
    assert len(fake.calls(method, path)) == 1
    assert fake.created == [] and fake.calls("DELETE") == []


def test_a_log_its_node_cannot_serve_does_not_fail_the_step(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher],
    fake: FakeKubeApi,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The master's node stopped answering: the API server answers its log with 500s for longer
    # than one call's retries (seen on the test cluster: "x509 ... cannot validate certificate",
    # "connection refused"). Found on two nodes: the step failed with E_EXTERNAL and deleted a
    # job the operator was about to restart. The job is followed by its status; the log resumes.
    # Two polls' worth of failures (each call tries 4 times), the job still running after them.
    fake.scenario = Scenario(lines=LINES, min_reads=8)
    fake.fail("GET", r"/log$", 500, times=8, message="dial tcp 10.125.2.2:10250: i/o timeout")

    launch(pytorchjob_launcher())

    said = [r.getMessage() for r in caplog.records if "cannot be read now" in r.getMessage()]
    assert len(said) == 1 and f"{JOB}-master-0" in said[0], said
    assert fake.calls("DELETE") == []
    # Read again once the node answers, from where it stopped: nothing lost, nothing twice.
    assert capsys.readouterr().out.splitlines() == LINES


def test_a_log_refused_by_rbac_still_fails_the_step(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher], fake: FakeKubeApi
) -> None:
    fake.fail("GET", r"/log$", 403, times=5, message="pods/log is forbidden")
    with pytest.raises(KubeApiError, match="forbidden"):
        launch(pytorchjob_launcher())


def test_retries_are_bounded(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher], fake: FakeKubeApi
) -> None:
    fake.fail("POST", r"/pytorchjobs$", 503, times=100)

    with pytest.raises(
        RuntimeError,
        match=rf"create pytorchjobs.kubeflow.org {REF} still failing "
        "after 4 attempts: 503",
    ):
        launch(pytorchjob_launcher())


@pytest.mark.parametrize(
    ("own_pod", "owners"),
    [
        (POD, [POD.uid]),
        (PodRef(name="launcher", namespace="kubeflow", uid=POD.uid), []),
        (None, []),
    ],
    ids=["same-namespace", "other-namespace-cannot-own", "unknown-pod"],
)
def test_the_job_is_owned_by_the_launcher_pod_when_known(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher],
    fake: FakeKubeApi,
    own_pod: PodRef | None,
    owners: list[str],
) -> None:
    launch(pytorchjob_launcher(own_pod=own_pod))

    (create,) = fake.calls("POST")
    refs = create.body["metadata"].get("ownerReferences", [])
    assert [o["uid"] for o in refs] == owners
    for ref in refs:
        assert ref == {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": POD.name,
            "uid": POD.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }


def test_from_environment_reads_the_downward_api(
    monkeypatch: pytest.MonkeyPatch, api: KubeApi
) -> None:
    monkeypatch.setenv("POD_NAME", POD.name)
    monkeypatch.setenv("POD_NAMESPACE", POD.namespace)
    monkeypatch.setenv("POD_UID", POD.uid)

    found = PyTorchJobLauncher.from_environment(cluster=CLUSTER, api=api)

    assert (found.namespace, found.own_pod) == (NS, POD)


def test_from_environment_needs_a_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)

    with pytest.raises(ValueError, match="POD_NAMESPACE"):
        PyTorchJobLauncher.from_environment(cluster=CLUSTER)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"on_exit": "orphan"}, "on_exit must be delete, keep or suspend, got 'orphan'"),
        ({"poll_s": 0}, "poll_s must be > 0, got 0"),
        ({"log_tail": 0}, "log_tail must be >= 1, got 0"),
        ({"namespace": ""}, "namespace must be set"),
    ],
    ids=["on-exit", "poll", "log-tail", "namespace"],
)
def test_bad_arguments_are_refused(
    pytorchjob_launcher: Callable[..., ClusterJobLauncher], kwargs: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        pytorchjob_launcher(**kwargs)


def test_without_a_cluster_the_default_api_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")

    with pytest.raises(RuntimeError, match="no Kubernetes API to talk to"):
        launch(PyTorchJobLauncher(namespace=NS, cluster=CLUSTER))


@pytest.mark.parametrize("kind", [PYTORCHJOB, TRAINJOB], ids=["pytorchjob", "trainjob"])
def test_a_forbidden_create_names_the_missing_permission(
    api: KubeApi, fake: FakeKubeApi, kind: Kind
) -> None:
    fake.fail("POST", rf"/{kind.plural}$", 403, times=5, message=f"{kind.plural} is forbidden")

    with pytest.raises(KubeApiError) as info:
        launch(kind.launcher(namespace=NS, cluster=CLUSTER, api=api, poll_s=0.05))

    (group, plural, _) = kind.api_calls[0]
    assert f"needs RBAC verb 'create' on '{plural}' in API group '{group}'" in str(info.value)
    assert len(fake.calls("POST")) == 1
