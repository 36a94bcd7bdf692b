"""The sampler: filters, seeded determinism, distribution, logprobs, vectorisation, bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnomon.engine.sampler import Sampler, seeded_uniform
from gnomon.engine.sampling_params import SamplingParams as SP


def run(logits, params, sample_indices=None, positions=None, sampler=None):
    n = logits.shape[0]
    sampler = sampler or Sampler(seed=0)
    return sampler(logits, params, sample_indices or [0] * n, positions or [0] * n)


def allowed_set(logits_row, p, slack=1e-6):
    """Reference filter in numpy (float64 masses over float32-scaled logits): the tokens the
    params permit, with a rounding slack at the top-p boundary, where float32 and float64 may
    disagree."""
    # the scaled logits in float32, as the sampler computes them: two logits that round to the
    # same scaled value are a tie (broken by id), whatever float64 would say
    x = np.asarray(logits_row, dtype=np.float32)
    v = x.size
    s = ((x - x.max()) / np.float32(p.temperature)).astype(np.float64)
    order = sorted(range(v), key=lambda i: (-s[i], i))
    allowed = np.ones(v, dtype=bool)
    if p.top_k > 0:
        allowed[order[p.top_k:]] = False
    if p.top_p < 1:
        kept = [i for i in order if allowed[i]]
        w = np.exp(s[kept])
        w /= w.sum()
        before = np.cumsum(w) - w
        for i, b in zip(kept, before):
            if b >= p.top_p + slack:
                allowed[i] = False
    if p.min_p > 0:
        allowed &= s >= math.log(p.min_p) - slack
    return allowed


def test_greedy_is_argmax_with_ties_to_lowest_id():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(32, 100, generator=g)
    logits[3, [7, 42, 99]] = 50.0  # a three-way tie
    out = run(logits, [SP(temperature=0)] * 32)
    assert out.token_ids.dtype == torch.int64
    assert torch.equal(out.token_ids, torch.argmax(logits, dim=-1))
    assert out.token_ids[3].item() == 7
    assert out.logprobs == (None,) * 32


logit_rows = st.integers(2, 40).flatmap(
    lambda v: st.lists(st.floats(-8, 8, allow_nan=False, width=32), min_size=v, max_size=v))
params_st = st.builds(
    lambda t, k, p, m, seed: SP(temperature=t, top_k=k, top_p=p, min_p=m, seed=seed),
    st.sampled_from([0.3, 0.7, 1.0, 1.5, 4.0]), st.integers(0, 6),
    st.sampled_from([1.0, 0.99, 0.9, 0.5, 0.2, 0.01]), st.sampled_from([0.0, 0.05, 0.3, 0.9]),
    st.integers(0, 2**40))


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(row=logit_rows, p=params_st)
def test_filters_never_emit_a_filtered_token(row, p):
    allowed = allowed_set(row, p)
    draws = 64
    logits = torch.tensor([row] * draws, dtype=torch.float32)
    out = run(logits, [p] * draws, positions=list(range(draws)))
    for t in out.token_ids.tolist():
        assert allowed[t], (t, allowed, p)


def test_top_k_ties_keep_exactly_k_lowest_ids():
    logits = torch.zeros(400, 10)
    out = run(logits, [SP(top_k=3, seed=5)] * 400, positions=list(range(400)))
    assert set(out.token_ids.tolist()) == {0, 1, 2}


def test_masked_tokens_are_never_sampled():
    logits = torch.zeros(200, 8)
    logits[:, [1, 4, 6]] = -math.inf
    out = run(logits, [SP(temperature=2.0, seed=3)] * 200, positions=list(range(200)))
    assert set(out.token_ids.tolist()) == {0, 2, 3, 5, 7}


def test_small_temperature_approaches_greedy():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 500, generator=g) * 3
    greedy = torch.argmax(logits, dim=-1)
    out = run(logits, [SP(temperature=1e-4, seed=i) for i in range(64)])
    assert torch.equal(out.token_ids, greedy)
    # A hot temperature does not (sanity check that the test can fail).
    hot = run(logits, [SP(temperature=5.0, seed=i) for i in range(64)])
    assert not torch.equal(hot.token_ids, greedy)
    # Huge logits with a tiny temperature stay finite (row max is subtracted first).
    big = torch.tensor([[3e38, -3e38, 2.9e38]])
    assert run(big, [SP(temperature=1e-30)]).token_ids.item() == 0


def expected_probs(logits, p):
    allowed = allowed_set(logits, p, slack=0.0)
    s = (np.asarray(logits, np.float64) - max(logits)) / p.temperature
    w = np.where(allowed, np.exp(s), 0.0)
    return w / w.sum()


def chi_square(counts, probs):
    mask = probs > 0
    n = counts.sum()
    assert counts[~mask].sum() == 0
    expected = n * probs[mask]
    return float((((counts[mask] - expected) ** 2) / expected).sum())


@pytest.mark.parametrize("p", [
    SP(temperature=1.0, seed=11),
    SP(temperature=0.7, top_k=5, seed=12),
    SP(temperature=1.3, top_p=0.8, seed=13),
    SP(temperature=1.0, min_p=0.1, seed=14),
    SP(temperature=0.9, top_k=6, top_p=0.9, min_p=0.05, seed=15),
])
def test_empirical_distribution_matches_filtered_softmax(p):
    logits = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]
    n = 20000
    out = run(torch.tensor([logits] * n), [p] * n, positions=list(range(n)))
    counts = np.bincount(out.token_ids.numpy(), minlength=len(logits)).astype(np.float64)
    probs = expected_probs(logits, p)
    df = int((probs > 0).sum()) - 1
    # chi-square critical value at p = 1e-6 for df <= 7 is below 40.
    assert chi_square(counts, probs) < 40.0, (counts, probs)
    # The test has power: the unfiltered softmax at temperature 1 is rejected (unless it is the
    # target).
    plain = np.exp(np.array(logits) - max(logits))
    plain /= plain.sum()
    if not np.allclose(plain, probs):
        with np.errstate(divide="ignore", invalid="ignore"):
            stat = float((((counts - n * plain) ** 2) / (n * plain)).sum())
        assert stat > 100.0 and df >= 0


def test_unseeded_rows_follow_the_distribution_and_the_sampler_seed():
    logits = [1.0, 0.0, -1.0, 0.5]
    n = 20000
    x = torch.tensor([logits] * n)
    a = run(x, [SP()] * n, sampler=Sampler(seed=7))
    b = run(x, [SP()] * n, sampler=Sampler(seed=7))
    c = run(x, [SP()] * n, sampler=Sampler(seed=8))
    assert torch.equal(a.token_ids, b.token_ids)
    assert not torch.equal(a.token_ids, c.token_ids)
    counts = np.bincount(a.token_ids.numpy(), minlength=4).astype(np.float64)
    assert chi_square(counts, expected_probs(logits, SP())) < 40.0


def test_seeded_rows_ignore_batch_composition_order_and_preemption():
    g = torch.Generator().manual_seed(3)
    vocab = 1000
    target = torch.randn(1, vocab, generator=g) * 2
    p = SP(temperature=0.8, top_p=0.95, seed=1234)
    sampler = Sampler(seed=0)
    alone = [sampler(target, [p], [0], [pos]).token_ids.item() for pos in range(20)]
    for pos in range(20):
        others = torch.randn(9, vocab, generator=g)
        batch = torch.cat([others[:pos % 9], target, others[pos % 9:]])
        params = [SP(temperature=1.0, top_k=pos % 4)] * 9
        params.insert(pos % 9, p)
        idx = [0] * 10
        positions = [7] * 10
        positions[pos % 9] = pos
        got = sampler(batch, params, idx, positions).token_ids[pos % 9].item()
        assert got == alone[pos]
    # "Preempted and recomputed": a fresh sampler, after unrelated draws, gives the same tokens.
    later = Sampler(seed=99)
    later(torch.randn(5, vocab, generator=g), [SP()] * 5, [0] * 5, [0] * 5)
    again = [later(target, [p], [0], [pos]).token_ids.item() for pos in reversed(range(20))]
    assert again[::-1] == alone
    assert len(set(alone)) > 1


def test_different_seeds_and_sample_indices_differ():
    logits = torch.zeros(64, 1000)
    seqs = {}
    for seed, idx in [(1, 0), (2, 0), (1, 1)]:
        out = run(logits, [SP(seed=seed)] * 64, sample_indices=[idx] * 64,
                  positions=list(range(64)))
        seqs[(seed, idx)] = tuple(out.token_ids.tolist())
    assert len(set(seqs.values())) == 3
    assert seeded_uniform(1, 0, 0) != seeded_uniform(2, 0, 0) != seeded_uniform(1, 1, 0)
    assert 0.0 <= seeded_uniform(-5, 3, 10**12) < 1.0
    assert seeded_uniform(-1, 0, 0) == seeded_uniform(2**64 - 1, 0, 0)


def test_logprobs_are_raw_log_softmax_with_sorted_alternatives():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 50, generator=g)
    logits[0, [3, 9]] = 9.0  # a tie: the lower id comes first
    params = [SP(temperature=0, logprobs=5), SP(temperature=0.5, top_k=3, logprobs=2, seed=1),
              SP(logprobs=0, seed=2), SP(), SP(logprobs=50, top_p=0.5, seed=3),
              SP(logprobs=80, seed=4)]
    out = run(logits, params)
    ref = torch.log_softmax(logits, dim=-1)
    for i, p in enumerate(params):
        lp = out.logprobs[i]
        if p.logprobs is None:
            assert lp is None
            continue
        tok = out.token_ids[i].item()
        assert lp.token_id == tok
        assert lp.logprob == pytest.approx(ref[i, tok].item(), abs=1e-6)
        k = min(p.logprobs, 50)
        assert len(lp.top_token_ids) == len(lp.top_logprobs) == k
        assert list(lp.top_logprobs) == sorted(lp.top_logprobs, reverse=True)
        expect_ids = torch.sort(ref[i], descending=True, stable=True).indices[:k].tolist()
        assert list(lp.top_token_ids) == expect_ids
        for t, v in zip(lp.top_token_ids, lp.top_logprobs):
            assert v == pytest.approx(ref[i, t].item(), abs=1e-6)
    assert out.logprobs[0].top_token_ids[:2] == (3, 9)
    assert math.exp(out.logprobs[4].top_logprobs[0]) > 0  # raw, not the filtered distribution
    assert len(out.logprobs[4].top_token_ids) == 50


def test_batch_of_256_mixed_rows_matches_row_by_row():
    g = torch.Generator().manual_seed(5)
    vocab = 2048
    logits = torch.randn(256, vocab, generator=g) * 3
    rng = np.random.default_rng(0)
    params, idx, pos = [], [], []
    for i in range(256):
        kind = i % 8
        params.append(SP(
            temperature=[0.0, 1.0, 0.7, 1.2, 0.5, 2.0, 1.0, 0.9][kind],
            top_k=[0, 0, 20, 0, 0, 50, 0, 10][kind],
            top_p=[1.0, 1.0, 1.0, 0.9, 1.0, 0.8, 0.95, 0.7][kind],
            min_p=[0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.05, 0.02][kind],
            seed=None if i % 16 == 15 else int(rng.integers(0, 2**31)),
            logprobs=[None, 2, None, 0, None, 4, None, 1][kind]))
        idx.append(int(rng.integers(0, 4)))
        pos.append(int(rng.integers(0, 500)))
    sampler = Sampler(seed=0)
    out = sampler(logits, params, idx, pos)
    assert out.token_ids.shape == (256,)
    for i in range(256):
        if params[i].seed is None and params[i].temperature != 0:
            assert 0 <= out.token_ids[i].item() < vocab
            continue
        one = sampler(logits[i:i + 1], [params[i]], [idx[i]], [pos[i]])
        assert one.token_ids.item() == out.token_ids[i].item(), i
        assert one.logprobs[0] == out.logprobs[i]
    assert len(set(out.token_ids.tolist())) > 50


def test_half_precision_logits_are_accepted():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    out = run(logits, [SP(temperature=0)] * 4)
    assert torch.equal(out.token_ids, torch.argmax(logits.float(), dim=-1))


def test_numpy_integer_indices_are_accepted():
    logits = torch.zeros(2, 50)
    p = [SP(seed=9), SP(seed=9)]
    a = run(logits, p, sample_indices=[0, 1], positions=[3, 3])
    b = run(logits, p, sample_indices=list(np.array([0, 1])), positions=list(np.array([3, 3])))
    assert torch.equal(a.token_ids, b.token_ids)


def test_empty_batch():
    out = run(torch.empty(0, 10), [])
    assert out.token_ids.shape == (0,) and out.logprobs == ()


def test_bad_input_is_refused_with_a_named_argument():
    s = Sampler(seed=0)
    x = torch.zeros(2, 5)
    ok = [SP(), SP()]
    with pytest.raises(TypeError, match="logits"):
        s([[0.0, 1.0]], [SP()], [0], [0])
    with pytest.raises(ValueError, match="2-D"):
        s(torch.zeros(5), [SP()], [0], [0])
    with pytest.raises(ValueError, match="floating"):
        s(torch.zeros(2, 5, dtype=torch.int64), ok, [0, 0], [0, 0])
    with pytest.raises(ValueError, match="params: expected one entry per logits row"):
        s(x, [SP()], [0, 0], [0, 0])
    with pytest.raises(ValueError, match="sample_indices"):
        s(x, ok, [0], [0, 0])
    with pytest.raises(ValueError, match="output_positions"):
        s(x, ok, [0, 0], [0, 0, 0])
    with pytest.raises(ValueError, match=r"output_positions\[1\]"):
        s(x, ok, [0, 0], [0, -1])
    with pytest.raises(ValueError, match=r"sample_indices\[0\]"):
        s(x, ok, [1.5, 0], [0, 0])
    with pytest.raises(ValueError, match=r"sample_indices\[1\]"):
        s(x, ok, [0, True], [0, 0])
    with pytest.raises(TypeError, match=r"params\[1\]"):
        s(x, [SP(), {"temperature": 1.0}], [0, 0], [0, 0])
    with pytest.raises(ValueError, match="seed"):
        Sampler(seed="x")
    with pytest.raises(ValueError, match="V=0"):
        s(torch.zeros(1, 0), [SP()], [0], [0])
    nan = torch.zeros(3, 5)
    nan[2, 1] = math.nan
    with pytest.raises(ValueError, match=r"rows \[2\] contain NaN"):
        s(nan, [SP()] * 3, [0] * 3, [0] * 3)
    inf = torch.zeros(3, 5)
    inf[1, 0] = math.inf
    with pytest.raises(ValueError, match=r"rows \[1\] contain \+inf"):
        s(inf, [SP(temperature=0)] * 3, [0] * 3, [0] * 3)
    masked = torch.zeros(3, 5)
    masked[0] = -math.inf
    with pytest.raises(ValueError, match=r"rows \[0\] contain -inf in every position"):
        s(masked, [SP()] * 3, [0] * 3, [0] * 3)


def test_extreme_uniforms_pick_the_first_and_last_kept_tokens(monkeypatch):
    logits = torch.tensor([[-math.inf, 0.0, 5.0, -math.inf, 1.0, -5.0, -math.inf]] * 2)
    p = SP(temperature=1.0, min_p=1e-30)
    for u, expect in [(0.0, 1), (1.0 - 2.0 ** -53, 5)]:
        monkeypatch.setattr(Sampler, "_uniforms",
                            lambda self, *a, u=u: torch.full((2,), u, dtype=torch.float64))
        assert run(logits, [p, p]).token_ids.tolist() == [expect, expect]


def test_wide_nucleus_matches_reference_and_row_by_row():
    """Top-p-only rows whose nucleus is wider than the sampler's first look (1024 tokens)."""
    g = torch.Generator().manual_seed(8)
    vocab = 3000
    logits = torch.randn(12, vocab, generator=g) * 0.2
    logits[::3] *= 40  # peaked rows keep a small nucleus; the others need the full sort
    params = [SP(top_p=[0.95, 0.5, 0.99][i % 3], min_p=[0.0, 0.0, 0.2][i % 3] if i % 4 else 0.0,
                 seed=100 + i) for i in range(12)]
    sampler = Sampler(seed=0)
    for pos in range(3):
        out = sampler(logits, params, [0] * 12, [pos] * 12)
        for i in range(12):
            t = out.token_ids[i].item()
            assert allowed_set(logits[i].tolist(), params[i], slack=1e-5)[t]
            assert sampler(logits[i:i + 1], [params[i]], [0], [pos]).token_ids.item() == t
    # The nucleus of a flat row is about top_p of the vocabulary.
    flat = torch.zeros(1, vocab)
    out = run(flat.expand(2000, vocab).contiguous(), [SP(top_p=0.5, seed=1)] * 2000,
              positions=list(range(2000)))
    assert 1400 < out.token_ids.max().item() < 1500  # exactly tokens 0..1499 survive


def test_wide_nucleus_of_distinct_logits_reaches_past_the_first_look():
    vocab = 3000
    logits = (-torch.arange(vocab, dtype=torch.float32) * 1e-4)[None, :]
    p = SP(top_p=0.5, seed=4)
    allowed = allowed_set(logits[0].tolist(), p, slack=0.0)
    edge = int(allowed.sum())
    assert 1100 < edge < 1600
    out = run(logits.expand(4000, vocab).contiguous(), [p] * 4000, positions=list(range(4000)))
    assert edge - 60 < out.token_ids.max().item() < edge
