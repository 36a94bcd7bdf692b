"""RooflinePredictor against FLOPs and bytes counted by hand for a Llama and a gpt-oss step.

The hardware is made up so the arithmetic is easy to follow: 1 TFLOP/s of bf16 math, 1 TB/s of
memory, every efficiency 1 and no launch cost; so each op takes max(flops, bytes) / 1e12 s.
"""

import math

import pytest

from gnomon.engine.config import ModelConfig
from gnomon.hardware import Figure, Hardware
from gnomon.predict.cost import FAMILIES, PredictionRefused, StepCost
from gnomon.predict.roofline import RooflinePredictor
from gnomon.predict.shapes import ModelSpec, StepShape

UNIT = Hardware(name="unit", vendor="test", bf16_tflops=Figure(1.0, "test"),
                fp8_tflops=Figure(None, "test"), fp4_tflops=Figure(None, "test"),
                hbm_tbps=Figure(1.0, "test"), hbm_gb=Figure(80, "test"),
                interconnect_gbps=Figure(100, "test"))
EXACT = {"compute": {"bfloat16": 1.0}, "memory": 1.0, "launch_s": 0.0,
         "allreduce_latency_s": 0.0}


def roof(flops, nbytes):
    return max(flops, nbytes) / 1e12


def test_llama_step_matches_hand_count():
    # tiny-llama: H 64, I 128, 2 layers, 4 query / 2 KV heads of 16, vocab 256, float32 (4 B)
    spec = ModelSpec.from_config(ModelConfig.preset("tiny-llama"))
    shape = StepShape.of(spec, [(3, 5), (1, 10)])  # a 3-token chunk after 5, and a decode
    cost = RooflinePredictor(UNIT, EXACT).predict(shape)
    T, L, a = 4, 2, 4
    gemm = L * (roof(2 * T * 64 * 128, 64 * 128 * a + T * 64 * a + T * 128 * a)     # qkv
                + roof(2 * T * 64 * 64, 64 * 64 * a + T * 64 * a + T * 64 * a)      # o
                + roof(2 * T * 64 * 256, 64 * 256 * a + T * 64 * a + T * 256 * a)   # gate_up
                + roof(2 * T * 128 * 64, 128 * 64 * a + T * 128 * a + T * 64 * a))  # down
    gemm += roof(2 * 2 * 64 * 256, 64 * 256 * a + 2 * 64 * a + 2 * 256 * 4)        # lm_head
    assert cost.breakdown["gemm"] == pytest.approx(gemm, rel=1e-12)
    # keys: 6 + 7 + 8 for the chunk, 11 for the decode; 4 FLOPs per key element per head
    keys, kv_read = 6 + 7 + 8 + 11, 8 + 11
    attention = L * (roof(0, 2 * 2 * T * 32 * a)                                    # cache write
                     + roof(4 * 4 * 16 * keys, 2 * kv_read * 32 * a + 2 * T * 64 * a))
    assert cost.breakdown["attention"] == pytest.approx(attention, rel=1e-12)
    assert cost.breakdown["moe"] == 0 and cost.breakdown["communication"] == 0
    assert cost.seconds == pytest.approx(sum(cost.breakdown.values()), rel=1e-12)
    assert set(cost.breakdown) == set(FAMILIES)
    assert set(cost.provenance.values()) == {"analytical"}


def test_gpt_oss_decode_matches_hand_count():
    # tiny-gpt-oss: H 64, I 64, 4 experts top 2, window 8 on layer 0, full on layer 1, MXFP4
    spec = ModelSpec.from_config(ModelConfig.preset("tiny-gpt-oss"), mxfp4_experts=True)
    shape = StepShape.of(spec, [(1, 20)])
    cost = RooflinePredictor(UNIT, EXACT).predict(shape)
    a = 4
    distinct = 4 * (1 - (1 - 2 / 4) ** 1)  # = 2 experts expected for one token
    assert distinct == 2
    experts = roof(2 * 1 * 2 * 3 * 64 * 64,
                   distinct * 3 * 64 * 64 * 0.53125 + 2 * 64 * a + 2 * 3 * 64 * a)
    router = roof(2 * 64 * 4, 64 * 4 * a + 64 * a + 4 * a)
    topk = roof(5 * 4, 4 * a + 2 * 2 * 4)
    assert cost.breakdown["moe"] == pytest.approx(2 * (experts + router + topk), rel=1e-12)
    # the sliding layer reads 8 keys, the full one 21
    sliding = roof(4 * 4 * 16 * 8, 2 * 8 * 32 * a + 2 * 64 * a)
    full = roof(4 * 4 * 16 * 21, 2 * 21 * 32 * a + 2 * 64 * a)
    write = roof(0, 2 * 2 * 32 * a)
    assert cost.breakdown["attention"] == pytest.approx(sliding + full + 2 * write, rel=1e-12)


def test_moe_reads_fewer_distinct_experts_than_tokens_times_k():
    spec = ModelSpec.from_model("gpt-oss-120b")
    p = RooflinePredictor("MI355X")
    one = p.predict(StepShape.of(spec, [(1, 100)])).breakdown["moe"]
    many = p.predict(StepShape.of(spec, [(1, 100)] * 256)).breakdown["moe"]
    # 256 tokens x 4 of 128 experts touch nearly all 128; far less than 256x the one-token read
    assert one < many < 64 * one


def test_tensor_parallel_adds_the_runners_collectives_in_a_ring():
    spec = ModelSpec.from_config(ModelConfig.preset("tiny-llama"))
    p = RooflinePredictor(UNIT, {**EXACT, "allreduce_latency_s": 1e-6})
    cost = p.predict(StepShape.of(spec, [(4, 0)], tp=2))
    # the embedding's all-reduce and two per layer (2 layers), each rank sending 2 (n-1)/n of
    # the T x H float32 hidden states; then the one sampled row's logits all-gathered, each
    # rank sending (n-1)/n of the 256-entry float32 row
    reduces = 5 * (2 * (2 - 1) / 2 * (4 * 64 * 4) / 100e9 + 1e-6)
    gather = (2 - 1) / 2 * (256 * 4) / 100e9 + 1e-6
    assert cost.breakdown["communication"] == pytest.approx(reduces + gather, rel=1e-12)
    assert p.predict(StepShape.of(spec, [(4, 0)])).breakdown["communication"] == 0


def test_fp4_hardware_runs_mxfp4_experts_faster():
    spec = ModelSpec.from_model("gpt-oss-120b")
    shape = StepShape.of(spec, [(4096, 0)])  # compute-bound prefill
    b200 = RooflinePredictor("B200").predict(shape).breakdown["moe"]
    h200 = RooflinePredictor("H200").predict(shape).breakdown["moe"]
    assert b200 < h200


def test_interconnect_missing_refuses_tp():
    spec = ModelSpec.from_config(ModelConfig.preset("tiny-llama"))
    bare = Hardware(name="bare", vendor="test", bf16_tflops=Figure(1.0, "t"),
                    fp8_tflops=Figure(None, "t"), fp4_tflops=Figure(None, "t"),
                    hbm_tbps=Figure(1.0, "t"), hbm_gb=Figure(1, "t"))
    with pytest.raises(PredictionRefused) as e:
        RooflinePredictor(bare).predict(StepShape.of(spec, [(1, 1)], tp=2))
    assert "interconnect" in e.value.reason


@pytest.mark.parametrize("bad, match", [
    ({"memory": 1.5}, "efficiencies.memory"),
    ({"compute": {"bfloat16": 0}}, "efficiencies.compute"),
    ({"speed": 2}, "unknown field"),
])
def test_bad_efficiencies(bad, match):
    with pytest.raises(ValueError, match=match):
        RooflinePredictor("H100", bad)


def test_unknown_hardware_lists_known():
    with pytest.raises(ValueError) as e:
        RooflinePredictor("TPU v5")
    for name in ("H100 SXM", "MI355X", "host"):
        assert name in str(e.value)


def test_step_cost_rejects_unknown_family_and_negative_time():
    with pytest.raises(ValueError, match="unknown families"):
        StepCost.from_parts({"gemm": 1.0, "flash": 2.0}, {})
    with pytest.raises(ValueError, match="gemm"):
        StepCost.from_parts({"gemm": -1.0}, {})
    with pytest.raises(ValueError, match="provenance"):
        StepCost.from_parts({"gemm": 1.0}, {"gemm": "guessed"})
    c = StepCost.from_parts({"gemm": 1.0, "overhead": 0.5}, {"gemm": "fitted"})
    assert math.isclose(c.seconds, 1.5) and c.provenance["attention"] == "analytical"


def test_fp4_dense_weights_read_at_their_own_memory_curve():
    # A decode of one token is memory bound on every dense GEMM: each reads its weights at the
    # generation's gemm_memory_fp4 fraction of the HBM peak, the bf16 lm_head at gemm_memory's.
    from gnomon.predict.efficiency import curves_for
    from gnomon.predict.opcount import dense_ops

    spec = ModelSpec.from_model("llama-3.1-70b", weight_dtype="nvfp4")
    predictor = RooflinePredictor("B200")
    curves, hbm = curves_for(predictor.hardware), predictor.hardware.hbm_tbps.value * 1e12
    launch = predictor.efficiencies.launch_s
    expected = 0.0
    for op in dense_ops(spec, 1, 1, 1):
        if op.family == "gemm":
            curve = curves["gemm_memory_fp4" if op.compute == "fp4" else "gemm_memory"]
            expected += op.bytes / (hbm * curve(op.bytes / op.launches)) + op.launches * launch
    assert {op.compute for op in dense_ops(spec, 1, 1, 1) if op.family == "gemm"} == {
        "fp4", "bfloat16"}
    got = predictor.predict(StepShape.of(spec, [(1, 100)])).breakdown["gemm"]
    assert got == pytest.approx(expected, rel=1e-9)
