"""Multi-head Latent Attention (MLA, DeepSeek-V2/V3's and the models built on them): its geometry,
weight table and cost, shared by every architecture that uses it. Torch-free. gnomon's engine has
no MLA kernel, so an architecture with MLA is simulation only (its module says so).

Geometry (`MLA`). Queries go through a low-rank projection (``q_a``, ``q_lora_rank`` wide, then an
RMSNorm, then ``q_b`` to the heads; no ``q_a`` when ``q_lora_rank`` is 0). Keys and values are
compressed into one latent per token: ``kv_a`` projects the hidden state to ``kv_lora_rank``
elements (RMSNorm'd) plus one ``qk_rope_head_dim`` rotary key shared by every head. The KV cache
holds that latent, ``kv_lora_rank + qk_rope_head_dim`` elements per token per layer (576 for
DeepSeek-V3), as one head. ``kv_b`` up-projects a latent to every head's ``qk_nope_head_dim`` key
part and ``v_head_dim`` value.

Tensor parallelism splits the heads (``q_b``, ``kv_b`` and ``o``'s columns); ``q_a``, ``kv_a``
and the latent cache are replicated on every rank, as vLLM's and SGLang's MLA backends keep them.

Counting (per GPU of ``tp``; ``hq`` the rank's heads; the serving engines' two forms, as vLLM's
MLA backends and FlashMLA run them):

- the projections (`projection_ops`, which depend on the step's token count only): the fused
  ``q_a`` and ``kv_a`` GEMM (one, as vLLM fuses them), their norms, ``q_b``, the rotary embedding
  of the query's and the latent's rotary parts, and ``o``;
- decode tokens (one new token after a cached context; `attention_ops`) run the *absorbed* form:
  each head's ``q_nope`` is projected into the latent space through ``kv_b``'s key part
  (``W_UK``), attention runs over the latent with one KV head (QK over ``kv_lora_rank +
  qk_rope_head_dim``, PV over ``kv_lora_rank``), and the output goes back through ``kv_b``'s value
  part (``W_UV``). The two absorbed GEMMs are batched per head and read ``W_UK`` / ``W_UV`` in the
  activation dtype (vLLM dequantises them at load). Each distinct cached key's latent is read
  once;
- prefill tokens (a prompt or a chunk of one) run the *naive* form: ``kv_b`` up-projects the
  latent of every key the chunk attends (cached and new) to per-head keys and values, then
  attention runs at ``qk_nope + qk_rope`` for QK and ``v_head_dim`` for PV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from gnomon.costing import Op


@dataclass(frozen=True)
class MLA:
    """MLA's widths (module docstring); ``q_lora_rank`` 0 for a direct query projection."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def latent(self) -> int:
        """Elements the KV cache holds per token per layer."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def read(r) -> MLA:
    """`MLA` from a config.json (`gnomon.engine.config_json.ConfigReader` ``r``)."""
    m = MLA(q_lora_rank=r.optional("q_lora_rank", 0), kv_lora_rank=r.required("kv_lora_rank"),
            qk_nope_head_dim=r.required("qk_nope_head_dim"),
            qk_rope_head_dim=r.required("qk_rope_head_dim"), v_head_dim=r.required("v_head_dim"))
    for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if getattr(m, name) < 1:
            r.fail(f"{name} must be >= 1, got {getattr(m, name)}")
    if m.q_lora_rank < 0:
        r.fail(f"q_lora_rank must be >= 0 or null, got {m.q_lora_rank}")
    return m


# ---- weights -------------------------------------------------------------------------------

# How tensor parallelism splits them: the heads' projections by heads, the rest replicated.
SHARDING = {"attn_norm": ("replicate", None), "mlp_norm": ("replicate", None),
            "q_a": ("replicate", None), "q_a_norm": ("replicate", None), "q": ("heads", 0),
            "q_b": ("heads", 0), "kv_a": ("replicate", None), "kv_a_norm": ("replicate", None),
            "kv_b": ("heads", 0), "o": ("row", -1)}


def shapes(config) -> dict:
    """A layer's norms and MLA weights: ``q_a`` [q_lora_rank, H] and ``q_a_norm``, ``q_b``
    [heads x (nope + rope), q_lora_rank] (or ``q`` [heads x (nope + rope), H]), ``kv_a``
    [latent, H], ``kv_a_norm`` [kv_lora_rank], ``kv_b`` [heads x (nope + v), kv_lora_rank] and
    ``o`` [H, heads x v]."""
    c, m = config, config.mla
    H, heads = c.hidden_size, c.num_heads
    out = {"attn_norm": (H,)}
    if m.q_lora_rank:
        out.update(q_a=(m.q_lora_rank, H), q_a_norm=(m.q_lora_rank,),
                   q_b=(heads * m.qk_head_dim, m.q_lora_rank))
    else:
        out["q"] = (heads * m.qk_head_dim, H)
    out.update(kv_a=(m.latent, H), kv_a_norm=(m.kv_lora_rank,),
               kv_b=(heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
               o=(H, heads * m.v_head_dim), mlp_norm=(H,))
    return out


# ---- cost ----------------------------------------------------------------------------------

def projection_ops(ops) -> None:
    """Every layer's norms and MLA projections around its attention (`gnomon.costing.StepOps`
    ``ops``; module docstring)."""
    c, m, T, a = ops.config, ops.config.mla, ops.T, ops.pricing.activation_bytes
    H, hq = c.hidden_size, c.num_heads // ops.tp
    ops.elementwise("rms_norm", 2 * 4 * T * H * a, 2)
    if m.q_lora_rank:
        ops.gemm("gemm", "fused_qkv_a_proj", H, m.q_lora_rank + m.latent)
        ops.elementwise("q_a_kv_a_norm", 2 * T * (m.q_lora_rank + m.kv_lora_rank) * a, 2)
        ops.gemm("gemm", "q_b_proj", m.q_lora_rank, hq * m.qk_head_dim)
    else:
        ops.gemm("gemm", "q_proj", H, hq * m.qk_head_dim)
        ops.gemm("gemm", "kv_a_proj", H, m.latent)
        ops.elementwise("kv_a_norm", 2 * T * m.kv_lora_rank * a, 1)
    ops.elementwise("rotary_embedding", 2 * T * (hq + 1) * m.qk_rope_head_dim * a, 1)
    ops.gemm("gemm", "o_proj", hq * m.v_head_dim, H)


def attention_ops(config, tp: int, pricing, kv_bytes: float, decode: Tuple[int, int, int],
                  prefill: Tuple[int, int, int]) -> List[Op]:
    """The step's KV write and attention (module docstring), in `pricing`'s dtypes
    (`gnomon.costing.Pricing`; the prefill's ``kv_b`` in the linear dtype). `decode` and
    `prefill` are ``(tokens, keys attended, distinct keys read)`` of the step's decode and
    prefill sequences (`gnomon.predict.opcount.attention_sums`)."""
    m, L, a = config.mla, config.num_layers, pricing.activation_bytes
    hq, rank, nope, v = config.num_heads // tp, m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim
    T = decode[0] + prefill[0]
    ops = [Op("attention", "mla_cache_write", 0.0, L * T * m.latent * (a + kv_bytes), L)]
    D, keys, reads = decode
    if D:
        ops.append(Op("gemm", "mla_absorb_q", L * 2.0 * D * hq * nope * rank,
                      L * (hq * nope * rank * a + D * hq * (nope + rank) * a), L,
                      rows=D, depth=nope))
        ops.append(Op("attention", "mla_decode", L * 2.0 * hq * (m.latent + rank) * keys,
                      L * (reads * m.latent * kv_bytes + D * hq * (m.latent + rank) * a), L,
                      rows=keys // D, depth=m.latent))
        ops.append(Op("gemm", "mla_absorb_out", L * 2.0 * D * hq * rank * v,
                      L * (hq * rank * v * a + D * hq * (rank + v) * a), L, rows=D, depth=rank))
    P, keys, reads = prefill
    if P:
        width = hq * (nope + v)
        ops.append(Op("gemm", "kv_b_proj", L * 2.0 * reads * rank * width,
                      L * (width * rank * pricing.linear_bytes + reads * rank * kv_bytes
                           + reads * width * a), L, pricing.linear_compute, rows=reads,
                      depth=rank))
        ops.append(Op("attention", "mla_prefill", L * 2.0 * hq * (m.qk_head_dim + v) * keys,
                      L * (reads * hq * (m.qk_head_dim + v) * a + P * hq * (m.qk_head_dim + v) * a),
                      L, rows=keys // P, depth=m.qk_head_dim))
    return ops
