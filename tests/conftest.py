"""Suite-wide skips: ``gpu`` tests need CUDA, ``e2e`` tests need a reachable kind cluster."""

from __future__ import annotations

import functools
import shutil
import subprocess

import pytest

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False"


@functools.cache
def cuda_missing() -> str | None:
    """Why GPU tests cannot run here, or ``None`` when a CUDA device is visible."""
    import torch

    return None if torch.cuda.is_available() else NO_CUDA


def _kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args], capture_output=True, text=True, timeout=10, check=False
    )


@functools.cache
def kind_missing() -> str | None:
    """Why e2e tests cannot run here, or ``None`` when a ``kind-*`` context answers.

    Cached: the check runs at most once per session, and only when e2e tests were collected.
    """
    if shutil.which("kubectl") is None:
        return "needs a kind cluster: kubectl is not on PATH"
    try:
        context = _kubectl("config", "current-context")
    except subprocess.TimeoutExpired:
        return "needs a kind cluster: `kubectl config current-context` timed out"
    name = context.stdout.strip()
    if context.returncode != 0 or not name:
        return "needs a kind cluster: kubeconfig has no current context"
    if not name.startswith("kind-"):
        return f"needs a kind cluster: current kubeconfig context is {name!r}, not kind-*"
    try:
        ready = _kubectl("--request-timeout=5s", "get", "--raw", "/readyz")
    except subprocess.TimeoutExpired:
        return f"needs a kind cluster: context {name!r} did not answer within 10 s"
    if ready.returncode != 0:
        why = (ready.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"needs a kind cluster: context {name!r} is not reachable ({why})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add a skip marker, with the reason, to ``gpu`` and ``e2e`` tests that cannot run here."""
    for item in items:
        if item.get_closest_marker("gpu") is not None and (reason := cuda_missing()):
            item.add_marker(pytest.mark.skip(reason=reason))
        if item.get_closest_marker("e2e") is not None and (reason := kind_missing()):
            item.add_marker(pytest.mark.skip(reason=reason))
