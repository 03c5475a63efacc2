"""The training pipeline on KFP 2.17's real backend (hack/cluster/addons/kfp.sh), through the
commands a user types against a port-forward of the API server's Service (`ml-pipeline:8888`):
upload, runs to the end, what the Argo Workflow carries, caching, a failing step, recurring runs,
terminate, and a retried train step that re-attaches to its PyTorchJob.

Every step runs in the trainer's CPU image under KFP's own driver and launcher; the train step
launches a 2-node PyTorchJob through the Training Operator; register writes to the in-cluster
MLflow. The node has 2 cores: runs are compiled with small CPU requests (GPUPIPE_STEP_RESOURCES,
see tests/cluster/kfp.py), their limits as compiled.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import kfp, kube
from tests.cluster.kfp import NS, api, gpupipe

pytestmark = [
    pytest.mark.skipif(
        not (kube.STATE / "addons" / "kfp").is_dir(),
        reason="the KFP add-on is not installed in this cluster (GPUPIPE_CLUSTER_ADDONS)",
    ),
    pytest.mark.timeout(1800),  # a whole pipeline run on this 2-core node
    # The longest here, with its module's fixtures when it runs first, took about 450 s in CI
    # (the training run's 190 s setup and a test's own run or two); with 900, a test near the
    # end of a cold CI run would skip although it had the time to finish.
    pytest.mark.ci_allowance(540),
]
MLFLOW = "http://mlflow.kubeflow:5000"
JOB_SETTINGS = {
    **{k: v for k, v in kube.JOB_POD_SETTINGS.items() if k != "object_store_secret"},
    "cpu_request": "100m",
}
"""The train step's PyTorchJob here: two pods at a tenth of a CPU each, not a quarter. KFP's tests
run in three streams (hack/cluster-tests.sh), each with up to one job at a time, beside stage 2's
jobs in .ci/run; the scheduler places a job's pods one at a time, with no gang. The cluster's
services ask for 1014m of the node's 2 CPUs, which leaves room for three pods at a quarter. Jobs
started together can each get one pod, whose torchrun then waits for the other until a job
elsewhere ends (both terminate tests waited 900 s for their pods in 14da96b's CI, beside stage 2
and make test). Three jobs' six pods at a tenth, with the steps' own pods at a twentieth, fit."""
TUNE_SPACE = {
    "objective": {"type": "minimize", "objectiveMetricName": "val_loss"},
    "algorithm": {"algorithmName": "random"},
    "parameters": [
        {
            "name": "optim.lr",
            "parameterType": "double",
            "feasibleSpace": {"min": "0.001", "max": "0.01"},
        }
    ],
    "maxTrialCount": 2,
    "parallelTrialCount": 1,
    "maxFailedTrialCount": 1,
}


def run_params(table: str, model: str, **over: Any) -> list[str]:
    """`--param` flags of a whole training run on this node: tune (local engine, 2 trials),
    train as a 2-node CPU PyTorchJob, evaluate, register into the in-cluster MLflow."""
    params: dict[str, Any] = {
        "data_uri": table,
        "target": "churned",
        "epochs": 2,
        "launcher": "pytorchjob",
        "nodes": 2,
        "gpus_per_node": 0,
        "tune_enabled": True,
        "tune_engine": "local",
        "tune_space_json": json.dumps(TUNE_SPACE),
        "tune_trial_epochs": 1,
        "train_config_json": json.dumps({f"cluster.{k}": v for k, v in JOB_SETTINGS.items()}),
        "registry_uri": MLFLOW,
        "registered_model_name": model,
        **over,
    }
    out: list[str] = []
    for key, value in params.items():
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        out += ["--param", f"{key}={text}"]
    return out


def start_run(
    host: str, pipeline: str, model: str, params: list[str], *, wait: bool = False
) -> subprocess.CompletedProcess[str]:
    """`gpupipe run --host HOST --pipeline PIPELINE --run-name MODEL PARAMS`; with ``wait``, also
    `--wait` (followed to its end)."""
    follow = ["--wait"] if wait else []
    return gpupipe(
        "run", "--host", host, "--pipeline", pipeline, *follow, "--run-name", model, *params
    )


def run_id_of(out: subprocess.CompletedProcess[str]) -> str:
    """The id of the run `gpupipe run` started (its line ``started run ID``)."""
    found = re.search(r"started run (\S+)", out.stdout)
    assert found, out.stdout + out.stderr
    return found.group(1)


def start_training(
    host: str, pipeline: str, table: str, prefix: str, epochs: int = 40, **over: Any
) -> tuple[str, str]:
    """A run long enough to be stopped mid-training (40 epochs, no tuning: about 25 s of training
    on an idle node), started: its id and, once it is made, the name of its train step's
    PyTorchJob. ``over``: further pipeline parameters."""
    model = kube.unique(prefix)
    params = run_params(table, model, tune_enabled=False, epochs=epochs, **over)
    out = start_run(host, pipeline, model, params)
    assert out.returncode == 0, out.stderr
    run_id = run_id_of(out)
    job = kube.wait_until("the train step's PyTorchJob", lambda: _job_of(run_id), 600, 3)
    return run_id, job


@pytest.fixture(scope="module")
def host() -> Iterator[str]:
    with kfp.port_forward("ml-pipeline", 8888) as url:
        yield url


@pytest.fixture(scope="module")
def table(store: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The raw demo table (the pipeline preprocesses it) in the cluster's store."""
    from trainer.steps.preprocess import write_demo_data

    path = tmp_path_factory.mktemp("kfp") / "churn.parquet"
    write_demo_data(str(path), rows=2000, task="classification", seed=0)
    return kfp.upload_table(path, f"{kube.unique('gpupipe-kfp')}/churn.parquet")


@pytest.fixture(scope="module")
def pipeline(host: str) -> str:
    """The training pipeline uploaded under a name of this module's own."""
    name = kube.unique("gpupipe-kfp")
    out = gpupipe("upload", "--host", host, "--pipeline", name)
    assert out.returncode == 0, out.stderr
    return name


@pytest.fixture(scope="module")
def finished(host: str, pipeline: str, table: str) -> dict[str, Any]:
    """One whole run, started and followed with `gpupipe run --host --wait`."""
    model = kube.unique("gpupipe-kfp-model")
    out = start_run(host, pipeline, model, run_params(table, model), wait=True)
    return {"out": out, "run_id": run_id_of(out), "model": model}


# -- 1. upload ---------------------------------------------------------------------------------


def test_upload_creates_the_pipeline_then_adds_versions_never_a_second_pipeline(
    host: str, tmp_path: Path
) -> None:
    name = kube.unique("gpupipe-up")
    first = gpupipe("upload", "--host", host, "--pipeline", name)
    assert first.returncode == 0, first.stderr
    assert "created pipeline and version" in first.stdout
    again = gpupipe("upload", "--host", host, "--pipeline", name)
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout
    other = gpupipe("upload", "--host", host, "--pipeline", name, "--version", "second")
    assert other.returncode == 0, other.stderr
    assert "added version 'second'" in other.stdout
    flt = json.dumps(
        {"predicates": [{"operation": "EQUALS", "key": "display_name", "string_value": name}]}
    )
    found = api(host, "GET", f"/apis/v2beta1/pipelines?filter={_q(flt)}")["pipelines"]
    assert len(found) == 1, found
    versions = api(host, "GET", f"/apis/v2beta1/pipelines/{found[0]['pipeline_id']}/versions")
    assert len(versions["pipeline_versions"]) == 2, versions


def test_a_broken_yaml_is_refused_with_the_api_servers_own_reason(
    host: str, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("pipelineInfo: {name: broken}\nroot: {dag: {tasks: {a: {}}}}\n")
    out = gpupipe(
        "upload", "--host", host, "--pipeline", kube.unique("gpupipe-bad"), "--package", str(broken)
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("ERROR [gpupipe upload] E_REJECTED: KFP refused to upload"), lines
    assert "400" in lines[0] and len(lines[0]) > 80, lines[0]


# -- 2. a whole run ----------------------------------------------------------------------------


def test_the_training_pipeline_runs_to_the_end_and_registers_the_model(
    host: str, finished: dict[str, Any]
) -> None:
    out, run_id = finished["out"], finished["run_id"]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"run {run_id} SUCCEEDED" in out.stdout
    run = api(host, "GET", f"/apis/v2beta1/runs/{run_id}")
    states = kfp.task_states(run)
    for task in ("fingerprint", "preprocess", "tune", "train", "evaluate", "register"):
        assert states.get(task) == "SUCCEEDED", states
    # The summary `gpupipe run --local` prints, read back from the run's own artifacts.
    for line in ("gate           passed: ", "model          minio://", "vs trivial", "accuracy"):
        assert line in out.stdout, out.stdout
    # The model's files are in KFP's artifact store, where the train task's output says.
    from trainer.base import storage

    models = [u for u in _artifact_uris(run_id) if u.rstrip("/").endswith("/model")]
    assert models, _artifact_uris(run_id)
    assert storage.exists(storage.join(models[0], "model.safetensors")), models[0]
    # MLflow asks who is calling (manifests/mlflow): the steps used the account of the secret
    # registry_secret names; a request without one is refused (kfp.registered_version).
    version = kfp.registered_version(finished["model"], run_id)
    assert version is not None, f"no version of {finished['model']} tagged with run {run_id}"


def test_a_run_started_as_the_ui_starts_it_succeeds_with_preprocess_from_the_cache(
    host: str, pipeline: str, table: str, finished: dict[str, Any]
) -> None:
    """The UI's Create run: POST /apis/v2beta1/runs with a pipeline version reference. The same
    table as the whole run's: KFP's driver serves preprocess from its cache, so no preprocess pod
    runs (KFP 2.17's API reports a cached task as SUCCEEDED; its driver's log says "Use cache")."""
    params = run_params(table, kube.unique("gpupipe-ui-model"), tune_enabled=False)
    run_id = _start_as_the_ui(host, pipeline, params)
    done = kfp.wait_run(host, run_id)
    assert done["state"] == "SUCCEEDED", kfp.failure_report(done)
    assert _executor_pod(run_id, "preprocess") is None, "preprocess ran: not from the cache"
    # Never cached: it reads the data, and its output is preprocess's cache key.
    assert _executor_pod(run_id, "fingerprint") is not None


# -- 3. what the Workflow carries, and caching -------------------------------------------------


def test_the_workflow_retries_only_the_steps_a_retry_helps(finished: dict[str, Any]) -> None:
    wf = kfp.workflow_of(finished["run_id"])
    retried: dict[str, dict[str, str]] = {}
    plain: set[str] = set()
    for template in wf["spec"]["templates"]:
        for task in (template.get("dag") or {}).get("tasks", []):
            args = {p["name"]: p.get("value", "") for p in task["arguments"].get("parameters", [])}
            if task.get("template") == "retry-system-container-executor":
                retried[task["name"]] = args
            elif task.get("template") == "system-container-executor":
                plain.add(task["name"])
    assert {"train", "train-2", "tune", "register"} <= set(retried), retried
    assert {"fingerprint", "preprocess", "evaluate"} <= plain, plain
    for args in retried.values():
        assert args["retry-max-count"] == "2" and args["retry-backoff-duration"] == "30", args
        assert args["retry-backoff-factor"] == "2", args


@pytest.fixture(scope="module")
def gpu_run(
    host: str, pipeline: str, store: dict[str, str], tmp_path_factory: Any
) -> Iterator[Any]:
    """A GPU run (launcher=local: the train step trains in its own pod) on new data, read while
    its train pod waits (this node has no GPU and not the selected label); terminated after."""
    from trainer.steps.preprocess import write_demo_data

    path = tmp_path_factory.mktemp("gpu") / "other.parquet"
    write_demo_data(str(path), rows=1500, task="classification", seed=7)
    other = kfp.upload_table(path, f"{kube.unique('gpupipe-kfp')}/other.parquet")
    model = kube.unique("gpupipe-gpu")
    selector = json.dumps({"gpupipe.dev/gpu": "h100"})
    params = run_params(
        other,
        model,
        launcher="local",
        gpus_per_node=1,
        tune_enabled=False,
        gpu_node_selector=selector,
    )
    # Started as a user waits on it: `run --host --wait`, its lines collected as they come.
    waiting = kfp.gpupipe_popen(
        "run", "--host", host, "--pipeline", pipeline, "--wait", "--run-name", model, *params
    )
    lines: list[str] = []

    def collect() -> None:
        for line in waiting.stdout or ():
            lines.append(line.rstrip("\n"))

    threading.Thread(target=collect, daemon=True).start()
    run_id = ""
    try:
        started = kube.wait_until(
            "`run --wait` to start the run",
            lambda: next((m for x in lines if (m := re.search(r"started run (\S+)", x))), None),
            120,
            1,
        )
        run_id = started.group(1)
        pod = kube.wait_until("the GPU train pod", lambda: _executor_pod(run_id, "train-2"), 600, 3)
        yield run_id, pod, lines
    finally:
        if run_id:
            api(host, "POST", f"/apis/v2beta1/runs/{run_id}:terminate")
        try:
            waiting.wait(timeout=300)
        except subprocess.TimeoutExpired:
            waiting.kill()


def test_a_gpu_train_pod_gets_its_placement_shm_and_store_secret(gpu_run: Any) -> None:
    run_id, pod, _ = gpu_run
    spec = pod["spec"]
    main = next(c for c in spec["containers"] if c["name"] == "main")
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in [
        {k: t.get(k) for k in ("key", "operator", "effect")} for t in spec["tolerations"]
    ], spec["tolerations"]
    assert spec["nodeSelector"].get("gpupipe.dev/gpu") == "h100", spec.get("nodeSelector")
    shm = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert shm and shm[0]["emptyDir"]["medium"] == "Memory", spec["volumes"]
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    assert mounts.get("dshm") == "/dev/shm", mounts
    secret_env = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in main.get("env", [])
        if "secretKeyRef" in (e.get("valueFrom") or {})
    }
    assert secret_env.get("AWS_ACCESS_KEY_ID") == "mlpipeline-minio-artifact", secret_env
    # New data: preprocess ran (its pod), not served from the cache.
    assert _executor_pod(run_id, "preprocess") is not None


def test_a_gpu_train_pod_asks_for_its_gpus(gpu_run: Any) -> None:
    # KFP 2.17's driver reads an accelerator count from a channel only as a string: the int
    # pipeline parameter gave no limit at all; tune's text output train_gpu_limit does.
    _, pod, _ = gpu_run
    main = next(c for c in pod["spec"]["containers"] if c["name"] == "main")
    assert main["resources"]["limits"].get("nvidia.com/gpu") in ("1", 1), main["resources"]


def test_run_wait_says_why_the_gpu_train_pod_waits(gpu_run: Any) -> None:
    # No GPU and not the selected label on this node: the pod stays Pending, and the waiting
    # command says so with the scheduler's reason (read from the run's Workflow, v1beta1 API),
    # once, instead of printing nothing until its timeout.
    _, _, lines = gpu_run
    said = kube.wait_until(
        "`run --wait` to say why train-2 waits",
        lambda: [x for x in lines if x.startswith("  step train-2 waits: ")] or None,
        120,
        2,
    )
    # 0/N: every node of the cluster, one or several (make cluster-up NODES=N), lacks the GPU.
    waits = r"  step train-2 waits: Unschedulable: 0/\d+ nodes are available"
    assert re.match(waits, said[0]), said
    assert all(a != b for a, b in itertools.pairwise(said)), said  # each news once


# -- 4. a failing step -------------------------------------------------------------------------


def test_a_bad_target_fails_the_run_with_the_steps_one_line(
    host: str, pipeline: str, table: str
) -> None:
    model = kube.unique("gpupipe-bad")
    params = run_params(table, model, target="no_such_column", tune_enabled=False)
    out = start_run(host, pipeline, model, params, wait=True)
    assert out.returncode == 1, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ERROR [gpupipe run] E_RUN_FAILED: run "), last
    assert "failed step: ERROR [preprocess] E_COLUMN: target column 'no_such_column'" in last, last
    assert "failed step     preprocess" in out.stdout or "failed step    preprocess" in out.stdout
    run_id = run_id_of(out)
    assert api(host, "GET", f"/apis/v2beta1/runs/{run_id}")["state"] == "FAILED"
    # The run's details as the API gives them to the UI (v1beta1: the Workflow, whose failed
    # node's message is the step's termination message: its one line).
    manifest = api(host, "GET", f"/apis/v1beta1/runs/{run_id}")["pipeline_runtime"][
        "workflow_manifest"
    ]
    nodes = json.loads(manifest)["status"]["nodes"].values()
    messages = [n.get("message", "") for n in nodes if n.get("type") == "Pod"]
    assert any(
        "ERROR [preprocess] E_COLUMN: target column 'no_such_column'" in m for m in messages
    ), messages


# -- 5. recurring runs ------------------------------------------------------------------------


def test_a_schedule_really_starts_a_run_and_is_updated_disabled_enabled_and_deleted(
    host: str, pipeline: str, table: str
) -> None:
    name = kube.unique("gpupipe-sched")
    model = kube.unique("gpupipe-sched-model")
    # What this test checks is the schedule, not the launcher (test 2's run has the PyTorchJob):
    # the train step trains in its own pod, two pods and their start fewer on this 2-core node.
    params = run_params(table, model, tune_enabled=False, launcher="local", nodes=1)
    base = ["schedule", "--host", host, "--pipeline", pipeline, "--name", name, "--no-catchup"]
    # Created, then the same again, with one cron that cannot tick during the test (computing
    # "three minutes from now" twice once crossed a minute and read as a change: CI, 492cc1f).
    idle = "0 0 3 1 1 *"
    first = gpupipe(*base, "--cron", idle, *params)
    assert first.returncode == 0, first.stderr
    assert f"created recurring run {name!r}" in first.stdout
    again = gpupipe(*base, "--cron", idle, *params)
    assert again.returncode == 0 and "unchanged" in again.stdout, again
    # The same name with another cron replaces it: never two of that name.
    cron = kfp.cron_in(45)  # the call below takes a few seconds (imports, three API calls)
    assert cron != idle
    replaced = gpupipe(*base, "--cron", cron, *params)
    assert replaced.returncode == 0 and "replaced recurring run" in replaced.stdout, replaced
    mine = [r for r in _recurring(host) if r["display_name"] == name]
    assert len(mine) == 1, mine
    rid = mine[0]["recurring_run_id"]
    # Its next tick starts a run, which succeeds.
    started = kube.wait_until(
        "the schedule's first run", lambda: _runs_of_schedule(host, rid), 300, 10
    )
    done = kfp.wait_run(host, started[0]["run_id"])
    assert done["state"] == "SUCCEEDED", kfp.failure_report(done)
    for action, mode in (("--disable", "DISABLE"), ("--enable", "ENABLE")):
        out = gpupipe("schedule", "--host", host, action, name)
        assert out.returncode == 0, out.stderr
        kfp.expect_mode(host, rid, mode)
    listed = gpupipe("schedule", "--host", host, "--list")
    assert name in listed.stdout, listed.stdout
    gone = gpupipe("schedule", "--host", host, "--delete", name)
    assert gone.returncode == 0, gone.stderr
    assert all(r["display_name"] != name for r in _recurring(host))


# -- 6. terminate ------------------------------------------------------------------------------


def test_terminating_a_run_stops_the_train_step_and_leaves_no_job_or_pod(
    host: str, pipeline: str, table: str
) -> None:
    run_id, job = start_training(host, pipeline, table, "gpupipe-stop")
    kube.wait_until(
        "its pods to run", lambda: _running(kube.job_pods(NS, job)), kfp.PODS_TIMEOUT_S, 2
    )
    api(host, "POST", f"/apis/v2beta1/runs/{run_id}:terminate")  # the UI's Terminate button
    kfp.wait_stopped(run_id, job)
    done = kfp.wait_run(host, run_id, timeout=300)
    assert done["state"] in {"CANCELED", "FAILED"}, done["state"]
    assert not [j for j in kube.jobs(NS) if run_id[:8] in j["metadata"]["name"]]


# -- 7. a retried train step -------------------------------------------------------------------


def test_a_deleted_train_step_pod_is_retried_and_re_attaches_to_its_job(
    host: str, pipeline: str, table: str
) -> None:
    # 80 epochs: the job must outlast the deleted pod's way out (up to its 30 s grace period). With
    # 40 (about 25 s of training) it once finished first on an idle node: the step then succeeded
    # on its first attempt, and nothing was retried.
    """The step's pod lost as with its node (force-deleted: gone from the API at once), while its
    PyTorchJob trains: KFP retries the step, and the retry re-attaches to the same job.

    Why forced: KFP 2.17's Argo config (upstream's ``workflow-controller-configmap``) gives every
    template ``retryPolicy: OnError``, and the compiled ``set_retry`` sets no policy of its own, so
    a step is retried when its pod errs (gone: ``pod deleted``), never when its container exits
    non-zero (``test_a_train_step_that_refuses_its_input_runs_once``). A graceful delete is
    either: the launcher exits on the SIGTERM within a second, and whether Argo records that exit
    (Failed: the run fails) or the pod's absence (Error: retried) first is a race; this test lost
    it once in five clean-clone runs. docs/kfp.md#retries says so to users."""
    run_id, job = start_training(host, pipeline, table, "gpupipe-retry", epochs=80)
    uid = kube.get_json("pytorchjob", "-n", NS, job)["metadata"]["uid"]
    launcher = _launcher_pod(run_id)
    # Lose the step's pod while the job trains (its pods running, the job not finished).
    kube.wait_until(
        "the job's pods running", lambda: _running(kube.job_pods(NS, job)), kfp.PODS_TIMEOUT_S, 2
    )
    lost = kube.get_json("pod", "-n", NS, launcher)["metadata"]["uid"]
    kube.kubectl("-n", NS, "delete", "pod", launcher, "--grace-period=0", "--force")
    state = kube.get_json("pytorchjob", "-n", NS, job)["status"]["conditions"][-1]["type"]
    assert state not in ("Succeeded", "Failed"), (
        f"the job ended before the step's deleted pod was gone: {state}"
    )
    done = kfp.wait_run(host, run_id)
    if done["state"] != "SUCCEEDED":  # what the job says too, when it is still there
        job_now = kube.kubectl("get", "pytorchjob", "-n", NS, job, "-o", "json", check=False)
        status = json.loads(job_now.stdout).get("status", {}) if job_now.returncode == 0 else {}
        conditions = [
            (c["type"], c.get("reason", ""), c.get("message", ""))
            for c in status.get("conditions", [])
        ]
        said = conditions or job_now.stderr
        raise AssertionError(f"{kfp.failure_report(done)}\njob {job}: {said}")
    # A second attempt of the step ran, and found the same job (one job, never two). Argo runs it
    # in one of two ways: a Retry node's next child (a new pod name), or, when its Workflow still
    # had the lost pod's node Pending (the controller had not yet recorded it Running: it lags on a
    # busy node), the same pod name created again. Either is a new pod: a uid other than the lost.
    attempts = [
        (p["metadata"]["name"], p["metadata"]["uid"])
        for p in kfp.run_pods(run_id)
        if _is_launcher(p)
    ]
    assert [a for a in attempts if a[1] != lost], (launcher, lost, attempts)
    jobs = [j for j in kube.jobs(NS) if run_id[:8] in j["metadata"]["name"]]
    assert [j["metadata"]["uid"] for j in jobs] == [uid], jobs
    # Owned by the run's Workflow (deleting the run deletes it), no longer by the deleted pod
    # (by uid: the second attempt's pod may have its name, and owns the job too).
    owners = jobs[0]["metadata"].get("ownerReferences") or []
    workflow = kfp.workflow_of(run_id)["metadata"]
    assert {"kind": "Workflow", "uid": workflow["uid"]}.items() <= owners[0].items(), owners
    assert lost not in [o["uid"] for o in owners], owners


def test_a_train_step_that_refuses_its_input_runs_once(
    host: str, pipeline: str, table: str
) -> None:
    """The train step has ``set_retry(2)``, and its bad input runs once all the same: on KFP 2.17
    as upstream installs it, Argo retries a step whose pod errs, not one whose container fails
    (the retry policy every template gets is ``OnError``; KFP's ``set_retry`` cannot set one).
    Should a KFP release or the cluster's Argo config retry failures, the train step's bad input
    would run three times, and this test says so (docs/kfp.md#retries). Started as the UI starts
    a run: `gpupipe run` refuses this setting before any run starts."""
    bad = json.dumps({"no_such_setting": 1})
    model = kube.unique("gpupipe-once")
    params = run_params(table, model, tune_enabled=False, train_config_json=bad)
    run_id = _start_as_the_ui(host, pipeline, params)
    done = kfp.wait_run(host, run_id, timeout=600)
    assert done["state"] == "FAILED", kfp.failure_report(done)
    train = [p for p in kfp.run_pods(run_id) if kfp.task_of(p) == ("train", "executor")]
    assert len(train) == 1, [p["metadata"]["name"] for p in train]
    # Argo's retry node of each failed pod ran one attempt (every template has a retry strategy
    # here: upstream's default one, or set_retry's); the train step's says the step's one line.
    # KFP's launcher, the container's command, exits 1 whatever the step's own code: Argo sees 1.
    nodes = (kfp.workflow_of(run_id).get("status") or {}).get("nodes") or {}
    pods = {k for k, n in nodes.items() if n.get("type") == "Pod"}
    failed = [
        n
        for n in nodes.values()
        if n.get("type") == "Retry" and n["phase"] == "Failed" and set(n["children"]) & pods
    ]
    assert failed and all(len(n["children"]) == 1 for n in failed), failed
    said = [n.get("message", "") for n in failed]
    assert any("(exit code 1): ERROR [train] E_CONFIG: " in m for m in said), said


# -- 7. a table larger than the preprocess pod's memory -----------------------------------------

BIG_ROWS = 4_000_000
"""312 MiB as an Arrow table (a 47 MiB Parquet file): more than the preprocess pod may hold."""
PREPROCESS_LIMIT = "288Mi"
"""The preprocess pod's memory limit here (compiled: 16Gi). Under it the step plans its batches
from what the cgroup leaves beside the interpreter and KFP's launcher (trainer/base/memory.py);
the whole-table path needs about five times the table."""


def test_a_table_larger_than_the_preprocess_pods_memory_limit_goes_through(
    host: str, store: dict[str, str], tmp_path: Path
) -> None:
    """Issue 61, item 3: a version compiled with the preprocess pod's limit set low on purpose
    (GPUPIPE_STEP_RESOURCES, as a platform team sets it) preprocesses a table larger than that
    limit, streaming, with no OOM kill and no retry, and the run trains (200 steps: a whole
    epoch of its 3.2M training rows takes about 300 s on this node), evaluates the whole test
    split and registers, to SUCCEEDED."""
    import pyarrow.parquet as pq

    from trainer.base import storage
    from trainer.steps.preprocess import make_demo_table

    table = make_demo_table(BIG_ROWS, seed=0)
    assert table.nbytes > 288 << 20, table.nbytes  # the pod's limit
    path = tmp_path / "big.parquet"
    pq.write_table(table, path)
    del table
    uri = kfp.upload_table(path, f"{kube.unique('gpupipe-big')}/big.parquet")
    steps = {**kfp.SMALL_STEPS}
    steps["preprocess"] = {**steps["preprocess"], "memory_limit": PREPROCESS_LIMIT}
    name = kube.unique("gpupipe-capped")
    up = gpupipe(
        "upload", "--host", host, "--pipeline", name,
        env={"GPUPIPE_STEP_RESOURCES": json.dumps(steps)},
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    model = kube.unique("gpupipe-big-model")
    params = run_params(
        uri, model, tune_enabled=False, epochs=1, launcher="local", nodes=1,
        train_config_json=json.dumps({"train.max_steps": 200}),
    )  # fmt: skip
    out = start_run(host, name, model, params, wait=True)
    run_id = run_id_of(out)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    pod = _executor_pod(run_id, "preprocess")
    assert pod is not None, "no preprocess pod: served from a cache?"
    (main,) = [c for c in pod["spec"]["containers"] if c["name"] == "main"]
    assert main["resources"]["limits"]["memory"] == PREPROCESS_LIMIT, main["resources"]
    (status,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "main"]
    assert status["restartCount"] == 0, status
    assert status["state"]["terminated"]["reason"] == "Completed", status
    # One pod for the step: no OOM-killed attempt before it.
    tries = [p for p in kfp.run_pods(run_id) if kfp.task_of(p) == ("preprocess", "executor")]
    assert len(tries) == 1, [p["metadata"]["name"] for p in tries]
    # Every row went to a split, written a row group at a time.
    dataset = next(
        u for u in _artifact_uris(run_id) if "/preprocess/" in u and u.endswith("/dataset")
    )
    rows = 0
    for split in ("train", "val", "test"):
        with storage.open_input(storage.join(dataset, f"{split}.parquet")) as f:
            meta = pq.ParquetFile(f).metadata
            rows += meta.num_rows
            assert meta.num_row_groups > 1, (split, meta.num_row_groups)
    assert rows == BIG_ROWS


# -- 8. the README's lines for this cluster, as written ------------------------------------------


def readme_block(marker: str) -> str:
    """The fenced block that follows README.md's ``<!-- MARKER...`` line, as written."""
    lines = (kube.ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"<!-- {marker}"))
    assert lines[start + 1].startswith("```"), lines[start + 1]
    end = next(i for i in range(start + 2, len(lines)) if lines[i] == "```")
    return "\n".join(lines[start + 2 : end]) + "\n"


def test_the_readmes_lines_for_the_test_cluster_run_as_written(
    store: dict[str, str], tmp_path: Path
) -> None:
    """Issue 62, item 4: a newcomer who ran README's KFP block as written on this cluster got a
    run that never started (its steps asked for more CPU than the node has), a GPU it does not
    have, no table at the URI, and no registry. The README's block for this cluster, pasted into
    a shell as it is (its `&` port-forward on 8080 included), runs the demo pipeline to
    SUCCEEDED; the shell starts without this checkout's settings (no store keys, no step sizes:
    the block's first line gives them)."""
    script = readme_block("test-cluster-demo")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MINIO_", "GPUPIPE_", "KUBECONFIG", "AWS_", "MLFLOW_"))
    }
    env["PATH"] = ":".join(
        p for p in env.get("PATH", "").split(":") if not p.startswith(str(kube.ROOT))
    )
    log = tmp_path / "readme-block.log"
    with log.open("w") as sink:
        # To a file, not a pipe: the block's port-forward outlives a failed line, and would hold a
        # pipe open.
        shell = subprocess.Popen(
            ["bash", "-c", f"set -eo pipefail\n{script}kill %1 || true\n"],
            cwd=kube.ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its port-forward goes with it
        )
        try:
            shell.wait(timeout=kfp.RUN_TIMEOUT_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGTERM)
    out = log.read_text()
    assert shell.returncode == 0, out[-4000:]
    found = re.search(r"run (\S+) SUCCEEDED", out)
    assert found, out[-4000:]
    assert "model" in out and "accuracy" in out, out[-3000:]


# -- 8b. a node lost under the pipeline's job ----------------------------------------------------


@pytest.mark.timeout(1800)
@pytest.mark.ci_allowance(900)
def test_a_node_lost_under_the_pipelines_job_and_back_the_run_still_succeeds(
    host: str, pipeline: str, table: str
) -> None:
    """Issue 63 item 5 through KFP: a run started as a user starts it, its train step's 2-node
    PyTorchJob one worker per node (the pipeline's ``one_worker_per_node``); once the job has
    trained past its first checkpoints, a node holding one of its workers (and not the step's
    own pod) loses its power (hack/cluster-node.sh stop), goes NotReady, its pod is evicted, and
    the node comes back: the Training Operator replaces the pod, training resumes from the last
    checkpoint, and the run ends SUCCEEDED with the model registered. Skipped on one node."""
    names = sorted(n["metadata"]["name"] for n in kube.get_json("nodes")["items"])
    if len(names) < 2:
        pytest.skip(f"the test cluster has one node ({names[0]}): make cluster-up NODES=2")
    script = kube.ROOT / "hack" / "cluster-node.sh"
    run_id, job = start_training(
        host, pipeline, table, "gpupipe-node", epochs=120, one_worker_per_node=True
    )
    launcher = _launcher_pod(run_id)

    def target() -> tuple[int, str] | None:
        """Node K (not node 1, the control plane's) with a worker running and not the step."""
        pods = kube.job_pods(NS, job)
        if not _running(pods) or kube.pod_steps(NS, f"{job}-master-0", "pytorch") < 12:
            return None
        step_node = kube.get_json("pod", "-n", NS, launcher)["spec"].get("nodeName")
        for pod in pods:
            node = pod["spec"]["nodeName"]
            if node not in (kube.NODE_NAME, step_node):
                return int(node.rsplit("-", 1)[1]), pod["metadata"]["name"]
        return None

    k, lost = kube.wait_until(
        "the job past its first checkpoints, a worker on a node of its own", target, 600, 2
    )
    node = kube.node_name(k)
    try:
        subprocess.run([str(script), "stop", str(k)], check=True, timeout=120)
        kube.wait_until(
            f"{node} NotReady",
            lambda: any(
                c["type"] == "Ready" and c["status"] != "True"
                for c in kube.get_json("node", node)["status"]["conditions"]
            ),
            180,
        )
        kube.wait_until(
            f"pod {lost} evicted",
            lambda: bool(kube.get_json("pod", "-n", NS, lost)["metadata"].get("deletionTimestamp")),
            180,
        )
    finally:
        subprocess.run([str(script), "start", str(k)], check=True, timeout=300)
    done = kfp.wait_run(host, run_id)
    assert done["state"] == "SUCCEEDED", kfp.failure_report(done)
    steps = [p for p in kfp.run_pods(run_id) if _is_launcher(p)]
    log = "".join(kube.logs(NS, p["metadata"]["name"], "main") for p in steps)
    assert re.search(r"resum", log, re.IGNORECASE), log[-3000:]


# -- 9. docs/kfp.md's own pipeline, as a user compiles it -----------------------------------------


def test_the_docs_own_pipeline_runs_on_the_real_backend(host: str, tmp_path: Path) -> None:
    """Issue 62, item 1: docs/kfp.md's "Using the components in your own pipeline" failed here at
    preprocess (`E_DATA ... ACCESS_DENIED`: it read `data_uri` itself, and nothing gave it the
    store's keys). The page's block, compiled with KFP's SDK as a user compiles it
    (tests/docs_pipelines.py), uploaded and started as the UI starts a run: the user's own step
    writes the table as a Dataset, which reaches preprocess as an artifact through KFP's launcher
    with no store secret on any step; train (from its component.yaml) trains in its own pod;
    evaluate reads the cluster's MLflow with the account the page's one line gives it; the
    user's own check of evaluate's metrics passes."""
    from tests.docs_pipelines import compile_own_pipeline

    package = compile_own_pipeline(tmp_path / "own-pipeline.yaml")
    name = kube.unique("gpupipe-docs")
    out = gpupipe("upload", "--host", host, "--pipeline", name, "--package", str(package))
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = _start_with_parameters(
        host,
        name,
        {"rows": 1000, "epochs": 3, "registry_uri": MLFLOW, "min_roc_auc": 0.55},
    )
    run = kfp.wait_run(host, run_id)
    assert run["state"] == "SUCCEEDED", kfp.failure_report(run)
    states = kfp.task_states(run)
    for task in ("make-table", "preprocess", "train", "evaluate", "check-metrics"):
        assert states.get(task) == "SUCCEEDED", (task, states)
    # No step's own container had the store's keys: the table came in as an artifact, through
    # KFP's launcher (which reads the store with KFP's own credentials).
    executors = [p for p in kfp.run_pods(run_id) if kfp.task_of(p)[1] == "executor"]
    assert {kfp.task_of(p)[0] for p in executors} >= {"make-table", "preprocess", "evaluate"}
    for pod in executors:
        main = next(c for c in pod["spec"]["containers"] if c["name"] == "main")
        secrets = {
            e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
            for e in main.get("env", [])
            if "secretKeyRef" in (e.get("valueFrom") or {})
        }
        assert kube.STORE_SECRET not in secrets.values(), (pod["metadata"]["name"], secrets)
        if kfp.task_of(pod)[0] == "evaluate":
            assert secrets.get("MLFLOW_TRACKING_USERNAME") == "mlflow-auth", secrets


# -- helpers -----------------------------------------------------------------------------------


def _q(text: str) -> str:
    import urllib.parse

    return urllib.parse.quote(text)


def _pipeline_id(host: str, name: str) -> str:
    flt = json.dumps(
        {"predicates": [{"operation": "EQUALS", "key": "display_name", "string_value": name}]}
    )
    (found,) = api(host, "GET", f"/apis/v2beta1/pipelines?filter={_q(flt)}")["pipelines"]
    return str(found["pipeline_id"])


def _start_as_the_ui(host: str, pipeline: str, flags: list[str]) -> str:
    """A run of the pipeline's newest version started as the UI's Create run starts one (POST
    /apis/v2beta1/runs with a pipeline version reference, in an experiment of its own, the
    ``--param`` flags as the form's typed values, nothing checked first); its id."""
    return _start_with_parameters(host, pipeline, _as_ui_parameters(flags))


def _start_with_parameters(host: str, pipeline: str, parameters: dict[str, Any]) -> str:
    """A run of the pipeline's newest version started as the UI's Create run starts one, with
    ``parameters`` as the form sends them (typed JSON values): for any pipeline, also one that is
    not gpupipe's (whose `--param` flags `gpupipe run` would check against gpupipe's); its id."""
    pid = _pipeline_id(host, pipeline)
    vid = api(host, "GET", f"/apis/v2beta1/pipelines/{pid}/versions")["pipeline_versions"][0][
        "pipeline_version_id"
    ]
    exp = api(host, "POST", "/apis/v2beta1/experiments", {"display_name": kube.unique("ui")})
    run = api(
        host,
        "POST",
        "/apis/v2beta1/runs",
        {
            "display_name": kube.unique("ui-run"),
            "experiment_id": exp["experiment_id"],
            "pipeline_version_reference": {"pipeline_id": pid, "pipeline_version_id": vid},
            "runtime_config": {"parameters": parameters},
        },
    )
    return str(run["run_id"])


def _as_ui_parameters(flags: list[str]) -> dict[str, Any]:
    """`--param k=v` flags as the UI's form sends them (typed JSON values)."""
    from pipelines.params import typed_parameters

    return typed_parameters([f for f in flags if f != "--param"])


def _maybe_workflow(run_id: str) -> dict[str, Any] | None:
    try:
        return kfp.workflow_of(run_id)
    except AssertionError:
        return None


def _artifact_uris(run_id: str) -> list[str]:
    """Every output the run's steps wrote: KFP 2.17's driver names them
    ``<pipeline root>/<pipeline>/<run id>/<task>/<salt>/<output>``."""
    from pipelines.cluster_summary import DEFAULT_PIPELINE_ROOT, outputs_of
    from pipelines.training import PIPELINE_NAME
    from trainer.base import storage

    outputs = outputs_of(storage.join(DEFAULT_PIPELINE_ROOT, PIPELINE_NAME, run_id))
    return [uri for outs in outputs.values() for uri in outs.values()]


def _recurring(host: str) -> list[dict[str, Any]]:
    return api(host, "GET", "/apis/v2beta1/recurringruns?page_size=100").get("recurringRuns") or (
        api(host, "GET", "/apis/v2beta1/recurringruns?page_size=100").get("recurring_runs") or []
    )


def _runs_of_schedule(host: str, recurring_run_id: str) -> list[dict[str, Any]] | None:
    runs = api(host, "GET", "/apis/v2beta1/runs?page_size=100").get("runs") or []
    mine = [r for r in runs if r.get("recurring_run_id") == recurring_run_id]
    return mine or None


def _job_of(run_id: str) -> str | None:
    for job in kube.jobs(NS):
        if run_id[:8] in job["metadata"]["name"]:
            return str(job["metadata"]["name"])
    return None


def _running(pods: list[dict[str, Any]]) -> bool:
    return len(pods) >= 2 and all(p["status"].get("phase") == "Running" for p in pods)


def _is_launcher(pod: dict[str, Any]) -> bool:
    """The cluster-job train task's own pod (its executor: the launcher of the PyTorchJob)."""
    return kfp.task_of(pod) == ("train", "executor")


def _executor_pod(run_id: str, task: str) -> dict[str, Any] | None:
    try:
        pods = kfp.run_pods(run_id)
    except AssertionError:
        return None
    return next((p for p in pods if kfp.task_of(p) == (task, "executor")), None)


def _launcher_pod(run_id: str) -> str:
    def running() -> str | None:
        for pod in kfp.run_pods(run_id):
            if _is_launcher(pod) and pod["status"].get("phase") == "Running":
                return str(pod["metadata"]["name"])
        return None

    return kube.wait_until("the train step's pod", running, kfp.PODS_TIMEOUT_S, 2)
