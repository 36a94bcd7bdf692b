"""Llama (``LlamaForCausalLM``): full attention, a dense SwiGLU MLP, llama3 RoPE scaling."""

from __future__ import annotations

ARCHITECTURE = "LlamaForCausalLM"

# ---- config.json ---------------------------------------------------------------------------

DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048}
ROPE_SCALING = ("llama3",)
MXFP4_TENSOR = None


def config_fields(r, base) -> dict:
    r.require_silu_mlp()
    r.sliding_window()  # checked, then dropped: Llama has no sliding window
    return dict(head_dim=r.head_dim(), attention_bias=r.optional("attention_bias", False, bool),
                num_experts=0, top_k=0, routing=None, layer_types=("full",) * base["num_layers"],
                sliding_window=None, has_sinks=False, activation="silu", gate_up_layout="concat")


# ---- weights -------------------------------------------------------------------------------

def mlp_shapes(config, mxfp4: bool) -> dict:
    H, I = config.hidden_size, config.intermediate_size
    return {"w13": (2 * I, H), "w2": (H, I)}


# How tensor parallelism splits them (`gnomon.engine.weights.shard_weights`): kind and dim.
MLP_SHARDING = {"w13": ("gate_up", -2), "w2": ("row", -1)}


def load_mlp(read, config, i: int, mxfp4: bool) -> dict:
    """``w13``: ``mlp.gate_proj`` rows, then ``mlp.up_proj`` rows; ``w2``: ``mlp.down_proj``.
    A rank reads its rows of gate and of up, and its columns of down."""
    import torch

    H, I, hf = config.hidden_size, config.intermediate_size, f"model.layers.{i}.mlp."
    rows, columns = ("span", 0), ("span", 1)
    return {"w13": torch.cat([read.dense(hf + "gate_proj.weight", (I, H), rows),
                              read.dense(hf + "up_proj.weight", (I, H), rows)]),
            "w2": read.dense(hf + "down_proj.weight", (H, I), columns)}


# ---- cost ----------------------------------------------------------------------------------

def step_ops(ops) -> None:
    """The step's ops as the forward runs them (`gnomon.engine.cost.StepOps`)."""
    ops.decoder(ops.gated_mlp)


# ---- forward -------------------------------------------------------------------------------

def forward_layer(runner, i, h, residual, inputs, tick):
    from .layers import decoder_layer, gated_mlp
    return decoder_layer(runner, i, h, residual, inputs, tick, gated_mlp)
