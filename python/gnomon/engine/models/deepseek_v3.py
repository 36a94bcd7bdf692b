"""DeepSeek-V3 (``DeepseekV3ForCausalLM``; DeepSeek-R1 and Kimi-K2's text model share it):
Multi-head Latent Attention (`gnomon.engine.models.mla`) on every layer; a dense gated MLP on the
first ``first_k_dense_replace`` layers; on the rest, ``n_routed_experts`` experts
``moe_intermediate_size`` wide with sigmoid scores, group-limited top-k (``n_group`` groups, the
best ``topk_group`` of them) and ``routed_scaling_factor``, beside ``n_shared_experts`` shared
experts that every token runs.

Simulation only: gnomon's engine has no MLA kernel. The checkpoints' multi-token-prediction layer
(``num_nextn_predict_layers``) serves speculative decoding: a simulation with
``num_speculative_tokens`` prices it as one more layer of this shape
(`gnomon.predict.simulated.SimulatedRunner`); its weights and KV are not counted in the
memory.

Cost assumptions: routing is balanced, so a step of T tokens reads ``E (1 - (1 - k/E)^T)``
distinct experts (`gnomon.costing.StepOps.moe`): group-limited routing leaves each expert's
chance ``k / E`` per token when the groups are balanced, and no public figure of DeepSeek-V3's
routing skew under serving loads was found to do better."""

from __future__ import annotations

from . import common, mla

ARCHITECTURE = "DeepseekV3ForCausalLM"
SIMULATION_ONLY = f"{ARCHITECTURE}: simulation only; the engine has no MLA kernel"

# ---- config.json ---------------------------------------------------------------------------

# transformers' DeepseekV3Config defaults
DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096}
ROPE_SCALING = ("yarn",)
MXFP4_TENSOR = None
# Linear modules as Hugging Face names them, by what a checkpoint of INT4 routed experts
# (`gnomon.engine.config_json.INT4_EXPERTS`, Kimi-K2's) does with them: attention, the dense MLP
# and the shared experts stay in the activation dtype; the routed experts are INT4
INT4_LINEARS = (
    tuple([f"model.layers.0.self_attn.{m}" for m in ("q_a_proj", "q_b_proj",
                                                    "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")]
          + [f"model.layers.0.mlp.{m}" for m in ("gate_proj", "up_proj", "down_proj")]
          + [f"model.layers.1.mlp.shared_experts.{m}"
             for m in ("gate_proj", "up_proj", "down_proj")]),
    tuple(f"model.layers.1.mlp.experts.0.{m}" for m in ("gate_proj", "up_proj", "down_proj")))


def config_fields(r, base) -> dict:
    r.require_silu_mlp()
    m = mla.read(r)
    experts = r.required("n_routed_experts")
    top_k = r.experts_per_token("num_experts_per_tok", experts)
    if r.optional("moe_layer_freq", 1) != 1:
        r.fail("moe_layer_freq other than 1 (dense layers among the MoE ones) is not supported")
    scoring = r.raw.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        r.fail(f"scoring_func must be 'sigmoid', got {scoring!r}")
    groups, best = r.optional("n_group", 1), r.optional("topk_group", 1)
    if groups < 1 or experts % groups or not 1 <= best <= groups:
        r.fail(f"n_group ({groups}) must divide n_routed_experts ({experts}) and topk_group "
               f"({best}) be in [1, n_group]")
    dense = r.optional("first_k_dense_replace", 0)
    if not 0 <= dense < base["num_layers"]:
        r.fail(f"first_k_dense_replace must be in [0, num_hidden_layers), got {dense}")
    return dict(head_dim=m.qk_head_dim, attention_bias=r.optional("attention_bias", False, bool),
                intermediate_size=r.required("moe_intermediate_size"), num_experts=experts,
                top_k=top_k, routing="sigmoid_group_topk",
                layer_types=("full",) * base["num_layers"], sliding_window=None,
                has_sinks=False, activation="silu", gate_up_layout="concat",
                mla=m, first_dense_layers=dense,
                dense_intermediate_size=base["intermediate_size"] if dense else 0,
                shared_experts=r.optional("n_shared_experts", 0))


PRESETS = {
    # deepseek-ai/DeepSeek-V3 config.json (Hugging Face hub; aiconfigurator-core 0.12.0 ships it
    # as model_configs/deepseek-ai--DeepSeek-V3_config.json). DeepSeek-R1's is the same model.
    "deepseek-v3": {
        "architectures": [ARCHITECTURE], "vocab_size": 129280, "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 3, "moe_layer_freq": 1, "num_nextn_predict_layers": 1,
        "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": 1e-6,
        "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                         "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096},
        "max_position_embeddings": 163840, "tie_word_embeddings": False, "bos_token_id": 0,
        "eos_token_id": 1, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128]}},
    # 1 dense layer then 1 MoE layer of 8 experts (top-2 of 2 groups) and a shared expert
    "tiny-deepseek-v3": common.tiny(
        ARCHITECTURE, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, moe_intermediate_size=32,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, rms_norm_eps=1e-6, rope_theta=10000.0),
}

# ---- weights -------------------------------------------------------------------------------

SHARDING = {**mla.SHARDING, "w13": ("gate_up", -2), "w2": ("down", -1),
            "router": ("replicate", None), "router_bias": ("replicate", None),
            "shared_w13": ("gate_up", -2), "shared_w2": ("down", -1)}


def layer_shapes(config, mxfp4: bool) -> dict:
    """`mla.shapes`, then a dense layer's ``w13`` [2I, H] / ``w2`` [H, I], or a MoE layer's
    ``router`` [E, H] and its ``router_bias`` [E] (``e_score_correction_bias``), the experts'
    ``w13`` [E, 2I, H] / ``w2`` [E, H, I] and the shared experts' ``shared_w13`` / ``shared_w2``
    (``n_shared_experts x I`` wide)."""
    c = config
    H, I = c.hidden_size, c.intermediate_size
    if not c.is_moe:
        return {**mla.shapes(c), "w13": (2 * I, H), "w2": (H, I)}
    shared = c.shared_experts * I
    out = {**mla.shapes(c), **common.stacked_expert_shapes(c), "router_bias": (c.num_experts,)}
    if shared:
        out.update(shared_w13=(2 * shared, H), shared_w2=(H, shared))
    return out


def load_layer(read, config, i: int, mxfp4: bool) -> dict:
    raise ValueError(SIMULATION_ONLY)


# ---- cost ----------------------------------------------------------------------------------

def step_ops(ops) -> None:
    """The step's ops (`gnomon.costing.StepOps`): MLA's projections on every layer, the
    dense MLP on the first ``first_k_dense_replace``, the routed and shared experts on the
    rest."""
    c = ops.config
    ops.embedding()
    mla.projection_ops(ops)
    if c.first_dense_layers:
        ops.gated_mlp(c.dense_intermediate_size, c.first_dense_layers)
    ops.moe(c.num_layers - c.first_dense_layers)
    ops.tail()


# ---- forward -------------------------------------------------------------------------------

def forward_layer(model, i, h, residual, step, kv, tick):
    raise ValueError(SIMULATION_ONLY)
