"""FLOPs, bytes and kernel launches of every op in one step, the features every predictor uses.

`step_ops(shape)` lists the ops the engine's runner runs for a `StepShape` (per GPU of ``tp``),
each layer's ops already multiplied by the number of layers that share their cost. Counting:

- activations in the model's dtype; linear weights in `ModelSpec.linear_dtype` (FP8 one byte,
  its math FP8; NVFP4 4.5 and MXFP4 4.25 bits, their math FP4), MXFP4 experts 4.25 bits;
  embedding, router and lm_head in the model's dtype; the KV cache in `ModelSpec.kv_bytes` per
  element;
- GEMMs read their weights once and their input and output activations once;
- attention counts each sequence's own keys: query ``j`` of ``n`` new tokens after ``c`` cached
  ones attends ``min(c + j + 1, window)`` keys (2 FLOPs per key element for QK and 2 for PV) and
  reads the KV of the union of its queries' windows;
- MoE reads the expected number of distinct experts under uniform routing,
  ``E (1 - (1 - k/E)^T)`` for T tokens, and computes ``k`` experts per token, in two grouped
  GEMMs (w13 with K = hidden, w2 with K = intermediate / tp);
- lm_head, the final norm and sampling run only on the sequences that sample;
- with ``tp > 1`` what the engine's runner does: an all-reduce of the hidden states after the
  vocab-parallel embedding and two per layer (after the attention and after the MLP), and an
  all-gather of the sampled rows' float32 logits (the vocabulary padded to a multiple of tp),
  each counted as the bytes one rank sends in a ring (`ring_bytes`, `Op.comm_bytes`).
"""

from __future__ import annotations

import functools
from typing import List, NamedTuple, Tuple

from .shapes import ModelSpec, StepShape, kv_heads_per_gpu

LOGITS_BYTES = 4  # lm_head's output is float32


class Op(NamedTuple):  # a tuple: attention builds a few per step, 6x faster than a dataclass
    family: str  # one of cost.FAMILIES
    name: str
    flops: float
    bytes: float
    launches: int
    compute: str = "bfloat16"  # the math the FLOPs run in: "bfloat16", "fp8" or "fp4"
    comm_bytes: float = 0.0  # bytes one rank sends (communication ops only; `ring_bytes`)
    collectives: int = 0
    rows: int = 0  # what the kernel's efficiency depends on: a GEMM's M, the tokens per expert
    # of a grouped MoE GEMM, the keys per query of attention; 0 where nothing does
    depth: int = 0  # a GEMM's K (attention: the head dim)


COLLECTIVES = ("all_reduce", "all_gather")


def ring_bytes(collective: str, payload: float, ranks: int) -> float:
    """The bytes one of `ranks` sends in a ring `collective` of `payload` bytes (all-reduce: the
    tensor each rank holds, ``2 (n - 1) / n`` of it; all-gather: the gathered tensor,
    ``(n - 1) / n``), what a link's bandwidth bounds (nccl-tests' bus bandwidth)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective: expected one of {', '.join(COLLECTIVES)}, got "
                         f"{collective!r}")
    share = (ranks - 1) / ranks
    return (2 * share if collective == "all_reduce" else share) * payload


NO_WINDOW = 1 << 40  # a window no context reaches: full attention


def attention_sums(requests, window: int) -> Tuple[int, int]:
    """``(keys attended, distinct keys read)`` summed over the ``(new, cached)`` pairs, for one
    attention window (`NO_WINDOW` for full attention). The query at position p attends
    ``min(p + 1, window)`` keys; the n new queries after c cached tokens read the union of
    their windows, ``min(c + n, window + n - 1)`` keys. A plain loop: compiled (opcount.pxd
    types it), it costs nanoseconds per sequence."""
    keys = reads = 0
    for n, c in requests:
        m = c + n
        t1 = m if m < window else window  # sum(min(j, window) for j in 1..m) ...
        t0 = c if c < window else window  # ... minus the same through c
        keys += t1 * (t1 + 1) // 2 + (m - t1) * window - t0 * (t0 + 1) // 2 - (c - t0) * window
        union = window + n - 1
        reads += m if m < union else union
    return keys, reads


def step_ops(shape: StepShape) -> List[Op]:
    """Every op of the step: `dense_ops` (which depend only on the token counts) and
    `attention_ops` (which depend on each sequence's context)."""
    return list(dense_ops(shape.model, shape.num_tokens, shape.num_sampled, shape.tp)) + \
        attention_ops(shape)


def attention_ops(shape: StepShape) -> List[Op]:
    spec, c, tp = shape.model, shape.model.config, shape.tp
    a, T, ckv = spec.dtype_bytes, shape.num_tokens, spec.kv_bytes
    q = c.q_size // tp
    kv = kv_heads_per_gpu(c, tp) * c.head_dim
    hq, d = c.num_heads // tp, c.head_dim
    ops: List[Op] = []
    for window, layers in spec.attention_groups:
        k, kv_read = attention_sums(shape.requests, NO_WINDOW if window is None else window)
        ops.append(Op("attention", "reshape_and_cache", 0.0,
                      layers * 2 * T * kv * (a + ckv), layers))
        # rows: keys per query, the context the kernel's efficiency depends on; depth: the
        # head dim, the K of its QK^T
        ops.append(Op("attention", "paged_attention" + (f"[window {window}]" if window else ""),
                      layers * 4.0 * hq * d * k,
                      layers * (2 * kv_read * kv * ckv + 2 * T * q * a), layers,
                      rows=k // T if T else 0, depth=d))
    return ops


@functools.lru_cache(maxsize=4096)
def dense_ops(spec: ModelSpec, T: int, R: int, tp: int) -> Tuple[Op, ...]:
    """The ops that depend only on the step's token count T and sampled rows R (cached: decode
    steps repeat the same few)."""
    c = spec.config
    a, w = spec.dtype_bytes, spec.linear_bytes
    linear = spec.linear_compute
    L, H = c.num_layers, c.hidden_size
    q = c.q_size // tp
    kv = kv_heads_per_gpu(c, tp) * c.head_dim
    ops: List[Op] = []

    def gemm(family, name, m, k, n, layers=L, weight_bytes=w, compute=linear):
        ops.append(Op(family, name, layers * 2.0 * m * k * n,
                      layers * (k * n * weight_bytes + m * k * a + m * n * a), layers, compute,
                      rows=m, depth=k))

    def elementwise(name, nbytes, launches, layers=L):
        ops.append(Op("elementwise", name, 0.0, layers * nbytes, layers * launches))

    elementwise("embedding", 2 * T * H * a, 1, layers=1)
    elementwise("rms_norm", 2 * 4 * T * H * a, 2)  # two per layer, residual fused
    gemm("gemm", "qkv_proj", T, H, q + 2 * kv)
    elementwise("rotary_embedding", 2 * T * (q + kv) * a, 1)
    gemm("gemm", "o_proj", T, q, H)

    if c.is_moe:
        E, k, I = c.num_experts, c.top_k, c.intermediate_size // tp
        gemm("moe", "router", T, H, E, weight_bytes=a, compute="bfloat16")
        ops.append(Op("moe", "topk_routing", L * 5.0 * T * E, L * (T * E * a + 2 * T * k * 4),
                      L))
        distinct = E * (1.0 - (1.0 - k / E) ** T) if T else 0.0
        weights = distinct * H * I * spec.expert_bytes_per_param
        experts = "fp4" if spec.mxfp4_experts else linear
        per_expert = round(T * k / distinct) if T else 0  # the grouped GEMMs' M
        # the two grouped GEMMs of the fused MoE: w13 (K = H) and, after the activation, w2
        ops.append(Op("moe", "fused_moe[w13]", L * 2.0 * T * k * 2 * I * H,
                      L * (2 * weights + T * H * a + T * k * 2 * I * a), L, experts,
                      rows=per_expert, depth=H))
        ops.append(Op("moe", "fused_moe[w2]", L * 2.0 * T * k * I * H,
                      L * (weights + T * k * I * a + T * H * a), L, experts,
                      rows=per_expert, depth=I))
    else:
        I = c.intermediate_size // tp
        gemm("gemm", "gate_up_proj", T, H, 2 * I)
        elementwise("silu_and_mul", 3 * T * I * a, 1)
        gemm("gemm", "down_proj", T, I, H)

    if tp > 1:
        reduces = 2 * L + 1
        ops.append(Op("communication", "all_reduce", 0.0, 0.0, reduces,
                      comm_bytes=reduces * ring_bytes("all_reduce", T * H * a, tp),
                      collectives=reduces))
    if R:
        elementwise("final_norm", 4 * R * H * a, 1, layers=1)
        V = c.vocab_size // tp
        ops.append(Op("gemm", "lm_head", 2.0 * R * H * V,
                      H * V * a + R * H * a + R * V * LOGITS_BYTES, 1, rows=R, depth=H))
        ops.append(Op("sampling", "sample", 5.0 * R * c.vocab_size,
                      3 * R * c.vocab_size * LOGITS_BYTES, 2))
        if tp > 1:
            ops.append(Op("communication", "all_gather", 0.0, 0.0, 1, comm_bytes=ring_bytes(
                "all_gather", R * -(-c.vocab_size // tp) * tp * LOGITS_BYTES, tp),
                collectives=1))
    return tuple(ops)
