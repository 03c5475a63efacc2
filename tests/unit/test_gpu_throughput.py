"""The GPU throughput benchmark's logic, on its tiny CPU configuration."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest
import torch

from benchmarks import gpu_throughput
from trainer.models import ModelSpec, build_model, count_params, flops_per_token

TINY_ARGS = ["--tiny", "--no-compile", "--steps", "2", "--repeats", "2", "--warmup", "1"]


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


@pytest.mark.timeout(60)
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

    assert re.fullmatch(
        r"raw-loop ratio \(cpu tiny config\): \d+\.\d{3} \(goal <= 1\.02\)", lines[-3]
    )
    assert re.fullmatch(
        r"data-path ratio \(cpu tiny config\): \d+\.\d{3} \(goal <= 1\.02\)", lines[-2]
    )
    assert lines[-1] == (
        f"gpu_throughput mfu_ratio: {float(mfu_mm):.3f} "
        "(goal >= 0.45 at 0.5-1B on H200) (cpu tiny config)"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_without_cuda_the_tiny_config_is_implied(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_throughput.main(["--steps", "1", "--repeats", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "gpt-tiny" in out and "gpt-124m" not in out
    assert out.strip().splitlines()[-1].endswith("(cpu tiny config)")


def test_bad_arguments_are_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gpu_throughput.main(["--steps", "0"])
    assert "--steps and --repeats must be >= 1" in capsys.readouterr().err
