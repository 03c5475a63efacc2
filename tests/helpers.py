"""Helpers shared by the test modules (unit and integration); test files import from here only."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import load_file

from trainer.demo import make_table
from trainer.distributed import dist
from trainer.launch.torchrun import torchrun_command

if TYPE_CHECKING:
    from trainer.steps.tune import TuneConfig


@contextmanager
def dist_session(backend: str = "auto", timeout_s: int = 1800) -> Iterator[dist.DistContext]:
    """``with dist_session() as ctx:``: ``dist.init``, run the body, and always ``dist.close``."""
    ctx = dist.init(backend, timeout_s)
    try:
        yield ctx
    finally:
        dist.close(ctx)


TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "GPUPIPE_JOB",
)
"""Variables torchrun, the training operator or a job set: a test deletes them to run as one
process."""


# --- the PyTorchJob CRD, as the API server applies it ----------------------------------------

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = Path(os.environ.get("GPUPIPE_CRD_DIR") or REPO.parent / "shared" / "crds")
CRD_FILE = CRD_DIR / "kubeflow.org_pytorchjobs.yaml"
CRD_MISSING = (
    None
    if CRD_FILE.is_file()
    else f"needs the upstream PyTorchJob CRD: {CRD_FILE} not found (set GPUPIPE_CRD_DIR)"
)
needs_crd = pytest.mark.skipif(CRD_MISSING is not None, reason=CRD_MISSING or "")
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# --------------------------------------------------------------------------------------------
# The CRD schema as the API server applies it
# --------------------------------------------------------------------------------------------


def _structural(node: Any) -> Any:
    """A Kubernetes structural schema -> a JSON schema with the API server's strictness.

    ``x-kubernetes-int-or-string`` becomes ``anyOf: [integer, string]``; objects with declared
    properties reject unknown fields (what ``kubectl apply`` does with its default strict field
    validation; without it, the API server would drop them silently); other ``x-kubernetes-*``
    keys (CEL rules, list and map types) are left out.
    """
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _structural(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validator() -> jsonschema.protocols.Validator:
    """A validator for ``spec.versions[0].schema.openAPIV3Schema`` of the PyTorchJob CRD."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1"
    schema = _structural(version["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


def schema_errors(job: dict[str, Any]) -> list[str]:
    """Every reason the API server or the operator's webhook would reject ``job``."""
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in crd_validator().iter_errors(job)
    ]
    # What the CRD schema leaves to the API server (metadata) and the operator's webhook.
    if job.get("apiVersion") != "kubeflow.org/v1" or job.get("kind") != "PyTorchJob":
        errors.append("apiVersion/kind must be kubeflow.org/v1 PyTorchJob")
    name = job.get("metadata", {}).get("name", "")
    if not (DNS1035.match(name) and len(name) <= 63):
        errors.append(f"metadata.name {name!r} is not a DNS-1035 label")
    replicas = job.get("spec", {}).get("pytorchReplicaSpecs", {})
    if replicas.get("Master", {}).get("replicas") != 1:
        errors.append("Master replicas must be 1")
    for rtype, rspec in replicas.items():
        if rtype not in ("Master", "Worker"):
            errors.append(f"unknown replica type {rtype}")
        names = [
            c.get("name") for c in rspec.get("template", {}).get("spec", {}).get("containers", [])
        ]
        if "pytorch" not in names:
            errors.append(f"{rtype} has no container named pytorch")
    return errors


def assert_valid_job(job: dict[str, Any]) -> None:
    """Fail with every schema and webhook error of ``job``."""
    errors = schema_errors(job)
    assert not errors, "\n".join(errors)


# --- the TrainJob CRD (Kubeflow Trainer v2.3.0), with its CEL rules ----------------------------

TRAINJOB_CRD_FILE = CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml"
TORCH_RUNTIME_FILE = CRD_DIR / "runtime_torch_distributed.yaml"
TRAINJOB_CRD_MISSING = (
    None
    if TRAINJOB_CRD_FILE.is_file() and TORCH_RUNTIME_FILE.is_file()
    else f"needs the upstream TrainJob CRD and torch runtime in {CRD_DIR} (set GPUPIPE_CRD_DIR)"
)
needs_trainjob_crd = pytest.mark.skipif(
    TRAINJOB_CRD_MISSING is not None, reason=TRAINJOB_CRD_MISSING or ""
)


@functools.cache
def _trainjob_schema() -> dict[str, Any]:
    crd = yaml.safe_load(TRAINJOB_CRD_FILE.read_text())
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    return dict(version["schema"]["openAPIV3Schema"])


@functools.cache
def trainjob_crd_validator() -> jsonschema.protocols.Validator:
    """A validator for the TrainJob CRD's schema, strict like the PyTorchJob one."""
    schema = _structural(_trainjob_schema())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
_MANAGED_BY = ["trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"]
CEL_RULES: dict[str, Any] = {
    # Transition rules compare with the stored object: a create has none, so they hold.
    "self == oldSelf": lambda v: True,
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": lambda v: bool(
        DNS1035.match(v["metadata"]["name"])
    ),
    "size(self.metadata.name) <= 63": lambda v: len(v["metadata"]["name"]) <= 63,
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']": (
        lambda v: v in _MANAGED_BY
    ),
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')": lambda v: (
        v == "" or bool(_URI.match(v))
    ),
    "has(self.lastUpdatedTime)": lambda v: "lastUpdatedTime" in v,
}
"""Every CEL rule of the v2.3.0 TrainJob CRD, evaluated by hand (no CEL library installs here):
a rule this table does not know is an error, so a new upstream rule cannot pass unchecked."""


def cel_errors(obj: Any, schema: dict[str, Any] | None = None, path: str = "") -> list[str]:
    """The ``x-kubernetes-validations`` rules ``obj`` breaks, walking the schema with it."""
    schema = _trainjob_schema() if schema is None else schema
    errors = []
    for rule in schema.get("x-kubernetes-validations") or []:
        check = CEL_RULES.get(rule["rule"])
        if check is None:
            errors.append(f"{path or '/'}: unknown CEL rule {rule['rule']!r}: add it to CEL_RULES")
        elif not check(obj):
            errors.append(f"{path or '/'}: {rule['message']}")
    if isinstance(obj, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors += cel_errors(value, sub, f"{path}/{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            errors += cel_errors(item, schema["items"], f"{path}/{i}")
    return errors


@functools.cache
def torch_runtime_containers() -> frozenset[tuple[str, str]]:
    """(replicated job, container) pairs of the default ``torch-distributed`` runtime."""
    runtime = yaml.safe_load(TORCH_RUNTIME_FILE.read_text())
    return frozenset(
        (rj["name"], c["name"])
        for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        for c in rj["template"]["spec"]["template"]["spec"]["containers"]
    )


def trainjob_schema_errors(job: dict[str, Any]) -> list[str]:
    """Every reason the API server (schema, CEL) or Trainer's webhook would reject ``job``."""
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in trainjob_crd_validator().iter_errors(job)
    ]
    errors += cel_errors(job)
    if job.get("apiVersion") != "trainer.kubeflow.org/v1alpha1" or job.get("kind") != "TrainJob":
        errors.append("apiVersion/kind must be trainer.kubeflow.org/v1alpha1 TrainJob")
    # The torch plugin's webhook: no torchrun variables of the user's own in trainer.env.
    for env in (job.get("spec") or {}).get("trainer", {}).get("env") or []:
        if env.get("name", "").startswith("PET_"):
            errors.append(f"spec/trainer/env: reserved torchrun variable {env['name']}")
    # Patched containers must exist in the runtime.
    for patch in (job.get("spec") or {}).get("runtimePatches") or []:
        rjobs = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {})
        for rjob in rjobs.get("replicatedJobs") or []:
            pod = rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            for c in pod.get("containers") or []:
                if (rjob["name"], c["name"]) not in torch_runtime_containers():
                    errors.append(f"runtime has no container {rjob['name']}/{c['name']}")
    return errors


def assert_valid_trainjob(job: dict[str, Any]) -> None:
    """Fail with every schema, CEL and webhook error of ``job``."""
    errors = trainjob_schema_errors(job)
    assert not errors, "\n".join(errors)


# --- tune --------------------------------------------------------------------------------

LR = {
    "name": "optim.lr",
    "parameterType": "double",
    "feasibleSpace": {"min": "1e-5", "max": "0.1", "distribution": "logUniform"},
}
MEDIAN = {
    "algorithmName": "medianstop",
    "algorithmSettings": [
        {"name": "min_trials_required", "value": "2"},
        {"name": "start_step", "value": "1"},
    ],
}


def write_dataset(root: Path, rows: int = 600) -> Path:
    """A preprocess-shaped dataset: train/val Parquet and a schema.json."""
    root.mkdir(parents=True, exist_ok=True)
    table = make_table(rows + rows // 4, features=6, seed=0)
    pq.write_table(table.slice(0, rows), root / "train.parquet")
    pq.write_table(table.slice(rows), root / "val.parquet")
    features = [n for n in table.column_names if n != "label"]
    schema = {"target": "label", "task": "classification", "features": features}
    (root / "schema.json").write_text(json.dumps(schema))
    return root


def tune_config(**over: Any) -> TuneConfig:
    """A small in-process tune config (TPE over ``optim.lr``, median stopping); ``over`` replaces
    top-level fields."""
    from trainer.base.typedconfig import from_dict
    from trainer.steps.tune import TuneConfig

    data: dict[str, Any] = {
        "runner": "in_process",
        "trial_epochs": 2,
        "train": {
            "model": {"hidden_dim": 16},
            "train": {"global_batch_size": 100, "log_every_steps": 1000},
        },
        "space": {
            "parameters": [LR],
            "objective": {"type": "minimize", "objectiveMetricName": "val_loss"},
            "algorithm": {"algorithmName": "tpe"},
            "earlyStopping": MEDIAN,
            "maxTrialCount": 5,
            "parallelTrialCount": 1,
            "maxFailedTrialCount": 1,
        },
    }
    data.update(over)
    return from_dict(TuneConfig, data)


# --------------------------------------------------------------------------------------------
# Real worker runs: torchrun (or python -m trainer.launch) over a small table
# --------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: on every worker's PYTHONPATH, the working directory of every run."""


def write_data(tmp: Path, rows: int = 2048, seed: int = 0) -> tuple[str, str]:
    table = make_table(rows + 512, features=6, classes=3, seed=seed)
    train, val = tmp / "train.parquet", tmp / "val.parquet"
    pq.write_table(table.slice(0, rows), train, row_group_size=512)
    pq.write_table(table.slice(rows), val)
    return str(train), str(val)


def make_config(tmp: Path, name: str, *, data: tuple[str, str], **sections: dict[str, Any]) -> Path:
    """A small worker config under tmp/name; sections override the defaults below."""
    run = tmp / name
    run.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = {
        "data": {"train_uri": data[0], "val_uri": data[1], "target": "label"},
        # Random starting weights: these runs watch a loss fall and compare weights bit for bit
        # (the default start from a linear fit, model.linear, has tests of its own).
        "model": {"name": "mlp", "hidden_dim": 32, "num_layers": 2, "linear": "none"},
        "optim": {"lr": 5e-3, "warmup_steps": 5},
        "train": {"epochs": 3, "global_batch_size": 64, "log_every_steps": 8, "seed": 7},
        "checkpoint": {"uri": str(run / "ckpt"), "every_steps": 16, "keep_last": 2},
        "output": {"model_uri": str(run / "model"), "history_uri": str(run / "history.jsonl")},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    path = run / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    e.pop("RANK", None)
    return e


def launch_cmd(config: Path, nproc: int = 2) -> list[str]:
    """The production training command on ``config``: what ``LocalLauncher`` and local tune
    trials run (``python -m trainer.launch ... -m trainer.worker --config <uri>``)."""
    return torchrun_command(str(config), nproc_per_node=nproc, standalone=True)


def torchrun_cmd(config: Path, nproc: int) -> list[str]:
    """The production command without its exit-code wrapper: the plain torchrun that
    ``python -m trainer.launch`` runs (torchrun reports every worker failure as 1)."""
    cmd = launch_cmd(config, nproc)
    wrapper = cmd.index("trainer.launch")
    return [*cmd[:wrapper], "torch.distributed.run", *cmd[wrapper + 1 :]]


def torchrun(
    config: Path, nproc: int, *, check: bool = True, timeout: int = 240
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        torchrun_cmd(config, nproc),
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"torchrun exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def history(config: Path) -> list[dict[str, Any]]:
    path = config.parent / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def weights(config: Path) -> dict[str, torch.Tensor]:
    """The trained weights, named as in the plain MLP (fault plugins wrap it as ``inner``)."""
    loaded = load_file(str(config.parent / "model" / "model.safetensors"))
    return {k.removeprefix("inner."): v for k, v in loaded.items()}


def run(cmd: list[str], timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def wait_for_step(proc: subprocess.Popen[str], step: int, timeout: float = 120) -> None:
    """Read a run's JSON log lines from ``proc.stdout`` until training has passed ``step``.

    Raises:
        AssertionError: If ``timeout`` passes first, or the output ends before ``step``.
    """
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if '"event": "step"' in line and json.loads(line)["step"] >= step:
            return
        assert time.monotonic() < deadline, "training never got going"
    raise AssertionError(f"the run's output ended before step {step}")


def mapping_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("gpupipe launch:")]


def tokens(path: Path, cycles: int, seed: int = 0) -> str:
    """A flat token column repeating one 24-token sequence: the next token is always knowable."""
    cycle = np.random.default_rng(seed).permutation(64)[:24]
    pq.write_table(pa.table({"tokens": np.tile(cycle, cycles).astype(np.int64)}), path)
    return str(path)


GPT = {"name": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "vocab_size": 64}
"""A tiny GPT that learns :func:`tokens` in a few hundred steps."""


def label_selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (``matchLabels``, ``matchExpressions`` with In, NotIn, Exists and
    DoesNotExist) against a pod's labels, as the API server evaluates it."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        held = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not held:
            return False
    return True


def gpupipe_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``gpupipe ARGV`` in this process: its exit code, stdout and stderr."""
    from pipelines.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def demo_parts(
    root: Path, fmt: str, task: str, sizes: list[int], *, seed: int, row_group_size: int
) -> Path:
    """A folder ``root`` of files holding the demo table's rows cut at ``sizes`` (some text and
    gaps), ``part-00.parquet``... or ``part-00.csv``...: a dataset of many files."""
    import pyarrow.csv as pacsv

    from trainer.steps.preprocess import make_demo_table

    root.mkdir()
    table = make_demo_table(sum(sizes), task=task, seed=seed)
    at = 0
    for i, size in enumerate(sizes):
        part = table.slice(at, size)
        at += size
        if fmt == "parquet":
            pq.write_table(part, root / f"part-{i:02d}.parquet", row_group_size=row_group_size)
        else:
            pacsv.write_csv(part, root / f"part-{i:02d}.csv")
    return root


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc; no psutil needed). torchrun starts each
    worker in a session of its own, so a signal to torchrun's process group misses them."""
    import contextlib

    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):  # the process may be gone already
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def cluster_bash(
    tmp_path: Path, script: str, path_dir: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run SCRIPT after sourcing the test cluster's lib.sh, procs.sh and host.sh (hack/cluster/),
    its state and cache folders under tmp_path; PATH_DIR first on PATH (fake tools)."""
    full_env = {
        **os.environ,
        "GPUPIPE_CLUSTER_DIR": str(tmp_path / "state"),
        "GPUPIPE_CLUSTER_CACHE": str(tmp_path / "cache"),
        **env,
    }
    if path_dir is not None:
        full_env["PATH"] = f"{path_dir}:{os.environ['PATH']}"
    prelude = (
        "set -euo pipefail\n"
        f"source {ROOT}/hack/cluster/lib.sh\n"
        f"source {ROOT}/hack/cluster/procs.sh\n"
        f"source {ROOT}/hack/cluster/host.sh\n"
    )
    return subprocess.run(
        ["bash", "-c", prelude + script], env=full_env, capture_output=True, text=True, timeout=60
    )
