"""The simulated runner: same decisions as a real run, the engine's runner surface, no
allocation, and KV sizing from the hardware's capacity."""

import resource
from dataclasses import replace

import pytest

from engine.test_llm import engine_runner_surface
from gnomon.engine.batch import ScheduledBatch, ScheduledSequence
from gnomon.engine.config import ModelConfig
from gnomon.engine.kv_cache import kv_bytes_per_block
from gnomon.engine.sampling_params import SamplingParams
from gnomon.hardware import gpu
from gnomon.predict.cost import PredictionRefused, StepCost
from gnomon.predict.roofline import RooflinePredictor
from gnomon.engine.engine_config import EngineConfig
from gnomon.predict.serve import run_workload, simulated_engine, timed_engine
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.simulated import (GPU_MEMORY_UTILIZATION, SimulatedRunner, VirtualClock,
                                      activation_bytes, kv_blocks_for_hardware)
from gnomon.predict.workloads import LengthDist, SyntheticSpec, Workload, synthetic

TINY = ModelSpec.from_config(ModelConfig.preset("tiny-llama"), name="tiny-llama")
# a small token budget (chunked prefill), few slots and a small cache (preemption)
KV_BLOCKS = 20
CONFIG = EngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=128,
                    num_kv_blocks=KV_BLOCKS)


def _workload(n=24, rate=400.0, seed=3):
    return synthetic(SyntheticSpec(num_requests=n, rate=rate, prompt_len=LengthDist.uniform(3, 30),
                                   output_len=LengthDist.uniform(1, 12), vocab_size=256,
                                   seed=seed))


class Replay:
    """Returns recorded step durations in order."""

    name = "replay"

    def __init__(self, seconds):
        self.seconds = list(seconds)
        self.calls = 0

    def predict(self, shape):
        t = self.seconds[self.calls]
        self.calls += 1
        return StepCost.from_parts({"overhead": t}, {"overhead": "measured"})


def test_same_decisions_as_a_real_run():
    # A burst of 12 at t=0 (four long sequences at once overflow the 20 blocks: preemption,
    # whatever the machine's speed), then arrivals spaced like the steps (admission depends on
    # the clock).
    spaced = _workload()
    workload = Workload(spaced.name, tuple(
        replace(r, arrival_time=0.0) if i < 12 else r for i, r in enumerate(spaced.requests)),
        spaced.description)
    engine = timed_engine("tiny-llama", CONFIG, random_weights=True)
    # The real forward runs, but samples the simulation's filler token: the tokens are part of
    # each batch (decode inputs), and only their timing is under test.
    filler = SimulatedRunner(TINY, Replay([]), VirtualClock()).token
    import torch

    from gnomon.engine.sampler import SamplerOutput

    engine.runner.runner.sample = lambda logits, seqs: SamplerOutput(
        torch.full((len(seqs),), filler), (None,) * len(seqs))
    real = run_workload(engine, workload)
    replay = Replay(s.seconds for s in real.steps)
    sim = run_workload(simulated_engine(TINY, "H100", replay, CONFIG, keep_batches=True), workload)
    assert replay.calls == len(real.steps)
    assert [s.batch for s in sim.steps] == [s.batch for s in real.steps]
    assert [s.start for s in sim.steps] == [s.start for s in real.steps]
    assert [o.metrics for o in sim.outputs] == [o.metrics for o in real.outputs]
    assert sim.token_times == real.token_times
    # the workload exercised what makes decisions interesting
    assert real.num_preemptions > 0
    assert any(s.batch.num_prefill_tokens and s.batch.num_decode_tokens for s in real.steps)
    assert any(not seq.is_last_prefill_chunk for s in real.steps for seq in s.batch.sequences)
    for o, r in zip(real.outputs, workload.requests):
        assert o.finished and len(o.outputs[0].token_ids) == r.output_len


def test_idle_gaps_jump_to_the_next_arrival():
    workload = _workload(n=3, rate=0.5)  # seconds apart; steps take microseconds
    trace = run_workload(simulated_engine(TINY, "H100", RooflinePredictor("H100"), CONFIG),
                         workload)
    arrivals = [r.arrival_time for r in workload.requests]
    firsts = [o.metrics.first_scheduled_time for o in trace.outputs]
    assert firsts == arrivals  # each admitted the moment it arrived: the clock jumped there
    assert trace.steps[-1].start > arrivals[-1] > 1.0


def test_simulated_runner_answers_the_engine_surface():
    runner = simulated_engine(TINY, "H100", RooflinePredictor("H100"), CONFIG).runner
    assert isinstance(runner, SimulatedRunner)
    missing = sorted(a for a in engine_runner_surface() if not hasattr(runner, a))
    assert not missing, f"the engine uses runner attributes SimulatedRunner lacks: {missing}"


def test_simulation_of_a_120b_model_allocates_nothing():
    spec = ModelSpec.from_model("gpt-oss-120b")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    engine = simulated_engine(spec, "MI355X", RooflinePredictor("MI355X"))
    workload = synthetic(SyntheticSpec(num_requests=20, rate=10.0,
                                       prompt_len=LengthDist.uniform(100, 2000),
                                       output_len=LengthDist.uniform(10, 50),
                                       vocab_size=spec.config.vocab_size))
    trace = run_workload(engine, workload)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 300, f"a simulation grew the process by {grown_mb:.0f} MB"
    assert engine.num_kv_blocks > 100_000  # the MI355X's capacity, not the engine default
    assert all(o.finished for o in trace.outputs)
    assert trace.steps[0].breakdown["moe"] > 0


def test_kv_blocks_follow_the_budget_arithmetic():
    spec = ModelSpec.from_model("llama-3.1-8b")
    hw = gpu("H100")
    blocks = kv_blocks_for_hardware(spec, hw, block_size=16)
    budget = (85.52e9 * GPU_MEMORY_UTILIZATION - spec.weight_bytes()  # 81,559 MiB reported
              - activation_bytes(spec, max_num_batched_tokens=8192, max_num_seqs=256))
    per_block = kv_bytes_per_block(num_layers=32, block_size=16, num_kv_heads=8, head_dim=128,
                                   dtype_size=2)
    assert blocks == int(budget) // per_block
    # two GPUs: half the weights each and half the KV heads per block -> more than 2x blocks
    assert kv_blocks_for_hardware(spec, hw, block_size=16, tp=2) > 2 * blocks


def test_model_that_does_not_fit_is_refused_with_bytes():
    with pytest.raises(PredictionRefused) as e:
        kv_blocks_for_hardware(ModelSpec.from_model("llama-3.1-70b"), gpu("H100"))
    reason = e.value.reason
    assert "does not fit" in reason and "141.1" in reason and "76.97 GB is available" in reason


def test_step_shape_keeps_each_pair():
    seq = lambda sid, n, c, last: ScheduledSequence(  # noqa: E731
        seq_id=sid, request_id=str(sid), sample_index=0, token_ids=(1,) * n,
        num_computed_tokens=c, block_ids=((0,),), is_last_prefill_chunk=last,
        sampling_params=SamplingParams())
    batch = ScheduledBatch(sequences=(seq(0, 1, 40, True), seq(1, 7, 0, False)),
                           num_prefill_tokens=7, num_decode_tokens=1)
    shape = StepShape.from_batch(batch, TINY)
    assert shape.requests == ((1, 40), (7, 0))
    assert shape.num_sampled == 1 and shape.kind == "mixed" and shape.max_context == 41


def test_simulated_runner_refuses_logits_and_bad_predictor():
    runner = SimulatedRunner(TINY, RooflinePredictor("H100"), VirtualClock())
    with pytest.raises(NotImplementedError, match="no logits"):
        runner.execute_logits(ScheduledBatch())
    with pytest.raises(TypeError, match="predictor"):
        SimulatedRunner(TINY, object(), VirtualClock())
    with pytest.raises(ValueError, match="seconds"):
        VirtualClock().advance(-1.0)


def _plain_vs_batched(model, workload, *, config, concurrency=None, serving=None):
    """The same run with every step batched (keep_batches) and with plain decode steps run
    batch-free by the scheduler; returns both traces and how many steps ran batch-free."""
    kw = {} if serving is None else {"serving": serving}
    batched = run_workload(simulated_engine(model, "H100", RooflinePredictor(gpu("H100")),
                                            config, keep_batches=True),
                           workload, concurrency=concurrency, **kw)
    engine = simulated_engine(model, "H100", RooflinePredictor(gpu("H100")), config)
    runner, plain = engine.runner, []
    execute_decode = runner.execute_decode
    runner.execute_decode = lambda pairs: (plain.append(len(pairs)), execute_decode(pairs))
    fast = run_workload(engine, workload, concurrency=concurrency, **kw)
    return batched, fast, len(plain)


def _same_run(a, b):
    assert [(s.start, s.seconds, s.breakdown, s.num_prefill_tokens, s.num_decode_tokens,
             s.num_seqs) for s in a.steps] == \
        [(s.start, s.seconds, s.breakdown, s.num_prefill_tokens, s.num_decode_tokens, s.num_seqs)
         for s in b.steps]
    assert a.token_times == b.token_times
    assert [o.metrics for o in a.outputs] == [o.metrics for o in b.outputs]
    assert [o.outputs for o in a.outputs] == [o.outputs for o in b.outputs]
    assert a.kv_usage == b.kv_usage and a.kv_group_blocks == b.kv_group_blocks
    assert (a.num_preemptions, a.prefix_queried_tokens, a.prefix_hit_tokens) == \
        (b.num_preemptions, b.prefix_queried_tokens, b.prefix_hit_tokens)


@pytest.mark.parametrize("policy", ["max_utilization", "guaranteed_no_evict"])
def test_plain_decode_steps_decide_as_batched_steps_under_preemption_and_arrivals(policy):
    # open-loop arrivals mid-run, chunked prefill and a cache that preempts (max_utilization)
    workload = synthetic(SyntheticSpec(num_requests=24, rate=4000.0,
                                       prompt_len=LengthDist.uniform(3, 30),
                                       output_len=LengthDist.uniform(10, 40), vocab_size=256,
                                       seed=5))
    config = CONFIG.replace(capacity_policy=policy, num_kv_blocks=40)
    batched, fast, plain = _plain_vs_batched(TINY, workload, config=config)
    _same_run(batched, fast)
    assert plain > 0
    assert (batched.num_preemptions > 0) == (policy == "max_utilization")


def test_plain_decode_steps_decide_as_batched_steps_in_a_closed_loop_with_sliding_windows():
    # gpt-oss's sliding layers release blocks behind the window; shared prefixes hit the cache;
    # a closed loop whose engine schedules a step ahead: a request sent mid-step waits a step
    from gnomon.predict.engines import ServingPath
    model = ModelSpec.from_config(ModelConfig.preset("tiny-gpt-oss"), name="tiny-gpt-oss")
    workload = synthetic(SyntheticSpec(num_requests=30, rate=float("inf"),
                                       prompt_len=LengthDist.uniform(10, 40),
                                       output_len=LengthDist.uniform(20, 60), vocab_size=256,
                                       shared_prefix_groups=2, shared_prefix_len=8, seed=7))
    config = EngineConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=32,
                          max_model_len=128)
    serving = ServingPath(request_s=1e-4, per_prompt_token_s=1e-6, response_s=2e-4,
                          schedule_ahead_steps=1)
    batched, fast, plain = _plain_vs_batched(model, workload, config=config, concurrency=6,
                                             serving=serving)
    _same_run(batched, fast)
    assert plain > len(fast.steps) / 3
    assert batched.prefix_hit_tokens > 0
    full, window = fast.kv_windows.index(None), fast.kv_windows.index(8)
    assert any(b[window] < b[full] for b in fast.kv_group_blocks)  # the window released blocks
