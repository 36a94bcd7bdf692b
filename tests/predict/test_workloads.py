"""Tests for gnomon.predict.workloads: synthetic generation, presets, trace loading, resolve."""

import json
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gnomon.predict.workloads import (
    WORKLOADS, LengthDist, SyntheticSpec, Workload, WorkloadRequest, load_trace, named, resolve,
    synthetic)


def spec(**kw):
    base = dict(num_requests=50, rate=4.0, prompt_len=LengthDist.uniform(4, 32),
                output_len=LengthDist.uniform(1, 16))
    base.update(kw)
    return SyntheticSpec(**base)


def arrivals(w):
    return np.array([r.arrival_time for r in w.requests])


def prompt_lens(w):
    return np.array([len(r.prompt_token_ids) for r in w.requests])


def output_lens(w):
    return np.array([r.output_len for r in w.requests])


# --------------------------------------------------------------------------- determinism


def test_same_seed_gives_identical_workload():
    s = spec(seed=7, shared_prefix_groups=3, shared_prefix_len=4)
    assert synthetic(s) == synthetic(s)


def test_different_seeds_give_different_arrivals_lengths_and_tokens():
    a, b = synthetic(spec(seed=1)), synthetic(spec(seed=2))
    assert not np.array_equal(arrivals(a), arrivals(b))
    assert not np.array_equal(prompt_lens(a), prompt_lens(b))
    assert not np.array_equal(output_lens(a), output_lens(b))
    assert a.requests[0].prompt_token_ids != b.requests[0].prompt_token_ids


def test_changing_rate_keeps_requests_and_scales_arrivals():
    a, b = synthetic(spec(rate=1.0, seed=3)), synthetic(spec(rate=4.0, seed=3))
    assert [r.prompt_token_ids for r in a.requests] == [r.prompt_token_ids for r in b.requests]
    assert [r.output_len for r in a.requests] == [r.output_len for r in b.requests]
    np.testing.assert_allclose(arrivals(b), arrivals(a) / 4.0, rtol=1e-12)


# --------------------------------------------------------------------------- arrivals


def test_poisson_mean_interarrival_is_one_over_rate():
    rate, n = 5.0, 20001
    gaps = np.diff(arrivals(synthetic(spec(num_requests=n, rate=rate,
                                           prompt_len=LengthDist.fixed(1)))))
    # Exponential gaps: the mean of 20000 has standard error (1/rate)/sqrt(20000) ~ 0.7%;
    # allow 5 standard errors. The exponential's std equals its mean: check within 5%.
    assert gaps.mean() == pytest.approx(1 / rate, rel=5 / math.sqrt(n - 1))
    assert gaps.std() == pytest.approx(1 / rate, rel=0.05)
    assert arrivals(synthetic(spec(rate=rate)))[0] == 0.0


def test_fixed_arrivals_are_exactly_spaced():
    w = synthetic(spec(num_requests=100, rate=4.0, arrival="fixed"))
    assert arrivals(w).tolist() == [i * 0.25 for i in range(100)]  # 0.25 sums exactly
    w3 = synthetic(spec(num_requests=100, rate=3.0, arrival="fixed"))
    np.testing.assert_allclose(np.diff(arrivals(w3)), 1 / 3, rtol=1e-9)
    assert w3.duration == pytest.approx(99 / 3)


@pytest.mark.parametrize("arrival", ["poisson", "fixed"])
def test_infinite_rate_puts_every_arrival_at_zero(arrival):
    w = synthetic(spec(rate=math.inf, arrival=arrival))
    assert arrivals(w).tolist() == [0.0] * 50
    assert w.duration == 0.0


# --------------------------------------------------------------------------- lengths


@settings(max_examples=60, deadline=None)
@given(low=st.integers(1, 500), span=st.integers(0, 500), seed=st.integers(0, 2**32),
       median_at=st.floats(0, 1), sigma=st.floats(0, 3))
def test_length_samples_respect_bounds(low, span, seed, median_at, sigma):
    high = low + span
    rng = np.random.default_rng(seed)
    u = LengthDist.uniform(low, high).sample(rng, 200)
    ln = LengthDist.lognormal(low + median_at * span, sigma, low, high).sample(rng, 200)
    f = LengthDist.fixed(low).sample(rng, 200)
    for x in (u, ln, f):
        assert x.dtype == np.int64 and x.shape == (200,)
        assert x.min() >= low and x.max() <= high
    assert (f == low).all()


def test_uniform_lengths_reach_both_inclusive_ends():
    x = LengthDist.uniform(3, 5).sample(np.random.default_rng(0), 1000)
    assert set(x.tolist()) == {3, 4, 5}


def test_synthetic_prompt_and_output_lengths_within_bounds():
    w = synthetic(spec(num_requests=500, prompt_len=LengthDist.lognormal(40, 2.0, 10, 60),
                       output_len=LengthDist.uniform(2, 9)))
    assert prompt_lens(w).min() >= 10 and prompt_lens(w).max() <= 60
    assert output_lens(w).min() >= 2 and output_lens(w).max() <= 9


def test_lognormal_median_is_roughly_the_requested_median():
    x = LengthDist.lognormal(1000, 0.8, 16, 4096).sample(np.random.default_rng(0), 20001)
    # The sample median's standard error on the log scale is sqrt(pi/2)*sigma/sqrt(n) ~ 0.7%
    # here; clipping does not move the median. Allow 5%.
    assert np.median(x) == pytest.approx(1000, rel=0.05)


def test_lognormal_with_zero_sigma_is_the_median():
    x = LengthDist.lognormal(37, 0.0, 1, 100).sample(np.random.default_rng(0), 10)
    assert x.tolist() == [37] * 10


# --------------------------------------------------------------------------- tokens and prefixes


def test_token_ids_lie_in_one_to_vocab_size():
    w = synthetic(spec(num_requests=200, vocab_size=50))
    ids = np.concatenate([r.prompt_token_ids for r in w.requests])
    assert ids.min() >= 1 and ids.max() <= 49
    w2 = synthetic(spec(vocab_size=2, shared_prefix_groups=2, shared_prefix_len=3))
    assert {t for r in w2.requests for t in r.prompt_token_ids} == {1}


def test_shared_prefixes_are_shared_within_a_group_and_differ_across_groups():
    g, p = 4, 16
    w = synthetic(spec(num_requests=400, prompt_len=LengthDist.uniform(20, 40),
                       shared_prefix_groups=g, shared_prefix_len=p, seed=5))
    prefixes = {}
    for r in w.requests:
        prefixes.setdefault(r.prompt_token_ids[:p], []).append(r)
    # With 400 requests drawn uniformly over 4 groups, each group is used (P(miss) ~ 4 * 0.75**400).
    assert len(prefixes) == g
    assert all(len(rs) > 50 for rs in prefixes.values())
    # Across groups the prefixes differ at their first token (ids drawn from 31999 values),
    # so no two groups share even a partial prefix there.
    assert len({k[0] for k in prefixes}) == g
    # Past the prefix, requests of one group do not share tokens systematically.
    for rs in prefixes.values():
        assert len({r.prompt_token_ids[p:p + 4] for r in rs}) == len(rs)


def test_without_groups_prompts_share_no_prefix():
    w = synthetic(spec(num_requests=200, prompt_len=LengthDist.fixed(8)))
    assert len({r.prompt_token_ids[:4] for r in w.requests}) == 200


def test_prompt_shorter_than_prefix_is_lengthened_to_prefix_plus_one():
    w = synthetic(spec(prompt_len=LengthDist.fixed(5), shared_prefix_groups=2,
                       shared_prefix_len=16))
    assert prompt_lens(w).tolist() == [17] * 50


def test_request_ids_are_unique_and_in_arrival_order():
    w = synthetic(spec(), name="x")
    assert [r.request_id for r in w.requests] == [f"x-{i}" for i in range(50)]
    assert (np.diff(arrivals(w)) >= 0).all()


@pytest.mark.timing
def test_hundred_thousand_requests_generate_quickly():
    s = spec(num_requests=100_000, prompt_len=LengthDist.fixed(8),
             output_len=LengthDist.fixed(4))
    best = math.inf
    for _ in range(3):  # best of three, to be robust to a busy machine
        t = time.perf_counter()
        w = synthetic(s)
        best = min(best, time.perf_counter() - t)
    assert w.num_requests == 100_000
    assert best < 1.0


# --------------------------------------------------------------------------- Workload


def test_workload_properties():
    reqs = (WorkloadRequest("a", 0.0, (1, 2, 3), 4), WorkloadRequest("b", 1.5, (5,), 2))
    w = Workload("w", reqs, "hand made")
    assert w.num_requests == 2
    assert w.duration == 1.5
    assert w.mean_prompt_len == 2.0
    assert w.mean_output_len == 3.0


def test_workload_refuses_unsorted_duplicate_or_empty_requests():
    a, b = WorkloadRequest("a", 2.0, (1,), 1), WorkloadRequest("b", 1.0, (1,), 1)
    with pytest.raises(ValueError, match="sorted by arrival_time"):
        Workload("w", (a, b), "d")
    with pytest.raises(ValueError, match="unique"):
        Workload("w", (a, a), "d")
    with pytest.raises(ValueError, match="non-empty"):
        Workload("w", (), "d")


@pytest.mark.parametrize("kw,field", [
    (dict(arrival_time=-1.0), "arrival_time"),
    (dict(arrival_time=math.nan), "arrival_time"),
    (dict(prompt_token_ids=()), "prompt_token_ids"),
    (dict(prompt_token_ids=[1, 2]), "prompt_token_ids"),
    (dict(output_len=0), "output_len"),
    (dict(output_len=2.0), "output_len"),
])
def test_workload_request_validation_names_the_field(kw, field):
    args = dict(request_id="r", arrival_time=0.0, prompt_token_ids=(1,), output_len=1)
    args.update(kw)
    with pytest.raises(ValueError, match=field):
        WorkloadRequest(**args)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kw,field", [
    (dict(kind="normal"), "kind"),
    (dict(kind="fixed", value=0), "value"),
    (dict(kind="fixed", value=2.5), "value"),
    (dict(kind="fixed", value=3, low=1), "low"),
    (dict(kind="uniform", low=5), "high"),
    (dict(kind="uniform", low=0, high=4), "low"),
    (dict(kind="uniform", low=5, high=4), "low must be <= high"),
    (dict(kind="lognormal", low=1, high=10, median=5, sigma=-0.1), "sigma"),
    (dict(kind="lognormal", low=1, high=10, median=5, sigma=math.inf), "sigma"),
    (dict(kind="lognormal", low=1, high=10, median=20, sigma=1.0), "median"),
    (dict(kind="lognormal", low=1, high=10, median=math.nan, sigma=1.0), "median"),
    (dict(kind="lognormal", low=1, high=10, sigma=1.0), "median"),
])
def test_length_dist_validation_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        LengthDist(**kw)


@pytest.mark.parametrize("kw,field", [
    (dict(num_requests=0), "num_requests"),
    (dict(num_requests=2.0), "num_requests"),
    (dict(rate=0.0), "rate"),
    (dict(rate=-1.0), "rate"),
    (dict(rate=math.nan), "rate"),
    (dict(rate="fast"), "rate"),
    (dict(arrival="bursty"), "arrival"),
    (dict(prompt_len=16), "prompt_len"),
    (dict(output_len=None), "output_len"),
    (dict(shared_prefix_groups=-1), "shared_prefix_groups"),
    (dict(shared_prefix_len=-1), "shared_prefix_len"),
    (dict(shared_prefix_groups=2), "shared_prefix_len"),
    (dict(shared_prefix_len=8), "shared_prefix_len"),
    (dict(vocab_size=1), "vocab_size"),
    (dict(seed=-1), "seed"),
    (dict(seed=True), "seed"),
])
def test_synthetic_spec_validation_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        spec(**kw)


# --------------------------------------------------------------------------- presets


def test_named_chat_respects_num_requests_and_rate():
    w = named("chat", num_requests=2001, rate=8.0, vocab_size=32000, seed=1)
    assert w.num_requests == 2001
    # 2000 exponential gaps: the mean's standard error is ~2.2%; allow 5 of them.
    assert np.diff(arrivals(w)).mean() == pytest.approx(1 / 8.0, rel=0.11)
    assert prompt_lens(w).min() >= 16 and prompt_lens(w).max() <= 4096
    assert output_lens(w).min() >= 8 and output_lens(w).max() <= 1024
    assert np.median(prompt_lens(w)) == pytest.approx(1000, rel=0.1)
    assert np.median(output_lens(w)) == pytest.approx(250, rel=0.1)


def test_named_long_context_respects_num_requests_and_rate():
    w1 = named("long-context", num_requests=20, rate=1.0, vocab_size=1000, seed=2)
    w3 = named("long-context", num_requests=20, rate=3.0, vocab_size=1000, seed=2)
    assert w1.num_requests == w3.num_requests == 20
    np.testing.assert_allclose(arrivals(w3), arrivals(w1) / 3.0, rtol=1e-12)
    assert prompt_lens(w1).min() >= 8000 and prompt_lens(w1).max() <= 32000
    assert output_lens(w1).min() >= 16 and output_lens(w1).max() <= 2048


def test_presets_are_poisson_and_described():
    for name in ("chat", "long-context"):
        s = WORKLOADS[name](num_requests=3, rate=1.0, vocab_size=100)
        assert s.arrival == "poisson"
    w = named("chat", num_requests=3, rate=2.0, vocab_size=100)
    assert w.name == "chat" and "poisson" in w.description and "\n" not in w.description


def test_named_unknown_lists_known_names():
    with pytest.raises(ValueError, match="chat.*long-context"):
        named("code", num_requests=3, rate=1.0, vocab_size=100)


# --------------------------------------------------------------------------- traces


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_csv_trace_round_trip(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_time,prompt_tokens,output_tokens\n"
                                 "12.5,10,3\n10.0,4,7\n11.0,6,1\n10.0,5,2\n")
    w = load_trace(p, vocab_size=100, seed=1)
    assert arrivals(w).tolist() == [0.0, 0.0, 1.0, 2.5]
    # The two rows at 10.0 keep their file order (stable sort).
    assert prompt_lens(w).tolist() == [4, 5, 6, 10]
    assert output_lens(w).tolist() == [7, 2, 1, 3]
    ids = [t for r in w.requests for t in r.prompt_token_ids]
    assert min(ids) >= 1 and max(ids) <= 99
    assert load_trace(p, vocab_size=100, seed=1) == w
    assert load_trace(p, vocab_size=100, seed=2) != w
    assert w.name == "trace:t.csv" and str(p) in w.description


@pytest.mark.parametrize("ext", [".jsonl", ".json"])
def test_jsonl_trace_round_trip(tmp_path, ext):
    rows = [dict(arrival_time=3.0, prompt_tokens=8, output_tokens=2),
            dict(arrival_time=1.0, prompt_tokens=9, output_tokens=5, extra="ignored")]
    p = write(tmp_path, "t" + ext, "\n".join(json.dumps(r) for r in rows) + "\n\n")
    w = load_trace(p)
    assert arrivals(w).tolist() == [0.0, 2.0]
    assert prompt_lens(w).tolist() == [9, 8]
    assert output_lens(w).tolist() == [5, 2]


AZURE_CSV = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
             "2023-11-16 18:15:46.6805900,374,44\n"
             "2023-11-16 18:15:50,396,109\n"
             "2023-11-16 18:15:45.1000000,879,20\n")


def test_azure_csv_timestamps_parsed(tmp_path):
    w = load_trace(write(tmp_path, "azure.csv", AZURE_CSV))
    t = arrivals(w)
    assert t[0] == 0.0
    assert t[1] == pytest.approx(1.58059, abs=1e-9)
    assert t[2] == pytest.approx(4.9, abs=1e-9)
    assert prompt_lens(w).tolist() == [879, 374, 396]
    assert output_lens(w).tolist() == [20, 44, 109]
    assert "Azure" in w.description


def test_azure_jsonl_and_timezone_suffix(tmp_path):
    rows = [dict(TIMESTAMP="2024-05-10 00:00:01.5+00:00", ContextTokens=10, GeneratedTokens=2),
            dict(TIMESTAMP="2024-05-10T00:00:00Z", ContextTokens=20, GeneratedTokens=3)]
    w = load_trace(write(tmp_path, "az.jsonl", "\n".join(json.dumps(r) for r in rows)))
    assert arrivals(w).tolist() == [0.0, 1.5]
    assert prompt_lens(w).tolist() == [20, 10]


def test_max_requests_truncates_after_sorting(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_time,prompt_tokens,output_tokens\n"
                                 "5,1,1\n1,2,1\n3,3,1\n0,4,1\n")
    w = load_trace(p, max_requests=2)
    assert prompt_lens(w).tolist() == [4, 2]
    assert arrivals(w).tolist() == [0.0, 1.0]
    assert load_trace(p, max_requests=10).num_requests == 4


def test_missing_trace_file_names_the_path(tmp_path):
    p = tmp_path / "nope.csv"
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_trace(p)


def test_unknown_trace_extension_names_accepted(tmp_path):
    p = write(tmp_path, "t.txt", "arrival_time,prompt_tokens,output_tokens\n0,1,1\n")
    with pytest.raises(ValueError, match=r"\.txt.*\.csv.*\.json.*\.jsonl"):
        load_trace(p)


def test_header_without_needed_columns(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_time,prompt_tokens,out\n0,1,1\n")
    with pytest.raises(ValueError) as e:
        load_trace(p)
    msg = str(e.value)
    assert "['output_tokens']" in msg
    assert "arrival_time" in msg and "TIMESTAMP" in msg and "ContextTokens" in msg
    p = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n")
    with pytest.raises(ValueError, match=r"\['GeneratedTokens'\]"):
        load_trace(p)
    p = write(tmp_path, "j.jsonl", '{"arrival_time": 0, "output_tokens": 1}\n')
    with pytest.raises(ValueError, match=r"j\.jsonl:1:.*\['prompt_tokens'\].*TIMESTAMP"):
        load_trace(p)


HEADER = "arrival_time,prompt_tokens,output_tokens\n"


@pytest.mark.parametrize("row,field", [
    ("1.0,abc,5", "prompt_tokens"),
    ("x,4,5", "arrival_time"),
    ("-1.0,4,5", "arrival_time"),
    ("nan,4,5", "arrival_time"),
    ("1.0,-4,5", "prompt_tokens"),
    ("1.0,0,5", "prompt_tokens"),
    ("1.0,4,0", "output_tokens"),
    ("1.0,4.5,5", "prompt_tokens"),
    ("1.0,4", "output_tokens"),
    ("1.0,,5", "prompt_tokens"),
])
def test_malformed_csv_row_names_line_and_field(tmp_path, row, field):
    # Line 1 header, line 2 good, line 3 blank, line 4 the bad row.
    p = write(tmp_path, "t.csv", HEADER + "0.0,10,5\n\n" + row + "\n0.5,1,1\n")
    with pytest.raises(ValueError) as e:
        load_trace(p)
    assert f"{p}:4:" in str(e.value)
    assert field in str(e.value)


def test_csv_row_with_extra_fields_names_line(tmp_path):
    p = write(tmp_path, "t.csv", HEADER + "0.0,10,5,9\n")
    with pytest.raises(ValueError, match=r"t\.csv:2:.*4 fields"):
        load_trace(p)


def test_malformed_azure_timestamp_names_line_and_field(tmp_path):
    p = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                 "2023-11-16 18:15:46.68,1,1\nyesterday,1,1\n")
    with pytest.raises(ValueError, match=r"a\.csv:3:.*TIMESTAMP"):
        load_trace(p)


@pytest.mark.parametrize("line,field", [
    ('{"arrival_time": 1.0, "prompt_tokens": 4', "bad JSON"),
    ('[1.0, 4, 5]', "JSON object"),
    ('{"arrival_time": 1.0, "prompt_tokens": "4", "output_tokens": 5}', "prompt_tokens"),
    ('{"arrival_time": 1.0, "prompt_tokens": 4, "output_tokens": 0}', "output_tokens"),
    ('{"arrival_time": 1.0, "prompt_tokens": 0, "output_tokens": 5}', "prompt_tokens"),
    ('{"arrival_time": -2, "prompt_tokens": 4, "output_tokens": 5}', "arrival_time"),
    ('{"arrival_time": 1.0, "prompt_tokens": 4}', "output_tokens"),
    ('{"arrival_time": null, "prompt_tokens": 4, "output_tokens": 5}', "arrival_time"),
    ('{"arrival_time": 1.0, "prompt_tokens": true, "output_tokens": 5}', "prompt_tokens"),
])
def test_malformed_jsonl_row_names_line_and_field(tmp_path, line, field):
    good = '{"arrival_time": 0.0, "prompt_tokens": 4, "output_tokens": 5}'
    p = write(tmp_path, "t.jsonl", good + "\n\n" + line + "\n" + good + "\n")
    with pytest.raises(ValueError) as e:
        load_trace(p)
    assert f"{p}:3:" in str(e.value)
    assert field in str(e.value)


@pytest.mark.parametrize("name,text", [("t.csv", ""), ("t.csv", HEADER), ("t.csv", HEADER + "\n"),
                                       ("t.jsonl", ""), ("t.jsonl", "\n\n")])
def test_empty_trace_is_refused(tmp_path, name, text):
    with pytest.raises(ValueError, match="no requests"):
        load_trace(write(tmp_path, name, text))


@pytest.mark.parametrize("kw,field", [(dict(max_requests=0), "max_requests"),
                                      (dict(vocab_size=1), "vocab_size"),
                                      (dict(seed=-3), "seed")])
def test_load_trace_argument_validation(tmp_path, kw, field):
    p = write(tmp_path, "t.csv", HEADER + "0,1,1\n")
    with pytest.raises(ValueError, match=field):
        load_trace(p, **kw)


# --------------------------------------------------------------------------- resolve


def test_resolve_presets_match_named():
    for name in ("chat", "long-context"):
        kw = dict(num_requests=3, rate=2.0, vocab_size=100, seed=4)
        assert resolve(name, **kw) == named(name, **kw)


def test_resolve_trace(tmp_path):
    p = write(tmp_path, "t.csv", HEADER + "0,1,1\n1,2,2\n2,3,3\n")
    w = resolve(f"trace:{p}", num_requests=2, rate=None, vocab_size=100, seed=1)
    assert w == load_trace(p, vocab_size=100, seed=1, max_requests=2)
    assert resolve(f"trace:{p}", num_requests=None, rate=None, vocab_size=100).num_requests == 3


def test_resolve_trace_refuses_a_rate(tmp_path):
    p = write(tmp_path, "t.csv", HEADER + "0,1,1\n")
    with pytest.raises(ValueError, match="rate must be None"):
        resolve(f"trace:{p}", num_requests=None, rate=2.0, vocab_size=100)


def test_resolve_preset_needs_num_requests_and_rate():
    with pytest.raises(ValueError, match="num_requests and rate"):
        resolve("chat", num_requests=3, rate=None, vocab_size=100)


@pytest.mark.parametrize("bad", ["alpaca", "trace", "trace:", "Chat", ""])
def test_resolve_unknown_lists_accepted_forms(bad):
    with pytest.raises(ValueError) as e:
        resolve(bad, num_requests=3, rate=1.0, vocab_size=100)
    msg = str(e.value)
    assert "trace:" in msg
    if bad != "trace:":
        assert "'chat'" in msg and "'sharegpt'" in msg and "'trace:PATH'" in msg
