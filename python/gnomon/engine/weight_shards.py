"""Tensor-parallel weight shards: `shard_weights` cuts rank ``shard.rank``'s part of gnomon-named
weights by the sharding rules of `gnomon.engine.parallel` and each architecture's ``SHARDING``
(`gnomon.engine.models`). `gnomon.engine.weights.load_weights` reads a rank's part directly;
it cuts here what it must read whole (MXFP4 experts padded to whole scale blocks)."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from gnomon.engine import models
from gnomon.engine.config import ModelConfig
from gnomon.engine.parallel import Shard
from gnomon.formats import E8M0_BIAS

# How the weights outside the layers split (`gnomon.engine.parallel` states the rules); each
# architecture's module gives its layers' (``SHARDING``).
_SHARDING = {"embed": ("vocab", 0), "lm_head": ("vocab", 0), "norm": ("replicate", None)}
_PAD = {"_scales": E8M0_BIAS}  # an MXFP4 scale that pads: 2**0; padded codes are 0
INTERMEDIATE_SPLITS = ("gate_up", "down")  # the MLP's splits along its intermediate dimension


def shard_weights(weights: Dict[str, torch.Tensor], config: ModelConfig, shard: Shard, *,
                  mxfp4: Optional[bool] = None) -> Dict[str, torch.Tensor]:
    """Rank ``shard.rank``'s part of gnomon-named `weights` (all of a model's, or any subset),
    by the sharding rules of `gnomon.engine.parallel` and the architecture's ``SHARDING``:
    each fused tensor is split per component (Q, K and V heads of ``qkv``; gate and up rows of
    ``w13``), never as one contiguous slice. `mxfp4` defaults to whether `weights` hold scales."""
    if shard.size == 1:
        return dict(weights)
    if mxfp4 is None:
        mxfp4 = any(n.endswith("_scales") for n in weights)
    rules = {**_SHARDING, **models.model_module(config.architecture).SHARDING}
    padded = shard.intermediate(config, mxfp4)
    out: Dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        leaf = name.rsplit(".", 1)[-1]
        if name == "lm_head" and config.tie_word_embeddings and "embed" in out:
            out[name] = out["embed"]
            continue
        kind, dim = rules[leaf]
        if kind in INTERMEDIATE_SPLITS and padded != config.intermediate_size:
            fill = next((v for suffix, v in _PAD.items() if leaf.endswith(suffix)), 0)
            tensor = _pad_intermediate(tensor, dim, padded / config.intermediate_size,
                                       fill, kind == "gate_up" and
                                       config.gate_up_layout == "concat")
        out[name] = _split(tensor, kind, dim, config, shard)
    return out


def _split(t: torch.Tensor, kind: str, dim, config: ModelConfig, shard: Shard) -> torch.Tensor:
    if kind == "replicate":
        return t
    if kind == "once":  # a bias added after the all-reduce: rank 0's alone
        return t if shard.rank == 0 else torch.zeros_like(t)
    if kind == "vocab":
        rows = shard.vocab(config)
        if rows != t.shape[0]:
            t = torch.cat([t, t.new_zeros((rows - t.shape[0],) + tuple(t.shape[1:]))])
        return t[shard.span(rows)].contiguous()
    D = config.head_dim
    if kind == "heads":
        return t[shard.span(config.num_heads)].contiguous()
    if kind == "qkv":
        q, kv = config.num_heads * D, config.num_kv_heads * D
        heads = shard.span(config.num_heads)
        kv_heads = shard.kv_heads(config)
        return torch.cat([t[heads.start * D:heads.stop * D],
                          t[q + kv_heads.start * D:q + kv_heads.stop * D],
                          t[q + kv + kv_heads.start * D:q + kv + kv_heads.stop * D]]).contiguous()
    n = t.shape[dim]
    if kind == "gate_up" and config.gate_up_layout == "concat":
        gate, up = t.split(n // 2, dim=dim)
        part = shard.span(n // 2)
        return torch.cat([gate.narrow(dim, part.start, part.stop - part.start),
                          up.narrow(dim, part.start, part.stop - part.start)], dim=dim)
    part = shard.span(n)  # row, down, or gate/up interleaved: contiguous pairs
    return t.narrow(dim, part.start, part.stop - part.start).contiguous()


def _pad_intermediate(t: torch.Tensor, dim: int, ratio: float, fill: int,
                      halves: bool) -> torch.Tensor:
    """`t` with its intermediate dimension `dim` grown by `ratio` (each half when `halves`)."""
    def grow(part: torch.Tensor) -> torch.Tensor:
        extra = list(part.shape)
        extra[dim] = round(part.shape[dim] * ratio) - part.shape[dim]
        return torch.cat([part, torch.full(extra, fill, dtype=part.dtype)], dim=dim)

    if halves:
        return torch.cat([grow(h) for h in t.split(t.shape[dim] // 2, dim=dim)], dim=dim)
    return grow(t)
