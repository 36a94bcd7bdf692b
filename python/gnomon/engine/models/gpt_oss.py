"""gpt-oss (``GptOssForCausalLM``): alternating sliding-window (128) and full attention with
sinks and biases, a top-k-then-softmax Mixture of Experts with biases and the clamped
``swiglu_oai`` activation (gate/up interleaved), YaRN RoPE, and MXFP4 experts."""

from __future__ import annotations

from gnomon.formats import MXFP4_BLOCK

from . import common

ARCHITECTURE = "GptOssForCausalLM"

# ---- config.json ---------------------------------------------------------------------------

DEFAULTS = {"rms_norm_eps": 1e-5, "rope_theta": 150000.0, "max_position_embeddings": 131072}
ROPE_SCALING = ("yarn",)
MXFP4_TENSOR = "model.layers.0.mlp.experts.gate_up_proj_blocks"
LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}


def config_fields(r, base) -> dict:
    r.require_silu_mlp()
    layers, experts = base["num_layers"], r.required("num_local_experts")
    top_k = r.experts_per_token("experts_per_token", experts, fallback="num_experts_per_tok")
    window = r.sliding_window()
    names = r.raw.get("layer_types")
    if names is None:  # transformers' default: even layers slide
        names = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if not isinstance(names, list) or len(names) != layers:
        r.fail(f"layer_types must be a list of {layers} entries (num_hidden_layers)")
    bad = [n for n in names if n not in LAYER_TYPES]
    if bad:
        r.fail(f"layer_types entries must be 'sliding_attention' or 'full_attention', got "
               f"{bad[0]!r}")
    layer_types = tuple(LAYER_TYPES[n] for n in names)
    if "sliding" in layer_types and window is None:
        r.fail("layer_types has sliding_attention layers but sliding_window is null")
    limit = r.optional("swiglu_limit", 7.0, float)
    if limit != 7.0:
        r.fail(f"swiglu_limit must be 7.0 (the limit gnomon's swiglu_oai uses), got {limit}")
    return dict(head_dim=r.optional("head_dim", 64),
                attention_bias=r.optional("attention_bias", True, bool), num_experts=experts,
                top_k=top_k, routing="topk_softmax", layer_types=layer_types,
                sliding_window=window if "sliding" in layer_types else None, has_sinks=True,
                activation="swiglu_oai", gate_up_layout="interleaved")


def _gpt_oss(layers: int, experts: int, vocab: int = 201088) -> dict:
    return {
        "architectures": [ARCHITECTURE], "vocab_size": vocab, "hidden_size": 2880,
        "intermediate_size": 2880, "num_hidden_layers": layers, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 150000,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                         "truncate": False},
        "max_position_embeddings": 131072, "tie_word_embeddings": False,
        "num_local_experts": experts, "experts_per_token": 4, "num_experts_per_tok": 4,
        "sliding_window": 128, "swiglu_limit": 7.0, "attention_bias": True,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(layers)],
        "eos_token_id": 200002, "pad_token_id": 199999, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "mxfp4"},
    }


PRESETS = {
    # openai/gpt-oss-20b config.json (Hugging Face hub).
    "gpt-oss-20b": _gpt_oss(layers=24, experts=32),
    # openai/gpt-oss-120b config.json (Hugging Face hub).
    "gpt-oss-120b": _gpt_oss(layers=36, experts=128),
    # gpt-oss-20b's layers (attention, sinks, windows, MXFP4 experts of its width, top-4), 4
    # of them with 8 experts each and a 32,000-token vocabulary: 1.09B parameters, 0.80B of them
    # MXFP4 experts, the about-1B gpt-oss a GPU's calibration and validation run for real.
    "gpt-oss-1b": _gpt_oss(layers=4, experts=8, vocab=32000),
    # max_position = factor * original, as in the real gpt-oss config
    "tiny-gpt-oss": common.tiny(
        ARCHITECTURE, intermediate_size=64, rope_theta=150000.0, num_local_experts=4,
        experts_per_token=2, num_experts_per_tok=2, sliding_window=8, swiglu_limit=7.0,
        attention_bias=True, layer_types=["sliding_attention", "full_attention"],
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "original_max_position_embeddings": 128, "truncate": False}),
}

# ---- weights -------------------------------------------------------------------------------

def mlp_shapes(config, mxfp4: bool) -> dict:
    H, I, E = config.hidden_size, config.intermediate_size, config.num_experts
    shapes = {"router": (E, H)}
    if mxfp4:
        shapes.update(w13=(E, 2 * I, H // 2), w13_scales=(E, 2 * I, H // MXFP4_BLOCK),
                      w2=(E, H, I // 2), w2_scales=(E, H, I // MXFP4_BLOCK))
    else:
        shapes.update(w13=(E, 2 * I, H), w2=(E, H, I))
    shapes.update(router_bias=(E,), w13_bias=(E, 2 * I), w2_bias=(E, H))
    return shapes


# How tensor parallelism splits them (`gnomon.engine.weight_shards.shard_weights`): kind and dim.
# MXFP4 codes and scales split along N for w13 and along K for w2; w2's bias is added once.
MLP_SHARDING = {"router": ("replicate", None), "router_bias": ("replicate", None),
                "w13": ("gate_up", -2), "w13_scales": ("gate_up", -2),
                "w13_bias": ("gate_up", -1), "w2": ("down", -1), "w2_scales": ("down", -1),
                "w2_bias": ("once", None)}
SHARDING = {**common.ATTENTION_SHARDING, **MLP_SHARDING}


def layer_shapes(config, mxfp4: bool) -> dict:
    return {**common.attention_shapes(config), **mlp_shapes(config, mxfp4)}


def load_layer(read, config, i: int, mxfp4: bool) -> dict:
    return {**common.load_attention(read, config, i), **load_mlp(read, config, i, mxfp4)}


def load_mlp(read, config, i: int, mxfp4: bool) -> dict:
    """``router(_bias)``: ``mlp.router``. MXFP4: ``w13`` / ``w2`` are ``gate_up_proj_blocks``
    [E, 2I, H/32, 16] / ``down_proj_blocks`` [E, H, I/32, 16] viewed flat, with their
    ``*_scales``; dense: ``gate_up_proj`` [E, H, 2I] / ``down_proj`` [E, I, H] transposed (gate/up
    interleaved). ``w13_bias`` / ``w2_bias``: ``gate_up_proj_bias`` / ``down_proj_bias``. A rank
    reads its contiguous run of interleaved gate/up rows (N) and its part of down's K."""
    H, I, E = config.hidden_size, config.intermediate_size, config.num_experts
    hf = f"model.layers.{i}.mlp."
    ex = hf + "experts."
    out = {"router": read.dense(hf + "router.weight", (E, H)),
           "router_bias": read.dense(hf + "router.bias", (E,))}
    if mxfp4:
        nb_h, nb_i = H // MXFP4_BLOCK, I // MXFP4_BLOCK
        nbytes = MXFP4_BLOCK // 2  # a block's codes, two to a byte
        w13 = read.codes(ex + "gate_up_proj_blocks", (E, 2 * I, nb_h, nbytes), ("span", 1))
        out["w13"] = w13.reshape(E, w13.shape[1], H // 2)
        out["w13_scales"] = read.codes(ex + "gate_up_proj_scales", (E, 2 * I, nb_h), ("span", 1))
        w2 = read.codes(ex + "down_proj_blocks", (E, H, nb_i, nbytes), ("span", 2))
        out["w2"] = w2.reshape(E, H, w2.shape[2] * nbytes)
        out["w2_scales"] = read.codes(ex + "down_proj_scales", (E, H, nb_i), ("span", 2))
    else:
        out["w13"] = read.dense(ex + "gate_up_proj", (E, H, 2 * I),
                                ("span", 2)).transpose(1, 2).contiguous()
        out["w2"] = read.dense(ex + "down_proj", (E, I, H), ("span", 1)).transpose(1, 2).contiguous()
    out["w13_bias"] = read.dense(ex + "gate_up_proj_bias", (E, 2 * I), ("span", 1))
    out["w2_bias"] = read.dense(ex + "down_proj_bias", (E, H), "once")
    return out


# ---- cost ----------------------------------------------------------------------------------

def step_ops(ops) -> None:
    """The step's ops as the forward runs them (`gnomon.costing.StepOps`)."""
    ops.decoder(ops.moe)


# ---- forward -------------------------------------------------------------------------------

def forward_layer(model, i, h, residual, step, kv, tick):
    from .layers import decoder_layer, moe
    return decoder_layer(model, i, h, residual, step, kv, tick, moe)
