"""Qwen3 (``Qwen3ForCausalLM``): Llama's decoder with an RMSNorm over each head of Q and of K
before RoPE (``q_norm`` / ``k_norm``), no QKV bias, and full attention on every layer."""

from __future__ import annotations

from . import common, llama

ARCHITECTURE = "Qwen3ForCausalLM"

# ---- config.json ---------------------------------------------------------------------------

# transformers' Qwen3Config defaults
DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 32768}
ROPE_SCALING = ("yarn",)
MXFP4_TENSOR = None


def check_full_attention(r) -> None:
    """Qwen3 configs carry ``sliding_window`` / ``max_window_layers`` unused unless
    ``use_sliding_window``, which no released Qwen3 sets; gnomon refuses it by name."""
    if r.optional("use_sliding_window", False, bool):
        r.fail("use_sliding_window=true (Qwen3's sliding window above max_window_layers) is not "
               "supported")


def config_fields(r, base) -> dict:
    r.require_silu_mlp()
    check_full_attention(r)
    return dict(head_dim=r.head_dim(), attention_bias=r.optional("attention_bias", False, bool),
                num_experts=0, top_k=0, routing=None, layer_types=("full",) * base["num_layers"],
                sliding_window=None, has_sinks=False, activation="silu", gate_up_layout="concat")


def _qwen3(layers: int, hidden: int, heads: int, kv_heads: int, inter: int) -> dict:
    return {"architectures": [ARCHITECTURE], "vocab_size": 151936, "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": 128,
            "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "rope_scaling": None, "max_position_embeddings": 40960,
            "max_window_layers": layers, "sliding_window": None, "use_sliding_window": False,
            "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
            "torch_dtype": "bfloat16"}


PRESETS = {
    # Qwen/Qwen3-8B config.json (Hugging Face hub; aiconfigurator-core 0.12.0 ships it as
    # model_configs/Qwen--Qwen3-8B_config.json)
    "qwen3-8b": _qwen3(layers=36, hidden=4096, heads=32, kv_heads=8, inter=12288),
    # Qwen/Qwen3-32B config.json (model_configs/Qwen--Qwen3-32B_config.json there)
    "qwen3-32b": _qwen3(layers=64, hidden=5120, heads=64, kv_heads=8, inter=25600),
    "tiny-qwen3": common.tiny(ARCHITECTURE, rms_norm_eps=1e-6, rope_theta=10000.0),
}

# ---- weights -------------------------------------------------------------------------------

# ``q_norm`` / ``k_norm`` [D]: ``self_attn.{q,k}_norm.weight``, the same on every rank
HEAD_NORM_SHARDING = {"q_norm": ("replicate", None), "k_norm": ("replicate", None)}
SHARDING = {**common.ATTENTION_SHARDING, **HEAD_NORM_SHARDING, **llama.MLP_SHARDING}


def head_norm_shapes(config) -> dict:
    return {"q_norm": (config.head_dim,), "k_norm": (config.head_dim,)}


def load_head_norms(read, config, i: int) -> dict:
    attn, D = f"model.layers.{i}.self_attn.", config.head_dim
    return {"q_norm": read.dense(attn + "q_norm.weight", (D,)),
            "k_norm": read.dense(attn + "k_norm.weight", (D,))}


def layer_shapes(config, mxfp4: bool) -> dict:
    return {**common.attention_shapes(config), **head_norm_shapes(config),
            **llama.mlp_shapes(config, mxfp4)}


def load_layer(read, config, i: int, mxfp4: bool) -> dict:
    return {**common.load_attention(read, config, i), **load_head_norms(read, config, i),
            **llama.load_mlp(read, config, i, mxfp4)}


# ---- cost ----------------------------------------------------------------------------------

def head_norm_ops(ops) -> None:
    """The per-head RMSNorms of Q and K: each reads and writes its rows once."""
    a = ops.pricing.activation_bytes
    ops.elementwise("qk_norm", 2 * ops.T * (ops.q_width + ops.kv_width) * a, 2)


def step_ops(ops) -> None:
    """The step's ops as the forward runs them (`gnomon.costing.StepOps`)."""
    ops.decoder(ops.gated_mlp, after_qkv=head_norm_ops)


# ---- forward -------------------------------------------------------------------------------

def head_norms(model, i: int, q, k):
    """RMSNorm over each head's D values of Q and K, with layer ``i``'s ``q_norm`` / ``k_norm``
    weights ``[D]``, before RoPE; returns new Q and K (the views into the fused QKV output are
    copied: the norm takes whole rows)."""
    from gnomon import ops

    c, w, p = model.config, model.weights, f"layers.{i}."

    def norm(x, weight):
        rows = x.contiguous().view(-1, x.shape[-1])
        return ops.rms_norm(rows, weight, c.rms_norm_eps).view(x.shape)

    return norm(q, w[p + "q_norm"]), norm(k, w[p + "k_norm"])


def forward_layer(model, i, h, residual, step, kv, tick):
    from .layers import decoder_layer, gated_mlp
    return decoder_layer(model, i, h, residual, step, kv, tick, gated_mlp, qk=head_norms)
