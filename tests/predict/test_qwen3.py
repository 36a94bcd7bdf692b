"""Qwen3 and Qwen3-MoE in the simulator: priced from their own modules (the per-head Q/K norms,
the experts at ``moe_intermediate_size``), read from presets and config.json files, and the
features gnomon does not implement refused by name."""

import json

import pytest

from gnomon.engine.config import ModelConfig, preset_json
from gnomon.predict.opcount import step_ops
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.simulate import simulate
from gnomon.predict.spec import SimulationSpec
from gnomon.predict.workloads import LengthDist


def _ops(name, requests, tp=1, **kw):
    spec = ModelSpec.from_model(name, **kw)
    return spec, {op.name: op for op in step_ops(StepShape.of(spec, requests, tp=tp))}


def test_qwen3_prices_its_head_norms():
    spec, ops = _ops("qwen3-32b", [(100, 0), (1, 500)], tp=2)
    c = spec.config
    T, L, a = 101, 64, 2
    q, kv = 64 * 128 // 2, 8 * 128 // 2  # this rank's query and KV widths
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size) == (64, 8, 128, 25600)
    assert ops["qk_norm"].bytes == L * 2 * T * (q + kv) * a
    assert ops["qk_norm"].launches == 2 * L
    assert ops["gate_up_proj"].flops == L * 2.0 * T * 5120 * 2 * 25600 // 2
    _, llama = _ops("llama-3.1-70b", [(100, 0)])
    assert "qk_norm" not in llama


def test_qwen3_moe_prices_experts_at_moe_intermediate_size():
    spec, ops = _ops("qwen3-235b-a22b", [(1, 1000)] * 16, tp=4, weight_dtype="fp8")
    c = spec.config
    assert (c.num_experts, c.top_k, c.intermediate_size) == (128, 8, 1536)
    T, L, H, k, inter = 16, 94, 4096, 8, 1536 // 4
    assert ops["fused_moe[w13]"].flops == L * 2.0 * T * k * 2 * inter * H
    assert ops["fused_moe[w2]"].depth == inter
    assert ops["fused_moe[w13]"].compute == "fp8" and ops["router"].compute == "bfloat16"
    assert "qk_norm" in ops and "gate_up_proj" not in ops


def test_qwen3_simulates_from_a_config_json_and_its_fp8_build(tmp_path):
    raw = preset_json("qwen3-32b")
    # Qwen/Qwen3-32B-FP8's quantization_config: FP8 weights in 128x128 blocks, no FP8 KV cache
    raw["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    spec = ModelSpec.from_model(str(tmp_path))
    assert (spec.linear_dtype, spec.kv_dtype) == ("fp8", None)
    # one byte per parameter of the 32,762,123,264, two for the embedding's and lm_head's
    # 2 x 151,936 x 5,120 (and for the norms, under 1M)
    assert spec.weight_bytes(1) == pytest.approx(32_762_123_264 + 2 * 151936 * 5120, rel=1e-4)
    lengths = dict(input_len=LengthDist.fixed(512), output_len=LengthDist.fixed(32))
    run = dict(hardware="H100 SXM", workload="random", num_requests=8, rate=4.0, tp=2, **lengths)
    fp8, _ = simulate(SimulationSpec.of(model=str(tmp_path), **run))
    bf16, _ = simulate(SimulationSpec.of(model="qwen3-32b", **run))
    assert fp8["setup"]["dtypes"]["weights"] == "fp8"
    assert fp8["metrics"]["requests"] == bf16["metrics"]["requests"] == 8
    # decode streams the weights: FP8 halves them
    assert fp8["metrics"]["tpot"]["mean"] < 0.8 * bf16["metrics"]["tpot"]["mean"]


@pytest.mark.parametrize("preset, edit, match", [
    ("qwen3-32b", {"use_sliding_window": True}, "use_sliding_window=true"),
    ("qwen3-235b-a22b", {"norm_topk_prob": False}, "norm_topk_prob=false"),
    ("qwen3-235b-a22b", {"mlp_only_layers": [0, 5]}, "mlp_only_layers"),
    ("qwen3-235b-a22b", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("qwen3-235b-a22b", {"num_experts_per_tok": 129}, "experts per token"),
])
def test_unsupported_qwen3_features_are_refused_by_name(preset, edit, match):
    raw = {**preset_json(preset), **edit}
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_json(raw)
