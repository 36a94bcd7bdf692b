"""Mixtral (``MixtralForCausalLM``): a softmax-then-top-k Mixture of Experts, and the sliding
window on every layer when the config sets one."""

from __future__ import annotations

from . import common

ARCHITECTURE = "MixtralForCausalLM"

# ---- config.json ---------------------------------------------------------------------------

DEFAULTS = {"rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_position_embeddings": 4096 * 32}
ROPE_SCALING = ()
MXFP4_TENSOR = None


def config_fields(r, base) -> dict:
    r.require_silu_mlp()
    head_dim, bias = r.head_dim(), r.optional("attention_bias", False, bool)
    experts = r.required("num_local_experts")
    top_k = r.experts_per_token("num_experts_per_tok", experts)
    window = r.sliding_window()
    return dict(head_dim=head_dim, attention_bias=bias, num_experts=experts, top_k=top_k,
                routing="softmax_topk",
                layer_types=("sliding" if window else "full",) * base["num_layers"],
                sliding_window=window, has_sinks=False, activation="silu",
                gate_up_layout="concat")


PRESETS = {
    # mistralai/Mixtral-8x7B-v0.1 config.json (Hugging Face hub).
    "mixtral-8x7b": {
        "architectures": [ARCHITECTURE], "vocab_size": 32000, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None,
        "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    },
    "tiny-mixtral": common.tiny(ARCHITECTURE, rope_theta=1e6, num_local_experts=4,
                                num_experts_per_tok=2, sliding_window=None),
}

# ---- weights -------------------------------------------------------------------------------

SHARDING = {**common.ATTENTION_SHARDING, **common.STACKED_EXPERT_SHARDING}


def layer_shapes(config, mxfp4: bool) -> dict:
    return {**common.attention_shapes(config), **common.stacked_expert_shapes(config)}


def load_layer(read, config, i: int, mxfp4: bool) -> dict:
    """``router``: ``block_sparse_moe.gate``; ``w13[e]``: expert e's ``w1`` (gate) rows, then its
    ``w3`` (up) rows; ``w2[e]``: its ``w2``."""
    moe = f"model.layers.{i}.block_sparse_moe."
    return {**common.load_attention(read, config, i),
            **common.load_stacked_experts(read, config, moe + "gate.weight", moe + "experts.",
                                          ("w1", "w3", "w2"))}


# ---- cost ----------------------------------------------------------------------------------

def step_ops(ops) -> None:
    """The step's ops as the forward runs them (`gnomon.costing.StepOps`)."""
    ops.decoder(ops.moe)


# ---- forward -------------------------------------------------------------------------------

def forward_layer(model, i, h, residual, step, kv, tick):
    from .layers import decoder_layer, moe
    return decoder_layer(model, i, h, residual, step, kv, tick, moe)
