"""Kimi-K2.5 (``KimiK25ForConditionalGeneration``): Moonshot AI's multimodal wrapper around Kimi
K2's text model, which is DeepSeek-V3's architecture (`gnomon.engine.models.deepseek_v3`: MLA on
every layer, a dense MLP on the first ``first_k_dense_replace``, routed and shared experts on the
rest) at Kimi's sizes: 61 layers, 64 heads, 384 experts of which 8 per token, 1 shared expert, 1
dense layer, a 163,840-token vocabulary. The config.json keeps that text model under
``text_config`` (`text_config` reads it, with the wrapper's top-level ``quantization_config``
where the text model has none, as NVIDIA's NVFP4 checkpoint places it) beside a
``vision_config``; everything else (fields, weight table, sharding, cost) is DeepSeek-V3's,
delegated to its module.

Simulation only: gnomon's engine has no MLA kernel. The workload is text only, so the vision
tower does no work in a step.

Weights: Moonshot's checkpoint holds the routed experts alone in INT4 (compressed-tensors
``pack-quantized``: symmetric 4-bit integers in groups of 32 with one bf16 scale each, no zero
point, 4.5 bits a weight; bf16 activations, W4A16), attention, the shared expert and the dense
MLP in bf16 (its ``ignore`` list). `gnomon.engine.config_json` reads that as ``quantization
"int4"``; `gnomon.predict.shapes.ModelSpec` counts the experts at 0.5625 bytes a parameter and
prices their grouped GEMMs weight-only (the ``w4a16`` curve at the bf16 peak, as MXFP4 experts
run on Hopper), the other linear layers in bf16.

Not counted:

- the vision tower and its projector (in bf16 in both Moonshot's and NVIDIA's checkpoints). Their
  shapes follow from ``vision_config`` and vLLM's MoonViT-3D (``vllm/model_executor/models/
  kimi_k25_vit.py``): a 14x14 patch embedding (1152 x 3 x 14 x 14 and its bias), a 64 x 64 x 1152
  learned position embedding, 27 pre-norm blocks (LayerNorms with biases, fused QKV 3456 x 1152,
  output 1152 x 1152, MLP 4304 x 1152 and 1152 x 4304, every one with a bias: 15,239,504
  parameters each), a final LayerNorm, and the patch-merger projector (a LayerNorm, 4608 x 4608
  and 7168 x 4608 with biases), 471,143,920 parameters in all (0.94 GB in bf16, about 0.05% of
  the model; Moonshot's model card gives the encoder as 400M). gnomon's `ModelConfig` holds no
  vision fields and its weight table only the text model's, so these bytes are left out of
  ``ModelSpec.weight_bytes``: where an engine loads the tower on every GPU (vLLM's default, or
  replicated under its data-parallel encoder mode), each GPU's KV capacity is overstated by up
  to 0.94 GB;
- multi-token-prediction layers (Kimi-K2.5 ships none: ``num_nextn_predict_layers`` 0).
"""

from __future__ import annotations

from . import deepseek_v3 as text

ARCHITECTURE = "KimiK25ForConditionalGeneration"
SIMULATION_ONLY = f"{ARCHITECTURE}: simulation only; the engine has no MLA kernel"

# ---- config.json ---------------------------------------------------------------------------

# KimiK25Config's text_config is a DeepseekV3Config: its defaults
DEFAULTS = text.DEFAULTS
ROPE_SCALING = text.ROPE_SCALING
MXFP4_TENSOR = None
INT4_LINEARS = text.INT4_LINEARS  # the text model keeps DeepSeek-V3's module names
# what the wrapper may hold at its top level for the text model (NVIDIA's NVFP4 checkpoint keeps
# its quantization_config there, Moonshot's inside text_config)
_INHERITED = ("quantization_config", "eos_token_id", "tie_word_embeddings", "torch_dtype",
              "dtype")


def text_config(r) -> dict:
    """The text model's config.json fields: ``text_config``, with the wrapper's `_INHERITED`
    keys where it has none (`gnomon.engine.config_json.read_config` reads from it)."""
    inner = r.raw.get("text_config")
    if inner is None:
        raise KeyError(f"{r.source}: config is missing the required key 'text_config'")
    if not isinstance(inner, dict):
        r.fail(f"text_config must be an object, got {inner!r}")
    out = dict(inner)
    for key in _INHERITED:
        if out.get(key) is None and r.raw.get(key) is not None:
            out[key] = r.raw[key]
    return out


def config_fields(r, base) -> dict:
    return text.config_fields(r, base)


# Kimi-K2.5's INT4 experts, as its checkpoint's compressed-tensors quantization_config holds them
_INT4_EXPERTS = {
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "quantization_status": "compressed", "kv_cache_scheme": None,
    "config_groups": {"group_0": {
        "targets": ["Linear"], "input_activations": None, "output_activations": None,
        "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                    "group_size": 32, "dynamic": False, "actorder": None,
                    "block_structure": None, "observer": "minmax", "observer_kwargs": {}}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}

PRESETS = {
    # moonshotai/Kimi-K2.5 config.json (Hugging Face hub; aiconfigurator-core 0.12.0 ships it as
    # model_configs/moonshotai--Kimi-K2.5_config.json), the fields gnomon reads and the
    # vision_config as shipped
    "kimi-k2.5": {
        "architectures": [ARCHITECTURE], "model_type": "kimi_k25", "dtype": "bfloat16",
        "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839,
        "tie_word_embeddings": False,
        "text_config": {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
            "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
            "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8,
            "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "norm_topk_prob": True, "routed_scaling_factor": 2.827, "first_k_dense_replace": 1,
            "moe_layer_freq": 1, "num_nextn_predict_layers": 0, "hidden_act": "silu",
            "attention_bias": False, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
            "rope_scaling": {"type": "yarn", "factor": 64.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "original_max_position_embeddings": 4096},
            "max_position_embeddings": 262144, "tie_word_embeddings": False,
            "bos_token_id": 163584, "eos_token_id": 163585, "dtype": "bfloat16",
            "quantization_config": _INT4_EXPERTS},
        "vision_config": {
            "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
            "init_pos_emb_time": 4, "pos_emb_type": "divided_fixed",
            "vt_hidden_size": 1152, "vt_intermediate_size": 4304, "vt_num_attention_heads": 16,
            "vt_num_hidden_layers": 27, "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool",
            "mm_projector_type": "patchmerger", "mm_hidden_size": 1152,
            "text_hidden_size": 7168, "projector_hidden_act": "gelu",
            "projector_ln_eps": 1e-5, "video_attn_type": "spatial_temporal"}},
    # the wrapper around tiny-deepseek-v3's shapes (1 dense layer then 1 MoE layer of 8 experts
    # of 32, top-2, a shared expert) in bf16, its routed experts INT4 as Kimi-K2.5's
    "tiny-kimi-k2.5": {
        "architectures": [ARCHITECTURE], "dtype": "bfloat16", "eos_token_id": 2,
        "tie_word_embeddings": False,
        "text_config": {
            **{k: v for k, v in text.PRESETS["tiny-deepseek-v3"].items()
               if k not in ("architectures", "torch_dtype")},
            "dtype": "bfloat16", "quantization_config": _INT4_EXPERTS},
        "vision_config": {
            "patch_size": 14, "init_pos_emb_height": 4, "init_pos_emb_width": 4,
            "init_pos_emb_time": 4, "pos_emb_type": "divided_fixed", "vt_hidden_size": 32,
            "vt_intermediate_size": 64, "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1,
            "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool",
            "mm_projector_type": "patchmerger", "mm_hidden_size": 32, "text_hidden_size": 64}},
}

# ---- weights -------------------------------------------------------------------------------

SHARDING = text.SHARDING
layer_shapes = text.layer_shapes


def load_layer(read, config, i: int, mxfp4: bool) -> dict:
    raise ValueError(SIMULATION_ONLY)


# ---- cost ----------------------------------------------------------------------------------

step_ops = text.step_ops

# ---- forward -------------------------------------------------------------------------------


def forward_layer(model, i, h, residual, step, kv, tick):
    raise ValueError(SIMULATION_ONLY)
