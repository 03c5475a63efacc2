"""A GPT-2-style causal language model (pre-LN, tied embeddings, fused attention)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.models.lm_loss import chunked_lm_loss

# Linear and LayerNorm layers carry no bias: it saves a little memory and time per step and, as in
# nanoGPT and most modern LMs, costs nothing in quality.
_INIT_STD = 0.02


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``.

    ``is_causal=True`` (rather than an explicit mask) lets PyTorch pick the flash or
    memory-efficient kernel on GPUs, and keeps the module free of a ``[T, T]`` mask buffer.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over ``x`` of shape ``[B, T, C]``; each position sees itself and the past."""
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # [B, T, C] -> [B, H, T, C/H]
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    """The position-wise feed-forward network: 4x expansion with GELU."""

    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model, bias=False)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d_model, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the feed-forward network to ``[B, T, C]``."""
        return self.dropout(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """A pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, bias=False)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln_2 = nn.LayerNorm(d_model, bias=False)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Transform ``[B, T, C]`` into ``[B, T, C]``."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A decoder-only transformer language model in the GPT-2 mould.

    Token and learned position embeddings, ``n_layer`` pre-LN blocks, a final LayerNorm and a
    language-model head whose weight *is* the token embedding (weight tying: fewer parameters and
    usually a slightly better model). Weights are drawn from N(0, 0.02); the two residual output
    projections of each block use ``0.02 / sqrt(2 * n_layer)`` so the residual stream's variance
    does not grow with depth (GPT-2 paper, section 2.3). All initialisation uses the global
    generator, so the same ``torch.manual_seed`` gives the same model.

    The forward pass has no data-dependent Python control flow, so it compiles to one graph
    under ``torch.compile`` and runs under bf16/fp16 autocast (logits then come out in the
    autocast dtype; ``compute_loss`` upcasts them).

    Given ``targets``, the forward returns the mean next-token loss instead of the logits. With
    ``loss_chunk > 0`` the head and the loss run ``loss_chunk`` tokens at a time
    (:func:`~trainer.models.lm_loss.chunked_lm_loss`), so the ``[B, T, vocab_size]`` logits are
    never materialised; ``computes_loss`` is then true, which tells the trainer to call
    ``model(x, targets=y)`` rather than compute the loss from logits.

    Args:
        vocab_size: Number of token ids.
        block_size: Longest sequence the model accepts (size of the position embedding).
        n_layer: Number of transformer blocks.
        n_head: Attention heads per block.
        d_model: Embedding width; must divide by ``n_head``.
        dropout: Dropout on embeddings, attention weights and residual branches.
        activation_checkpointing: Recompute each block's activations in the backward pass
            (training mode only) to trade compute for memory.
        loss_chunk: Tokens per chunk of the chunked head + loss; 0 computes the loss from the
            full logits.

    Raises:
        ValueError: If ``d_model`` does not divide by ``n_head`` or a size is not positive.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int,
        n_head: int,
        d_model: int,
        dropout: float = 0.0,
        activation_checkpointing: bool = False,
        loss_chunk: int = 0,
    ) -> None:
        super().__init__()
        if loss_chunk < 0:
            raise ValueError(f"GPT loss_chunk must be >= 0, got {loss_chunk}")
        if min(vocab_size, block_size, n_layer, n_head, d_model) <= 0 or d_model % n_head:
            raise ValueError(
                f"GPT sizes must be positive and d_model divisible by n_head, got "
                f"vocab_size={vocab_size}, block_size={block_size}, n_layer={n_layer}, "
                f"n_head={n_head}, d_model={d_model}"
            )
        self.block_size = block_size
        self.activation_checkpointing = activation_checkpointing
        self.loss_chunk = loss_chunk
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(block_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, bias=False)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self._init_weights(n_layer)

    def _init_weights(self, n_layer: int) -> None:
        """GPT-2 initialisation, in a fixed module order so that a seed fixes the weights."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=_INIT_STD)
        residual_std = _INIT_STD / math.sqrt(2 * n_layer)
        for block in self.blocks:
            assert isinstance(block, Block)
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=residual_std)

    @property
    def computes_loss(self) -> bool:
        """Whether ``forward(idx, targets=...)`` is the cheaper way to the training loss."""
        return self.loss_chunk > 0

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits for every position, or the mean loss against ``targets``.

        Args:
            idx: Token ids, int64 ``[B, T]`` with ``T <= block_size``.
            targets: Next-token ids ``[B, T]`` (``-100`` entries are ignored), or None.

        Returns:
            Without ``targets``: logits ``[B, T, vocab_size]``; position ``t`` depends only on
            ``idx[:, : t + 1]``. With them: the scalar float32 mean cross-entropy, computed
            chunk by chunk when ``loss_chunk > 0``.

        Raises:
            ValueError: If the sequence is longer than ``block_size``.
        """
        t = idx.shape[1]
        if t > self.block_size:  # a shape check, which torch.compile turns into a guard
            raise ValueError(
                f"sequence length {t} exceeds the model's block size {self.block_size}"
            )
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x)
        if self.loss_chunk > 0:
            return chunked_lm_loss(x, self.lm_head.weight, targets, chunk=self.loss_chunk)
        logits = self.lm_head(x).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
