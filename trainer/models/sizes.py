"""A model's size and its training FLOPs per token (for MFU)."""

from __future__ import annotations

from torch import nn

from trainer.config import ModelConfig
from trainer.models.losses import unwrap_model
from trainer.models.spec import ModelSpec

__all__ = ["count_params", "flops_per_token"]


def count_params(model: nn.Module, *, exclude_embeddings: bool = False) -> int:
    """Number of distinct parameters (a tied weight counts once).

    Args:
        model: The model (DDP and torch.compile wrappers are looked through).
        exclude_embeddings: Leave out weights used only for embedding lookups. Following
            nanoGPT, a token embedding tied to the output head *stays in*: the head is a real
            matmul of ``2 * V * d`` FLOPs per token, so it belongs in ``6N``. For the GPT this
            removes just the position embedding.

    Returns:
        The parameter count.
    """
    model = unwrap_model(model)
    lookup_only: set[int] = set()
    if exclude_embeddings:
        embedding = {
            id(p)
            for m in model.modules()
            if isinstance(m, nn.Embedding)
            for p in m.parameters(recurse=False)
        }
        elsewhere = {
            id(p)
            for m in model.modules()
            if not isinstance(m, nn.Embedding)
            for p in m.parameters(recurse=False)
        }
        lookup_only = embedding - elsewhere
    return sum(p.numel() for p in model.parameters() if id(p) not in lookup_only)


def flops_per_token(cfg: ModelConfig, spec: ModelSpec, n_params: int) -> float:
    """Training FLOPs (forward and backward) per token, for MFU.

    GPT: ``6 N + 12 L H Q T`` (PaLM, appendix B) with ``L`` layers, ``H`` heads, head size
    ``Q``, sequence length ``T``; the second term is attention's score and value matmuls, which
    no weight accounts for. Every other model: ``6 N`` per sample (a "token" is a row).

    Args:
        cfg: The model section of the config.
        spec: Shapes of the data (``seq_len`` for the GPT).
        n_params: ``N``; pass ``count_params(model, exclude_embeddings=True)`` (position
            embeddings are lookups, not matmuls; the tied token embedding is the output head).

    Returns:
        FLOPs per token (per row for tabular models).
    """
    flops = 6.0 * n_params
    if cfg.name == "gpt" and spec.seq_len is not None:
        head_dim = cfg.d_model // cfg.n_head
        flops += 12.0 * cfg.n_layer * cfg.n_head * head_dim * spec.seq_len
    return flops
