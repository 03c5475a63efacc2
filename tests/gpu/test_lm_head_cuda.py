"""The chunked LM head on a CUDA device: bf16, torch.compile (Inductor + Triton), peak memory.

Run on a GPU machine with ``PYTHONPATH=. python -m pytest tests/gpu -m gpu``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer.config import ModelConfig
from trainer.models import ModelSpec, build_model, compute_loss
from trainer.models.lm_loss import chunked_lm_loss

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _peak_bytes(fn: object) -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()  # type: ignore[operator]
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_chunked_head_in_bf16_matches_and_peaks_far_lower_on_cuda() -> None:
    n, d, v = 8 * 1024, 768, 50304
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(n, d, device="cuda", generator=g).requires_grad_()
    weight = (torch.randn(v, d, device="cuda", generator=g) * 0.02).requires_grad_()
    target = torch.randint(0, v, (n,), device="cuda", generator=g)
    target[:100] = -100
    results = {}

    def run(name: str, loss_fn: object) -> None:
        hidden.grad = weight.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn()  # type: ignore[operator]
        loss.backward()
        results[name] = (loss.detach(), hidden.grad.clone(), weight.grad.clone())  # type: ignore[union-attr]

    def plain() -> torch.Tensor:
        return F.cross_entropy(F.linear(hidden, weight).float(), target)

    def chunked() -> torch.Tensor:
        return chunked_lm_loss(hidden, weight, target, chunk=2048)

    peak_plain = _peak_bytes(lambda: run("plain", plain))
    peak_chunked = _peak_bytes(lambda: run("chunked", chunked))
    for a, b in zip(results["chunked"], results["plain"], strict=True):
        assert (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max()
    # plain: [N, V] bf16 logits + fp32 copy + log-softmax + gradients, > 4 GB here
    assert peak_chunked < 0.25 * peak_plain, (peak_chunked, peak_plain)


def test_compiled_gpt_with_chunked_loss_trains_like_the_old_loss_on_cuda() -> None:
    curves = []
    for loss_chunk in (0, 96):
        torch.manual_seed(0)
        cfg = ModelConfig(
            name="gpt", vocab_size=512, n_layer=2, n_head=2, d_model=64, loss_chunk=loss_chunk
        )
        model = build_model(cfg, ModelSpec(task="lm", seq_len=64)).cuda().train()
        compiled = torch.compile(model, fullgraph=True)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
        seq = (torch.arange(65, device="cuda") * 7 % 40).repeat(8, 1)
        losses = []
        for _ in range(30):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if loss_chunk:
                    loss = compiled(seq[:, :-1], targets=seq[:, 1:])
                else:
                    loss = compute_loss("lm", compiled(seq[:, :-1]), seq[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    old, new = curves
    assert new[-1] < 0.5 * new[0]
    assert max(abs(a - b) for a, b in zip(old, new, strict=True)) < 0.05
