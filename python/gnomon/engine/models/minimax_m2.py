"""MiniMax-M2 (``MiniMaxM2ForCausalLM``; MiniMax-M2.1, M2.5 and M2.7 share it): grouped-query
attention on every layer (``head_dim`` wide heads, no bias) whose Q and K projections each pass
one RMSNorm over their whole width before RoPE (``use_qk_norm`` with ``qk_norm_type``
"per_layer": a weight per element of all the heads, not Qwen3's per-head norm), RoPE on the first
``rotary_dim`` of each head; and on every layer a Mixture of ``num_local_experts`` experts
``intermediate_size`` wide: sigmoid scores, the top ``num_experts_per_tok`` of the scores plus a
per-expert routing bias (``use_routing_bias``, ``e_score_correction_bias``), their unbiased scores
renormalised; DeepSeek-V3's routing with one group and no scaling factor, hence its ``routing``
name. No shared experts, no dense layers.

Simulation only: gnomon's engine has no routing kernel for sigmoid scores with a bias, takes no
partial rotary dim, and has no norm that spans the tensor-parallel ranks. The checkpoints'
multi-token-prediction modules (``use_mtp``, ``num_mtp_modules``) serve speculative decoding:
a simulation with ``num_speculative_tokens`` prices one more layer of this shape as its drafter
(`gnomon.predict.simulated.SimulatedRunner`); their weights and KV are not counted in the
memory.

Cost assumptions:

- the Q/K norms are one elementwise op after the QKV projection that reads and writes this GPU's
  Q and K rows and reads their norm weights (as wide as one token's Q and K); with ``tp > 1``
  each rank holds only its heads' part of the normalised width, so the sum of squares is
  all-reduced, one all-reduce per layer of the T tokens' two float32 sums (Q's and K's together,
  as vLLM's and SGLang's MiniMax-M2 do);
- the rotary embedding is priced over the whole head (`gnomon.costing.StepOps`' rotary op):
  it touches only ``rotary_dim`` of the ``head_dim`` values (half, on MiniMax-M2.5), a known
  over-count of an elementwise op of a few kilobytes per decode token and layer;
- the router is priced in the model's dtype (`gnomon.costing.StepOps.moe`); vLLM runs it in
  float32, a known under-count of ``H x E`` x 2 bytes per layer (1.5 MiB on MiniMax-M2.5,
  about 0.1 GB per step);
- routing is balanced, so a step of T tokens reads ``E (1 - (1 - k/E)^T)`` distinct experts
  (`gnomon.costing.StepOps.moe`), as for DeepSeek-V3."""

from __future__ import annotations

from gnomon.costing import Op, ring_bytes

from . import common

ARCHITECTURE = "MiniMaxM2ForCausalLM"
SIMULATION_ONLY = (f"{ARCHITECTURE}: simulation only; the engine has no kernel for its "
                   f"sigmoid routing with a bias, its partial rotary embedding or its Q/K norm "
                   f"across tensor-parallel ranks")

# ---- config.json ---------------------------------------------------------------------------

# transformers' MiniMaxM2Config defaults
DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 5000000.0, "max_position_embeddings": 196608}
ROPE_SCALING = ()
MXFP4_TENSOR = None
SUM_BYTES = 4  # the norms' sums of squares are float32


def config_fields(r, base) -> dict:
    r.require_silu_mlp()
    head_dim = r.head_dim()
    experts = r.required("num_local_experts")
    top_k = r.experts_per_token("num_experts_per_tok", experts)
    scoring = r.raw.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        r.fail(f"scoring_func must be 'sigmoid', got {scoring!r}")
    if not r.optional("use_routing_bias", True, bool):
        r.fail("use_routing_bias=false (sigmoid routing without the score-correction bias) is "
               "not supported")
    if not r.optional("use_qk_norm", True, bool):
        r.fail("use_qk_norm=false is not supported")
    norm = r.raw.get("qk_norm_type", "per_layer")
    if norm != "per_layer":
        r.fail(f"qk_norm_type must be 'per_layer' (one norm over all the heads), got {norm!r}")
    if r.optional("shared_intermediate_size", 0):
        r.fail("shared_intermediate_size other than 0 (a shared expert) is not supported")
    attn_types = r.raw.get("attn_type_list")
    if attn_types is not None and any(t != 1 for t in attn_types):
        r.fail("attn_type_list: only full softmax attention (1) on every layer is supported, "
               f"got {attn_types!r}")
    if r.sliding_window() is not None:
        r.fail("sliding_window is not supported (MiniMax-M2 attends in full on every layer)")
    rotary = r.optional("rotary_dim", head_dim)
    if rotary < 2 or rotary % 2 or rotary > head_dim:
        r.fail(f"rotary_dim must be even and in [2, head_dim = {head_dim}], got {rotary}")
    return dict(head_dim=head_dim, attention_bias=r.optional("attention_bias", False, bool),
                num_experts=experts, top_k=top_k, routing="sigmoid_group_topk",
                layer_types=("full",) * base["num_layers"], sliding_window=None,
                has_sinks=False, activation="silu", gate_up_layout="concat")


PRESETS = {
    # MiniMaxAI/MiniMax-M2.5 config.json as aiconfigurator-core 0.12.0 ships it
    # (model_configs/MiniMaxAI--MiniMax-M2.5_config.json), with "torch_dtype": "bfloat16" added:
    # that copy names no dtype, and the checkpoint's unquantised tensors are bfloat16 (its NVFP4
    # re-export, nvidia--MiniMax-M2.5-NVFP4_config.json there, says "dtype": "bfloat16")
    "minimax-m2.5": {
        "architectures": [ARCHITECTURE], "model_type": "minimax_m2", "num_hidden_layers": 62,
        "hidden_size": 3072, "num_attention_heads": 48, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 1536, "vocab_size": 200064,
        "num_experts_per_tok": 8, "num_local_experts": 256, "max_position_embeddings": 196608,
        "rope_theta": 5000000, "rotary_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-06,
        "use_cache": True, "tie_word_embeddings": False, "use_qk_norm": True,
        "qk_norm_type": "per_layer", "use_routing_bias": True, "use_mtp": True,
        "mtp_transformer_layers": 1, "num_mtp_modules": 3, "shared_intermediate_size": 0,
        "scoring_func": "sigmoid",
        "quantization_config": {"quant_method": "fp8", "fmt": "float8_e4m3fn",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                                "modules_to_not_convert": ["gate", "e_score_correction_bias",
                                                           "lm_head"]},
        "auto_map": {"AutoConfig": "configuration_minimax_m2.MiniMaxM2Config",
                     "AutoModelForCausalLM": "modeling_minimax_m2.MiniMaxM2ForCausalLM"},
        "transformers_version": "4.46.1", "torch_dtype": "bfloat16"},
    # 8 experts of 32 (top-2), RoPE on half of each 16-wide head
    "tiny-minimax-m2": common.tiny(
        ARCHITECTURE, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
        rotary_dim=8, use_qk_norm=True, qk_norm_type="per_layer", use_routing_bias=True,
        scoring_func="sigmoid", shared_intermediate_size=0, rms_norm_eps=1e-6,
        rope_theta=10000.0),
}

# ---- weights -------------------------------------------------------------------------------

# ``q_norm`` / ``k_norm`` are split with their heads: a rank holds its query heads' part of
# q_norm and its KV heads' part of k_norm (a contiguous slice while tp divides the KV heads; with
# more ranks than KV heads it would need the replicated head's D values, which no split here
# cuts; simulation only, so nothing loads it)
SHARDING = {**common.ATTENTION_SHARDING, "q_norm": ("row", 0), "k_norm": ("row", 0),
            **common.STACKED_EXPERT_SHARDING, "router_bias": ("replicate", None)}


def layer_shapes(config, mxfp4: bool) -> dict:
    """`common.attention_shapes`, the per-layer norms ``q_norm`` [Hq D] / ``k_norm`` [Hkv D]
    (``self_attn.{q,k}_norm.weight``), then ``router`` [E, H] (``block_sparse_moe.gate``), its
    ``router_bias`` [E] (``block_sparse_moe.e_score_correction_bias``) and the experts' ``w13``
    [E, 2I, H] / ``w2`` [E, H, I] (``block_sparse_moe.experts.{e}.w1`` and ``w3`` rows /
    ``w2``)."""
    c = config
    return {**common.attention_shapes(c), "q_norm": (c.q_size,), "k_norm": (c.kv_size,),
            **common.stacked_expert_shapes(c), "router_bias": (c.num_experts,)}


def load_layer(read, config, i: int, mxfp4: bool) -> dict:
    raise ValueError(SIMULATION_ONLY)


# ---- cost ----------------------------------------------------------------------------------

def qk_norm_ops(ops) -> None:
    """The per-layer RMSNorms of Q and K (the module docstring's cost assumptions): one op that
    reads and writes this GPU's Q and K rows and reads their weights, and with ``tp > 1`` the
    all-reduce of each token's two float32 sums of squares."""
    a, T, tp = ops.pricing.activation_bytes, ops.T, ops.tp
    width = ops.q_width + ops.kv_width
    ops.elementwise("qk_norm", (2 * T + 1) * width * a, 2)
    if tp > 1:
        L = ops.config.num_layers
        ops.ops.append(Op("communication", "all_reduce", 0.0, 0.0, L,
                          comm_bytes=L * ring_bytes("all_reduce", T * 2 * SUM_BYTES, tp),
                          collectives=L, ranks=tp))


def step_ops(ops) -> None:
    """The step's ops (`gnomon.costing.StepOps`): the embedding, every layer's attention
    block with the Q/K norms after its QKV projection and its routed experts, then the tail."""
    ops.decoder(ops.moe, after_qkv=qk_norm_ops)


# ---- forward -------------------------------------------------------------------------------

def forward_layer(model, i, h, residual, step, kv, tick):
    raise ValueError(SIMULATION_ONLY)
