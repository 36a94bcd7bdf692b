"""MiniMax-M2.5 in the simulator: the weight table against the published parameter count, a
decode step's per-layer Q/K norms and routed experts counted by hand, a priced simulation with
and without expert parallelism, and the engine's refusal."""

import math
import re

import pytest

from gnomon.engine.config import ModelConfig
from gnomon.costing import ring_bytes
from gnomon.engine.models import minimax_m2, weight_shapes
from gnomon.predict.opcount import step_ops
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.simulate import simulate
from gnomon.predict.spec import SimulationSpec
from gnomon.predict.workloads import parse_length


def test_weight_table_holds_the_published_parameter_count():
    # The Hugging Face model page of MiniMaxAI/MiniMax-M2.5 gives "229B" params (the hub's
    # count of the checkpoint's safetensors, to the billion; the model card's "230B total" is
    # the same figure rounded to ten billions). The weight table counts no multi-token-prediction
    # weights (use_mtp, 3 modules of one decoder layer each: speculative decoding, not
    # simulated), and agrees with the published count without them: 3 more MoE layers would be
    # about 11B (5%) more. The FP8 checkpoint's block scales (one per 128 x 128 weights, about
    # 14M) are not parameters of the model and are below the published precision.
    config = ModelConfig.preset("minimax-m2.5")
    total = sum(math.prod(s) for s in weight_shapes(config).values())
    published, unit = 229e9, 1e9
    assert total == pytest.approx(published, rel=min(0.005, unit / 2 / published))


def test_the_config_reads_as_the_published_architecture():
    c = ModelConfig.preset("minimax-m2.5")
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size, c.num_experts, c.top_k, c.vocab_size) == \
        (62, 3072, 48, 8, 128, 1536, 256, 8, 200064)
    assert c.quantization == "fp8" and c.torch_dtype == "bfloat16"
    assert c.shared_experts == 0 and c.first_dense_layers == 0 and c.mla is None
    shapes = weight_shapes(c)
    # per_layer Q/K norms: a weight per element of all the heads, not per head
    assert shapes["layers.0.q_norm"] == (48 * 128,) and shapes["layers.61.k_norm"] == (8 * 128,)
    assert shapes["layers.0.router_bias"] == (256,)
    assert shapes["layers.0.w13"] == (256, 2 * 1536, 3072)


def _ops(requests, tp=1, ep=1):
    spec = ModelSpec.from_model("tiny-minimax-m2")
    return step_ops(StepShape.of(spec, requests, tp=tp, ep=ep))


def _named(ops, name):
    return [op for op in ops if op.name == name]


@pytest.mark.parametrize("tp", [1, 2])
def test_a_decode_steps_qk_norms_and_experts_counted_by_hand(tp):
    # tiny: 2 layers, hidden 64, 4 query / 2 KV heads of 16, 8 experts of 32, top-2; float32
    L, H, D, hq, hkv, E, k, I, a = 2, 64, 16, 4, 2, 8, 2, 32, 4
    T = 3  # three sequences decoding one token each
    ops = _ops([(1, 10), (1, 20), (1, 5)], tp=tp)
    q, kv = hq * D // tp, hkv * D // tp
    # the norms read and write Q and K of the T tokens and read their full-width weights
    (norm,) = _named(ops, "qk_norm")
    assert norm.bytes == L * (2 * T * (q + kv) + (q + kv)) * a
    assert norm.launches == L * 2 and norm.flops == 0
    # with tp > 1 each layer all-reduces the tokens' float32 sums of squares of Q and K
    reduces = _named(ops, "all_reduce")
    if tp == 1:
        assert reduces == []
    else:
        norm_reduce = min(reduces, key=lambda op: op.collectives)
        assert norm_reduce.collectives == L
        assert norm_reduce.comm_bytes == L * ring_bytes("all_reduce", T * 2 * 4, tp)
        # the tensor-parallel all-reduces of the hidden states are still there
        assert max(op.collectives for op in reduces) == 2 * L + 1
    # the rotary embedding is priced over whole heads (rotary_dim 8 of 16: an over-count)
    (rope,) = _named(ops, "rotary_embedding")
    assert rope.bytes == L * 2 * T * (q + kv) * a
    # router, then k experts per token in two grouped GEMMs, each expert I / tp wide
    (router,) = _named(ops, "router")
    assert router.flops == L * 2 * T * H * E
    (w13,) = _named(ops, "fused_moe[w13]")
    (w2,) = _named(ops, "fused_moe[w2]")
    assert w13.flops == L * 2 * T * k * 2 * (I // tp) * H
    assert w2.flops == L * 2 * T * k * (I // tp) * H
    distinct = E * (1 - (1 - k / E) ** T)
    assert w13.bytes == pytest.approx(L * (2 * distinct * H * (I // tp) * a + T * H * a
                                           + T * k * 2 * (I // tp) * a))
    # no shared experts and no dense layers: nothing else runs an MLP
    assert not [op for op in ops if "shared" in op.name or op.name == "gate_up_proj"]


def test_expert_parallelism_splits_the_pairs_and_leaves_the_norms():
    tp_only, ep2 = _ops([(4, 0)], tp=2), _ops([(4, 0)], tp=2, ep=2)
    assert _named(ep2, "qk_norm") == _named(tp_only, "qk_norm")
    assert _named(ep2, "all_reduce") == _named(tp_only, "all_reduce")
    assert _named(ep2, "fused_moe[w13]")[0].flops == \
        pytest.approx(_named(tp_only, "fused_moe[w13]")[0].flops)


@pytest.mark.parametrize("ep", [1, 4])
def test_a_simulation_is_priced_on_h100s_in_fp8(ep):
    report, _ = simulate(SimulationSpec.of(model="minimax-m2.5", hardware="H100 SXM", tp=4, ep=ep,
                         weight_dtype="fp8", engine="vllm", num_requests=8, concurrency=4,
                         input_len=parse_length("256", "i"), output_len=parse_length("16", "o")))
    assert report["metrics"]["tpot"]["mean"] > 0
    limits = " ".join(report["limits"])
    assert "simulation only" in limits
    if ep > 1:
        assert "expert parallelism over 4 GPUs: each holds 64 experts" in limits


def test_the_engine_refuses_by_name():
    import gnomon

    with pytest.raises(ValueError, match=re.escape(minimax_m2.SIMULATION_ONLY)):
        gnomon.LLM("tiny-minimax-m2", random_weights=True)


@pytest.mark.parametrize("key, value, reason", [
    ("qk_norm_type", "per_head", "qk_norm_type must be 'per_layer'"),
    ("scoring_func", "softmax", "scoring_func must be 'sigmoid'"),
    ("use_routing_bias", False, "use_routing_bias=false"),
    ("shared_intermediate_size", 32, "shared_intermediate_size"),
    ("attn_type_list", [0, 1], "attn_type_list"),
    ("rotary_dim", 18, "rotary_dim must be even"),
])
def test_what_the_simulation_cannot_price_is_refused_by_name(key, value, reason):
    from gnomon.engine.config import preset_json

    raw = preset_json("tiny-minimax-m2")
    raw[key] = value
    with pytest.raises(ValueError, match=re.escape(reason)):
        ModelConfig.from_json(raw)
