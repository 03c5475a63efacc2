"""Real torchrun runs of the worker with gloo on CPU: training, equivalence, resume and failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    ROOT,
    descendants,
    env,
    history,
    make_config,
    torchrun,
    torchrun_cmd,
    wait_for_step,
    weights,
    write_data,
)
from trainer.base import storage

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return write_data(tmp_path_factory.mktemp("data"))


def test_two_ranks_train_and_loss_falls(tmp_path: Path, data: tuple[str, str]) -> None:
    cfg = make_config(tmp_path, "ddp", data=data)
    proc = torchrun(cfg, 2)
    steps = [r for r in history(cfg) if r["event"] == "step"]
    assert steps[-1]["loss"] < 0.6 * steps[0]["loss"]  # first value averages the first 8 steps
    evals = [r for r in history(cfg) if r["event"] == "eval"]
    assert evals[-1]["val_accuracy"] > 0.75
    start = next(r for r in history(cfg) if r["event"] == "start")
    assert start["world_size"] == 2
    meta = json.loads((cfg.parent / "model" / "model.json").read_text())
    assert meta["features"] == [f"f{i}" for i in range(6)]
    # stdout is JSON lines from rank 0 only (the progress bar never appears in a pipe)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert all(json.loads(ln)["job"] for ln in lines)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_start_from_the_linear_fit_and_never_end_worse(
    tmp_path: Path, data: tuple[str, str], strategy: str
) -> None:
    import pyarrow.parquet as pq
    import torch.nn.functional as F

    from trainer.models.linear_fit import fit_linear

    es = {"metric": "val_loss", "patience": 4}
    cfg = make_config(tmp_path, strategy, data=data, model={"linear": "fit"},
                      train={"epochs": 2, "strategy": strategy, "early_stopping": es})  # fmt: skip
    torchrun(cfg, 2)
    evals = [r for r in history(cfg) if r["event"] == "eval"]
    assert evals[0]["step"] == 0 and len(evals) > 1

    def table(uri: str) -> tuple[torch.Tensor, torch.Tensor]:
        t = pq.read_table(uri)
        x = torch.tensor(t.drop(["label"]).to_pandas().to_numpy(), dtype=torch.float32)
        return x, torch.tensor(t["label"].to_numpy(), dtype=torch.long)

    # Both ranks start from the logistic fit that one process computes from the training rows.
    fit = fit_linear(*table(data[0]), task="classification", num_classes=3)
    assert fit is not None
    x_val, y_val = table(data[1])
    start_loss = F.cross_entropy(x_val.double() @ fit.weight.T + fit.bias, y_val).item()
    assert evals[0]["val_loss"] == pytest.approx(start_loss, rel=1e-4)
    metrics = json.loads((cfg.parent / "model" / "metrics.json").read_text())
    assert metrics["val_loss"] <= evals[0]["val_loss"] + 1e-6
    assert {"linear.weight", "linear.bias"} <= set(weights(cfg))


def test_one_and_two_ranks_reach_the_same_weights(tmp_path: Path, data: tuple[str, str]) -> None:
    one = make_config(tmp_path, "one", data=data, train={"epochs": 2})
    two = make_config(tmp_path, "two", data=data, train={"epochs": 2})
    torchrun(one, 1)
    torchrun(two, 2)
    w1, w2 = weights(one), weights(two)
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-4, atol=1e-5, msg=k)


def test_sigkill_one_rank_then_rerun_resumes_to_identical_weights(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    marker = tmp_path / "killed"
    fault = {
        "name": "tests.plugins.faults:kill",
        "options": {"at": 40, "rank": 1, "marker": str(marker)},
    }
    ref_marker = tmp_path / "ref-marker"
    ref_marker.write_text("never fire\n")
    ref = make_config(
        tmp_path,
        "ref",
        data=data,
        model={**fault, "options": {**fault["options"], "marker": str(ref_marker)}},
    )
    run = make_config(tmp_path, "run", data=data, model=fault)
    torchrun(ref, 2)

    first = torchrun(run, 2, check=False)
    assert first.returncode != 0 and marker.exists(), first.stderr[-2000:]
    assert not (run.parent / "model").exists()  # nothing half-written
    ckpt_steps = sorted(p.name for p in (run.parent / "ckpt").iterdir() if p.name[5:].isdigit())
    assert ckpt_steps and ckpt_steps[-1] == "step-00000032"

    torchrun(run, 2)
    restore = [r for r in history(run) if r["event"] == "restore"]
    assert restore and restore[0]["step"] == 32
    w_ref, w_run = weights(ref), weights(run)
    for k in w_ref:
        assert torch.equal(w_ref[k], w_run[k]), k


def test_sigterm_writes_a_complete_checkpoint_and_rerun_finishes(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    cfg = make_config(
        tmp_path,
        "term",
        data=data,
        train={"epochs": 400, "log_every_steps": 4},
        checkpoint={"every_steps": 100000},
    )
    err_path = tmp_path / "stderr.log"
    with err_path.open("w") as err_file:
        proc = subprocess.Popen(
            torchrun_cmd(cfg, 2),
            env=env(),
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
            cwd=ROOT,
        )
    wait_for_step(proc, 40)  # training is really under way
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    err = err_path.read_text()
    assert proc.returncode != 0  # torchrun reports the preempted workers as failed
    from trainer.checkpoint.manager import CheckpointManager

    mgr = CheckpointManager(str(cfg.parent / "ckpt"), keep_last=2)
    steps = mgr.steps()
    assert steps and steps[-1] >= 40, (steps, err[-2000:])
    state = mgr.load(steps[-1])  # verifies checksums and loads weights_only
    assert state["meta"]["step"] == steps[-1]
    assert "checkpointing" in err

    short = json.loads(cfg.read_text())
    short["train"]["max_steps"] = steps[-1] + 8
    cfg.write_text(json.dumps(short))
    torchrun(cfg, 2)
    restore = [r for r in history(cfg) if r["event"] == "restore"]
    assert restore[0]["step"] == steps[-1]


def test_a_stale_run_that_wakes_up_is_fenced_out_and_the_new_ones_checkpoints_stand(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    """A network partition rather than a crash: the first run's processes freeze mid-training
    (SIGSTOP, as a node cut off), the job's restart resumes from the same checkpoint folder and
    finishes; the old run then wakes up (SIGCONT) and, at its next save, stops with one line
    instead of writing, pruning or deleting the new run's checkpoints."""
    longer = {"train": {"epochs": 12}}  # long enough to freeze the first run mid-training
    ref = make_config(tmp_path, "ref", data=data, **longer)
    torchrun(ref, 2)
    run = make_config(tmp_path, "run", data=data, **longer)
    old = subprocess.Popen(
        torchrun_cmd(run, 2),
        env={**env(), "PYTHONUNBUFFERED": "1"},  # its step lines as they come
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        wait_for_step(old, 40)
        frozen = descendants(old.pid)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        torchrun(run, 2)  # the restarted job: resumes, finishes, exports
        restore = [r for r in history(run) if r["event"] == "restore"]
        assert restore and 32 <= restore[0]["step"] < 384, restore  # resumed mid-training
        ckpt = run.parent / "ckpt"
        before = {p: p.read_bytes() for p in sorted(ckpt.rglob("*")) if p.is_file()}
        model = (run.parent / "model" / "model.safetensors").read_bytes()
    finally:
        for pid in descendants(old.pid):
            os.kill(pid, signal.SIGCONT)
    _, err = old.communicate(timeout=240)
    assert old.returncode != 0
    stale = [ln for ln in err.splitlines() if "ERROR [train]" in ln]
    assert len(stale) == 1, err[-3000:]
    assert stale[0].startswith("ERROR [train] E_STALE_ATTEMPT: a newer attempt (generation 2"), (
        stale
    )
    after = {p: p.read_bytes() for p in sorted(ckpt.rglob("*")) if p.is_file()}
    assert after == before  # not a byte of the new run's checkpoints touched
    assert (run.parent / "model" / "model.safetensors").read_bytes() == model
    w_ref, w_run = weights(ref), weights(run)
    for k in w_ref:
        assert torch.equal(w_ref[k], w_run[k]), k


def test_nan_loss_rolls_back_and_recovers(tmp_path: Path, data: tuple[str, str]) -> None:
    marker = tmp_path / "nan-fired"
    cfg = make_config(
        tmp_path,
        "nan",
        data=data,
        model={"name": "tests.plugins.faults:nan", "options": {"at": 45, "marker": str(marker)}},
    )
    torchrun(cfg, 2)
    h = history(cfg)
    rollback = [r for r in h if r["event"] == "rollback"]
    assert marker.exists() and len(rollback) == 1
    assert rollback[0]["step"] == 32 and rollback[0]["lr_scale"] == 0.5
    w = weights(cfg)
    assert all(torch.isfinite(t).all() for t in w.values())
    assert [r for r in h if r["event"] == "eval"][-1]["val_accuracy"] > 0.7


def test_nan_that_keeps_coming_back_fails_clearly(tmp_path: Path, data: tuple[str, str]) -> None:
    cfg = make_config(
        tmp_path,
        "nan-always",
        data=data,
        model={"name": "tests.plugins.faults:nan_always", "options": {"at": 20}},
        train={"max_nan_rollbacks": 2},
    )
    proc = torchrun(cfg, 2, check=False)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR [train]")]
    assert errors and "after 2 rollbacks (train.max_nan_rollbacks=2)" in errors[0]
    assert not (cfg.parent / "model").exists()


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory: pytest.TempPathFactory, data: tuple[str, str]) -> Path:
    """A one-epoch run without faults: the reference both OOM cases compare their weights to."""
    ref = make_config(tmp_path_factory.mktemp("ref"), "ref", data=data, train={"epochs": 1})
    torchrun(ref, 2)
    return ref


@pytest.mark.parametrize("oom_rank", [None, 1], ids=["all-ranks", "one-rank"])
def test_oom_halves_micro_batch_and_keeps_the_effective_batch(
    tmp_path: Path, data: tuple[str, str], one_epoch: Path, oom_rank: int | None
) -> None:
    cfg = make_config(
        tmp_path,
        "oom",
        data=data,
        train={"epochs": 1},
        model={"name": "tests.plugins.faults:oom", "options": {"max_rows": 12, "rank": oom_rank}},
    )
    torchrun(cfg, 2)
    ooms = [r for r in history(cfg) if r["event"] == "oom"]
    # local batch 32 -> 16 -> 8: two halvings, then the rest of the run at 8
    assert [(r["old_micro_batch"], r["micro_batch"]) for r in ooms] == [(32, 16), (16, 8)]
    assert ooms[-1]["accumulation"] == 4
    w_ref, w = weights(one_epoch), weights(cfg)
    for k in w_ref:  # same effective batch: same math up to float summation order
        torch.testing.assert_close(w[k], w_ref[k], rtol=1e-4, atol=1e-5, msg=k)


def test_bad_config_is_one_line_exit_2(tmp_path: Path, data: tuple[str, str]) -> None:
    cfg = make_config(tmp_path, "bad", data=data, train={"epochz": 3})
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.worker", "--config", str(cfg)],
        env=env(),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,  # a Python importing torch: seconds of CPU, 20x that on a loaded machine
    )
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
    assert errors == [errors[0]] and errors[0].startswith(
        "ERROR [train] E_CONFIG: unknown config key train.epochz"
    )


def test_writes_the_model_to_s3(
    tmp_path: Path, data: tuple[str, str], s3_server: str, s3_bucket: str
) -> None:
    cfg = make_config(
        tmp_path,
        "s3",
        data=data,
        train={"epochs": 1},
        checkpoint={"uri": f"s3://{s3_bucket}/run/ckpt"},
        output={"model_uri": f"s3://{s3_bucket}/run/model", "history_uri": None},
    )
    torchrun(cfg, 2)
    names = storage.list_dir(f"s3://{s3_bucket}/run/model")
    assert {"model.safetensors", "model.json", "metrics.json"} <= set(names)
    assert storage.list_dir(f"s3://{s3_bucket}/run/ckpt")
