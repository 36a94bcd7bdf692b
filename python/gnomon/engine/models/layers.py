"""The forward pieces the architecture modules compose: a pre-norm decoder layer around an
attention block over the paged KV cache, and the dense or Mixture-of-Experts MLPs. Each takes
the `ModelRunner` (its weights, config, KV caches and RoPE table) and the step's inputs, and
charges each op group's time to its family through ``tick``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gnomon import ops


def decoder_layer(runner, i: int, h: torch.Tensor, residual, inputs, tick, mlp, qk=None):
    """Layer ``i``: rms_norm (fused with the residual add from the second layer on), attention
    (`attention`, with ``qk``), O projection, rms_norm (fused residual), then
    ``mlp(runner, i, x, tick)``. Returns ``(h, residual)``."""
    c, w, p = runner.config, runner.weights, f"layers.{i}."
    if residual is None:
        residual = h
        x = ops.rms_norm(h, w[p + "attn_norm"], c.rms_norm_eps)
    else:
        x = ops.rms_norm(h, w[p + "attn_norm"], c.rms_norm_eps, residual=residual)
    tick("elementwise")
    attn = attention(runner, i, x, inputs, tick, qk)
    h = F.linear(attn, w[p + "o"], w.get(p + "o_bias"))
    tick("gemm")
    h = runner.reduce(h, tick)
    x = ops.rms_norm(h, w[p + "mlp_norm"], c.rms_norm_eps, residual=residual)
    tick("elementwise")
    return runner.reduce(mlp(runner, i, x, tick), tick), residual


def attention(runner, i: int, x: torch.Tensor, inputs, tick, qk=None) -> torch.Tensor:
    """QKV projection (+bias), ``qk(runner, i, q, k) -> (q, k)`` where the architecture
    transforms Q and K (``[T, heads, D]``) before RoPE, rotary embedding, the new K/V into layer
    ``i``'s cache through its KV-cache group's slots, and one paged_attention for the whole mixed
    batch (sliding window and sinks where the layer has them); returns ``[T, Hq * D]`` (this
    rank's heads: ``local``)."""
    c, w, p = runner.local, runner.weights, f"layers.{i}."
    num_tokens = x.shape[0]
    hq, hkv, d = c.num_heads, c.num_kv_heads, c.head_dim
    qkv = F.linear(x, w[p + "qkv"], w.get(p + "qkv_bias"))
    tick("gemm")
    # views into qkv, no copies: the ops take rows (tokens) any stride apart
    q = qkv[:, :c.q_size].view(num_tokens, hq, d)
    k = qkv[:, c.q_size:c.q_size + c.kv_size].view(num_tokens, hkv, d)
    v = qkv[:, c.q_size + c.kv_size:].view(num_tokens, hkv, d)
    if qk is not None:
        q, k = qk(runner, i, q, k)
        tick("elementwise")
    ops.rotary_embedding(inputs["positions"], q, k, runner.cos_sin_cache)
    tick("elementwise")
    group, position = runner.layer_slots[i]
    k_cache, v_cache = runner.kv_caches[position]
    ops.reshape_and_cache(k, v, k_cache, v_cache, inputs["slot_mapping"][group])
    out = ops.paged_attention(q, k_cache, v_cache, inputs["block_tables"][group],
                              inputs["seq_lens"], inputs["query_start_loc"],
                              scale=runner.scale, sliding_window=runner.windows[i],
                              sinks=w.get(p + "sinks"))
    tick("attention")
    return out.reshape(num_tokens, hq * d)


def gated_mlp(runner, i: int, x: torch.Tensor, tick, activation=F.silu) -> torch.Tensor:
    """The dense gated MLP: ``w2 @ (activation(gate) * up)``, gate and up the two halves of
    ``w13``'s output (SwiGLU with the default `activation`)."""
    w, p = runner.weights, f"layers.{i}."
    gate, up = F.linear(x, w[p + "w13"]).chunk(2, dim=-1)
    tick("gemm")
    act = activation(gate) * up
    tick("elementwise")
    out = F.linear(act, w[p + "w2"])
    tick("gemm")
    return out


def moe(runner, i: int, x: torch.Tensor, tick) -> torch.Tensor:
    """Router matmul (+bias), top-k routing and one fused_moe over the layer's experts (dense or
    MXFP4), with the config's routing, activation and gate/up layout."""
    c, w, p = runner.config, runner.weights, f"layers.{i}."
    logits = F.linear(x, w[p + "router"], w.get(p + "router_bias"))
    topk_w, topk_ids = ops.topk_routing(logits, c.top_k, mode=c.routing)
    out = ops.fused_moe(x, w[p + "w13"], w[p + "w2"], topk_w, topk_ids,
                        activation=c.activation, gate_up_layout=c.gate_up_layout,
                        w13_bias=w.get(p + "w13_bias"), w2_bias=w.get(p + "w2_bias"),
                        w13_scales=w.get(p + "w13_scales"), w2_scales=w.get(p + "w2_scales"))
    tick("moe")
    return out
