"""The weight table pieces the architecture modules share: a pre-norm decoder layer's norms and
its multi-head attention (Q, K and V fused into ``qkv``, biases and sinks where the config has
them), their Hugging Face names and how tensor parallelism splits them. Torch-free: torch is
imported inside the loaders only."""

from __future__ import annotations

from typing import Dict, Tuple

def tiny(architecture: str, **fields) -> dict:
    """A test config.json: 2 layers, hidden 64, 4 query / 2 KV heads of 16, vocab 256, float32;
    hidden and intermediate multiples of 32 so MXFP4 experts fit; `fields` added or replaced."""
    return {"architectures": [architecture], "vocab_size": 256, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 512, "tie_word_embeddings": False, "hidden_act": "silu",
            "eos_token_id": 2, "bos_token_id": 1, "torch_dtype": "float32", **fields}


# How tensor parallelism splits them (`gnomon.engine.weight_shards.shard_weights`): kind and dim.
ATTENTION_SHARDING = {"attn_norm": ("replicate", None), "mlp_norm": ("replicate", None),
                      "qkv": ("qkv", 0), "qkv_bias": ("qkv", 0), "o": ("row", -1),
                      "o_bias": ("once", None), "sinks": ("heads", 0)}


def attention_shapes(config) -> Dict[str, Tuple[int, ...]]:
    """The layer's norms and attention: ``attn_norm`` / ``mlp_norm`` [H], ``qkv``
    [(Hq + 2 Hkv) D, H] (q, then k, then v rows), ``o`` [H, Hq D], with ``attention_bias``
    ``qkv_bias`` and ``o_bias``, with sinks ``sinks`` [Hq]."""
    c = config
    H, qkv = c.hidden_size, c.q_size + 2 * c.kv_size
    shapes = {"attn_norm": (H,), "qkv": (qkv, H), "o": (H, c.q_size)}
    if c.attention_bias:
        shapes.update(qkv_bias=(qkv,), o_bias=(H,))
    if c.has_sinks:
        shapes["sinks"] = (c.num_heads,)
    shapes["mlp_norm"] = (H,)
    return shapes


def load_attention(read, config, i: int) -> dict:
    """Layer ``i``'s `attention_shapes` from ``model.layers.{i}.``: ``input_layernorm``,
    ``post_attention_layernorm``, ``self_attn.{q,k,v,o}_proj`` (and their biases), and
    ``self_attn.sinks``. A rank reads its query heads' rows, its KV heads' rows and its columns
    of o."""
    import torch

    c, f = config, read.dense
    H, q, kv = c.hidden_size, c.q_size, c.kv_size
    hf = f"model.layers.{i}."
    attn = hf + "self_attn."
    out = {"attn_norm": f(hf + "input_layernorm.weight", (H,)),
           "qkv": torch.cat([f(attn + "q_proj.weight", (q, H), ("span", 0)),
                             f(attn + "k_proj.weight", (kv, H), "kv"),
                             f(attn + "v_proj.weight", (kv, H), "kv")]),
           "o": f(attn + "o_proj.weight", (H, q), ("span", 1))}
    if c.attention_bias:
        out["qkv_bias"] = torch.cat([f(attn + "q_proj.bias", (q,), ("span", 0)),
                                     f(attn + "k_proj.bias", (kv,), "kv"),
                                     f(attn + "v_proj.bias", (kv,), "kv")])
        out["o_bias"] = f(attn + "o_proj.bias", (H,), "once")
    if c.has_sinks:
        out["sinks"] = f(attn + "sinks", (c.num_heads,), ("span", 0))
    out["mlp_norm"] = f(hf + "post_attention_layernorm.weight", (H,))
    return out


def stacked_expert_shapes(config) -> Dict[str, Tuple[int, ...]]:
    """A router and E experts held as ``w13`` [E, 2I, H] (gate rows, then up rows) and ``w2``
    [E, H, I]."""
    H, I, E = config.hidden_size, config.intermediate_size, config.num_experts
    return {"router": (E, H), "w13": (E, 2 * I, H), "w2": (E, H, I)}


# Experts are split on their intermediate dimension, not across ranks; the router is replicated.
STACKED_EXPERT_SHARDING = {"router": ("replicate", None), "w13": ("gate_up", -2),
                           "w2": ("down", -1)}


def load_stacked_experts(read, config, router: str, experts: str, names: Tuple[str, str, str]
                         ) -> dict:
    """`stacked_expert_shapes` from a checkpoint that keeps each expert's three matrices apart:
    ``router`` [E, H], and expert e's gate, up and down (``names``) under ``experts`` + ``e.``.
    A rank reads its rows of gate and up and its columns of down, for every expert."""
    import torch

    H, I, E = config.hidden_size, config.intermediate_size, config.num_experts
    gate, up, down = names
    rows, columns = ("span", 0), ("span", 1)
    prefixes = [f"{experts}{e}." for e in range(E)]
    out = {"router": read.dense(router, (E, H))}
    out["w13"] = torch.stack([torch.cat([read.dense(x + gate + ".weight", (I, H), rows),
                                  read.dense(x + up + ".weight", (I, H), rows)])
                       for x in prefixes])
    out["w2"] = torch.stack([read.dense(x + down + ".weight", (H, I), columns)
                             for x in prefixes])
    return out
