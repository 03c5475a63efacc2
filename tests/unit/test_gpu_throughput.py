"""The GPU throughput benchmark's logic, on its tiny CPU configuration."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_throughput
from benchmarks.lib import gpu_contenders as hf
from benchmarks.lib import gpu_report
from trainer.distributed import dist
from trainer.models import ModelSpec, build_model, count_params, flops_per_token

TINY_ARGS = [
    "--tiny", "--no-compile", "--steps", "2", "--repeats", "2", "--warmup", "1",
    "--curve-steps", "4",
]  # fmt: skip
HAVE_TRANSFORMERS = hf.hf_unavailable() is None


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """``dist.init()`` (called by the benchmark) sets up the root logger: undo it."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)


def test_flops_per_token_matches_a_hand_count() -> None:
    # tiny GPT: 2 layers, d=64, 2 heads (Q=32), T=64, vocab 256, tied head, no biases
    d, layers, vocab, heads, q, t = 64, 2, 256, 2, 32, 64
    per_layer = 3 * d * d + d * d + 4 * d * d + 4 * d * d + 2 * d  # qkv, proj, fc, proj, 2 LN
    n = layers * per_layer + d + vocab * d  # + final LN + token embedding (= output head)
    assert n == 115_008
    case = gpu_throughput.TINY_CASE
    model = build_model(case.model, ModelSpec(task="lm", seq_len=case.seq_len))
    assert count_params(model, exclude_embeddings=True) == n
    expected = 6 * n + 12 * layers * heads * q * t
    spec = ModelSpec(task="lm", seq_len=case.seq_len)
    assert flops_per_token(case.model, spec, n) == expected == 788_352


@pytest.mark.timeout(120)
def test_tiny_run_prints_the_table_and_the_mfu_ratio_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert gpu_throughput.main(TINY_ARGS) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["model", "N"])
    assert lines[header].split() == " ".join(c for c, _ in gpu_throughput.COLUMNS).split()
    cells = lines[header + 1].split()
    assert len(cells) == len(gpu_throughput.COLUMNS)
    (
        model, n, flops, tok_step, micro, step_ms, tok_s, tflops,
        mfu_sheet, mfu_mm, raw, data, compile_s, speedup, peak,
    ) = cells  # fmt: skip
    assert (model, n, flops, tok_step, micro) == ("gpt-tiny", "0.1M", "7.8835e+05", "512", "8")
    assert float(step_ms) > 0 and float(tok_s) > 0 and float(tflops) > 0
    # MFU = tokens/s x FLOPs/token / measured peak, which the run prints first
    peak_line = next(line for line in lines if line.startswith("peak: "))
    peak_tflops = float(peak_line.split()[1])
    assert float(mfu_mm) == pytest.approx(float(tflops) / peak_tflops, rel=0.01, abs=1e-3)
    assert float(mfu_mm) > 0 and float(raw) > 0 and float(data) > 0
    # no datasheet peak, compile or GPU memory on the CPU
    assert (mfu_sheet, compile_s, speedup, peak) == ("-", "-", "-", "-")

    # the comparison table: the trainer against its old loss and (where importable) HF
    hf_header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["model", "tok/s"])
    cmp = lines[hf_header + 1].split()
    assert len(cmp) == len(gpu_report.HF_COLUMNS) and cmp[0] == "gpt-tiny"
    assert cmp[1] == tok_s and float(cmp[2]) > 0  # old-loss tok/s
    assert float(cmp[4]) == pytest.approx(float(tok_s) / float(cmp[2]), rel=0.01)
    # fp32 on one CPU process: the chunked and the full-logits loss give the same curve
    assert float(cmp[13]) < 1e-4 and float(cmp[14]) < 1e-4
    assert any(
        re.fullmatch(r"loss curve \(gpt-tiny, 4 steps\): .*\(goal <= 0\.05\)", x) for x in lines
    )
    if not HAVE_TRANSFORMERS:
        assert cmp[3] == "-" and f"hf: skipped: {hf.hf_unavailable()}" in lines

    tail = lines[-4:] if HAVE_TRANSFORMERS else lines[-3:]
    assert re.fullmatch(
        r"raw-loop ratio \(cpu tiny config\): \d+\.\d{3} \(goal <= 1\.02\)", tail[0]
    )
    assert re.fullmatch(
        r"data-path ratio \(cpu tiny config\): \d+\.\d{3} \(goal <= 1\.02\)", tail[1]
    )
    assert tail[2] == (
        f"gpu_throughput mfu_ratio: {float(mfu_mm):.3f} "
        "(goal >= 0.40 at 124M, >= 0.55 at 1.3B vs the datasheet) (cpu tiny config)"
    )
    if HAVE_TRANSFORMERS:  # then the worst tok/s ratio against Hugging Face is the headline
        assert re.fullmatch(
            r"gpu_throughput hf_speed_ratio: \d+\.\d{3} \(worst: gpt-tiny; goal >= 1\.10\)",
            tail[3],
        )


@pytest.mark.timeout(120)
def test_skipped_contenders_leave_dashes_and_no_curve(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*TINY_ARGS, "--skip", "raw,old,hf,curve", "--loss-chunk", "100"]
    assert gpu_throughput.main(args) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert "loss_chunk 100;" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["model", "N"])
    assert lines[header + 1].split()[10] == "-"  # raw
    cmp = next(line for line in lines if line.startswith("gpt-tiny") and "/" in line).split()
    assert cmp[2] == cmp[3] == cmp[4] == cmp[5] == "-" and cmp[6] == "8/-/-"
    assert "loss curve" not in out and "raw-loop ratio" not in out and "hf: skipped" not in out
    assert lines[-1].startswith("gpu_throughput mfu_ratio: ")


def test_old_and_new_loss_give_the_same_training_curve_through_the_trainer(
    tmp_path: Path,
) -> None:
    """20 steps of the real Run with the chunked and the full-logits loss, on learnable tokens."""
    case = gpu_throughput.TINY_CASE
    cfg = gpu_throughput.make_config(case, tmp_path / "unused.parquet", tmp_path, compile=False)
    ctx = dist.init()
    try:
        new, old = hf.loss_curves(
            cfg, ctx, gpu_throughput.build_run, steps=20, loss_chunks=(100, 0)
        )
    finally:
        dist.close(ctx)
    assert len(new) == len(old) == 20
    assert new[-1] < new[0] - 0.2  # the stream is learnable: the loss falls
    assert new == pytest.approx(old, rel=1e-5, abs=1e-5)
    max_diff, tail_diff = hf.curve_diff(new, old)
    assert max_diff < 1e-4 and tail_diff <= max_diff


def test_curve_diff_is_the_max_and_the_tail_mean_difference() -> None:
    a = [5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    b = [5.0, 4.5, 3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 1.0]
    assert hf.curve_diff(a, b) == pytest.approx((0.5, 0.1))  # last 2 of 11: means 1.0, 1.1


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs transformers (not a project dependency)")
def test_hugging_face_gpt2_has_our_shape_and_sdpa(tmp_path: Path) -> None:
    case = gpu_throughput.TINY_CASE
    cfg = gpu_throughput.make_config(case, tmp_path / "unused.parquet", tmp_path, compile=False)
    model = hf.hf_model(cfg, case.seq_len, torch.device("cpu"))
    ours = build_model(case.model, ModelSpec(task="lm", seq_len=case.seq_len))
    assert model.config._attn_implementation == "sdpa"
    assert model.lm_head.weight is model.transformer.wte.weight  # tied, as ours
    # same matrices; HF adds biases to its linears and LayerNorms
    matrices = sorted(p.numel() for p in model.parameters() if p.dim() == 2)
    assert matrices == sorted(p.numel() for p in ours.parameters() if p.dim() == 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_without_cuda_the_tiny_config_is_implied(capsys: pytest.CaptureFixture[str]) -> None:
    # Without the HF contender (importable or not), the last line is the MFU line.
    args = ["--steps", "1", "--repeats", "1", "--warmup", "0", "--skip", "hf"]
    assert gpu_throughput.main(args) == 0
    out = capsys.readouterr().out
    assert "gpt-tiny" in out and "gpt-124m" not in out
    assert out.strip().splitlines()[-1].endswith("(cpu tiny config)")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps and --repeats must be >= 1"),
        (["--skip", "raw,nope"], "--skip must name some of raw, eager, old, hf, curve"),
        (["--micro", "0"], "--micro must be >= 1"),
        (["--loss-chunk", "-1"], "--loss-chunk must be >= 0"),
    ],
    ids=["steps", "skip", "micro", "loss-chunk"],
)
def test_bad_arguments_are_rejected(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        gpu_throughput.main(args)
    assert message in capsys.readouterr().err
