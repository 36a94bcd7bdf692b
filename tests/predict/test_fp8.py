"""FP8 weights and an FP8 KV cache: read from a config's quantization_config or from flags,
priced as bytes and as the FP8 peak (weight-only where the chip has no FP8 math), refused by
the real engine."""

import json

import pytest

from gnomon.engine.config import ModelConfig, preset_json
from gnomon.engine.llm import LLMEngine
from gnomon.hardware import gpu
from gnomon.predict.cost import PredictionRefused
from gnomon.predict.opcount import step_ops
from gnomon.predict.roofline import RooflinePredictor
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.simulated import kv_blocks_for_hardware


def _llama(quant=None):
    raw = preset_json("llama-3.1-8b")
    if quant is not None:
        raw["quantization_config"] = quant
    return ModelConfig.from_json(raw)


CT = {"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"targets": ["Linear"],
                                    "weights": {"num_bits": 8, "type": "float"},
                                    "input_activations": {"num_bits": 8, "type": "float"}}},
      "ignore": ["lm_head"]}
QUARK = {"quant_method": "quark",
         "global_quant_config": {"weight": {"dtype": "fp8_e4m3"},
                                 "input_tensors": {"dtype": "fp8_e4m3"}},
         "layer_quant_config": {"*k_proj": {"output_tensors": {"dtype": "fp8_e4m3"}},
                                "*v_proj": {"output_tensors": {"dtype": "fp8_e4m3"}}},
         "exclude": ["lm_head"]}


@pytest.mark.parametrize("quant, kv", [
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, None),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, None),
    (CT, None),
    ({**CT, "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}, "fp8"),
    ({k: v for k, v in QUARK.items() if k != "layer_quant_config"}, None),
    (QUARK, "fp8"),
])
def test_quantization_configs_declare_fp8(quant, kv):
    config = _llama(quant)
    assert config.quantization == "fp8" and config.kv_cache_dtype == kv
    spec = ModelSpec.from_config(config)
    assert spec.linear_dtype == "fp8" and spec.kv_bytes == (1 if kv else 2)


@pytest.mark.parametrize("quant, match", [
    ({"quant_method": "awq"}, "unknown quant_method 'awq'"),
    ({**CT, "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}},
     "compressed-tensors is supported with one weight format"),
    ({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp4"}}},
     "quark is supported with fp8_e4m3"),
    ({"quant_method": "mxfp4"}, "gpt-oss only"),
])
def test_other_methods_are_refused_by_name(quant, match):
    with pytest.raises(ValueError, match=match):
        _llama(quant)


def test_fp8_halves_the_linear_weights_and_the_kv():
    bf16 = ModelSpec.from_model("llama-3.1-70b")
    fp8 = ModelSpec.from_model("llama-3.1-70b", weight_dtype="fp8", kv_dtype="fp8")
    c = bf16.config
    embeddings = 2 * c.vocab_size * c.hidden_size * 2  # embedding and lm_head stay bf16
    norms = c.num_layers * 2 * c.hidden_size * 2
    linear = bf16.weight_bytes() - embeddings - norms
    assert fp8.weight_bytes() == pytest.approx(embeddings + norms + linear / 2)
    assert fp8.kv_bytes_per_token() * 2 == bf16.kv_bytes_per_token()
    hw = gpu("MI300X")
    assert kv_blocks_for_hardware(fp8, hw, tp=8) > 2 * kv_blocks_for_hardware(bf16, hw, tp=8)


def test_fp8_gemms_run_at_the_fp8_peak_and_read_half_the_bytes():
    bf16 = ModelSpec.from_model("llama-3.1-8b")
    fp8 = ModelSpec.from_model("llama-3.1-8b", weight_dtype="fp8")
    ops = {op.name: op for op in step_ops(StepShape.of(fp8, [(4096, 0)]))}
    assert ops["qkv_proj"].compute == "fp8" and ops["lm_head"].compute == "bfloat16"
    shape = [(4096, 0)]
    h100 = RooflinePredictor("H100")
    fast = h100.predict(StepShape.of(fp8, shape)).breakdown["gemm"]
    slow = h100.predict(StepShape.of(bf16, shape)).breakdown["gemm"]
    assert fast < 0.75 * slow  # compute bound: about half, lm_head aside


def test_a_chip_without_fp8_math_runs_fp8_weight_only():
    fp8 = ModelSpec.from_model("llama-3.1-8b", weight_dtype="fp8")
    bf16 = ModelSpec.from_model("llama-3.1-8b")
    a100 = RooflinePredictor("A100")
    prefill = [(4096, 0)]  # compute bound: bf16 math at the w8a16 kernel's efficiency
    w8a16 = a100.predict(StepShape.of(fp8, prefill)).breakdown["gemm"]
    assert w8a16 >= a100.predict(StepShape.of(bf16, prefill)).breakdown["gemm"]
    decode = [(1, 1000)] * 8  # memory bound: half the weight bytes
    assert (a100.predict(StepShape.of(fp8, decode)).breakdown["gemm"]
            < 0.7 * a100.predict(StepShape.of(bf16, decode)).breakdown["gemm"])


def test_hardware_file_without_the_fp8_peak_refuses_naming_the_field(tmp_path):
    base = {"name": "Mystery", "vendor": "NVIDIA", "generation": "hopper",
            "bf16_tflops": 900, "hbm_tbps": 3, "hbm_gb": 80}
    (tmp_path / "missing.json").write_text(json.dumps(base))
    (tmp_path / "none.json").write_text(json.dumps({**base, "fp8_tflops": None}))
    fp8 = ModelSpec.from_model("llama-3.1-8b", weight_dtype="fp8")
    shape = StepShape.of(fp8, [(16, 0)])
    with pytest.raises(PredictionRefused, match="fp8_tflops is not given"):
        RooflinePredictor(str(tmp_path / "missing.json")).predict(shape)
    RooflinePredictor(str(tmp_path / "none.json")).predict(shape)  # null: weight-only
    bf16 = ModelSpec.from_model("llama-3.1-8b")
    RooflinePredictor(str(tmp_path / "missing.json")).predict(StepShape.of(bf16, [(16, 0)]))


@pytest.mark.parametrize("quant, match", [
    ({"quant_method": "fp8"}, "fp8 weights .*no kernel"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4 weights .*no kernel"),
    ({**CT, "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float",
                                                 "group_size": 32}}}},
     "mxfp4-dense weights .*no kernel"),
])
def test_the_real_engine_refuses_quantized_weights_by_name(quant, match):
    with pytest.raises(ValueError, match=match):
        LLMEngine(_llama(quant), random_weights=True)


@pytest.mark.parametrize("quant, weights, kv", [
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
      "group_size": 16}, "nvfp4", "fp8"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8", None),
    ({**CT, "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float",
                                                 "group_size": 16}}}}, "nvfp4", None),
    ({**CT, "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float",
                                                 "group_size": 32}}}}, "mxfp4", None),
])
def test_fp4_quantization_configs_declare_their_dense_weights(quant, weights, kv):
    spec = ModelSpec.from_config(_llama(quant))
    assert spec.linear_dtype == weights and (spec.kv_dtype or None) == kv


@pytest.mark.parametrize("quant, match", [
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "modelopt is supported with"),
    ({**CT, "config_groups": {"a": {"weights": {"num_bits": 8, "type": "float"}},
                              "b": {"weights": {"num_bits": 4, "type": "float",
                                                "group_size": 16}}}}, "one weight format"),
])
def test_other_fp4_configs_are_refused_by_name(quant, match):
    with pytest.raises(ValueError, match=match):
        _llama(quant)


@pytest.mark.parametrize("dtype, bits", [("nvfp4", 4.5), ("mxfp4", 4.25)])
def test_fp4_dense_weights_are_their_bits_per_weight(dtype, bits):
    bf16 = ModelSpec.from_model("llama-3.1-70b")
    fp4 = ModelSpec.from_model("llama-3.1-70b", weight_dtype=dtype)
    c = bf16.config
    kept = 2 * c.vocab_size * c.hidden_size * 2 + c.num_layers * 2 * c.hidden_size * 2
    linear_params = (bf16.weight_bytes() - kept) / 2
    assert fp4.weight_bytes() == pytest.approx(kept + linear_params * bits / 8)


def test_fp4_gemms_run_on_the_fp4_peak_where_the_chip_has_one_else_weight_only():
    fp4 = ModelSpec.from_model("llama-3.1-70b", weight_dtype="nvfp4")
    fp8 = ModelSpec.from_model("llama-3.1-70b", weight_dtype="fp8")
    ops = {op.name: op for op in step_ops(StepShape.of(fp4, [(4096, 0)]))}
    assert ops["qkv_proj"].compute == "fp4" and ops["lm_head"].compute == "bfloat16"
    prefill = [(8192, 0)]
    b200, h100 = RooflinePredictor("B200"), RooflinePredictor("H100")
    # B200: FP4 math at twice the FP8 peak; compute bound, so well under FP8's time
    assert (b200.predict(StepShape.of(fp4, prefill)).breakdown["gemm"]
            < 0.7 * b200.predict(StepShape.of(fp8, prefill)).breakdown["gemm"])
    # H100 has no FP4 math: bf16 math (w4a16), slower than FP8's when compute bound ...
    assert (h100.predict(StepShape.of(fp4, prefill)).breakdown["gemm"]
            > h100.predict(StepShape.of(fp8, prefill)).breakdown["gemm"])
    # ... and faster when memory bound (fewer weight bytes)
    decode = [(1, 1000)] * 4
    assert (h100.predict(StepShape.of(fp4, decode)).breakdown["gemm"]
            < 0.7 * h100.predict(StepShape.of(fp8, decode)).breakdown["gemm"])


def test_kv_memory_free_takes_the_fraction_of_what_weights_and_activations_leave():
    from gnomon.predict.simulated import activation_bytes

    spec = ModelSpec.from_model("llama-3.1-70b", weight_dtype="fp8", kv_dtype="fp8")
    hw = gpu("H200")
    total = kv_blocks_for_hardware(spec, hw, gpu_memory_utilization=0.9)
    free = kv_blocks_for_hardware(spec, hw, gpu_memory_utilization=0.9, kv_memory="free")
    used = spec.weight_bytes() + activation_bytes(spec, max_num_batched_tokens=8192,
                                                  max_num_seqs=256)
    hbm = hw.hbm_gb.value * 1e9
    # "total": 0.9 of the HBM less what is used; "free": 0.9 of what is left after it
    assert free / total == pytest.approx(0.9 * (hbm - used) / (0.9 * hbm - used), rel=1e-3)


def test_kv_memory_static_leaves_the_activations_to_the_rest_of_the_hbm():
    # SGLang's mem_fraction_static: the pool is that share of the HBM less the weights; the
    # activations live in the reserved rest, so a bigger token budget does not shrink it
    from gnomon.predict.engines import resolve_engine
    from gnomon.predict.simulated import activation_bytes

    spec = ModelSpec.from_model("qwen3-32b")
    hw = gpu("H100 SXM")
    block = spec.config.kv_cache_groups(True).bytes_per_block(
        block_size=16, num_kv_heads=spec.config.num_kv_heads, head_dim=spec.config.head_dim,
        dtype_size=spec.kv_bytes)
    static = kv_blocks_for_hardware(spec, hw, gpu_memory_utilization=0.88, kv_memory="static")
    assert static == int((0.88 * hw.hbm_gb.value * 1e9 - spec.weight_bytes()) // block)
    assert static == kv_blocks_for_hardware(spec, hw, gpu_memory_utilization=0.88,
                                            kv_memory="static", max_num_batched_tokens=65536)
    # the same model under vLLM's accounting loses the activations from its pool
    total = kv_blocks_for_hardware(spec, hw, gpu_memory_utilization=0.88)
    acts = activation_bytes(spec, max_num_batched_tokens=8192, max_num_seqs=256)
    assert static - total == pytest.approx(acts / block, abs=1)
    assert resolve_engine("sglang").kv_memory == "static"
    with pytest.raises(ValueError, match="kv_memory: expected one of total, free, static"):
        kv_blocks_for_hardware(spec, hw, kv_memory="reserved")
