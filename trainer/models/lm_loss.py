"""Chunked linear + cross-entropy for a language-model head: the loss without ``[N, V]`` logits.

A GPT's head multiplies ``N = B * T`` hidden states ``[N, d]`` by the (tied) embedding ``[V, d]``.
Done plainly, the logits ``[N, V]`` (6.6 GB in bf16 for 64 x 1024 tokens and V = 50304), their
fp32 copy for the loss, the log-softmax saved for backward and its gradient all live at once:
most of the peak memory of a small GPT. Here the tokens are taken ``chunk`` at a time: the
chunk's logits in the compute dtype, its loss in fp32, and at once its gradients with respect to
the hidden states and the head weight (the Liger-Kernel / "cut cross-entropy" way). Only one
chunk's logits ever exist; what is kept for backward is ``d(loss)/d(hidden)`` (the size of the
hidden states, which the plain path keeps too) and ``d(loss)/d(weight)`` (the size of the
weight's own gradient).

Why gradients in the forward rather than recomputing the logits in the backward: recomputing
costs a third more head FLOPs (the ``[N, d] x [d, V]`` matmul again; about 10% of all FLOPs at
124M parameters) and saves no memory, since the backward needs the weight gradient buffer
anyway. The price is that the forward does the backward's head matmuls even when the caller
never calls ``backward``; so without grad mode (evaluation) only the loss is computed.

Precision follows autocast: the matmuls run in the autocast dtype (as ``nn.Linear`` would),
the softmax and loss in fp32, the weight gradient accumulates in fp32 over chunks. The logit
gradient is kept *unscaled* (``softmax - onehot``, in [-1, 1]) until after the matmuls and the
``1 / n_valid`` and upstream factors are applied in fp32 at the end, so nothing underflows in
fp16 or bf16 however many tokens there are. Under fp16 the weight gradient's matmul runs in fp32
(a chunk's sum over thousands of tokens could overflow fp16's 65504).

``torch.compile`` traces the function into the model's graph (``fullgraph=True`` holds): the
chunk loop unrolls and, the one-hot being written as a comparison rather than a scatter,
Inductor fuses each chunk's upcast, softmax, loss and logit gradient so that the only
``[chunk, V]`` buffer is the compute-dtype logits (checked in the CPU's generated code; the
Triton code is not yet inspected). Eagerly, one fp32 ``[chunk, V]`` buffer is made and worked
on in place.
"""

from __future__ import annotations

from typing import Any

import torch

IGNORE_INDEX = -100
"""Targets equal to this are left out of the loss (``F.cross_entropy``'s default)."""


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype ``nn.Linear`` would run in here: autocast's if it is on, else the input's."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype


def _chunk_ce(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int, with_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Summed fp32 cross-entropy of one chunk and, if asked, ``softmax - onehot`` (masked).

    Returns:
        The loss summed over the chunk's valid targets, and the unscaled logit gradient in
        ``logits.dtype`` (``None`` without ``with_grad``).
    """
    z = logits.float()
    valid = target != ignore_index
    safe = torch.where(valid, target, 0).unsqueeze(1)
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(1, safe).squeeze(1)
    loss = torch.where(valid, lse - picked, 0.0).sum()
    if not with_grad:
        return loss, None
    if torch.compiler.is_compiling():
        # All pointwise (the one-hot as a comparison with a column index, not a scatter), so
        # Inductor fuses upcast, softmax, one-hot and downcast into one kernel: no fp32 buffer.
        cols = torch.arange(z.shape[1], device=z.device).unsqueeze(0)
        p = torch.exp(z - lse.unsqueeze(1)) - (cols == safe).to(z.dtype)
        return loss, torch.where(valid.unsqueeze(1), p, 0.0).to(logits.dtype)
    # Eager: in place on z (a fresh upcast, or the fresh fp32 matmul output that nothing else
    # holds), so one fp32 [chunk, V] buffer is all the softmax gradient needs.
    p = z.sub_(lse.unsqueeze(1)).exp_()
    p.scatter_add_(1, safe, torch.full_like(picked, -1.0).unsqueeze(1))
    p.mul_(valid.unsqueeze(1))
    return loss, p.to(logits.dtype)


def _bounds(n: int, chunk: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk; equal sizes where ``chunk`` divides ``n``."""
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


class _LinearCrossEntropy(torch.autograd.Function):
    """``mean(cross_entropy(hidden @ weight.T, target))`` with gradients made in the forward."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        target: torch.Tensor,
        chunk: int,
        ignore_index: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            h = hidden.to(dtype)
            w = weight.to(dtype)
            # fp16 cannot hold a chunk's summed weight gradient; bf16 and fp32 can.
            wg_dtype = torch.float32 if dtype == torch.float16 else dtype
            h_wg = h if wg_dtype == dtype else h.to(wg_dtype)
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_h = torch.empty_like(h)
            grad_w = torch.empty(0)  # set by the first chunk
            for i, (start, end) in enumerate(_bounds(h.shape[0], chunk)):
                logits = h[start:end] @ w.t()
                part, g = _chunk_ce(logits, target[start:end], ignore_index, with_grad=True)
                assert g is not None
                del logits  # freed before the matmuls (in fp32, g reuses its storage)
                loss = loss + part
                grad_h[start:end] = g @ w
                gw = (g.to(wg_dtype).t() @ h_wg[start:end]).float()
                grad_w = gw if i == 0 else grad_w.add_(gw)
            n_valid = (target != ignore_index).sum().to(torch.float32)
            inv_n = 1.0 / n_valid  # 0 valid targets: inf, and the loss NaN, as F.cross_entropy
        ctx.save_for_backward(grad_h, grad_w, inv_n)
        ctx.hidden_dtype = hidden.dtype
        ctx.weight_dtype = weight.dtype
        return loss * inv_n

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w, inv_n = ctx.saved_tensors
        scale = grad_out.float() * inv_n
        dh = (grad_h.float() * scale).to(ctx.hidden_dtype)
        dw = (grad_w * scale).to(ctx.weight_dtype)
        return dh, dw, None, None, None, None


def _loss_only(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    chunk: int,
    ignore_index: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The same loss with no gradient work (grad mode off or nothing requires grad)."""
    with torch.autocast(hidden.device.type, enabled=False):
        h = hidden.to(dtype)
        w = weight.to(dtype)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start, end in _bounds(h.shape[0], chunk):
            part, _ = _chunk_ce(h[start:end] @ w.t(), target[start:end], ignore_index, False)
            loss = loss + part
        return loss / (target != ignore_index).sum().to(torch.float32)


def chunked_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    chunk: int,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight).float(), target)`` without the full logits.

    Args:
        hidden: Final hidden states ``[..., d]`` (e.g. ``[B, T, d]``).
        weight: Head weight ``[V, d]`` (may be the tied token embedding).
        target: Next-token ids ``[...]`` matching ``hidden``'s leading dims; ``ignore_index``
            entries are left out of the mean.
        chunk: Tokens per chunk: the largest logits tensor is ``[chunk, V]``.
        ignore_index: Target value that contributes no loss.

    Returns:
        A scalar float32 tensor: the mean loss over the valid targets (NaN if there are none).

    Raises:
        ValueError: If ``chunk`` is not positive or the shapes do not match.
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be > 0, got {chunk}")
    if target.numel() == 0:
        raise ValueError("chunked_lm_loss needs at least one token, got none")
    d = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != d or target.shape != hidden.shape[:-1]:
        raise ValueError(
            f"expected hidden [..., d], weight [V, d] and target [...], got hidden "
            f"{tuple(hidden.shape)}, weight {tuple(weight.shape)}, target {tuple(target.shape)}"
        )
    h = hidden.reshape(-1, d)
    y = target.reshape(-1)
    dtype = _compute_dtype(hidden)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        loss: torch.Tensor = _LinearCrossEntropy.apply(h, weight, y, chunk, ignore_index, dtype)
        return loss
    return _loss_only(h, weight, y, chunk, ignore_index, dtype)
