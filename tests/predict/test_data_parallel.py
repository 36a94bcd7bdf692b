"""Attention data parallelism in the simulator: ``dp`` schedulers in lockstep, each group's step
priced with every group's tokens in the routed experts and two all-to-alls per MoE layer (counted
by hand here), a closed loop split over the groups, and the layouts an engine refuses refused by
name."""

import math

import pytest

from gnomon.engine.config import ModelConfig
from gnomon.engine.parallel import check_dp, check_ep
from gnomon.predict.calibrated import CalibratedPredictor
from gnomon.predict.cost import PredictionRefused
from gnomon.predict.data_parallel import DataParallelEngine
from gnomon.predict.measured import PointRefused, from_silicon
from gnomon.predict.opcount import step_ops
from gnomon.predict.roofline import RooflinePredictor
from gnomon.engine.engine_config import EngineConfig
from gnomon.predict.serve import run_workload, simulated_engine
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.simulate import simulate
from gnomon.predict.spec import SimulationSpec
from gnomon.engine.sampling_params import SamplingParams
from gnomon.predict.workloads import Workload, WorkloadRequest, parse_length


def _ops(spec, requests, tp=1, ep=1, dp=1, dp_tokens=0):
    shape = StepShape.of(spec, requests, tp=tp, ep=ep)
    shape = StepShape(spec, shape.requests, shape.num_sampled, shape.num_prefill_tokens,
                      shape.num_decode_tokens, tp, ep, dp, dp_tokens)
    return {op.name: op for op in step_ops(shape)}


def test_deepseek_dispatch_and_combine_bytes_by_hand():
    # DeepSeek-V3 at dp 8 x ep 8 (tp 1): 58 MoE layers (61 less 3 dense), hidden 7,168, top-8 of
    # 256 experts, bf16 activations; this group decodes 64 tokens, the 8 groups 512 in all
    spec = ModelSpec.from_model("deepseek-v3", weight_dtype="fp8", kv_dtype="fp8")
    ops = _ops(spec, [(1, 1000)] * 64, ep=8, dp=8, dp_tokens=512)
    a2a = ops["all_to_all"]
    # a token goes to each of the 8 GPUs holding one of its 8 experts: 1 - (7/8)^8 of them,
    # 0.6564; a GPU moves 7/8 of max(512, 8 x 64) tokens times that, 7,168 x 2 bytes each
    per_layer = 7 / 8 * (1 - (7 / 8) ** 8) * 512 * 7168 * 2
    assert per_layer == pytest.approx(4_215_690, rel=1e-6)  # 4.2 MB per layer and way
    assert a2a.comm_bytes == pytest.approx(2 * 58 * per_layer)  # dispatch and combine
    assert a2a.collectives == 116
    # a busier group sends more than the GPU receives: 8 x 100 tokens beside 512 in all
    busy = _ops(spec, [(1, 1000)] * 100, ep=8, dp=8, dp_tokens=512)["all_to_all"]
    assert busy.comm_bytes == pytest.approx(a2a.comm_bytes * 800 / 512)


def test_the_experts_see_every_groups_tokens_and_the_rest_only_this_groups():
    # tiny-deepseek-v3: 2 layers (1 dense), hidden 64, 8 experts of 32, top-2; dp 2 x ep 2
    spec = ModelSpec.from_model("tiny-deepseek-v3")
    T, X, H, I, k, a = 6, 10, 64, 32, 2, 4
    dp = _ops(spec, [(T, 0)], ep=2, dp=2, dp_tokens=X)
    alone = _ops(spec, [(T, 0)])
    # each of the 2 GPUs holds 4 whole experts and computes half of the X tokens' pairs
    w13 = dp["fused_moe[w13]"]
    assert w13.flops == pytest.approx(1 * 2 * (X * k / 2) * 2 * I * H)
    distinct = 8 * (1 - (1 - k / 8) ** X)
    assert w13.bytes == pytest.approx(2 * (distinct / 2) * H * I * a + X * H * a
                                      + (X * k / 2) * 2 * I * a)
    # everything else runs on this group's T tokens, as a single engine's step would
    same = {n for n in alone if not n.startswith("fused_moe")}
    assert {n: dp[n] for n in same} == {n: alone[n] for n in same}
    assert set(dp) - set(alone) == {"all_to_all"}


def test_experts_are_split_over_every_gpu_of_every_group():
    spec = ModelSpec.from_model("deepseek-v3", weight_dtype="fp8")
    # routed experts: 58 layers x 256 x (w13 4,096 x 7,168 + w2 7,168 x 2,048), one byte each
    experts = 58 * 256 * (4096 * 7168 + 7168 * 2048)
    assert spec.weight_bytes(1, 1) - spec.weight_bytes(1, 8) == pytest.approx(experts * 7 / 8)


def _tiny(dp=2, ep=2, args_balance=None):
    spec = ModelSpec.from_model("tiny-deepseek-v3")
    predictor = RooflinePredictor("H100 SXM")
    balance = {} if args_balance is None else dict(
        attention_dp_balance=True, attention_dp_timeout_iters=args_balance[0],
        attention_dp_batching_wait_iters=args_balance[1])
    return spec, predictor, simulated_engine(
        spec, "H100 SXM", predictor,
        EngineConfig(max_num_batched_tokens=512, expert_parallel_size=ep, data_parallel_size=dp,
                     num_kv_blocks=64, **balance))


def test_a_step_lasts_as_long_as_the_slowest_groups():
    spec, predictor, engine = _tiny()
    assert isinstance(engine, DataParallelEngine)
    engine.add_request("long", [i % 256 for i in range(300)], arrival_time=0.0)
    engine.add_request("short", list(range(20)), arrival_time=0.0)
    assert [engine.group(r) for r in ("long", "short")] == engine.groups  # one each
    engine.step()
    step = engine.runner.steps[0]
    # both prompts in one step: each group priced with all 320 tokens in its experts
    long_ = predictor.predict(StepShape(spec, ((300, 0),), 1, 300, 0, 1, 2, 2, 320))
    short = predictor.predict(StepShape(spec, ((20, 0),), 1, 20, 0, 1, 2, 2, 320))
    assert long_.seconds > short.seconds
    assert step.seconds == pytest.approx(long_.seconds)
    assert (step.num_prefill_tokens, step.num_seqs) == (320, 2)
    # the groups meet at every layer: both first tokens come at the step's end
    times = {r: engine.scheduler.get_request(r).first_token_time for r in ("long", "short")}
    assert times["long"] == times["short"] == pytest.approx(step.seconds)


def test_a_closed_loop_is_split_evenly_over_the_groups():
    spec, _, engine = _tiny(dp=4, ep=4)
    reqs = tuple(WorkloadRequest(f"r{i}", 0.0, tuple(range(16 + 8 * (i % 3))), 4)
                 for i in range(12))
    trace = run_workload(engine, Workload("closed", reqs, "12 requests"), concurrency=8)
    assert all(o.finished for o in trace.outputs)
    # 8 in flight over 4 groups: 2 each, and each refill goes where one finished
    groups = [engine._group_of[f"r{i}"] for i in range(12)]
    assert sorted(groups[:8]) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(groups.count(g) == 3 for g in range(4))
    assert max(len(g.scheduler._running) for g in engine.groups) == 0
    assert trace.num_kv_blocks == 4 * 64


def _decoding_pair(timeout, batching):
    spec, _, engine = _tiny(args_balance=(timeout, batching))
    for rid in ("a", "b"):  # one per group, long enough to decode through the test
        engine.add_request(rid, list(range(1, 9)), SamplingParams(max_tokens=200,
                                                                  ignore_eos=True))
    while not all(s.pending_work(engine.clock())[1] for s in engine._schedulers):
        engine.step()
    return engine


def _steps_until_scheduled(engine, rid):
    steps = 0
    while engine.scheduler.get_request(rid).first_scheduled_time is None:
        engine.step()
        steps += 1
    return steps


def test_a_lone_prompt_waits_for_the_others_up_to_the_timeout():
    # TensorRT-LLM's enable_balance with timeout_iters 5: one group has a prompt, the other
    # only decodes, so the prompt waits; the wait counter runs through decode-only steps too
    engine = _decoding_pair(timeout=5, batching=0)
    engine.step()
    engine.step()
    before = engine._held  # 2: two decode-only steps counted
    assert before == 2
    engine.add_request("c", list(range(1, 9)), SamplingParams(max_tokens=4, ignore_eos=True),
                       arrival_time=engine.clock())
    assert _steps_until_scheduled(engine, "c") == 5 - before
    assert engine._held == 0


def test_prompts_on_every_group_gather_for_the_batching_wait():
    engine = _decoding_pair(timeout=5, batching=2)
    for rid in ("c", "d"):  # one per group (each has one unfinished request)
        engine.add_request(rid, list(range(1, 9)), SamplingParams(max_tokens=4,
                                                                  ignore_eos=True),
                           arrival_time=engine.clock())
    assert {engine._group_of["c"], engine._group_of["d"]} == {0, 1}
    # both groups have prompt work and decode: held batching_wait_iters (2) steps, then both run
    assert _steps_until_scheduled(engine, "c") == 3
    assert engine.scheduler.get_request("d").first_scheduled_time == \
        engine.scheduler.get_request("c").first_scheduled_time


def test_a_group_with_nothing_to_decode_never_holds_prompts():
    spec, _, engine = _tiny(args_balance=(50, 10))
    engine.add_request("a", list(range(1, 9)), SamplingParams(max_tokens=4, ignore_eos=True))
    assert _steps_until_scheduled(engine, "a") == 1  # the other group decodes nothing


def test_balance_settings_are_checked():
    with pytest.raises(ValueError, match="attention_dp_timeout_iters: expected an integer >= 0"):
        EngineConfig(attention_dp_balance=True, attention_dp_timeout_iters=-1)
    with pytest.raises(ValueError, match="attention_dp_balance: expected true or false"):
        EngineConfig(attention_dp_balance="yes")


def test_dp_1_is_the_single_engine():
    kw = dict(model="tiny-deepseek-v3", hardware="H100 SXM", num_requests=6, concurrency=3,
              input_len=parse_length("40", "i"), output_len=parse_length("5", "o"))
    one, _ = simulate(SimulationSpec.of(ep=1, dp=1, **kw))
    two, _ = simulate(SimulationSpec.of(ep=2, dp=2, **kw))
    assert one["setup"]["dp"] == 1 and two["setup"]["dp"] == 2
    assert two["metrics"]["throughput"]["num_gpus"] == 2
    assert any(x.startswith("attention data parallelism: 2 schedulers") for x in two["limits"])
    assert not any("data parallelism" in x for x in one["limits"])


@pytest.mark.parametrize("model, tp, ep, dp, reason", [
    ("tiny-llama", 1, 1, 2, "dp: 2, but LlamaForCausalLM has no MoE layers"),
    ("tiny-deepseek-v3", 1, 3, 2, "ep: 3 does not divide tp 1 x dp 2"),
    ("tiny-deepseek-v3", 1, 1, 3, "ep: 1 leaves each expert split 3 ways"),
    ("tiny-deepseek-v3", 1, 16, 16, "ep: 16 does not divide the 8 experts"),
])
def test_layouts_an_engine_refuses_are_refused_by_name(model, tp, ep, dp, reason):
    config = ModelConfig.preset(model)
    with pytest.raises(ValueError, match=reason):
        check_ep(config, tp, ep, dp=check_dp(config, dp))


def test_a_calibrated_predictor_refuses_data_parallel_steps():
    spec = ModelSpec.from_model("tiny-deepseek-v3")
    shape = StepShape(spec, ((4, 0),), 1, 4, 0, 1, 1, 2, 8)
    predictor = CalibratedPredictor.__new__(CalibratedPredictor)
    predictor.domain = {"tp": 1}
    with pytest.raises(PredictionRefused, match="dp = 2: calibrated on gnomon's engine"):
        predictor._check_domain(shape, None)


def _row(**fields):
    row = dict(id="r", silicon_data_source="source_file=runs.csv",
               model_path="deepseek-ai/DeepSeek-R1", system="b200_sxm",
               backend="trtllm", mode="agg", gemm_quant_mode="fp8", moe_quant_mode="fp8_block",
               isl="1024", osl="1024", batch_size="64", tp_size="1", pp_size="1",
               attention_dp_size="8", moe_tp_size="1", moe_ep_size="8",
               silicon_ttft_ms="100", silicon_tpot_ms="20")
    row.update(fields)
    return row


def test_a_measured_dp_row_maps_onto_tp_ep_dp():
    point = from_silicon(_row())
    assert (point.tp, point.ep, point.dp) == (1, 8, 8)
    settings = point.simulation_spec().engine_settings
    assert (settings["tensor_parallel_size"], settings["expert_parallel_size"],
            settings["data_parallel_size"]) == (1, 8, 8)


def test_a_measured_row_whose_moe_width_is_not_its_gpus_is_refused():
    with pytest.raises(PointRefused, match=r"moe_tp_size 2 x moe_ep_size 8 is not tp_size 1 x "
                                           r"attention_dp_size 8"):
        from_silicon(_row(moe_tp_size="2"))
    assert math.isfinite(from_silicon(_row(moe_tp_size="2", moe_ep_size="4")).tpot_ms)
