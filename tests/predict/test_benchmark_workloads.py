"""Workloads as benchmarks state them: fixed or ranged lengths, a closed loop at a concurrency,
every request at t=0, the engine's own knobs, ShareGPT-like lengths, and the throughput per
GPU and per user."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.engine.config import ModelConfig
from gnomon.predict.metrics import compute_metrics
from gnomon.predict.roofline import RooflinePredictor
from gnomon.engine.engine_config import EngineConfig
from gnomon.predict.serve import run_workload, simulated_engine
from gnomon.predict.shapes import ModelSpec
from gnomon.predict.simulate import simulate
from gnomon.predict.spec import SimulationSpec
from gnomon.predict.workloads import (LengthDist, SyntheticSpec, named, parse_length, parse_rate,
                                      sharegpt_lengths, synthetic)

TINY = ModelSpec.from_config(ModelConfig.preset("tiny-llama"), name="tiny-llama")


def _run(n, rate, concurrency, output=LengthDist.uniform(2, 20)):
    workload = synthetic(SyntheticSpec(num_requests=n, rate=rate,
                                       prompt_len=LengthDist.uniform(4, 40), output_len=output,
                                       vocab_size=256, seed=1))
    engine = simulated_engine(TINY, "H100", RooflinePredictor("H100"),
                              EngineConfig(max_num_seqs=64, num_kv_blocks=4096))
    return workload, run_workload(engine, workload, concurrency=concurrency)


def _spans(trace):
    return [(o.metrics.arrival_time, o.metrics.finish_time) for o in trace.outputs]


def _most_in_flight(spans):
    events = sorted([(a, 1) for a, _ in spans] + [(f, -1) for _, f in spans],
                    key=lambda e: (e[0], e[1]))  # a finish before a send at the same instant
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    return peak


def test_closed_loop_keeps_exactly_n_in_flight():
    _, trace = _run(40, math.inf, concurrency=5)
    spans = _spans(trace)
    assert _most_in_flight(spans) == 5
    assert [a for a, _ in spans[:5]] == [0.0] * 5
    finishes = sorted(f for _, f in spans)
    # each request after the first five is sent the moment one in flight finishes
    for i, (arrival, _) in enumerate(spans[5:]):
        assert arrival == finishes[i]


def test_rate_inf_without_concurrency_sends_everything_at_once():
    _, trace = _run(30, math.inf, concurrency=None)
    assert all(a == 0.0 for a, _ in _spans(trace))


def test_concurrency_caps_a_rate_limited_run():
    workload, capped = _run(60, 2000.0, concurrency=3)
    _, free = _run(60, 2000.0, concurrency=None)
    assert _most_in_flight(_spans(capped)) <= 3 < _most_in_flight(_spans(free))
    # a capped request is never sent before its workload arrival
    for r, (arrival, _) in zip(workload.requests, _spans(capped)):
        assert arrival >= r.arrival_time


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_concurrency_must_be_a_positive_int(bad):
    engine = simulated_engine(TINY, "H100", RooflinePredictor("H100"),
                              EngineConfig(num_kv_blocks=64))
    with pytest.raises(ValueError, match="concurrency"):
        run_workload(engine, named("chat", num_requests=2, rate=1.0, vocab_size=256),
                     concurrency=bad)


def test_parse_length_and_rate():
    assert parse_length("1024", "--input-len") == LengthDist.fixed(1024)
    assert parse_length("900:1100", "--input-len") == LengthDist.uniform(900, 1100)
    assert parse_rate("inf") == math.inf and parse_rate("2.5") == 2.5
    for bad in ("0", "-3", "x", "5:", "1:2:3", "10:5", ""):
        with pytest.raises(ValueError, match="--input-len"):
            parse_length(bad, "--input-len")
    for bad in ("0", "-1", "nan", "fast"):
        with pytest.raises(ValueError, match="--rate"):
            parse_rate(bad)


def test_lengths_replace_the_presets():
    w = named("sharegpt", num_requests=50, rate=1.0, vocab_size=256,
              input_len=LengthDist.fixed(7), output_len=LengthDist.uniform(3, 4))
    assert {len(r.prompt_token_ids) for r in w.requests} == {7}
    assert {r.output_len for r in w.requests} <= {3, 4}
    random = named("random", num_requests=3, rate=1.0, vocab_size=256)
    assert {(len(r.prompt_token_ids), r.output_len) for r in random.requests} == {(1024, 128)}


def test_sharegpt_lengths_match_their_published_means():
    data = sharegpt_lengths()
    assert "vLLM" in data["source"] and "stated default" in data["sigma_source"]
    w = named("sharegpt", num_requests=4000, rate=1.0, vocab_size=256)
    prompts = np.array([len(r.prompt_token_ids) for r in w.requests])
    outputs = np.array([r.output_len for r in w.requests])
    assert prompts.mean() == pytest.approx(data["prompt"]["published_mean"], rel=0.05)
    assert outputs.mean() == pytest.approx(data["output"]["published_mean"], rel=0.05)
    assert prompts.min() >= 4 and prompts.max() <= 1024 and outputs.max() <= 1024


def test_throughput_per_gpu_and_per_user():
    report, trace = simulate(SimulationSpec.of(
                             model="llama-3.1-8b", hardware="H100", workload="random",
                             rate=math.inf, num_requests=8,
                             tp=2, input_len=LengthDist.fixed(64),
                             output_len=LengthDist.fixed(16)))
    t = report["metrics"]["throughput"]
    assert t["num_gpus"] == 2
    assert t["total_tokens_per_s_per_gpu"] == pytest.approx(t["total_tokens_per_s"] / 2)
    assert t["output_tokens_per_s_per_gpu"] == pytest.approx(t["output_tokens_per_s"] / 2)
    assert t["output_tokens_per_s_per_user"] == pytest.approx(
        1 / report["metrics"]["tpot"]["mean"])
    assert t["total_tokens_per_s"] == pytest.approx((8 * 64 + 8 * 16)
                                                    / report["metrics"]["duration_s"])
    assert report["setup"]["workload"]["rate"] == "inf"  # JSON has no infinity
    with pytest.raises(ValueError, match="num_gpus"):
        compute_metrics(trace, num_gpus=0)


def test_engine_profile_sets_the_scheduler_knobs_and_flags_override_them():
    def knobs(**kw):
        report, _ = simulate(SimulationSpec.of(
                             model="llama-3.1-8b", hardware=kw.pop("hw", "H100"),
                             workload="random", rate=math.inf,
                             num_requests=2, input_len=LengthDist.fixed(8),
                             output_len=LengthDist.fixed(2), **kw))
        e = report["setup"]["engine"]
        return e["profile"], e["max_num_seqs"], e["max_num_batched_tokens"]

    assert knobs(engine="vllm") == ("vllm", 1024, 8192)  # a GPU of >= 70 GiB
    assert knobs(engine="vllm", hw="A100") == ("vllm", 256, 2048)  # A100s are excluded
    assert knobs(engine="vllm", hw="L40S") == ("vllm", 256, 2048)  # 48 GB
    assert knobs(engine="vllm", max_num_seqs=64) == ("vllm", 64, 8192)
    assert knobs(engine="vllm", hw="A100", max_num_batched_tokens=100) == ("vllm", 100, 100)
    assert knobs() == ("gnomon", 256, 8192)
    with pytest.raises(ValueError, match="max_num_seqs"):
        knobs(max_num_seqs=0)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 30), concurrency=st.integers(1, 12),
       rate=st.sampled_from([math.inf, 50.0, 5000.0]))
def test_in_flight_never_exceeds_the_concurrency(n, concurrency, rate):
    workload, trace = _run(n, rate, concurrency)
    spans = _spans(trace)
    assert _most_in_flight(spans) <= concurrency
    assert len(spans) == n and all(f >= a for a, f in spans)
    assert all(a >= r.arrival_time for r, (a, _) in zip(workload.requests, spans))
