"""Mixtral (``MixtralForCausalLM``): a softmax-then-top-k Mixture of Experts, and the sliding
window on every layer when the config sets one."""

from __future__ import annotations

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


# ---- weights -------------------------------------------------------------------------------

def mlp_shapes(config, mxfp4: bool) -> dict:
    H, I, E = config.hidden_size, config.intermediate_size, config.num_experts
    return {"router": (E, H), "w13": (E, 2 * I, H), "w2": (E, H, I)}


# How tensor parallelism splits them (`gnomon.engine.weights.shard_weights`): kind and dim.
# Experts are split on their intermediate dimension, not across ranks; the router is replicated.
MLP_SHARDING = {"router": ("replicate", None), "w13": ("gate_up", -2), "w2": ("row", -1)}


def load_mlp(read, config, i: int, mxfp4: bool) -> dict:
    """``router``: ``block_sparse_moe.gate``; ``w13[e]``: expert e's ``w1`` (gate) rows, then its
    ``w3`` (up) rows; ``w2[e]``: its ``w2``. A rank reads its rows of w1 and w3 and its columns
    of w2, for every expert."""
    import torch

    H, I, E = config.hidden_size, config.intermediate_size, config.num_experts
    moe = f"model.layers.{i}.block_sparse_moe."
    experts = [moe + f"experts.{e}." for e in range(E)]
    rows, columns = ("span", 0), ("span", 1)
    router = read.dense(moe + "gate.weight", (E, H))
    w13 = torch.stack([torch.cat([read.dense(x + "w1.weight", (I, H), rows),
                                  read.dense(x + "w3.weight", (I, H), rows)]) for x in experts])
    w2 = torch.stack([read.dense(x + "w2.weight", (H, I), columns) for x in experts])
    return {"router": router, "w13": w13, "w2": w2}


# ---- cost ----------------------------------------------------------------------------------

def step_ops(ops) -> None:
    """The step's ops as the forward runs them (`gnomon.engine.cost.StepOps`)."""
    ops.decoder(ops.moe)


# ---- forward -------------------------------------------------------------------------------

def forward_layer(runner, i, h, residual, inputs, tick):
    from .layers import decoder_layer, moe
    return decoder_layer(runner, i, h, residual, inputs, tick, moe)
