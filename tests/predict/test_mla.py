"""DeepSeek-V3's Multi-head Latent Attention and MoE in the simulator: the weight table against
the published parameter count, the latent KV cache, MLA's decode and prefill ops counted by hand,
the dense and shared-expert layers, and the engine's refusal."""

import math

import pytest

from gnomon.engine.config import ModelConfig
from gnomon.engine.models import weight_shapes
from gnomon.engine.parallel import Shard
from gnomon.predict import measured
from gnomon.predict.opcount import step_ops
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.simulate import simulate
from gnomon.predict.spec import SimulationSpec
from gnomon.predict.workloads import parse_length


def _params(config, tp=1):
    return sum(math.prod(s) for s in weight_shapes(Shard(0, tp).local_config(config)).values())


def test_weight_table_holds_the_published_parameter_count():
    # DeepSeek-V3 Technical Report (arXiv 2412.19437), abstract: "671B total parameters"; the
    # checkpoint's multi-token-prediction module (14B more) is not part of the served model
    total = _params(ModelConfig.preset("deepseek-v3"))
    assert total == pytest.approx(671e9, rel=0.005)


def test_tensor_parallel_shards_split_heads_and_experts_and_replicate_the_latent():
    c = ModelConfig.preset("deepseek-v3")
    shapes1, shapes8 = weight_shapes(c), weight_shapes(Shard(0, 8).local_config(c))
    assert shapes8["layers.0.kv_a"] == shapes1["layers.0.kv_a"] == (576, 7168)
    assert shapes8["layers.0.q_a"] == shapes1["layers.0.q_a"] == (1536, 7168)
    assert shapes8["layers.0.q_b"] == (16 * 192, 1536)  # 128 heads / 8
    assert shapes8["layers.0.kv_b"] == (16 * 256, 512)
    assert shapes8["layers.0.w13"] == (2 * 18432 // 8, 7168)  # a dense layer
    assert shapes8["layers.3.w13"] == (256, 2 * 2048 // 8, 7168)  # experts
    assert shapes8["layers.3.shared_w2"] == (7168, 2048 // 8)
    assert "layers.2.router" not in shapes8 and "layers.60.router" in shapes8


@pytest.mark.parametrize("kv, width", [("auto", 2), ("fp8", 1)])
def test_latent_kv_bytes_per_token(kv, width):
    spec = ModelSpec.from_model("deepseek-v3", kv_dtype=kv)
    # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64), one copy on every GPU
    assert spec.kv_bytes_per_token(1) == spec.kv_bytes_per_token(8) == 61 * 576 * width


def _ops(requests, tp=1):
    spec = ModelSpec.from_model("tiny-deepseek-v3")
    return {op.name: op for op in step_ops(StepShape.of(spec, requests, tp=tp))}


def test_mla_decode_and_prefill_counted_by_hand():
    # tiny: 2 layers, 4 heads, kv_lora_rank 32, rope 8 (latent 40), nope 16, v 16; float32
    L, hq, rank, latent, nope, v, a = 2, 4, 32, 40, 16, 16, 4
    ops = _ops([(1, 10), (1, 20), (6, 0)])
    # decodes: 11 and 21 keys, each read once; queries and outputs at latent + rank per head
    keys = 11 + 21
    assert ops["mla_decode"].flops == L * 2 * hq * (latent + rank) * keys
    assert ops["mla_decode"].bytes == L * (keys * latent * a + 2 * hq * (latent + rank) * a)
    assert ops["mla_absorb_q"].flops == L * 2 * 2 * hq * nope * rank
    assert ops["mla_absorb_out"].flops == L * 2 * 2 * hq * rank * v
    # the 6-token prompt: kv_b up-projects its 6 keys, causal attention attends 21 keys
    assert ops["kv_b_proj"].flops == L * 2 * 6 * rank * hq * (nope + v)
    assert ops["mla_prefill"].flops == L * 2 * hq * (nope + 8 + v) * 21
    assert ops["mla_cache_write"].bytes == L * 8 * latent * (a + a)


def test_dense_shared_and_routed_layers_are_counted_on_their_layers():
    ops = _ops([(5, 0)])
    T, H = 5, 64
    assert ops["gate_up_proj"].launches == 1  # first_k_dense_replace = 1 of 2 layers
    assert ops["gate_up_proj"].flops == 2 * T * H * 2 * 128
    assert ops["shared_expert_gate_up_proj"].flops == 2 * T * H * 2 * 32
    assert ops["fused_moe[w13]"].launches == 1
    assert ops["fused_moe[w13]"].flops == 2 * T * 2 * 2 * 32 * H  # top-2 of 32 wide


def test_tensor_parallel_splits_mla_heads_not_the_latent():
    one, two = _ops([(1, 10)]), _ops([(1, 10)], tp=2)
    assert two["mla_decode"].flops * 2 == one["mla_decode"].flops
    latent_reads = 2 * 11 * 40 * 4
    assert one["mla_decode"].bytes - latent_reads == 2 * (two["mla_decode"].bytes - latent_reads)


def test_the_engine_refuses_by_name_and_the_simulator_prices_it():
    import gnomon

    with pytest.raises(ValueError, match="DeepseekV3ForCausalLM: simulation only; the engine "
                                         "has no MLA kernel"):
        gnomon.LLM("tiny-deepseek-v3", random_weights=True)
    report, _ = simulate(SimulationSpec.of(model="deepseek-v3", hardware="B200", tp=8,
                                           engine="sglang",
                         num_requests=8, concurrency=4, input_len=parse_length("256", "i"),
                         output_len=parse_length("32", "o")))
    assert report["metrics"]["tpot"]["mean"] > 0
    limits = " ".join(report["limits"])
    assert "576-element latent per token per layer, replicated" in limits
    assert "simulation only" in limits


def test_silicon_deepseek_rows_map_to_the_preset_with_an_fp8_cache():
    row = {"id": "r", "silicon_data_source": "source_file=2026-04-06.csv; model=x",
           "backend": "sglang", "backend_version": "0.5.9",
           "model_path": "deepseek-ai/DeepSeek-R1", "system": "b200_sxm", "mode": "agg",
           "isl": "1024", "osl": "1024", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8_block",
           "batch_size": "4", "tp_size": "8", "pp_size": "1", "attention_dp_size": "1",
           "moe_tp_size": "8", "moe_ep_size": "1", "silicon_ttft_ms": "100",
           "silicon_tpot_ms": "10"}
    p = measured.from_silicon(row)
    assert (p.model, p.weight_dtype, p.kv_dtype, p.tp) == ("deepseek-v3", "fp8", "fp8", 8)
