"""The forward pieces the architecture modules compose: a pre-norm decoder layer around an
attention block over the paged KV cache, and the dense or Mixture-of-Experts MLPs, and the
three frozen things they read: the `Model` on this rank (configs, weights, RoPE table, the
all-reduce), the step's `StepInputs`, and each layer's `LayerKV` (its K/V caches, KV-cache group
and window). Each piece charges its op groups' time to their families through ``tick``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from gnomon import ops


@dataclass(frozen=True)
class Model:
    """What a layer's forward reads of the model on this tensor-parallel rank: the full
    ``config`` and this rank's share ``local``, the ``weights`` (gnomon's names), the RoPE
    ``cos_sin_cache``, the attention ``scale``, the rank's ``shard``, and ``reduce(t, tick)``
    (the sum over the ranks of a row-parallel op's output; ``t`` itself on one rank)."""

    config: object
    local: object
    weights: dict
    cos_sin_cache: torch.Tensor
    scale: float
    shard: object
    reduce: Callable


@dataclass(frozen=True)
class StepInputs:
    """One step's input tensors (`gnomon.engine.runner.ModelRunner.prepare`): per token its id,
    position and, per KV-cache group, its cache slot (``slot_mapping`` ``[G, T]``); per sequence
    its block table per group (``block_tables`` ``[G, B, W]``), its length after the step
    (``seq_lens``) and where its tokens start (``query_start_loc``, ``[B + 1]``); and the rows of
    the tokens that sample (``sample_rows``)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    sample_rows: torch.Tensor


@dataclass(frozen=True)
class LayerKV:
    """One layer's handle on the paged KV cache: its K and V cache tensors, the KV-cache
    ``group`` whose slots and block tables it reads from `StepInputs`, and its sliding
    ``window`` (None for full attention)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    group: int
    window: Optional[int]


def decoder_layer(model: Model, i: int, h: torch.Tensor, residual, step: StepInputs,
                  kv: LayerKV, tick, mlp, qk=None):
    """Layer ``i``: rms_norm (fused with the residual add from the second layer on), attention
    (`attention`, with ``qk``), O projection, rms_norm (fused residual), then
    ``mlp(model, i, x, tick)``. Returns ``(h, residual)``."""
    c, w, p = model.config, model.weights, f"layers.{i}."
    if residual is None:
        residual = h
        x = ops.rms_norm(h, w[p + "attn_norm"], c.rms_norm_eps)
    else:
        x = ops.rms_norm(h, w[p + "attn_norm"], c.rms_norm_eps, residual=residual)
    tick("elementwise")
    attn = attention(model, i, x, step, kv, tick, qk)
    h = F.linear(attn, w[p + "o"], w.get(p + "o_bias"))
    tick("gemm")
    h = model.reduce(h, tick)
    x = ops.rms_norm(h, w[p + "mlp_norm"], c.rms_norm_eps, residual=residual)
    tick("elementwise")
    return model.reduce(mlp(model, i, x, tick), tick), residual


def attention(model: Model, i: int, x: torch.Tensor, step: StepInputs, kv: LayerKV, tick,
              qk=None) -> torch.Tensor:
    """QKV projection (+bias), ``qk(model, i, q, k) -> (q, k)`` where the architecture
    transforms Q and K (``[T, heads, D]``) before RoPE, rotary embedding, the new K/V into the
    layer's cache (`LayerKV`) through its group's slots, and one paged_attention for the whole
    mixed batch (sliding window and sinks where the layer has them); returns ``[T, Hq * D]``
    (this rank's heads: ``local``)."""
    c, w, p = model.local, model.weights, f"layers.{i}."
    num_tokens = x.shape[0]
    hq, hkv, d = c.num_heads, c.num_kv_heads, c.head_dim
    qkv = F.linear(x, w[p + "qkv"], w.get(p + "qkv_bias"))
    tick("gemm")
    # views into qkv, no copies: the ops take rows (tokens) any stride apart
    q = qkv[:, :c.q_size].view(num_tokens, hq, d)
    k = qkv[:, c.q_size:c.q_size + c.kv_size].view(num_tokens, hkv, d)
    v = qkv[:, c.q_size + c.kv_size:].view(num_tokens, hkv, d)
    if qk is not None:
        q, k = qk(model, i, q, k)
        tick("elementwise")
    ops.rotary_embedding(step.positions, q, k, model.cos_sin_cache)
    tick("elementwise")
    ops.reshape_and_cache(k, v, kv.k_cache, kv.v_cache, step.slot_mapping[kv.group])
    out = ops.paged_attention(q, kv.k_cache, kv.v_cache, step.block_tables[kv.group],
                              step.seq_lens, step.query_start_loc, scale=model.scale,
                              sliding_window=kv.window, sinks=w.get(p + "sinks"))
    tick("attention")
    return out.reshape(num_tokens, hq * d)


def gated_mlp(model: Model, i: int, x: torch.Tensor, tick, activation=F.silu) -> torch.Tensor:
    """The dense gated MLP: ``w2 @ (activation(gate) * up)``, gate and up the two halves of
    ``w13``'s output (SwiGLU with the default `activation`)."""
    w, p = model.weights, f"layers.{i}."
    gate, up = F.linear(x, w[p + "w13"]).chunk(2, dim=-1)
    tick("gemm")
    act = activation(gate) * up
    tick("elementwise")
    out = F.linear(act, w[p + "w2"])
    tick("gemm")
    return out


def moe(model: Model, i: int, x: torch.Tensor, tick) -> torch.Tensor:
    """Router matmul (+bias), top-k routing and one fused_moe over the layer's experts (dense or
    MXFP4), with the config's routing, activation and gate/up layout."""
    c, w, p = model.config, model.weights, f"layers.{i}."
    logits = F.linear(x, w[p + "router"], w.get(p + "router_bias"))
    topk_w, topk_ids = ops.topk_routing(logits, c.top_k, mode=c.routing)
    out = ops.fused_moe(x, w[p + "w13"], w[p + "w2"], topk_w, topk_ids,
                        activation=c.activation, gate_up_layout=c.gate_up_layout,
                        w13_bias=w.get(p + "w13_bias"), w2_bias=w.get(p + "w2_bias"),
                        w13_scales=w.get(p + "w13_scales"), w2_scales=w.get(p + "w2_scales"))
    tick("moe")
    return out
