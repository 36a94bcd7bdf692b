"""Kimi-K2.5 (``KimiK25ForConditionalGeneration``) in the simulator: its weight table against the
published counts, its INT4 routed experts counted at 4.5 bits and priced weight-only (W4A16 at
the bf16 peak), the config's wrapper and quantization_config read (and other integer schemes
refused by name), a simulation, the engine's refusal and its measured rows mapped."""

import json
import math
import os

import pytest

from gnomon.engine.config import ModelConfig, preset_json
from gnomon.engine.models import weight_shapes
from gnomon.predict import measured
from gnomon.predict.opcount import step_ops
from gnomon.predict.roofline import RooflinePredictor
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.simulate import simulate
from gnomon.predict.spec import SimulationSpec
from gnomon.predict.workloads import parse_length

REASON = "KimiK25ForConditionalGeneration: simulation only; the engine has no MLA kernel"


def _aic_config(name):
    """aiconfigurator-core's copy of a model's config.json, or a skip where it is absent."""
    aic = pytest.importorskip("aiconfigurator_core")
    path = os.path.join(list(aic.__path__)[0], "model_configs", name)
    if not os.path.exists(path):
        pytest.skip(f"aiconfigurator-core has no {name}")
    return path


def _routed(shapes, c):
    return sum(math.prod(s) for n, s in shapes.items()
               if n.rsplit(".", 1)[-1] in ("w13", "w2") and len(s) == 3
               and s[0] == c.num_experts)


def test_weight_table_holds_the_published_parameter_counts():
    c = ModelConfig.preset("kimi-k2.5")
    shapes = weight_shapes(c)
    total, routed = sum(math.prod(s) for s in shapes.values()), _routed(shapes, c)
    # Kimi-K2.5's text model has Kimi-K2-Instruct's shapes (both config.json files as
    # aiconfigurator-core 0.12.0 ships them; K2.5 is continual pretraining atop Kimi-K2-Base),
    # whose checkpoint the Hugging Face hub counts at 1026.5B parameters from its safetensors
    # (as drose.io/aitools/tools/kimi-k2-instruct reproduces it; its FP8 block scales, ~0.06B,
    # included; no vision tower, no multi-token-prediction layer). K2.5's own card rounds to
    # "1T"; its INT4 checkpoint's packed count means nothing as parameters.
    assert total == pytest.approx(1026.5e9, rel=0.005)
    # "Active parameters 32.86B" (NVIDIA technical blog, "Build with Kimi K2.5 Multimodal VLM
    # Using NVIDIA GPU-Accelerated Endpoints"): all but the routed experts, and 8 of 384 of those
    assert total - routed + routed * 8 / 384 == pytest.approx(32.86e9, rel=0.005)


def test_weight_bytes_match_the_int4_checkpoints_size():
    # the checkpoint's files hold 595 GB (VentureBeat, "Moonshot's Kimi K2.5 is 'open,' 595GB,
    # and built for agent swarms", 2026-01-29): the text model, its routed experts at 4.5 bits,
    # and the vision tower and projector, 471,143,920 bf16 parameters gnomon does not count
    # (gnomon.engine.models.kimi_k25); at 4 or 4.25 bits the experts would miss by 5% or more
    spec = ModelSpec.from_model("kimi-k2.5")
    assert spec.weight_bytes() + 471_143_920 * 2 == pytest.approx(595e9, rel=0.005)


def test_int4_experts_are_four_and_a_half_bits_and_the_rest_bf16():
    spec = ModelSpec.from_model("tiny-kimi-k2.5")
    assert (spec.expert_dtype, spec.linear_dtype, spec.kv_dtype) == ("int4", "bfloat16", None)
    assert spec.expert_bytes_per_param == 0.5625  # 4 bits + a bf16 scale per 32, no zero point
    # tiny: vocab 256, H 64, 2 layers (MLA: q_a 32x64, q_b 96x32, kv_a 40x64, kv_b 128x32,
    # o 64x64, norms 64 + 32 + 32 + 64); layer 0 a dense MLP 128 wide, layer 1 a router of 8,
    # 8 experts of 32 (w13 8x64x64, w2 8x64x32) and a shared expert of 32
    embed, attention, norms = 2 * 256 * 64 + 64, 2048 + 3072 + 2560 + 4096 + 4096, 192
    dense, shared, router = 256 * 64 + 64 * 128, 64 * 64 + 64 * 32, 8 * 64 + 8
    experts = 8 * 64 * 64 + 8 * 64 * 32
    bf16 = embed + 2 * (attention + norms) + dense + shared + router
    assert spec.weight_bytes() == 2 * bf16 + 0.5625 * experts == 220_048
    # a decode step: the attention's, dense MLP's and shared expert's GEMMs read bf16 weights
    # in bf16 math, the routed experts' INT4 ones weight-only
    ops = {op.name: op for op in step_ops(StepShape.of(spec, [(1, 10)]))}
    assert {n for n, op in ops.items() if op.compute != "bfloat16"} == \
        {"fused_moe[w13]", "fused_moe[w2]"}
    assert {op.compute for n, op in ops.items() if n.startswith("fused_moe")} == {"w4a16"}
    assert ops["gate_up_proj"].bytes == 64 * 256 * 2 + (64 + 256) * 2
    assert ops["shared_expert_down_proj"].bytes == 32 * 64 * 2 + (32 + 64) * 2
    assert ops["o_proj"].bytes == 64 * 64 * 2 * 2 + 2 * (64 + 64) * 2  # 2 layers
    # one token reads its 2 experts' w2 (64 x 32 each) at 4.5 bits
    assert ops["fused_moe[w2]"].bytes == 2 * 64 * 32 * 0.5625 + 2 * 32 * 2 + 64 * 2


def test_the_fused_moe_runs_weight_only_at_the_bf16_peak():
    spec = ModelSpec.from_model("kimi-k2.5")
    p = RooflinePredictor("H200")
    hw, eff, curves = p.hardware, p.efficiencies, p.efficiencies.curves
    L, E, k, H, I, tp, a = 60, 384, 8, 7168, 2048 // 8, 8, 2
    for requests in ([(1, 1000)] * 256, [(4096, 0)]):  # a decode step, then a prefill
        X = len(requests) if requests[0][0] == 1 else 4096
        ops = {op.name: op for op in step_ops(StepShape.of(spec, requests, tp=tp))}
        distinct = E * (1 - (1 - k / E) ** X)
        rows = round(X * k / distinct)
        weights = distinct * H * I * 0.5625  # this GPU's slice of every expert read, INT4
        for name, flops, nbytes, depth in (  # this step's w13, then its w2
                ("fused_moe[w13]", L * 2 * X * k * 2 * I * H,
                 L * (2 * weights + X * H * a + X * k * 2 * I * a), H),
                ("fused_moe[w2]", L * 2 * X * k * I * H,
                 L * (weights + X * k * I * a + X * H * a), I)):
            op = ops[name]
            assert op.compute == "w4a16" and op.rows == rows and op.depth == depth
            assert op.flops == pytest.approx(flops) and op.bytes == pytest.approx(nbytes)
            # the bf16 peak at the best bf16 fraction, times the grouped GEMM's, K's and the
            # weight-only kernel's factors; the memory roof at the grouped GEMM's fraction
            rate = (hw.bf16_tflops.value * 1e12 * eff.compute["bfloat16"]
                    * curves["grouped_gemm"](rows) * curves["gemm_k"](depth)
                    * curves["w4a16"](rows))
            memory = nbytes / (hw.hbm_tbps.value * 1e12 * curves["grouped_gemm_memory"](rows))
            expected = max(flops / rate, memory) + L * eff.launch_s
            assert p.op_seconds(op) == pytest.approx(expected, rel=1e-12)
            # as MXFP4 experts run on Hopper, which has no FP4 math
            assert p.op_seconds(op) == p.op_seconds(op._replace(compute="fp4"))
    # the prefill's w2 (the loop's last op) is compute-bound: the weight-only kernel costs it
    # over bf16 math
    assert flops / rate > memory
    assert p.op_seconds(op) > p.op_seconds(op._replace(compute="bfloat16"))
    # a chip with FP4 math still runs INT4 experts weight-only, at its bf16 peak
    b200 = RooflinePredictor("B200")
    assert b200.op_seconds(op) > b200.op_seconds(op._replace(compute="fp4"))


def test_simulate_prices_it_and_states_the_limit():
    report, _ = simulate(SimulationSpec.of(model="kimi-k2.5", hardware="H200", tp=8, engine="vllm",
                         num_requests=8, concurrency=4, input_len=parse_length("256", "i"),
                         output_len=parse_length("16", "o")))
    assert report["metrics"]["tpot"]["mean"] > 0 and report["metrics"]["ttft"]["mean"] > 0
    limits = " ".join(report["limits"])
    assert REASON in limits
    assert "576-element latent per token per layer" in limits


def test_the_engine_refuses_it_by_name():
    import gnomon
    from gnomon.engine.llm import LLMEngine

    with pytest.raises(ValueError, match=REASON):
        gnomon.LLM("tiny-kimi-k2.5", random_weights=True)
    with pytest.raises(ValueError, match=REASON):
        LLMEngine(ModelConfig.preset("tiny-kimi-k2.5"), random_weights=True)


def _row(quant, system="h200_sxm", version="0.16.0", tp="8", ep="1"):
    return {"id": "r", "silicon_data_source": "source_file=2026-04-06.csv; model=Kimi-K2.5",
            "backend": "vllm", "backend_version": version, "model_path": "moonshotai/Kimi-K2.5",
            "system": system, "mode": "agg", "isl": "1024", "osl": "1024",
            "gemm_quant_mode": quant, "moe_quant_mode": quant, "batch_size": "4",
            "tp_size": tp, "pp_size": "1", "attention_dp_size": "1",
            "moe_tp_size": str(int(tp) // int(ep)), "moe_ep_size": ep,
            "silicon_ttft_ms": "100", "silicon_tpot_ms": "10"}


def test_silicon_rows_map_to_the_preset_with_their_dtypes():
    p = measured.from_silicon(_row("int4_wo"))
    assert (p.model, p.hardware, p.engine, p.tp) == ("kimi-k2.5", "H200", "vllm", 8)
    spec = ModelSpec.from_model(p.model, weight_dtype=p.weight_dtype, kv_dtype=p.kv_dtype)
    assert (spec.linear_dtype, spec.experts_dtype, spec.kv_bytes) == ("bfloat16", "int4", 2)
    # NVIDIA's NVFP4 checkpoint: NVFP4 replaces the INT4 experts, and an FP8 KV cache
    p = measured.from_silicon(_row("nvfp4", "b200_sxm", "0.17.0", tp="4", ep="4"))
    spec = ModelSpec.from_model(p.model, weight_dtype=p.weight_dtype, kv_dtype=p.kv_dtype)
    assert (p.model, p.ep) == ("kimi-k2.5", 4)
    assert (spec.linear_dtype, spec.experts_dtype, spec.expert_compute, spec.kv_bytes) == \
        ("nvfp4", "nvfp4", "fp4", 1)


def test_the_shipped_configs_read_as_the_preset():
    # Moonshot's config.json: the preset; NVIDIA's: the same model, NVFP4 and an FP8 KV cache
    # from the wrapper's top-level quantization_config
    moonshot = ModelConfig.from_json(_aic_config("moonshotai--Kimi-K2.5_config.json"))
    assert moonshot == ModelConfig.preset("kimi-k2.5")
    assert (moonshot.quantization, moonshot.num_experts, moonshot.first_dense_layers,
            moonshot.mla.latent) == ("int4", 384, 1, 576)
    nvidia = ModelConfig.from_json(_aic_config("nvidia--Kimi-K2.5-NVFP4_config.json"))
    assert (nvidia.quantization, nvidia.kv_cache_dtype) == ("nvfp4", "fp8")
    assert nvidia.num_layers == 61 and nvidia.vocab_size == 163840


def _with_quant(change):
    raw = preset_json("tiny-kimi-k2.5")
    change(raw["text_config"]["quantization_config"])
    return raw


def _group(q):
    return q["config_groups"]["group_0"]


@pytest.mark.parametrize("change, reason", [
    (lambda q: _group(q)["weights"].update(group_size=128), "group_size 128, not 32"),
    (lambda q: _group(q)["weights"].update(symmetric=False), "symmetric False, not True"),
    (lambda q: _group(q)["weights"].update(num_bits=8), "num_bits 8, not 4"),
    (lambda q: _group(q).update(input_activations={"num_bits": 8, "type": "int"}),
     "quantizes its input activations too"),
    (lambda q: q.update(ignore=["lm_head", "re:.*self_attn.*"]),
     "would quantize model.layers.0.mlp.gate_proj too"),
    (lambda q: q.update(ignore=["lm_head", "re:.*mlp.*", "re:.*self_attn.*"]),
     "would leave the routed experts' .* unquantized"),
])
def test_other_integer_schemes_are_refused_by_name(change, reason):
    with pytest.raises(ValueError, match="compressed-tensors is supported with .*INT4 on the "
                                         f"routed experts alone.*{reason}"):
        ModelConfig.from_json(_with_quant(change))


def test_int4_experts_are_refused_where_the_architecture_names_no_int4_linears():
    # the same quantization_config on an architecture whose module declares no INT4_LINEARS
    # (Qwen3-MoE's): generic code knows no architecture's module names, so it refuses
    raw = preset_json("tiny-qwen3-moe")
    raw["quantization_config"] = preset_json("tiny-kimi-k2.5")["text_config"][
        "quantization_config"]
    with pytest.raises(ValueError, match="INT4 on the routed experts alone.*declares no INT4 "
                                         "experts"):
        ModelConfig.from_json(raw)


def test_the_wrapper_without_its_text_model_names_the_key(tmp_path):
    raw = preset_json("tiny-kimi-k2.5")
    del raw["text_config"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(KeyError, match="text_config"):
        ModelConfig.from_json(tmp_path / "config.json")


@pytest.mark.parametrize("weight_dtype, experts", [
    ("auto", "int4"), ("bfloat16", "int4"), ("fp8", "int4"), ("nvfp4", "nvfp4"),
    ("mxfp4", "mxfp4")])
def test_an_explicit_weight_dtype_replaces_the_int4_experts_only_if_no_wider(weight_dtype,
                                                                              experts):
    spec = ModelSpec.from_model("kimi-k2.5", weight_dtype=weight_dtype)
    assert spec.experts_dtype == experts
    # gpt-oss's MXFP4 experts stay MXFP4 under every weight dtype, as before
    oss = ModelSpec.from_model("gpt-oss-120b", weight_dtype=weight_dtype)
    assert oss.mxfp4_experts and oss.experts_dtype == "mxfp4"
