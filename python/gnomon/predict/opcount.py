"""FLOPs, bytes and kernel launches of every op in one step, the features every predictor uses.

`step_ops(shape)` lists the ops the engine's runner runs for a `StepShape` (per GPU of ``tp``),
each layer's ops already multiplied by the number of layers that share their cost: the
architecture's own ops (`dense_ops`: its module's ``step_ops`` over `gnomon.costing`'s
vocabulary, which states how each is counted) and the attention, which depends on each
sequence's context: query ``j`` of ``n`` new tokens after ``c`` cached ones attends
``min(c + j + 1, window)`` keys (2 FLOPs per key element for QK and 2 for PV) and reads the KV
of the union of its queries' windows, in the KV cache's dtype (`ModelSpec.kv_bytes`). A model
with Multi-head Latent Attention counts it as `gnomon.engine.models.mla` states.
"""

from __future__ import annotations

import functools
from typing import List, Tuple

from gnomon.engine import models
from gnomon.engine.models import mla
from gnomon.costing import Op, StepOps, kv_heads_per_gpu

from .shapes import ModelSpec, StepShape

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
    return list(dense_ops(shape.model, shape.num_tokens, shape.num_sampled, shape.tp,
                          shape.ep, shape.dp, shape.dp_tokens)) + attention_ops(shape)


def attention_ops(shape: StepShape) -> List[Op]:
    spec, c, tp = shape.model, shape.model.config, shape.tp
    if c.mla is not None:  # its decode and prefill forms differ (gnomon.engine.models.mla)
        width = 1 + shape.draft_tokens  # a decode's tokens: its last and the drafts it verifies
        if shape.num_prefill_tokens:
            decode = [r for r in shape.requests if r[0] == width and r[1] > 0]
            prefill = [r for r in shape.requests if not (r[0] == width and r[1] > 0)]
        else:  # a decode step (every DP group's, most steps)
            decode, prefill = shape.requests, ()
        return mla.attention_ops(c, tp, spec.pricing, spec.kv_bytes,
                                 (len(decode) * width, *attention_sums(decode, NO_WINDOW)),
                                 (sum(n for n, _ in prefill),
                                  *attention_sums(prefill, NO_WINDOW)))
    a, T, ckv = spec.dtype_bytes, shape.num_tokens, spec.kv_bytes
    kv_dtype = spec.kv_dtype or spec.dtype
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
                      rows=k // T if T else 0, depth=d, kv_dtype=kv_dtype))
    return ops


@functools.lru_cache(maxsize=4096)
def dense_ops(spec: ModelSpec, T: int, R: int, tp: int, ep: int = 1, dp: int = 1,
              X: int = 0) -> Tuple[Op, ...]:
    """The ops that depend only on the step's token count T, sampled rows R and, under
    attention data parallelism, the X tokens of all groups, as the architecture's module lists
    them (cached: decode steps repeat the same few)."""
    step = StepOps(spec.config, spec.pricing, tp, T, R, ep, dp, X)
    models.model_module(spec.config.architecture).step_ops(step)
    return tuple(step.ops)
