"""Helpers of the KFP tests: the API server through a port-forward, `gpupipe` as a user types it,
and the run's Argo Workflow and pods as the cluster holds them."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import kube

NS = "kubeflow"
GPUPIPE = [sys.executable, "-m", "pipelines.cli"]
SMALL_STEPS = {
    step: {"cpu_request": "50m", "memory_request": "128Mi"}
    for step in (
        "fingerprint",
        "preprocess",
        "train",
        "train-launcher",
        "tune",
        "evaluate",
        "register",
        "notify",
    )
}
"""Requests that fit this one 2-core node beside the cluster's services (the compiled defaults
ask for a node's worth: preprocess 1 CPU, tune 2); limits stay as compiled."""
RUN_TIMEOUT_S = 1200
"""Longest a test waits for one pipeline run on this node."""
PODS_TIMEOUT_S = 900
"""Longest a test waits for a step's or a job's pods to run: KFP's tests run in three streams
beside stage 2's (hack/cluster-tests.sh), and a PyTorchJob's pods wait for another job's to end
when both do not fit the node's CPU requests."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def port_forward(service: str, port: int, namespace: str = NS) -> Iterator[str]:
    """``kubectl port-forward svc/SERVICE`` as a user runs it; yields ``http://127.0.0.1:<p>``."""
    local = free_port()
    proc = subprocess.Popen(
        [
            str(kube.KUBECTL),
            "--kubeconfig",
            str(kube.KUBECONFIG),
            "-n",
            namespace,
            "port-forward",
            f"svc/{service}",
            f"{local}:{port}",
            "--address",
            "127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{local}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", local), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read() if proc.stderr else ""
                    raise RuntimeError(f"port-forward to svc/{service} failed: {err}") from None
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _env(env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, "GPUPIPE_STEP_RESOURCES": json.dumps(SMALL_STEPS), **(env or {})}


def gpupipe(
    *args: str, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """`gpupipe ARGS` from the checkout, as a user runs it, with the small-node requests."""
    return subprocess.run(
        [*GPUPIPE, *args],
        cwd=kube.ROOT,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def gpupipe_popen(*args: str) -> subprocess.Popen[str]:
    """`gpupipe ARGS` started as :func:`gpupipe` runs it, left running (line-buffered pipes): for
    a command a test acts on while it waits, as `run --host --wait`."""
    return subprocess.Popen(
        [*GPUPIPE, *args],
        cwd=kube.ROOT,
        env={**_env(None), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def api(host: str, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One REST call to the API server, as the UI's pages make them."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"{host}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method} {path}: {e.code} {e.read().decode()[:500]}") from e
    return json.loads(text) if text else {}


def wait_run(host: str, run_id: str, timeout: float = RUN_TIMEOUT_S) -> dict[str, Any]:
    """The run, once it reached a final state."""

    def final() -> dict[str, Any] | None:
        run = api(host, "GET", f"/apis/v2beta1/runs/{run_id}")
        return run if run.get("state") in {"SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"} else None

    return kube.wait_until(f"run {run_id} to finish", final, timeout, 5)


def expect_mode(host: str, recurring_run_id: str, mode: str) -> None:
    """A recurring run just enabled or disabled is so where it counts, its ScheduledWorkflow (KFP
    patches that before it answers), and KFP's API reads ``mode`` (``ENABLE``/``DISABLE``) within
    a minute: its persistence agent can copy an older ScheduledWorkflow back for a while (read
    ``DISABLE`` just after an enable in CI on 5ccea30)."""
    swfs = kube.get_json("scheduledworkflows.kubeflow.org", "-n", NS)["items"]
    (swf,) = [s for s in swfs if s["metadata"]["uid"] == recurring_run_id]
    # `enabled` is `omitempty` in KFP's Go type: once KFP's controller writes the ScheduledWorkflow
    # back, a disabled one has no `enabled` at all (CI on 6a066f2: KeyError after a disable).
    assert swf["spec"].get("enabled", False) is (mode == "ENABLE"), swf["spec"]
    kube.wait_until(
        f"KFP to read recurring run {recurring_run_id} as {mode}",
        lambda: api(host, "GET", f"/apis/v2beta1/recurringruns/{recurring_run_id}")["mode"] == mode,
        60,
        2,
    )


def workflows() -> list[dict[str, Any]]:
    return kube.get_json("workflows.argoproj.io", "-n", NS)["items"]


def workflow_of(run_id: str) -> dict[str, Any]:
    """The Argo Workflow the API server made for a run (labelled with the run's id)."""
    for wf in workflows():
        if wf["metadata"].get("labels", {}).get("pipeline/runid") == run_id:
            return wf
    raise AssertionError(f"no Workflow labelled pipeline/runid={run_id}")


def run_pods(run_id: str) -> list[dict[str, Any]]:
    wf = workflow_of(run_id)["metadata"]["name"]
    return kube.get_json("pods", "-n", NS, "-l", f"workflows.argoproj.io/workflow={wf}")["items"]


def cron_in(seconds: int) -> str:
    """KFP's six-field cron (seconds first; the ScheduledWorkflow controller reads UTC here) for
    the moment ``seconds`` from now, to the second: a recurring run's first tick that soon. (A
    tick at the start of a minute at least a minute ahead cost the two recurring-run tests two
    minutes' wait on average.)"""
    at = datetime.now(UTC) + timedelta(seconds=seconds)
    return f"{at.second} {at.minute} {at.hour} * * *"


def task_of(pod: dict[str, Any]) -> tuple[str, str]:
    """(task, role) of a run's pod from Argo's node name: ``...train(0).executor(0)`` is the
    train task's executor (the step's own pod), ``...train-driver(0)`` its driver."""
    from pipelines.cluster import node_task

    node = (pod["metadata"].get("annotations") or {}).get("workflows.argoproj.io/node-name", "")
    return node_task(node)


def templates_of(wf: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [t for t in wf["spec"]["templates"] if t["name"].startswith(prefix)]


def task_states(run: dict[str, Any]) -> dict[str, str]:
    """Display name -> state of each task of a run."""
    return {
        t.get("display_name", ""): t.get("state", "")
        for t in (run.get("run_details") or {}).get("task_details") or []
    }


def failure_report(run: dict[str, Any]) -> str:
    """Why a run ended as it did, for a test's assertion message (pytest cuts a long dict short):
    its state; each task that neither succeeded nor was skipped, with KFP's error; each Argo node
    that failed or errored, with Argo's message (a deleted pod, an exit code, a retry's end); the
    last log lines of each failed pod's main container, and of each train step pod's."""
    lines = [f"run {run.get('run_id')}: {run.get('state')}"]
    for t in (run.get("run_details") or {}).get("task_details") or []:
        if t.get("state") not in (None, "", "SUCCEEDED", "SKIPPED"):
            error = (t.get("error") or {}).get("message", "")
            lines.append(f"task {t.get('display_name')}: {t.get('state')} {error}".rstrip())
    try:
        wf = workflow_of(run.get("run_id", ""))
        pods = run_pods(run.get("run_id", ""))
    except (AssertionError, subprocess.CalledProcessError) as e:
        return "\n".join([*lines, f"(no Workflow to read: {e})"])
    for node in ((wf.get("status") or {}).get("nodes") or {}).values():
        if node.get("phase") in ("Failed", "Error"):
            lines.append(
                f"node {node.get('displayName')} ({node.get('type')}): {node.get('phase')}"
                f" {node.get('message', '')}".rstrip()
            )
    for pod in pods:
        failed = (pod.get("status") or {}).get("phase") == "Failed"
        if failed or task_of(pod) == ("train", "executor"):
            name = pod["metadata"]["name"]
            out = kube.kubectl("logs", "-n", NS, name, "-c", "main", "--tail=500", check=False)
            said = (out.stdout or out.stderr).splitlines()
            # The step's own lines: not KFP launcher's (glog) or Argo's (time=...), nor the
            # executor's input and output (indented JSON).
            noise = r"^([IWEF]\d{4} |time=|\s|[\[\]{},]*$)"
            own = [x for x in said if not re.match(noise, x)] or said
            lines.append(f"pod {name} ({pod['status'].get('phase')}), its last own lines:")
            lines += ["  " + x for x in own[-25:]]
    return "\n".join(lines)


def upload_table(path: Path, key: str) -> str:
    """A local table put into the cluster's store; its minio:// URI."""
    from trainer.base import storage

    uri = f"minio://{kube.BUCKET}/{key}"
    storage.write_bytes(uri, path.read_bytes())
    return uri


def wait_stopped(run_id: str, job: str, timeout: float = 180) -> None:
    """Wait until a terminated run's PyTorchJob and its pods are gone; at the deadline, fail with
    what the cluster holds (the job, its pods, the run's Workflow, the step's log), so that a
    failure in CI says where the stop got stuck."""
    try:
        kube.wait_until(
            "the PyTorchJob and its pods to go", lambda: kube.job_gone(NS, job), timeout, 2
        )
    except AssertionError as e:
        raise AssertionError(f"{e}\n{stop_state(run_id, job)}") from None


def stop_state(run_id: str, job: str) -> str:
    """What the cluster holds of a run being stopped, in a few lines for a failure message."""
    lines = []
    for j in kube.jobs(NS):
        if j["metadata"]["name"] == job:
            meta, status = j["metadata"], j.get("status") or {}
            conditions = [c.get("type") for c in status.get("conditions") or []]
            lines.append(
                f"job {job}: deletionTimestamp={meta.get('deletionTimestamp')} "
                f"finalizers={meta.get('finalizers')} conditions={conditions} "
                f"owners={[(o['kind'], o['name']) for o in meta.get('ownerReferences') or []]}"
            )
    for p in kube.job_pods(NS, job):
        meta, status = p["metadata"], p.get("status") or {}
        containers = status.get("containerStatuses") or []
        states = [list((c.get("state") or {}).keys()) for c in containers]
        lines.append(
            f"job pod {meta['name']}: phase={status.get('phase')} "
            f"deletionTimestamp={meta.get('deletionTimestamp')} containers={states}"
        )
    try:
        wf = workflow_of(run_id)
    except AssertionError as e:
        return "\n".join([*lines, str(e)])
    spec, status = wf.get("spec") or {}, wf.get("status") or {}
    lines.append(
        f"workflow {wf['metadata']['name']}: phase={status.get('phase')} "
        f"activeDeadlineSeconds={spec.get('activeDeadlineSeconds')} shutdown={spec.get('shutdown')}"
    )
    for pod in run_pods(run_id):
        if task_of(pod) != ("train", "executor"):
            continue
        name = pod["metadata"]["name"]
        lines.append(f"train step pod {name}: phase={(pod.get('status') or {}).get('phase')}")
        lines += ["  " + line for line in kube.logs(NS, name, "main").splitlines()[-25:]]
    return "\n".join(lines)


def registered_version(model: str, run_id: str) -> Any:
    """The version of ``model`` that KFP run ``run_id`` registered in the cluster's MLflow, or
    None; MLflow asks who is calling (manifests/mlflow): a request without the account is
    refused (checked here), and the account of the secret ``registry_secret`` names is used."""
    from trainer.registry import find_version_by_pipeline_run

    with port_forward("mlflow", 5000) as mlflow:
        try:
            urllib.request.urlopen(f"{mlflow}/api/2.0/mlflow/registered-models/search", timeout=30)
        except urllib.error.HTTPError as refused:
            assert refused.code == 401, refused
        else:
            raise AssertionError("MLflow answered a request that named no account")
        account = {
            "MLFLOW_TRACKING_USERNAME": kube.secret_value(NS, "mlflow-auth", "username"),
            "MLFLOW_TRACKING_PASSWORD": kube.secret_value(NS, "mlflow-auth", "password"),
        }
        with pytest.MonkeyPatch.context() as env:
            for name, value in account.items():
                env.setenv(name, value)
            return find_version_by_pipeline_run(mlflow, model, run_id)
