"""The chunked linear + cross-entropy: same loss and gradients as the plain head, less memory."""

from __future__ import annotations

import re
import shutil
import weakref
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainer.models.lm_loss import IGNORE_INDEX, chunked_lm_loss

B, T, D, V = 3, 10, 16, 50


def plain_loss(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """What the trainer computed before: full logits, upcast, ``F.cross_entropy``."""
    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def inputs(
    *, ignored: int = 0, seed: int = 0, v: int = V, n: tuple[int, int] = (B, T)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*n, D, generator=g).requires_grad_()
    weight = (torch.randn(v, D, generator=g) * 0.3).requires_grad_()
    target = torch.randint(0, v, n, generator=g)
    target.view(-1)[:ignored] = IGNORE_INDEX
    return hidden, weight, target


def loss_and_grads(
    fn: Any, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    loss = fn(hidden, weight, target, **kw)
    # an upstream factor, as the trainer's micro-batch weighting and a grad scaler apply
    gh, gw = torch.autograd.grad(loss * 0.75, (hidden, weight))
    return loss.detach(), gh, gw


@pytest.mark.parametrize("chunk", [1, 7, 30, 1000], ids=["1", "7-uneven", "30-exact", "1000"])
@pytest.mark.parametrize("ignored", [0, 5], ids=["all-valid", "ignore-index"])
def test_fp32_loss_and_gradients_match_the_plain_head(chunk: int, ignored: int) -> None:
    hidden, weight, target = inputs(ignored=ignored)
    want = loss_and_grads(plain_loss, hidden, weight, target)
    got = loss_and_grads(chunked_lm_loss, hidden, weight, target, chunk=chunk)
    assert got[0].dtype == torch.float32 and got[0].shape == ()
    for name, a, b in zip(("loss", "d hidden", "d weight"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_bf16_autocast_matches_the_plain_head_within_bf16_tolerance() -> None:
    hidden, weight, target = inputs(ignored=4, v=256, n=(4, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = loss_and_grads(plain_loss, hidden, weight, target)
        got = loss_and_grads(chunked_lm_loss, hidden, weight, target, chunk=24)
    ref = loss_and_grads(plain_loss, hidden, weight, target)  # fp32
    assert got[1].dtype == hidden.dtype and got[2].dtype == weight.dtype == torch.float32
    for name, a, b, r in zip(("loss", "d hidden", "d weight"), got, want, ref, strict=True):
        scale = r.abs().max()
        # bf16 keeps 8 significant bits: both paths sit within a few ulps of fp32
        assert (a - r).abs().max() <= 0.02 * scale, name
        assert (a - b).abs().max() <= 0.02 * scale, name


def test_fp16_autocast_with_a_grad_scaler_factor_matches_fp32() -> None:
    """fp16 (the trainer's fp16 mode scales the loss by 2**16): finite, close to fp32."""
    hidden, weight, target = inputs(v=256, n=(4, 32))
    with torch.autocast("cpu", dtype=torch.float16):
        loss = chunked_lm_loss(hidden, weight, target, chunk=24)
    got = torch.autograd.grad(loss * 65536.0, (hidden, weight))
    want = torch.autograd.grad(plain_loss(hidden, weight, target) * 65536.0, (hidden, weight))
    for a, b in zip(got, want, strict=True):
        assert a.isfinite().all() and (a - b).abs().max() <= 0.01 * b.abs().max()


def test_tied_weight_gets_both_the_embedding_and_the_head_gradient() -> None:
    g = torch.Generator().manual_seed(1)
    emb = torch.nn.Embedding(V, D)
    idx = torch.randint(0, V, (B, T), generator=g)
    target = torch.roll(idx, -1, dims=1)
    target[:, -1] = IGNORE_INDEX
    grads = []
    for loss_fn in (plain_loss, lambda h, w, y: chunked_lm_loss(h, w, y, chunk=8)):
        emb.zero_grad(set_to_none=True)
        hidden = torch.tanh(emb(idx))  # the tied weight feeds the hidden states too
        loss_fn(hidden, emb.weight, target).backward()
        assert emb.weight.grad is not None
        grads.append(emb.weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_no_valid_target_gives_nan_like_cross_entropy() -> None:
    hidden, weight, target = inputs()
    target.fill_(IGNORE_INDEX)
    assert plain_loss(hidden, weight, target).isnan()
    assert chunked_lm_loss(hidden, weight, target, chunk=4).isnan()


def test_without_grad_mode_only_the_loss_is_computed() -> None:
    hidden, weight, target = inputs(ignored=2)
    with torch.no_grad():
        loss = chunked_lm_loss(hidden, weight, target, chunk=4)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, plain_loss(hidden, weight, target).detach())


@pytest.mark.parametrize(
    ("chunk", "shapes", "message"),
    [
        (0, None, "chunk must be > 0"),
        (4, ((B, T, D), (V, D + 1), (B, T)), "expected hidden"),
        (4, ((B, T, D), (V, D), (B, T + 1)), "expected hidden"),
        (4, ((0, T, D), (V, D), (0, T)), "needs at least one token"),
    ],
    ids=["chunk", "weight", "target", "empty"],
)
def test_bad_arguments_are_rejected(chunk: int, shapes: Any, message: str) -> None:
    hidden, weight, target = inputs()
    if shapes is not None:
        hidden, weight = torch.zeros(shapes[0]), torch.zeros(shapes[1])
        target = torch.zeros(shapes[2], dtype=torch.long)
    with pytest.raises(ValueError, match=message):
        chunked_lm_loss(hidden, weight, target, chunk=chunk)


class MemoryWatch(TorchDispatchMode):
    """Every tensor an op makes: the largest (elements) and the peak of their live bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            self.largest = max(self.largest, t.numel())
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self._seen or storage.nbytes() == 0:
                continue  # a view or an in-place result: no new memory
            self._seen.add(key)
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._freed, key, storage.nbytes())
        return out


def watched_step(fn: Any, **kw: Any) -> tuple[MemoryWatch, int]:
    """Forward and backward of a big-vocabulary head under a MemoryWatch; returns N * V too."""
    hidden, weight, target = inputs(v=8192, n=(4, 128))
    with MemoryWatch() as watch:
        loss = fn(hidden, weight, target, **kw)
        loss.backward()
    return watch, target.numel() * weight.shape[0]


def test_chunked_head_never_makes_a_full_logits_tensor_and_peaks_lower() -> None:
    plain, n_logits = watched_step(plain_loss)
    chunked, _ = watched_step(chunked_lm_loss, chunk=64)
    assert plain.largest >= n_logits  # the watch does see the plain path's [N, V] logits
    assert chunked.largest <= 64 * 8192  # one chunk's logits at most
    # plain keeps several [N, V] fp32 tensors alive; chunked a few [64, V] ones and [V, D] grads
    assert chunked.peak < 0.25 * plain.peak, (chunked.peak, plain.peak)


def test_compiles_into_one_graph_with_gradients() -> None:
    hidden, weight, target = inputs(ignored=3)
    want = loss_and_grads(plain_loss, hidden, weight, target)

    def fn(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return chunked_lm_loss(h, w, y, chunk=8)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    got = loss_and_grads(compiled, hidden, weight, target)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor on the CPU needs a C++ compiler")
def test_inductor_fuses_the_softmax_gradient_without_fp32_chunk_buffers() -> None:
    """Compiled under bf16 autocast: same results, and the only [chunk, V] buffer is bf16."""
    from torch._inductor.utils import run_and_get_code

    chunk, v = 32, 128
    hidden, weight, target = inputs(ignored=3, v=v, n=(4, 32))  # 4 chunks

    def fn(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return chunked_lm_loss(h, w, y, chunk=chunk)

    want = loss_and_grads(fn, hidden, weight, target)
    compiled = torch.compile(fn, fullgraph=True)
    (loss, codes) = run_and_get_code(compiled, hidden, weight, target)
    gh, gw = torch.autograd.grad(loss * 0.75, (hidden, weight))
    for a, b in zip((loss.detach(), gh, gw), want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-3)
    buffers = re.findall(
        r"empty_strided_cpu\(\((\d+), (\d+)\), \([^)]*\), torch\.(\w+)\)", "".join(codes)
    )
    chunk_sized = {dtype for rows, cols, dtype in buffers if int(rows) * int(cols) >= chunk * v}
    assert chunk_sized == {"bfloat16"}, buffers
