"""`EngineConfig`: every engine setting defined and checked in one place, and the one object a
real engine, its runner builder and a simulated engine are configured by."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.engine import launch
from gnomon.engine.engine_config import FIELDS, EngineConfig
from gnomon.engine.llm import LLM, LLMEngine
from gnomon.predict.roofline import RooflinePredictor
from gnomon.predict.serve import simulated_engine
from gnomon.predict.shapes import ModelSpec

BAD = {"block_size": 0, "max_num_seqs": -1, "max_num_batched_tokens": 2.5, "max_model_len": 0,
       "enable_prefix_caching": 1, "capacity_policy": "fifo", "batch_wait_timeout_iters": -1,
       "batch_wait_max_tokens_ratio": 1.5, "batching": "decode_first",
       "scheduler_recv_interval": 0, "enable_hybrid_kv": "yes", "num_kv_blocks": 0,
       "kv_cache_bytes": True, "gpu_memory_utilization": 0.0, "tensor_parallel_size": 0,
       "expert_parallel_size": "2", "data_parallel_size": None, "attention_dp_balance": 0,
       "attention_dp_timeout_iters": -5, "attention_dp_batching_wait_iters": 1.0,
       "num_speculative_tokens": -1, "draft_acceptance_rate": 1.5,
       "dtype": "int8", "device": "", "seed": -1}


def test_every_field_has_a_refused_value_named_in_its_error():
    assert set(BAD) == set(FIELDS)  # a new field needs its check, and a case here
    for name, value in BAD.items():
        with pytest.raises(ValueError, match=f"^{name}: expected"):
            EngineConfig(**{name: value})


def test_unknown_settings_are_named_wherever_they_enter():
    with pytest.raises(ValueError, match=r"engine: unknown \['colour'\]; expected fields of "
                                         r"EngineConfig: block_size, "):
        EngineConfig.from_mapping({"colour": 1, "block_size": 8}, "engine")
    with pytest.raises(ValueError, match=r"LLMEngine: unknown \['tp'\]"):
        LLMEngine("tiny-llama", random_weights=True, tp=2)
    with pytest.raises(ValueError, match=r"settings: unknown \['colour'\]"):
        EngineConfig().replace(colour=1)


def test_rules_across_fields():
    with pytest.raises(ValueError, match="max_num_batched_tokens: expected >= max_num_seqs"):
        EngineConfig(max_num_seqs=64, max_num_batched_tokens=32)
    with pytest.raises(ValueError, match="num_kv_blocks, gpu_memory_utilization: the KV cache "
                                         "is sized by one of them"):
        EngineConfig(num_kv_blocks=8, gpu_memory_utilization=0.9)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):  # replace checks again
        EngineConfig().replace(max_num_batched_tokens=8)
    # a decode verifying 3 drafts takes 4 tokens of the budget: 64 sequences need 256
    EngineConfig(max_num_seqs=64, max_num_batched_tokens=256, num_speculative_tokens=3)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens: expected >= max_num_seqs "
                                         r"\(64\) x 4 tokens per decode"):
        EngineConfig(max_num_seqs=64, max_num_batched_tokens=255, num_speculative_tokens=3)
    with pytest.raises(ValueError, match="draft_acceptance_rate: expected 0 without "
                                         "speculative decoding"):
        EngineConfig(draft_acceptance_rate=0.5)


def test_a_torch_dtype_is_taken_by_its_name():
    import torch

    assert EngineConfig(dtype=torch.bfloat16).dtype == "bfloat16"


@settings(max_examples=60, deadline=None)
@given(block_size=st.integers(1, 64), seqs=st.integers(1, 512), extra=st.integers(0, 4096),
       policy=st.sampled_from(["max_utilization", "guaranteed_no_evict"]),
       util=st.one_of(st.none(), st.floats(0.01, 1.0)), tp=st.integers(1, 8),
       seed=st.one_of(st.none(), st.integers(0, 2**31)))
def test_a_config_round_trips_through_its_json(block_size, seqs, extra, policy, util, tp, seed):
    config = EngineConfig(block_size=block_size, max_num_seqs=seqs,
                          max_num_batched_tokens=seqs + extra, capacity_policy=policy,
                          gpu_memory_utilization=util, tensor_parallel_size=tp, seed=seed)
    assert EngineConfig.from_mapping(config.to_json()) == config


def test_the_engine_takes_a_config_or_its_fields_and_resolves_its_defaults():
    base = EngineConfig(block_size=8, max_num_seqs=4, max_num_batched_tokens=64)
    engine = LLMEngine("tiny-llama", base, random_weights=True, max_model_len=96)
    resolved = engine.engine_config
    assert (resolved.block_size, resolved.max_num_seqs, resolved.max_model_len) == (8, 4, 96)
    assert resolved.dtype == engine.config.torch_dtype  # "auto": the checkpoint's
    assert resolved.num_kv_blocks == engine.kv.num_blocks
    assert (engine.scheduler.max_num_seqs, engine.scheduler.max_num_batched_tokens,
            engine.scheduler.max_model_len) == (4, 64, 96)
    llm = LLM("tiny-llama", base, random_weights=True, dtype="float32")
    assert llm.engine.engine_config.replace(num_kv_blocks=None) == base.replace(
        dtype="float32", max_model_len=llm.engine.config.max_position_embeddings)
    with pytest.raises(TypeError, match="config: expected an EngineConfig"):
        LLMEngine("tiny-llama", {"block_size": 8}, random_weights=True)


@pytest.mark.parametrize("setting, match", [
    ({"expert_parallel_size": 2}, "the real engine runs tensor parallelism only"),
    ({"data_parallel_size": 2}, "the real engine runs tensor parallelism only"),
    ({"gpu_memory_utilization": 0.5}, "gpu_memory_utilization: sizes a simulated engine's"),
    ({"scheduler_recv_interval": 30}, "scheduler_recv_interval: 30, but the real engine"),
    ({"num_speculative_tokens": 2}, "num_speculative_tokens: 2, but the real engine has no "
                                    "drafter"),
])
def test_the_real_engine_refuses_what_only_a_simulation_prices(setting, match):
    with pytest.raises(ValueError, match=match):
        LLM("tiny-llama", random_weights=True, **setting)


def test_the_runner_builder_holds_the_engines_resolved_config(monkeypatch):
    built = []
    real = launch.start_runner
    monkeypatch.setattr(launch, "start_runner",
                        lambda build, sample=None: built.append(build) or real(build, sample))
    engine = LLMEngine("tiny-llama", random_weights=True, block_size=4, dtype="float32")
    (build,) = built
    assert build.engine == engine.engine_config and build.device == "cpu"
    assert build.engine.num_kv_blocks == engine.runner.num_kv_blocks


def test_a_simulated_engine_is_configured_by_the_same_object():
    config = EngineConfig(block_size=8, max_num_seqs=16, max_num_batched_tokens=512,
                          capacity_policy="guaranteed_no_evict", num_kv_blocks=300,
                          batch_wait_timeout_iters=3, tensor_parallel_size=2)
    spec = ModelSpec.from_model("llama-3.1-8b")
    engine = simulated_engine(spec, "H100", RooflinePredictor("H100"), config)
    assert engine.engine_config == config.replace(dtype=spec.dtype, max_model_len=(
        spec.config.max_position_embeddings))
    assert engine.runner.tp == 2 and engine.scheduler.capacity_policy == "guaranteed_no_evict"
