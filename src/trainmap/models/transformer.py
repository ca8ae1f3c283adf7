"""The ``transformer`` / ``transformer_ln`` family.

The one-layer transformer of Nanda et al. (2023), "Progress measures for grokking via mechanistic
interpretability": token + learned positional embeddings, one attention block with separate
``q``/``k``/``v``/``o`` projections, one ReLU MLP block, both residual, readout from the last
position. ``transformer_ln`` adds pre-LayerNorms.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from trainmap.models.registry import ArchSpec, check_flag, check_positive, register_architecture


class MultiHeadAttention(nn.Module):
    """Bidirectional multi-head self-attention with separate ``q``, ``k``, ``v``, ``o`` projections.

    Head ``h`` owns rows ``h * d_head:(h + 1) * d_head`` of ``q.weight``, ``k.weight`` and
    ``v.weight`` and the same columns of ``o.weight``, so per-head circuits can be sliced out.
    As in Nanda et al. the projections have no bias. There is no causal mask: the readout only
    looks at the last position, which may then attend to every token (the grokking tasks are
    sequence-to-label, so nothing leaks from the future).
    """

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        _check_heads(d_model, n_heads)
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.o = nn.Linear(d_model, d_model, bias=False)

    def _split_heads(self, projected: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = projected.shape
        return projected.view(batch, seq_len, self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, stream: torch.Tensor) -> torch.Tensor:
        """Attention output ``(batch, seq_len, d_model)`` for a residual stream of that shape."""
        batch, seq_len, d_model = stream.shape
        queries = self._split_heads(self.q(stream))
        keys = self._split_heads(self.k(stream))
        values = self._split_heads(self.v(stream))
        scores = queries @ keys.transpose(-2, -1) / math.sqrt(self.d_head)
        mixed = scores.softmax(dim=-1) @ values
        merged = mixed.transpose(1, 2).reshape(batch, seq_len, d_model)
        return self.o(merged)


class Transformer(nn.Module):
    """A one-layer transformer classifier (Nanda et al. 2023), optionally with pre-LayerNorms.

    ``stream = embed(tokens) + pos_embed(positions)``, then
    ``stream += attention(ln_attn(stream))``, ``stream += mlp(ln_mlp(stream))`` and
    ``logits = readout(ln_final(stream[:, -1]))``. Without
    ``layer_norm`` the ``ln_*`` modules are identities, so the model holds no LayerNorm at all.
    No dropout: training dynamics should come from the optimiser, not from sampled masks.
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        num_classes: int,
        d_model: int,
        n_heads: int,
        d_mlp: int,
        layer_norm: bool,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(seq_len, d_model)
        self.ln_attn = _layer_norm_or_identity(d_model, layer_norm)
        self.attention = MultiHeadAttention(d_model, n_heads)
        self.ln_mlp = _layer_norm_or_identity(d_model, layer_norm)
        self.mlp = nn.Sequential(
            OrderedDict(
                up=nn.Linear(d_model, d_mlp), relu=nn.ReLU(), down=nn.Linear(d_mlp, d_model)
            )
        )
        self.ln_final = _layer_norm_or_identity(d_model, layer_norm)
        self.readout = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, num_classes)`` for int64 tokens ``(batch, seq_len)``."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        stream = self.embed(tokens) + self.pos_embed(positions)
        stream = stream + self.attention(self.ln_attn(stream))
        stream = stream + self.mlp(self.ln_mlp(stream))
        return self.readout(self.ln_final(stream[:, -1]))


def _layer_norm_or_identity(d_model: int, layer_norm: bool) -> nn.Module:
    return nn.LayerNorm(d_model) if layer_norm else nn.Identity()


def build_transformer(
    meta: dict, d_model: int = 128, n_heads: int = 4, d_mlp: int = 512, layer_norm: bool = False
) -> Transformer:
    """A one-layer transformer over ``input_shape[0]`` tokens from a ``vocab_size`` vocabulary."""
    _check_transformer_options(
        {"d_model": d_model, "n_heads": n_heads, "d_mlp": d_mlp, "layer_norm": layer_norm}
    )
    if "vocab_size" not in meta:
        raise ValueError("token data metadata must give 'vocab_size'")
    seq_len = meta["input_shape"][0]
    return Transformer(
        meta["vocab_size"], seq_len, meta["num_classes"], d_model, n_heads, d_mlp, layer_norm
    )


def _check_heads(d_model: int, n_heads: int) -> None:
    check_positive("d_model", d_model)
    check_positive("n_heads", n_heads)
    if d_model % n_heads != 0:
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}; "
            "each head needs d_model / n_heads dimensions"
        )


def _check_transformer_options(options: dict) -> None:
    _check_heads(options["d_model"], options["n_heads"])
    check_positive("d_mlp", options["d_mlp"])
    check_flag("layer_norm", options["layer_norm"])


_TOKENS = frozenset({"tokens"})
_TRANSFORMER_SIZES = {"d_model": 128, "n_heads": 4, "d_mlp": 512}

register_architecture(
    ArchSpec(
        name="transformer",
        builder=build_transformer,
        defaults={**_TRANSFORMER_SIZES, "layer_norm": False},
        input_kinds=_TOKENS,
        description="one-layer transformer (Nanda et al. 2023), no LayerNorm",
        check_options=_check_transformer_options,
    )
)
register_architecture(
    ArchSpec(
        name="transformer_ln",
        builder=build_transformer,
        defaults={**_TRANSFORMER_SIZES, "layer_norm": True},
        input_kinds=_TOKENS,
        description="one-layer transformer (Nanda et al. 2023) with pre-LayerNorms",
        check_options=_check_transformer_options,
    )
)
