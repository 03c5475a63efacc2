"""The Katib engine: the Experiment it builds (checked as Katib's webhook and the PyTorchJob CRD
would), and the launcher against a fake API server that plays Katib."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from pipelines.render import render_experiment
from tests.fakes.kube_api import ExperimentScenario, FakeKubeApi, TrialPlan, rbac_call
from tests.helpers import needs_crd, schema_errors
from trainer.base.errors import InputError
from trainer.base.typedconfig import apply_overrides, config_fields, parse_value
from trainer.config import WorkerConfig
from trainer.launch import TrainingRun
from trainer.launch.jobspec import ClusterConfig, JobSpec
from trainer.launch.kube import KubeApi, RetryPolicy
from trainer.launch.owners import PodRef
from trainer.launch.pytorchjob import build_pytorchjob
from trainer.launch.watch import REFUSAL_CHECK_POLLS, LaunchCancelled
from trainer.tune.katib import (
    KATIB_API_CALLS,
    KatibLauncher,
    build_experiment,
    experiment_name,
    katib_name,
    trial_template_errors,
)
from trainer.tune.space import SearchSpace, example_space, load_space

NS = "team-a"
NAME = experiment_name("run-0f3c9a", "tune")
POD = PodRef(name="tune-launcher-abc12", namespace=NS, uid="3f0e6a52-9a0c-4c2e-8f4e-0c7f7b1d2a11")
SPACE = load_space(example_space(), config_fields=config_fields(WorkerConfig))


def trial_job(nnodes: int = 2) -> dict[str, Any]:
    run = TrainingRun(
        job_name="gpupipe-train-x", config_uri="s3://b/work/worker-config.json", nnodes=nnodes
    )
    return build_pytorchjob(
        JobSpec(namespace=NS, run=run, cluster=ClusterConfig(image="gpupipe:test"))
    )


def experiment(space: SearchSpace = SPACE, **kwargs: Any) -> dict[str, Any]:
    kwargs = {
        "name": NAME,
        "namespace": NS,
        "trial_job": trial_job(),
        "base_overrides": {"train.epochs": 3},
        "trial_uri": "s3://b/work/trials",
        **kwargs,
    }
    return build_experiment(space, **kwargs)


def as_katib_runs_it(exp: dict[str, Any], values: dict[str, str]) -> dict[str, Any]:
    """The trial's PyTorchJob as Katib creates it: placeholders filled, name and namespace set."""
    text = json.dumps(exp["spec"]["trialTemplate"]["trialSpec"])
    for tp in exp["spec"]["trialTemplate"]["trialParameters"]:
        value = "trial-abc123" if tp["reference"] == "${trialSpec.Name}" else values[tp["name"]]
        text = text.replace(f"${{trialParameters.{tp['name']}}}", value)
    job = json.loads(text)
    job["metadata"].update(name="trial-abc123", namespace=NS)
    return job


# --------------------------------------------------------------------------------------------
# The Experiment
# --------------------------------------------------------------------------------------------


def test_names_map_to_dns_like_katib_names() -> None:
    assert katib_name("model.hidden_dim") == "model-hidden-dim"
    assert katib_name("optim.lr") == "optim-lr"
    assert experiment_name("run-0f3c9a", "tune") == NAME  # deterministic: safe to retry
    assert experiment_name("run-0f3c9b", "tune") != NAME
    assert len(experiment_name("r" * 80, "t" * 80)) <= 39


def test_experiment_passes_the_webhook_checks_and_maps_every_parameter() -> None:
    exp = experiment()
    assert trial_template_errors(exp) == []
    spec = exp["spec"]
    assert exp["apiVersion"] == "kubeflow.org/v1beta1" and exp["kind"] == "Experiment"
    assert [p["name"] for p in spec["parameters"]] == [
        "optim-lr",
        "model-hidden-dim",
        "optim-weight-decay",
        "model-dropout",
    ]
    assert json.loads(exp["metadata"]["annotations"]["gpupipe.dev/parameters"])["optim-lr"] == (
        "optim.lr"
    )
    assert spec["metricsCollectorSpec"] == {"collector": {"kind": "StdOut"}}
    tt = spec["trialTemplate"]
    assert tt["primaryContainerName"] == "pytorch"
    assert tt["successCondition"] == 'status.conditions.#(type=="Succeeded")#|#(status=="True")#'
    assert tt["failureCondition"] == 'status.conditions.#(type=="Failed")#|#(status=="True")#'
    assert spec["earlyStopping"]["algorithmName"] == "medianstop"
    assert (spec["maxTrialCount"], spec["parallelTrialCount"], spec["maxFailedTrialCount"]) == (
        12,
        2,
        3,
    )


def test_every_replica_gets_the_trial_values_and_metrics_stdout() -> None:
    job = as_katib_runs_it(
        experiment(),
        {
            "optim-lr": "0.003",
            "model-hidden-dim": "64",
            "optim-weight-decay": "0.01",
            "model-dropout": "0.1",
        },
    )
    for rtype in ("Master", "Worker"):
        c = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"][0]
        cmd = c["command"]
        overrides = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
        # The worker applies them in order: what the trial's config ends up as.
        out = apply_overrides({}, overrides)
        assert out["optim"] == {"lr": 0.003, "weight_decay": 0.01}
        assert out["model"] == {"hidden_dim": 64, "dropout": 0.1}
        assert out["train"] == {"epochs": 3, "metrics_stdout": True}
        assert out["checkpoint"]["uri"] == "s3://b/work/trials/trial-abc123/checkpoints"
        assert out["output"]["model_uri"] == "s3://b/work/trials/trial-abc123/model"
        assert {"name": "GPUPIPE_JOB", "value": "trial-abc123"} in c["env"]


@needs_crd
@pytest.mark.parametrize("nnodes", [1, 2])
def test_trial_pytorchjob_validates_against_the_crd(nnodes: int) -> None:
    exp = experiment(trial_job=trial_job(nnodes))
    values = {p["name"]: "1" for p in exp["spec"]["parameters"]}
    assert schema_errors(as_katib_runs_it(exp, values)) == []


def test_trial_spec_drops_name_namespace_and_owners() -> None:
    job = trial_job()
    job["metadata"]["ownerReferences"] = [{"uid": "x"}]
    meta = experiment(trial_job=job)["spec"]["trialTemplate"]["trialSpec"]["metadata"]
    assert not {"name", "namespace", "ownerReferences"} & set(meta)


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (
            lambda e: e["spec"]["trialTemplate"]["trialParameters"].append(
                {"name": "unused", "reference": "optim-lr"}
            ),
            "duplicated",
        ),
        (
            lambda e: e["spec"]["trialTemplate"]["trialParameters"].append(
                {"name": "unused", "reference": "${trialSpec.Namespace}"}
            ),
            "not used",
        ),
        (lambda e: e["spec"]["trialTemplate"]["trialParameters"].pop(0), "undeclared"),
        (
            lambda e: e["spec"]["trialTemplate"]["trialParameters"][0].update(reference="nope"),
            "no parameter",
        ),
        (
            lambda e: e["spec"]["trialTemplate"]["trialSpec"]["metadata"].update(name="x"),
            "must be omitted",
        ),
        (lambda e: e["metadata"].update(name="Bad_Name"), "metadata.name"),
    ],
    ids=["duplicate-reference", "unreferenced", "undeclared", "bad-reference", "named", "name"],
)
def test_webhook_rules_catch_broken_templates(mutate: Any, words: str) -> None:
    exp = experiment()
    mutate(exp)
    errors = trial_template_errors(exp)
    assert any(words in e for e in errors), errors


def test_build_rejects_bad_input_in_one_line() -> None:
    with pytest.raises(InputError, match="also a searched parameter"):
        experiment(base_overrides={"optim.lr": 0.1})
    with pytest.raises(InputError, match="DNS-1035"):
        experiment(name="Tune")
    with pytest.raises(InputError, match="PyTorchJob"):
        experiment(trial_job={"apiVersion": "batch/v1", "kind": "Job"})
    clash = example_space()
    clash["parameters"][3]["name"] = "optim.weight-decay"  # not dotted-valid anyway
    with pytest.raises(InputError):
        experiment(space=load_space(clash))


def test_hyperband_resource_name_is_mapped_to_the_katib_name() -> None:
    data = example_space()
    data["algorithm"] = {
        "algorithmName": "hyperband",
        "algorithmSettings": [{"name": "resource_name", "value": "model.hidden_dim"}],
    }
    del data["earlyStopping"]
    exp = experiment(space=load_space(data))
    assert exp["spec"]["algorithm"]["algorithmSettings"] == [
        {"name": "resource_name", "value": "model-hidden-dim"}
    ]


def test_render_experiment_prints_valid_yaml_and_rejects_unknown_params() -> None:
    import yaml

    exp = yaml.safe_load(render_experiment({"nodes": 2}))
    assert exp["kind"] == "Experiment" and trial_template_errors(exp) == []
    assert "Worker" in exp["spec"]["trialTemplate"]["trialSpec"]["spec"]["pytorchReplicaSpecs"]
    with pytest.raises(InputError, match="unknown pipeline parameter"):
        render_experiment({"nodez": 2})


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeKubeApi]:
    with FakeKubeApi() as server:
        yield server


@pytest.fixture
def api(fake: FakeKubeApi) -> KubeApi:
    cfg = client.Configuration(host=fake.url)
    cfg.retries = False
    return KubeApi(
        client.ApiClient(cfg),
        retry=RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.02),
        # Only a hung request should time out (and be retried), never one a loaded machine slowed.
        request_timeout_s=10,
        sleep=lambda s: None,
    )


def launcher(api: KubeApi, lines: list[str] | None = None, **kwargs: Any) -> KatibLauncher:
    return KatibLauncher(
        namespace=NS, api=api, poll_s=0.01, report=None if lines is None else lines.append, **kwargs
    )


def small_space(**changes: Any) -> SearchSpace:
    data = example_space()
    data.update({"maxTrialCount": 4, "parallelTrialCount": 2, "maxFailedTrialCount": 1, **changes})
    return load_space(data)


def test_success_returns_the_best_trial_mapped_back_to_config_fields(
    fake: FakeKubeApi, api: KubeApi
) -> None:
    space = small_space()
    lines: list[str] = []
    result = launcher(api, lines).run(experiment(space), space, timeout_s=10)
    assert fake.created_experiments == [f"{NS}/{NAME}"]
    assert result.best_value == pytest.approx(1 / 5)  # the fake's 4th trial is best
    assert set(result.best_parameters) == {
        "optim.lr",
        "model.hidden_dim",
        "optim.weight_decay",
        "model.dropout",
    }
    assert isinstance(result.best_parameters["model.hidden_dim"], int)
    assert result.trials["succeeded"] == 4 and result.trials["failed"] == 0
    assert result.reason == "ExperimentMaxTrialsReached"
    assert any("best so far val_loss=" in line for line in lines)
    assert fake.experiment(NAME) is not None  # kept for Katib's UI


def test_too_many_failed_trials_fail_the_step_and_delete_the_experiment(
    fake: FakeKubeApi, api: KubeApi
) -> None:
    fake.experiment_scenario = ExperimentScenario(
        trials=[
            TrialPlan(outcome="Failed", message="PyTorchJob failed: OOM"),
            TrialPlan(outcome="Failed", message="PyTorchJob failed: OOM"),
            TrialPlan(),
            TrialPlan(),
        ]
    )
    space = small_space()
    with pytest.raises(RuntimeError) as e:
        launcher(api).run(experiment(space), space, timeout_s=10)
    text = str(e.value)
    assert "trials failed, reaching maxFailedTrialCount=1" in text
    assert "PyTorchJob failed: OOM" in text
    assert "it was deleted" in text
    assert fake.experiment(NAME) is None


def test_a_failed_experiment_fails_the_step(fake: FakeKubeApi, api: KubeApi) -> None:
    fake.experiment_scenario = ExperimentScenario(
        outcome="Failed", reason="ExperimentFailed", message="suggestion service crashed"
    )
    space = small_space()
    with pytest.raises(RuntimeError, match="suggestion service crashed"):
        launcher(api).run(experiment(space), space, timeout_s=10)
    assert fake.experiment(NAME) is None


def test_deadline_deletes_the_experiment(fake: FakeKubeApi, api: KubeApi) -> None:
    fake.experiment_scenario = ExperimentScenario(outcome=None, trial_s=60)
    space = small_space()
    # 2 s: time for a loaded machine to create the Experiment before the deadline.
    with pytest.raises(TimeoutError, match=rf"{NAME} did not finish within 2 s"):
        launcher(api).run(experiment(space), space, timeout_s=2)
    assert fake.experiment(NAME) is None
    assert fake.calls("DELETE", "/experiments/")


def test_keep_on_exit_leaves_it(fake: FakeKubeApi, api: KubeApi) -> None:
    fake.experiment_scenario = ExperimentScenario(outcome=None, trial_s=60)
    space = small_space()
    with pytest.raises(TimeoutError, match="kubectl delete experiment"):
        launcher(api, on_exit="keep").run(experiment(space), space, timeout_s=2)  # as above
    assert fake.experiment(NAME) is not None


def test_a_retry_reattaches_and_adds_its_owner(fake: FakeKubeApi, api: KubeApi) -> None:
    space = small_space()
    # Still running when adopted (a finished one is only read, not patched), however slowly
    # this test's process gets to it: it runs on until read twice.
    fake.add_experiment(experiment(space), scenario=ExperimentScenario(min_reads=2))
    result = launcher(api, own_pod=POD).run(experiment(space), space, timeout_s=10)
    assert fake.created_experiments == []
    assert result.trials["succeeded"] == 4
    patches = fake.calls("PATCH", f"/experiments/{NAME}$")
    assert patches[0].body["metadata"]["ownerReferences"][-1]["uid"] == POD.uid


def test_a_409_is_adopted(fake: FakeKubeApi, api: KubeApi) -> None:
    space = small_space()
    body = experiment(space)
    fake.fail("GET", f"/experiments/{NAME}$", 404)  # first look: not there yet
    fake.fail("POST", "/experiments$", 409)  # ... then another attempt created it
    fake.add_experiment(body)
    result = launcher(api).run(body, space, timeout_s=10)
    assert result.trials["succeeded"] == 4
    assert fake.created_experiments == []


def test_sigterm_deletes_the_experiment(fake: FakeKubeApi, api: KubeApi) -> None:
    import os
    import signal
    import threading

    fake.experiment_scenario = ExperimentScenario(outcome=None, trial_s=60)
    space = small_space()

    def cancel_once_created() -> None:
        # Not after a fixed time: a loaded machine's launcher may not have its SIGTERM handler
        # yet (the signal would end pytest), or the Experiment may not exist yet.
        fake.wait_for_calls("POST", "/experiments$")
        os.kill(os.getpid(), signal.SIGTERM)

    stray: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stray.append(signum))
    try:
        threading.Thread(target=cancel_once_created, daemon=True).start()
        with pytest.raises(LaunchCancelled, match="cancelled"):
            launcher(api).run(experiment(space), space, timeout_s=60)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stray == [], "SIGTERM arrived outside the launcher"
    assert fake.experiment(NAME) is None


def test_no_reported_metric_is_an_error(fake: FakeKubeApi, api: KubeApi) -> None:
    fake.experiment_scenario = ExperimentScenario(
        trials=[TrialPlan(outcome="Failed"), TrialPlan(outcome="Failed")]
    )
    space = small_space(maxFailedTrialCount=3)
    with pytest.raises(RuntimeError, match="no trial reported 'val_loss'"):
        launcher(api).run(experiment(space), space, timeout_s=10)


def test_katib_api_calls_lists_exactly_the_calls_the_launcher_makes(
    fake: FakeKubeApi, api: KubeApi
) -> None:
    space = small_space()
    fake.experiment_scenario = ExperimentScenario(
        trials=[TrialPlan(outcome="Failed"), TrialPlan(outcome="Failed"), TrialPlan()]
    )
    with pytest.raises(RuntimeError):
        launcher(api).run(experiment(space), space, timeout_s=10)  # create, get, list, delete
    fake.experiment_scenario = ExperimentScenario()
    # Still running when adopted (the pod and run look-ups come first), and for as many polls as
    # it takes the wait to look for refused pods (events), however slow the machine is.
    reads = REFUSAL_CHECK_POLLS + 1
    fake.add_experiment(experiment(space), scenario=ExperimentScenario(min_reads=reads))
    fake.add_kfp_step_pod(POD.name, "run-wf", namespace=NS)  # its pod, the run that owns it
    launcher(api, own_pod=POD).run(experiment(space), space, timeout_s=10)  # patch
    # get on a trial: the launcher reads the best trial from it when the status lacks values
    api.get_trial(NS, "nope")
    assert {rbac_call(r.method, r.path, r.query) for r in fake.requests} == set(KATIB_API_CALLS)


def test_importing_the_engine_does_not_import_kubernetes_or_kfp() -> None:
    code = (
        "import sys, trainer.tune.katib; print('kubernetes' in sys.modules, 'kfp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_values_round_trip_through_the_workers_set() -> None:
    assert parse_value("64") == 64 and parse_value("0.003") == 0.003
