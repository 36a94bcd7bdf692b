"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3's attention (per-head Q/K norms) and a
softmax-then-top-k Mixture of Experts with the top-k weights renormalised
(``norm_topk_prob``), its experts ``moe_intermediate_size`` wide, on every layer."""

from __future__ import annotations

from . import common, qwen3

ARCHITECTURE = "Qwen3MoeForCausalLM"

# ---- config.json ---------------------------------------------------------------------------

DEFAULTS = qwen3.DEFAULTS  # transformers' Qwen3MoeConfig has Qwen3Config's
ROPE_SCALING = qwen3.ROPE_SCALING
MXFP4_TENSOR = None


def config_fields(r, base) -> dict:
    r.require_silu_mlp()
    qwen3.check_full_attention(r)
    experts = r.required("num_experts")
    top_k = r.experts_per_token("num_experts_per_tok", experts)
    if not r.optional("norm_topk_prob", False, bool):
        r.fail("norm_topk_prob=false (top-k weights left unnormalised) is not supported")
    if r.optional("decoder_sparse_step", 1) != 1 or r.raw.get("mlp_only_layers"):
        r.fail("decoder_sparse_step other than 1 or a non-empty mlp_only_layers (dense layers "
               "among the MoE ones) is not supported")
    return dict(head_dim=r.head_dim(), attention_bias=r.optional("attention_bias", False, bool),
                intermediate_size=r.required("moe_intermediate_size"), num_experts=experts,
                top_k=top_k, routing="softmax_topk", layer_types=("full",) * base["num_layers"],
                sliding_window=None, has_sinks=False, activation="silu", gate_up_layout="concat")


PRESETS = {
    # Qwen/Qwen3-235B-A22B config.json (Hugging Face hub; aiconfigurator-core 0.12.0 ships it
    # as model_configs/Qwen--Qwen3-235B-A22B_config.json)
    "qwen3-235b-a22b": {
        "architectures": [ARCHITECTURE], "vocab_size": 151936, "hidden_size": 4096,
        "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "num_hidden_layers": 94, "num_attention_heads": 64,
        "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu",
        "attention_bias": False, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "rope_scaling": None, "max_position_embeddings": 40960, "max_window_layers": 94,
        "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": False,
        "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"},
    # 4 experts of 32 (top-2)
    "tiny-qwen3-moe": common.tiny(ARCHITECTURE, rms_norm_eps=1e-6, rope_theta=10000.0,
                                  moe_intermediate_size=32, num_experts=4,
                                  num_experts_per_tok=2, norm_topk_prob=True),
}

# ---- weights -------------------------------------------------------------------------------

SHARDING = {**common.ATTENTION_SHARDING, **qwen3.HEAD_NORM_SHARDING,
            **common.STACKED_EXPERT_SHARDING}


def layer_shapes(config, mxfp4: bool) -> dict:
    return {**common.attention_shapes(config), **qwen3.head_norm_shapes(config),
            **common.stacked_expert_shapes(config)}


def load_layer(read, config, i: int, mxfp4: bool) -> dict:
    """``router``: ``mlp.gate``; ``w13[e]`` / ``w2[e]``: ``mlp.experts.{e}.gate_proj`` and
    ``up_proj`` rows / ``down_proj``."""
    mlp = f"model.layers.{i}.mlp."
    return {**common.load_attention(read, config, i), **qwen3.load_head_norms(read, config, i),
            **common.load_stacked_experts(read, config, mlp + "gate.weight", mlp + "experts.",
                                          ("gate_proj", "up_proj", "down_proj"))}


# ---- cost ----------------------------------------------------------------------------------

def step_ops(ops) -> None:
    """The step's ops as the forward runs them (`gnomon.costing.StepOps`)."""
    ops.decoder(ops.moe, after_qkv=qwen3.head_norm_ops)


# ---- forward -------------------------------------------------------------------------------

def forward_layer(model, i, h, residual, step, kv, tick):
    from .layers import decoder_layer, moe
    return decoder_layer(model, i, h, residual, step, kv, tick, moe, qk=qwen3.head_norms)
