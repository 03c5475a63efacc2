"""FSDP2 on CPU with gloo, 2 ranks, through real torchrun: equivalence, resume, failures, export."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import (
    GPT,
    ROOT,
    env,
    history,
    make_config,
    tokens,
    torchrun,
    torchrun_cmd,
    wait_for_step,
    weights,
    write_data,
)
from trainer.base import storage
from trainer.checkpoint import dcp
from trainer.checkpoint.manager import CheckpointManager
from trainer.config import ModelConfig
from trainer.models import ModelSpec, build_model, export

pytestmark = pytest.mark.integration

FSDP = {"strategy": "fsdp"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return write_data(tmp_path_factory.mktemp("data"))


def checkpoint_model(cfg: Path, step: int) -> torch.nn.Module:
    """The weights of sharded checkpoint ``step`` in a plain model (read in this one process)."""
    meta = json.loads((cfg.parent / "model" / "model.json").read_text())
    model = build_model(ModelConfig(**meta["model"]), ModelSpec.from_dict(meta["spec"]))
    return dcp.read_model_state(str(cfg.parent / "ckpt" / f"step-{step:08d}"), model).eval()


def val_features(data: tuple[str, str]) -> torch.Tensor:
    import pyarrow.parquet as pq

    table = pq.read_table(data[1]).drop(["label"])
    return torch.tensor(table.to_pandas().to_numpy(), dtype=torch.float32)


def test_fsdp_loss_falls_matches_ddp_and_exports_what_it_trained(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    ddp = make_config(tmp_path, "ddp", data=data, train={"epochs": 2, "strategy": "ddp"})
    fsdp = make_config(tmp_path, "fsdp", data=data, train={"epochs": 2, **FSDP})
    torchrun(ddp, 2)
    proc = torchrun(fsdp, 2)
    assert "data parallel strategy fsdp (train.strategy is 'fsdp')" in proc.stderr
    start = next(r for r in history(fsdp) if r["event"] == "start")
    assert start["strategy"] == "fsdp" and start["world_size"] == 2
    steps = [r for r in history(fsdp) if r["event"] == "step"]
    assert steps[-1]["loss"] < 0.6 * steps[0]["loss"]

    # Same global batch and seed: DDP and FSDP end at the same weights (up to summation order).
    w_ddp, w_fsdp = weights(ddp), weights(fsdp)
    assert w_ddp.keys() == w_fsdp.keys()
    for k in w_ddp:
        torch.testing.assert_close(w_fsdp[k], w_ddp[k], rtol=1e-4, atol=1e-5, msg=k)

    # The exported model.safetensors predicts like the trained weights in the last shards.
    last = CheckpointManager(str(fsdp.parent / "ckpt")).steps()[-1]
    assert last == steps[-1]["step"] == 64
    files = json.loads((fsdp.parent / "ckpt" / "step-00000064" / "COMPLETE.json").read_text())
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "state.pt"} <= set(files["files"])
    loaded = export.load_model(str(fsdp.parent / "model"))
    x = val_features(data)
    with torch.no_grad():
        torch.testing.assert_close(loaded.module(x), checkpoint_model(fsdp, last)(x))


def test_calibration_under_fsdp_fits_what_ddp_fits_and_exports_it(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    """The temperature and the linear share are fitted on the main rank from FSDP's gathered
    state (a plain copy of the model scores the validation rows) and written into it."""
    model = {"linear": "fit", "ensemble": 2}
    ddp = make_config(
        tmp_path, "ddp", data=data, model=model, train={"epochs": 2, "strategy": "ddp"}
    )
    fsdp = make_config(tmp_path, "fsdp", data=data, model=model, train={"epochs": 2, **FSDP})
    torchrun(ddp, 2)
    torchrun(fsdp, 2)
    m_ddp, m_fsdp = (
        json.loads((c.parent / "model" / "metrics.json").read_text()) for c in (ddp, fsdp)
    )
    assert {"temperature", "linear_share", "val_loss_calibrated"} <= m_fsdp.keys()
    for key in ("temperature", "linear_share", "val_loss_calibrated"):
        assert m_fsdp[key] == pytest.approx(m_ddp[key], rel=1e-3, abs=1e-4), key
    assert 0.0 < m_fsdp["linear_share"] < 1.0
    w_ddp, w_fsdp = weights(ddp), weights(fsdp)
    assert float(w_fsdp["anchor_share"]) == pytest.approx(m_fsdp["linear_share"])
    assert float(w_fsdp["temperature"]) == pytest.approx(m_fsdp["temperature"])
    for k in w_ddp:
        torch.testing.assert_close(w_fsdp[k], w_ddp[k], rtol=1e-3, atol=1e-4, msg=k)
    x = val_features(data)
    with torch.no_grad():
        torch.testing.assert_close(
            export.load_model(str(fsdp.parent / "model")).module(x),
            export.load_model(str(ddp.parent / "model")).module(x),
            rtol=1e-3,
            atol=1e-4,
        )


def test_gpt_shards_per_block_and_early_stopping_exports_the_best_weights(
    tmp_path: Path,
) -> None:

    train, val = tokens(tmp_path / "t.parquet", 400), tokens(tmp_path / "v.parquet", 40)
    cfg = make_config(tmp_path, "gpt", data=(train, val), model=GPT)
    raw = json.loads(cfg.read_text())
    raw["data"] = {"train_uri": train, "val_uri": val, "kind": "tokens", "seq_len": 16}
    raw["optim"] = {"lr": 3e-3, "warmup_steps": 5, "weight_decay": 0.0}
    raw["train"] = {
        "epochs": 3,
        "global_batch_size": 32,
        "log_every_steps": 5,
        "eval_every_steps": 10,
        # No later evaluation beats the first (of the starting weights, at step 0) by 100:
        # patience 2 stops at step 20.
        "early_stopping": {"metric": "val_loss", "patience": 2, "min_delta": 100.0},
        **FSDP,
    }
    raw["checkpoint"].update(every_steps=10, keep_last=5)
    cfg.write_text(json.dumps(raw))
    proc = torchrun(cfg, 2)
    assert "FSDP: 2 shard units + root" in proc.stderr
    h = history(cfg)
    evals = [r for r in h if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [0, 10, 20]
    assert next(r for r in h if r["event"] == "early_stop")["step"] == 20
    meta = json.loads((cfg.parent / "model" / "model.json").read_text())
    assert meta["tied"] == {"lm_head.weight": "wte.weight"}
    metrics = json.loads((cfg.parent / "model" / "metrics.json").read_text())
    assert metrics["val_loss"] == pytest.approx(evals[0]["val_loss"], rel=1e-5)
    loaded = export.load_model(str(cfg.parent / "model"))
    idx = torch.arange(16).remainder(64).unsqueeze(0)
    with torch.no_grad():  # the export holds step 0's weights, the best, not step 20's
        best, last = checkpoint_model(cfg, 0), checkpoint_model(cfg, 20)
        torch.testing.assert_close(loaded.module(idx), best(idx))
        assert not torch.allclose(loaded.module(idx), last(idx))


def test_gpt_blocks_compiled_under_fsdp_train_and_export(tmp_path: Path) -> None:

    train, val = tokens(tmp_path / "t.parquet", 400), tokens(tmp_path / "v.parquet", 40)
    cfg = make_config(tmp_path, "gpt", data=(train, val), model=GPT)
    raw = json.loads(cfg.read_text())
    raw["data"] = {"train_uri": train, "val_uri": val, "kind": "tokens", "seq_len": 16}
    raw["train"] = {"max_steps": 12, "global_batch_size": 32, "log_every_steps": 4, **FSDP}
    raw["train"]["compile"] = True
    cfg.write_text(json.dumps(raw))
    proc = torchrun(cfg, 2, timeout=480)
    assert (
        "FSDP: 2 shard units + root, parameter dtype fp32, cpu offload False, compiled units True"
        in proc.stderr
    )
    curve = [r["loss"] for r in history(cfg) if r["event"] == "step"]
    assert curve[-1] < 0.85 * curve[0], curve
    loaded = export.load_model(str(cfg.parent / "model"))
    assert set(loaded.meta["tied"]) == {"lm_head.weight"}  # no "_orig_mod." in any name
    idx = torch.arange(16).remainder(64).unsqueeze(0)
    with torch.no_grad():
        assert torch.isfinite(loaded.module(idx)).all()


def test_fsdp_sigkill_one_rank_then_rerun_resumes_to_identical_weights(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    marker, ref_marker = tmp_path / "killed", tmp_path / "ref-marker"
    ref_marker.write_text("never fire\n")

    def fault(m: Path) -> dict[str, Any]:
        return {
            "name": "tests.plugins.faults:kill",
            "options": {"at": 40, "rank": 1, "marker": str(m)},
        }

    ref = make_config(tmp_path, "ref", data=data, model=fault(ref_marker), train=FSDP)
    run = make_config(tmp_path, "run", data=data, model=fault(marker), train=FSDP)
    torchrun(ref, 2)
    first = torchrun(run, 2, check=False)
    assert first.returncode != 0 and marker.exists(), first.stderr[-2000:]
    assert not (run.parent / "model").exists()
    assert CheckpointManager(str(run.parent / "ckpt")).steps()[-1] == 32

    torchrun(run, 2)
    restore = [r for r in history(run) if r["event"] == "restore"]
    assert restore and restore[0]["step"] == 32
    w_ref, w_run = weights(ref), weights(run)
    for k in w_ref:
        assert torch.equal(w_ref[k], w_run[k]), k


def test_truncated_shard_is_skipped_and_one_rank_resumes_two_ranks_shards(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    cfg = make_config(tmp_path, "trunc", data=data, train={"max_steps": 40, **FSDP})
    torchrun(cfg, 2)
    ckpt = cfg.parent / "ckpt"
    assert CheckpointManager(str(ckpt)).steps() == [16, 32]
    shard = ckpt / "step-00000032" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])

    raw = json.loads(cfg.read_text())
    raw["train"]["max_steps"] = 48
    cfg.write_text(json.dumps(raw))
    proc = torchrun(cfg, 1)  # resharded: 2 ranks wrote the shards, 1 reads them
    warnings = [ln for ln in proc.stderr.splitlines() if "skipping checkpoint" in ln]
    assert warnings and "step-00000032" in warnings[0] and "__1_0.distcp" in warnings[0]
    assert (ckpt / "step-00000032.corrupt-0").is_dir()
    restore = [r for r in history(cfg) if r["event"] == "restore"]
    assert restore[-1]["step"] == 16
    assert "written by 2 processes, this run has 1" in proc.stderr
    done = [r for r in history(cfg) if r["event"] == "done"]
    assert done[-1]["step"] == 48 and done[-1]["train_loss"] < 1.0


def test_fsdp_oom_on_every_rank_halves_the_micro_batch_and_keeps_the_math(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    ref = make_config(tmp_path, "ref", data=data, train={"epochs": 1, **FSDP})
    cfg = make_config(
        tmp_path,
        "oom",
        data=data,
        train={"epochs": 1, **FSDP},
        model={"name": "tests.plugins.faults:oom", "options": {"max_rows": 12}},
    )
    torchrun(ref, 2)
    torchrun(cfg, 2)
    ooms = [r for r in history(cfg) if r["event"] == "oom"]
    assert [(r["old_micro_batch"], r["micro_batch"]) for r in ooms] == [(32, 16), (16, 8)]
    w_ref, w = weights(ref), weights(cfg)
    for k in w_ref:
        torch.testing.assert_close(w[k], w_ref[k], rtol=1e-4, atol=1e-5, msg=k)


def test_fsdp_nan_loss_rolls_back_to_the_sharded_checkpoint(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    marker = tmp_path / "nan-fired"
    cfg = make_config(
        tmp_path,
        "nan",
        data=data,
        train=FSDP,
        model={"name": "tests.plugins.faults:nan", "options": {"at": 45, "marker": str(marker)}},
    )
    torchrun(cfg, 2)
    rollback = [r for r in history(cfg) if r["event"] == "rollback"]
    assert marker.exists() and len(rollback) == 1 and rollback[0]["step"] == 32
    assert all(torch.isfinite(t).all() for t in weights(cfg).values())


def test_one_process_shards_over_a_one_rank_group_and_resumes(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    cfg = make_config(tmp_path, "one", data=data, train={"max_steps": 20, **FSDP})

    def worker() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trainer.worker", "--config", str(cfg)],
            env=env(),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )

    first = worker()
    assert first.returncode == 0, first.stderr[-2000:]
    assert (cfg.parent / "ckpt" / "step-00000016" / "__0_0.distcp").is_file()
    raw = json.loads(cfg.read_text())
    raw["train"]["max_steps"] = 24
    cfg.write_text(json.dumps(raw))
    again = worker()
    assert again.returncode == 0, again.stderr[-2000:]
    assert [r["step"] for r in history(cfg) if r["event"] == "restore"] == [16]


def test_sigterm_writes_a_complete_sharded_checkpoint_and_rerun_finishes(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    cfg = make_config(
        tmp_path,
        "term",
        data=data,
        train={"epochs": 400, "log_every_steps": 4, **FSDP},
        checkpoint={"every_steps": 100000},
    )
    proc = subprocess.Popen(
        torchrun_cmd(cfg, 2),
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    wait_for_step(proc, 20)  # training is really under way
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    mgr = CheckpointManager(str(cfg.parent / "ckpt"))
    last = mgr.steps()[-1]
    assert last >= 20
    marker = json.loads((cfg.parent / "ckpt" / f"step-{last:08d}" / "COMPLETE.json").read_text())
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(marker["files"])

    raw = json.loads(cfg.read_text())
    raw["train"]["max_steps"] = last + 8
    cfg.write_text(json.dumps(raw))
    torchrun(cfg, 2)
    assert [r["step"] for r in history(cfg) if r["event"] == "restore"] == [last]


def test_sharded_checkpoints_on_s3_resume(
    tmp_path: Path, data: tuple[str, str], s3_server: str, s3_bucket: str
) -> None:
    root = f"s3://{s3_bucket}/run/ckpt"
    cfg = make_config(
        tmp_path, "s3", data=data, train={"max_steps": 20, **FSDP}, checkpoint={"uri": root}
    )
    torchrun(cfg, 2)
    assert CheckpointManager(root).steps() == [0, 16]
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(
        storage.list_dir(f"{root}/step-00000016")
    )
    raw = json.loads(cfg.read_text())
    raw["train"]["max_steps"] = 24
    cfg.write_text(json.dumps(raw))
    torchrun(cfg, 2)
    assert [r["step"] for r in history(cfg) if r["event"] == "restore"] == [16]


def test_fsdp_oom_on_one_rank_only_fails_with_a_line_that_says_what_to_do(
    tmp_path: Path, data: tuple[str, str]
) -> None:
    # The other rank waits in its next all-gather: no agreement reaches it. The OOM rank's
    # control collective times out (dist.timeout_s) and names the fix, as a permanent error.
    cfg = make_config(
        tmp_path,
        "oom1",
        data=data,
        train={"epochs": 1, **FSDP},
        model={"name": "tests.plugins.faults:oom", "options": {"max_rows": 12, "rank": 1}},
        dist={"timeout_s": 15},
    )
    proc = torchrun(cfg, 2, check=False)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR [train] E_TRAIN")]
    assert errors and "out of memory at micro-batch 16 on rank 1" in errors[0]
    assert "set train.micro_batch_size lower" in errors[0]
    assert not (cfg.parent / "model").exists()
