"""Serving metrics of a `RunTrace`, against hand-computed values."""

import json
import math
import time

import numpy as np
import pytest

from gnomon.engine.batch import ScheduledBatch, ScheduledSequence
from gnomon.engine.llm import CompletionOutput, RequestMetrics, RequestOutput
from gnomon.engine.sampling_params import SamplingParams
from gnomon.predict.metrics import SLO, compute_metrics, request_metrics, summarize
from gnomon.predict.serve import RunTrace
from gnomon.predict.simulated import StepRecord
from gnomon.predict.workloads import Workload, WorkloadRequest

_PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def _batch(prefill: int, decode: int, seqs: int) -> ScheduledBatch:
    sequences = tuple(ScheduledSequence(seq_id=i, request_id=str(i), sample_index=0,
                                        token_ids=(1,), num_computed_tokens=0, block_ids=((i,),),
                                        is_last_prefill_chunk=True, sampling_params=_PARAMS)
                      for i in range(seqs))
    return ScheduledBatch(sequences=sequences, num_prefill_tokens=prefill,
                          num_decode_tokens=decode)


def _output(rid, prompt_len, token_times, arrival, scheduled, first, finish, finished=True):
    return RequestOutput(
        request_id=rid, prompt_token_ids=tuple(range(1, prompt_len + 1)),
        outputs=(CompletionOutput(index=0, token_ids=tuple([7] * len(token_times)), text=None,
                                  finish_reason="length" if finished else None),),
        finished=finished, metrics=RequestMetrics(arrival, scheduled, first, finish))


# (request id, prompt tokens, arrival, first scheduled, first token, finish, token times)
REQUESTS = [
    ("a", 4, 0.0, 0.5, 1.0, 1.4, [1.0, 1.2, 1.4]),
    ("b", 2, 1.0, 1.0, 1.2, 1.2, [1.2]),
    ("c", 6, 2.0, 3.0, 3.5, 3.8, [3.5, 3.6, 3.6, 3.8]),
]
STEPS = [StepRecord.of(0.0, _batch(10, 0, 2), 0.5, {"gemm": 0.4, "attention": 0.1}),
         StepRecord.of(0.5, _batch(6, 1, 2), 0.3, {"gemm": 0.2, "attention": 0.05}),
         StepRecord.of(3.0, _batch(0, 2, 2), 0.2, {"gemm": 0.1})]
KV = [(0.5, 0.2), (1.0, 0.6), (1.5, 0.4), (3.8, 0.1)]


def make_trace(requests=REQUESTS, steps=STEPS, kv=KV, *, unfinished=(), queried=12, hit=4,
               token_times=None):
    workload = Workload(name="hand", description="three hand-made requests", requests=tuple(
        WorkloadRequest(rid, arrival, tuple(range(1, p + 1)), len(times))
        for rid, p, arrival, _, _, _, times in requests))
    outputs = [_output(rid, p, times, arrival, sched, first,
                       None if rid in unfinished else finish, rid not in unfinished)
               for rid, p, arrival, sched, first, finish, times in requests]
    # two KV-cache groups splitting each sample's blocks 60:40, then 2:1 and so on
    split = [(12, 8), (40, 20), (30, 10), (6, 4)] if kv is KV else \
        [(round(u * 100), 0) for _, u in kv]
    return RunTrace(workload=workload, steps=list(steps), outputs=outputs,
                    token_times=token_times or {r[0]: list(r[6]) for r in requests},
                    kv_usage=list(kv), kv_windows=(None, 4), kv_group_blocks=split,
                    num_kv_blocks=100, num_preemptions=2,
                    prefix_queried_tokens=queried, prefix_hit_tokens=hit, wall_seconds=0.25)


def test_request_metrics_hand_computed():
    rows = {r["request_id"]: r for r in request_metrics(make_trace())}
    a, b, c = rows["a"], rows["b"], rows["c"]
    assert [r["request_id"] for r in request_metrics(make_trace())] == ["a", "b", "c"]
    assert (a["arrival"], a["prompt_tokens"], a["output_tokens"]) == (0.0, 4, 3)
    assert a["queueing_s"] == pytest.approx(0.5) and a["prefill_s"] == pytest.approx(0.5)
    assert a["ttft_s"] == pytest.approx(1.0) and a["e2e_s"] == pytest.approx(1.4)
    assert a["tpot_s"] == pytest.approx(0.2)
    assert a["itl_s"] == pytest.approx([0.2, 0.2])
    assert b["output_tokens"] == 1 and b["tpot_s"] is None and b["itl_s"] == []
    assert b["queueing_s"] == 0.0 and b["ttft_s"] == pytest.approx(0.2)
    assert c["queueing_s"] == pytest.approx(1.0) and c["prefill_s"] == pytest.approx(0.5)
    assert c["ttft_s"] == pytest.approx(1.5) and c["e2e_s"] == pytest.approx(1.8)
    assert c["tpot_s"] == pytest.approx(0.1)
    assert c["itl_s"] == pytest.approx([0.1, 0.0, 0.2])  # equal token times give a 0 gap
    for r in rows.values():
        assert r["ttft_s"] == pytest.approx(r["queueing_s"] + r["prefill_s"])


def test_compute_metrics_latency_summaries():
    m = compute_metrics(make_trace())
    assert m["requests"] == 3
    assert m["duration_s"] == pytest.approx(3.8)
    assert m["ttft"]["count"] == 3
    assert m["ttft"]["mean"] == pytest.approx(0.9)
    assert m["ttft"]["p50"] == pytest.approx(1.0)
    assert m["ttft"]["p90"] == pytest.approx(1.4)   # 1.0 + 0.8 * (1.5 - 1.0)
    assert m["ttft"]["p99"] == pytest.approx(1.49)  # 1.0 + 0.98 * (1.5 - 1.0)
    assert m["ttft"]["min"] == pytest.approx(0.2) and m["ttft"]["max"] == pytest.approx(1.5)
    assert m["queueing"]["mean"] == pytest.approx(0.5)
    assert m["queueing"]["max"] == pytest.approx(1.0)
    assert m["prefill"]["mean"] == pytest.approx(0.4)
    assert m["tpot"]["count"] == 2  # the one-token request has no TPOT
    assert m["tpot"]["mean"] == pytest.approx(0.15)
    assert m["itl"]["count"] == 5
    assert m["itl"]["mean"] == pytest.approx(0.14)
    assert m["itl"]["p50"] == pytest.approx(0.2) and m["itl"]["min"] == pytest.approx(0.0)
    assert m["e2e"]["mean"] == pytest.approx((1.4 + 0.2 + 1.8) / 3)
    assert m["per_request"]["request_id"] == ["a", "b", "c"]
    assert m["per_request"]["ttft_s"] == pytest.approx([1.0, 0.2, 1.5])
    assert m["per_request"]["tpot_s"][1] is None
    assert m["per_request"]["tpot_s"][0] == pytest.approx(0.2)
    assert m["per_request"]["e2e_s"] == pytest.approx([1.4, 0.2, 1.8])
    assert m["per_request"]["queueing_s"] == pytest.approx([0.5, 0.0, 1.0])
    assert m["per_request"]["prefill_s"] == pytest.approx([0.5, 0.2, 0.5])


def test_throughput_and_goodput():
    m = compute_metrics(make_trace(), SLO(ttft_s=1.2, tpot_s=0.15))
    t = m["throughput"]
    assert t["requests_per_s"] == pytest.approx(3 / 3.8)
    assert t["output_tokens_per_s"] == pytest.approx(8 / 3.8)
    assert t["total_tokens_per_s"] == pytest.approx(20 / 3.8)
    assert (t["prompt_tokens"], t["output_tokens"]) == (12, 8)
    g = m["goodput"]
    # a misses TPOT (0.2 > 0.15), c misses TTFT (1.5 > 1.2), b has no TPOT and is good
    assert g["slo"] == {"ttft_s": 1.2, "tpot_s": 0.15}
    assert (g["good_requests"], g["ttft_violations"], g["tpot_violations"]) == (1, 1, 1)
    assert g["fraction"] == pytest.approx(1 / 3)
    assert g["requests_per_s"] == pytest.approx(1 / 3.8)
    loose = compute_metrics(make_trace(), SLO(ttft_s=1.2, tpot_s=0.25))["goodput"]
    assert (loose["good_requests"], loose["tpot_violations"]) == (2, 0)
    assert compute_metrics(make_trace(), SLO(ttft_s=0.1, tpot_s=1.0))["goodput"]["fraction"] == 0


def test_goodput_slo_bounds_are_inclusive():
    trace = make_trace(requests=[("x", 3, 0.0, 0.0, 0.5, 1.0, [0.5, 0.75, 1.0])])  # dyadic times
    assert compute_metrics(trace, SLO(0.5, 0.25))["goodput"]["good_requests"] == 1
    assert compute_metrics(trace, SLO(0.4999, 0.25))["goodput"]["ttft_violations"] == 1
    assert compute_metrics(trace, SLO(0.5, 0.2499))["goodput"]["tpot_violations"] == 1


def test_kv_prefix_preemptions_steps():
    m = compute_metrics(make_trace())
    kv = m["kv"]
    assert kv["num_blocks"] == 100 and kv["samples"] == 4
    assert kv["peak_usage"] == pytest.approx(0.6)
    # each sample holds until the next: (0.2*0.5 + 0.6*0.5 + 0.4*2.3) / 3.3
    assert kv["mean_usage"] == pytest.approx(0.4)
    assert kv["series"] == [list(p) for p in KV]
    full, sliding = kv["groups"]
    assert (full["window"], full["peak_blocks"], full["peak_usage"]) == (None, 40, 0.4)
    assert (sliding["window"], sliding["peak_blocks"], sliding["peak_usage"]) == (4, 20, 0.2)
    # (12*0.5 + 40*0.5 + 30*2.3) / 3.3 blocks of 100, and (8*0.5 + 20*0.5 + 10*2.3) / 3.3
    assert full["mean_usage"] == pytest.approx(0.95 / 3.3)
    assert sliding["mean_usage"] == pytest.approx(0.37 / 3.3)
    assert full["mean_usage"] + sliding["mean_usage"] == pytest.approx(kv["mean_usage"])
    assert m["prefix_cache"] == {"queried_tokens": 12, "hit_tokens": 4,
                                 "hit_rate": pytest.approx(1 / 3)}
    assert compute_metrics(make_trace(queried=0, hit=0))["prefix_cache"]["hit_rate"] is None
    assert m["preemptions"] == 2
    s = m["steps"]
    assert (s["count"], s["prefill"], s["decode"], s["mixed"]) == (3, 1, 1, 1)
    assert s["mean_batch_tokens"] == pytest.approx(19 / 3)
    assert s["mean_batch_seqs"] == pytest.approx(2.0)
    assert s["busy_s"] == pytest.approx(1.0)
    assert s["breakdown_s"] == {"attention": pytest.approx(0.15), "gemm": pytest.approx(0.7)}
    assert s["unattributed_s"] == pytest.approx(0.15)


def test_kv_series_is_downsampled_keeping_the_peak():
    n = 2003
    t = np.linspace(0.0, 10.0, n)
    u = np.full(n, 0.3)
    u[1234] = 0.97
    kv = compute_metrics(make_trace(kv=list(zip(t.tolist(), u.tolist()))))["kv"]
    series = kv["series"]
    assert len(series) == 500 and kv["samples"] == n
    assert [t[1234], 0.97] in series
    times = [p[0] for p in series]
    assert times == sorted(times) and set(times) <= set(t.tolist())
    assert kv["peak_usage"] == pytest.approx(0.97)


def test_metrics_are_json_ready():
    m = compute_metrics(make_trace())
    assert json.loads(json.dumps(m, allow_nan=False)) == m


def test_unfinished_request_is_refused():
    with pytest.raises(ValueError, match="request 'c' did not finish"):
        compute_metrics(make_trace(unfinished=("c",)))
    with pytest.raises(ValueError, match="'c'"):
        request_metrics(make_trace(unfinished=("c",)))


def test_token_times_must_match_the_outputs():
    times = {r[0]: list(r[6]) for r in REQUESTS}
    times["a"] = times["a"][:2]
    with pytest.raises(ValueError, match="request 'a'.*2 times for 3 output tokens"):
        compute_metrics(make_trace(token_times=times))


def test_summarize_matches_numpy():
    rng = np.random.default_rng(0)
    values = rng.lognormal(size=997).tolist()
    s = summarize(values)
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    assert s.count == 997
    assert (s.p50, s.p90, s.p99) == (p50, p90, p99)
    assert s.mean == pytest.approx(np.mean(values))
    assert (s.min, s.max) == (min(values), max(values))
    assert summarize([2.0]).as_dict() == {"count": 1, "mean": 2.0, "p50": 2.0, "p90": 2.0,
                                          "p99": 2.0, "min": 2.0, "max": 2.0}


def test_summarize_empty():
    s = summarize([])
    assert s.count == 0
    assert all(v is None for k, v in s.as_dict().items() if k != "count")


@pytest.mark.parametrize("kwargs,field", [({"ttft_s": 0}, "ttft_s"), ({"tpot_s": -0.1}, "tpot_s"),
                                          ({"ttft_s": math.nan}, "ttft_s"),
                                          ({"tpot_s": "1"}, "tpot_s"),
                                          ({"tpot_s": True}, "tpot_s")])
def test_slo_is_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SLO(**kwargs)
    assert SLO() == SLO(ttft_s=2.0, tpot_s=0.1)


@pytest.mark.timing
def test_thousand_requests_thousand_steps_is_fast():
    n_req, n_steps, n_tok = 1000, 1000, 100
    rng = np.random.default_rng(1)
    arrivals = np.sort(rng.uniform(0, 100, n_req))
    requests = []
    for i, a in enumerate(arrivals.tolist()):
        first = a + 0.05
        times = [first + 0.02 * k for k in range(n_tok)]
        requests.append((f"r{i}", 32, a, a + 0.01, first, times[-1], times))
    batch = _batch(64, 8, 16)
    steps = [StepRecord.of(0.1 * i, batch, 0.1, {"gemm": 0.07, "attention": 0.03})
             for i in range(n_steps)]
    kv = [(0.1 * i, (i % 100) / 100) for i in range(n_steps)]
    trace = make_trace(requests, steps, kv)
    began = time.perf_counter()
    m = compute_metrics(trace)
    seconds = time.perf_counter() - began
    assert m["requests"] == n_req and m["itl"]["count"] == n_req * (n_tok - 1)
    assert m["steps"]["count"] == n_steps and len(m["kv"]["series"]) == 500
    assert seconds < 1.0, f"compute_metrics took {seconds:.3f} s"
