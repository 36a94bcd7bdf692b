"""Llama (``LlamaForCausalLM``): full attention, a dense SwiGLU MLP, llama3 RoPE scaling."""

from __future__ import annotations

from . import common

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



def _llama31(layers: int, hidden: int, heads: int, inter: int, factor: float = 8.0,
             tied: bool = False) -> dict:
    return {
        "architectures": [ARCHITECTURE], "vocab_size": 128256, "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "max_position_embeddings": 131072, "tie_word_embeddings": tied,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
    }


PRESETS = {
    # meta-llama/Llama-3.1-8B config.json (Hugging Face hub).
    "llama-3.1-8b": _llama31(layers=32, hidden=4096, heads=32, inter=14336),
    # meta-llama/Llama-3.1-70B config.json (Hugging Face hub).
    "llama-3.1-70b": _llama31(layers=80, hidden=8192, heads=64, inter=28672),
    # meta-llama/Llama-3.2-1B config.json (Hugging Face hub; 1.24B parameters, its embedding
    # tied to the lm_head): the about-1B Llama a GPU's calibration and validation run for real.
    "llama-1b": _llama31(layers=16, hidden=2048, heads=32, inter=8192, factor=32.0, tied=True),
    # A CPU-sized Llama (21M parameters) that `gnomon calibrate` / `validate` run for real.
    "small-llama": {
        "architectures": [ARCHITECTURE], "vocab_size": 8192, "hidden_size": 512,
        "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "hidden_act": "silu",
        "eos_token_id": 2, "bos_token_id": 1, "torch_dtype": "float32"},
    # wavelengths span 2pi..~2e4 positions, so all three llama3 bands occur
    "tiny-llama": common.tiny(ARCHITECTURE, rope_theta=10000.0, attention_bias=False,
                              rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64}),
}

# ---- weights -------------------------------------------------------------------------------

def mlp_shapes(config, mxfp4: bool) -> dict:
    H, I = config.hidden_size, config.intermediate_size
    return {"w13": (2 * I, H), "w2": (H, I)}


# How tensor parallelism splits them (`gnomon.engine.weight_shards.shard_weights`): kind and dim.
MLP_SHARDING = {"w13": ("gate_up", -2), "w2": ("down", -1)}
SHARDING = {**common.ATTENTION_SHARDING, **MLP_SHARDING}


def layer_shapes(config, mxfp4: bool) -> dict:
    return {**common.attention_shapes(config), **mlp_shapes(config, mxfp4)}


def load_layer(read, config, i: int, mxfp4: bool) -> dict:
    return {**common.load_attention(read, config, i), **load_mlp(read, config, i, mxfp4)}


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
    """The step's ops as the forward runs them (`gnomon.costing.StepOps`)."""
    ops.decoder(ops.gated_mlp)


# ---- forward -------------------------------------------------------------------------------

def forward_layer(model, i, h, residual, step, kv, tick):
    from .layers import decoder_layer, gated_mlp
    return decoder_layer(model, i, h, residual, step, kv, tick, gated_mlp)
