"""End to end on the kind cluster of hack/kind-up.sh: installs, RBAC as the runner, a full run.

Runs only where a kind-* kubectl context answers (tests/conftest.py skips the `e2e` marker, with
the reason, elsewhere). Set up with `make kind-up`; the whole file takes ~15-30 minutes on a
laptop, most of it in the pipeline run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from trainer.launch.pytorchjob import API_CALLS

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "kubeflow"
RUNNER = f"system:serviceaccount:{NAMESPACE}:pipeline-runner"

pytestmark = pytest.mark.e2e


def kubectl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize(
    "crd", ["pytorchjobs.kubeflow.org", "experiments.kubeflow.org", "trials.kubeflow.org"]
)
def test_operator_crds_are_installed(crd: str) -> None:
    result = kubectl("get", "crd", crd)
    assert result.returncode == 0, f"{crd} missing (make kind-up): {result.stderr.strip()}"


@pytest.mark.parametrize(
    "deployment", ["ml-pipeline", "training-operator", "katib-controller", "mlflow"]
)
def test_services_are_available(deployment: str) -> None:
    wait = f"-n {NAMESPACE} wait --for condition=Available deployment/{deployment} --timeout 60s"
    result = kubectl(*wait.split(), timeout=90)
    assert result.returncode == 0, result.stderr.strip()


@pytest.mark.parametrize(
    "call", sorted(set(API_CALLS)), ids=lambda c: f"{c[2]}-{c[1]}.{c[0] or 'core'}"
)
def test_pipeline_runner_may_make_every_launcher_call(call: tuple[str, str, str]) -> None:
    group, resource, verb = call
    what = f"{resource}.{group}" if group else resource
    result = kubectl("auth", "can-i", verb, what, "-n", NAMESPACE, "--as", RUNNER)
    assert result.stdout.strip() == "yes", f"{RUNNER} may not {verb} {what}: {result.stdout}"


def test_training_pipeline_runs_on_pytorchjob_and_registers_the_model() -> None:
    timeout = int(os.environ.get("GPUPIPE_E2E_TIMEOUT", "2400"))
    result = subprocess.run(
        ["bash", "hack/e2e.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout + 300,
        check=False,
        env={**os.environ, "GPUPIPE_E2E_TIMEOUT": str(timeout)},
    )
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
    assert result.returncode == 0, tail
    assert "e2e ok: registered model" in result.stdout, tail
