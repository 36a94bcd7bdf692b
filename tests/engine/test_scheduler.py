"""Scheduler and KV-cache manager, driven with the real C++ allocator.

The test plays the model: `FakeModel` writes each scheduled token id into its slot of a fake KV
cache (through the block table, after applying the batch's block copies), and samples
``hash((context read back from the cache, seed)) % VOCAB``. A wrong block table, a missing
copy-on-write copy or a wrong prefix-cache hit changes the context and so the tokens; the
context is also compared with the scheduler's own token ids at every sampled position.
"""

from __future__ import annotations

import dataclasses
import numpy as np
import pytest

from gnomon.engine.batch import ScheduledBatch, ScheduledSequence, StepOutput
from gnomon.engine.engine_config import EngineConfig
from gnomon.engine.block_tables import BlockTables
from gnomon.engine.kv_cache import (KVCacheGroups, KVCacheManager, kv_bytes_per_block,
                                     resolve_num_blocks)
from gnomon.engine.sampling_params import SamplingParams
from gnomon.engine.scheduler import Scheduler
from gnomon.engine.sequence import sample_seed

VOCAB = 50


class FakeModel:
    """Applies the batches' block-table deltas as a runner does (`BlockTables`) and checks,
    every step, that each rebuilt table equals the allocator's."""

    def __init__(self, sched: Scheduler):
        self.sched = sched
        self.bs = sched.kv.block_size
        self.slots = np.full(sched.kv.num_blocks * self.bs, -1, dtype=np.int64)
        self.tables = BlockTables(sched.kv.num_blocks)
        self.checked_contexts = 0

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        bs = self.bs
        for src, dst in batch.block_copies:
            self.slots[dst * bs:(dst + 1) * bs] = self.slots[src * bs:(src + 1) * bs]
        self.tables.apply(batch)
        tables = {}
        for s in batch.sequences:
            tables[s.seq_id] = self.tables.table(s.seq_id)
            assert tables[s.seq_id] == self.sched.kv.block_table(s.seq_id), "delta mismatch"
        for s in batch.sequences:  # write all KV first (the forward writes before attending)
            bt = np.asarray(tables[s.seq_id])
            pos = np.arange(s.num_computed_tokens, s.context_len)
            self.slots[bt[pos // bs] * bs + pos % bs] = s.token_ids
        out = []
        for s in batch.sequences:
            if not s.is_last_prefill_chunk:
                out.append(None)
                continue
            bt = np.asarray(tables[s.seq_id])
            pos = np.arange(s.context_len)
            ctx = tuple(self.slots[bt[pos // bs] * bs + pos % bs].tolist())
            seq = next(q for q in self.sched.get_request(s.request_id).sequences
                       if q.seq_id == s.seq_id)
            assert list(ctx) == seq.token_ids[:s.context_len], "KV cache content is wrong"
            self.checked_contexts += 1
            # hash(None) is its address on Python 3.11: an unseeded request takes -1, so that
            # the tokens (and any prefix they happen to share) are the same on every run
            seed = s.sampling_params.seed
            out.append(hash((ctx, -1 if seed is None else seed)) % VOCAB)
        return StepOutput(tuple(out), seconds=0.001, breakdown={"fake": 0.001})


def make(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=32,
         max_model_len=1024, prefix=True, eos=(), capacity_policy="max_utilization", spec=0):
    kv = KVCacheManager(num_blocks, block_size, prefix)
    return Scheduler(kv, EngineConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=max_num_batched_tokens,
                                      capacity_policy=capacity_policy,
                                      num_speculative_tokens=spec), eos_token_ids=eos)


def run(sched, on_batch=None, max_steps=20000, model=None):
    """Drive to completion, checking the per-step invariants. Returns the batches."""
    model = model or FakeModel(sched)
    now = 0.0
    batches = []
    while sched.has_unfinished():
        assert len(batches) < max_steps, "scheduler does not make progress"
        batch = sched.schedule(now)
        if batch.is_empty:
            nxt = sched.next_arrival_time()
            assert nxt is not None and nxt > now, "empty batch with work runnable now"
            now = nxt
            continue
        check_batch(sched, batch)
        if on_batch:
            on_batch(batch)
        sched.update(batch, model.execute(batch))
        batches.append(batch)
        now += 0.001
    assert sched.kv.num_free_blocks == sched.kv.num_blocks
    return batches


def check_batch(sched, batch):
    assert batch.num_tokens == sum(len(s.token_ids) + s.num_draft_tokens
                                   for s in batch.sequences)
    assert 0 < batch.num_tokens <= sched.max_num_batched_tokens
    assert batch.num_seqs <= sched.max_num_seqs
    assert len({s.seq_id for s in batch.sequences}) == batch.num_seqs
    for s in batch.sequences:
        assert len(s.token_ids) >= 1
        assert len(sched.kv.block_table(s.seq_id)) * sched.kv.block_size \
            >= s.context_len + s.num_draft_tokens


def outputs(sched, ids):
    return {rid: sched.get_request(rid).outputs() for rid in ids}


def check_finished(sched, ids):
    for rid in ids:
        req = sched.get_request(rid)
        assert req.finished and req.finish_time is not None
        for toks, reason in req.outputs():
            if reason == "length":
                assert len(toks) == req.params.max_tokens
            else:
                assert reason == "stop" and 1 <= len(toks) <= req.params.max_tokens


def workload(rng, n_req, prompt_range=(1, 30), out_range=(1, 12), shared_prefix=0, n=1):
    prefix = [int(x) for x in rng.integers(0, VOCAB, shared_prefix)]
    reqs = []
    for i in range(n_req):
        plen = int(rng.integers(*prompt_range))
        prompt = prefix + [int(x) for x in rng.integers(0, VOCAB, plen)]
        reqs.append((f"r{i}", prompt, SamplingParams(max_tokens=int(rng.integers(*out_range)),
                                                      seed=i, n=n, ignore_eos=True)))
    return reqs


def run_workload(reqs, arrivals=None, model=None, **kw):
    sched = make(**kw)
    for i, (rid, prompt, params) in enumerate(reqs):
        sched.add(rid, prompt, params, arrival_time=arrivals[i] if arrivals else 0.0)
    batches = run(sched, model=model(sched) if model else None)
    ids = [r[0] for r in reqs]
    check_finished(sched, ids)
    return sched, batches, outputs(sched, ids)


# --------------------------------------------------------------------------- batch contract
def test_batch_equality_and_immutability():
    p = SamplingParams()
    a = ScheduledSequence(1, "r", 0, (1, 2), 0, ((3,),), True, p)
    b = ScheduledSequence(1, "r", 0, (1, 2), 0, ((3,),), True, p)
    assert a == b and hash(a) == hash(b)
    assert ScheduledBatch((a,), ((1, 2),), (5,), 2, 0) == \
        ScheduledBatch((b,), ((1, 2),), (5,), 2, 0)
    assert ScheduledBatch((a,)) != ScheduledBatch((a._replace(block_ids=((4,),)),))
    with pytest.raises(AttributeError):
        a.token_ids = (9,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ScheduledBatch().sequences = ()


def test_batches_are_only_tuples_and_ints():
    sched = make()
    sched.add("a", list(range(10)), SamplingParams(max_tokens=3, n=2, seed=1))

    def walk(x):
        if dataclasses.is_dataclass(x):
            assert type(x).__dataclass_params__.frozen
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name))
        elif isinstance(x, tuple):
            for y in x:
                walk(y)
        else:
            assert isinstance(x, (int, str, float, type(None))), type(x)

    run(sched, on_batch=walk)


# --------------------------------------------------------------------------- policy
def test_budget_and_seq_cap_every_step():
    rng = np.random.default_rng(0)
    reqs = workload(rng, 30, prompt_range=(1, 40))
    sched, batches, _ = run_workload(reqs, max_num_seqs=4, max_num_batched_tokens=10,
                                     num_blocks=100)
    assert max(b.num_tokens for b in batches) == 10
    assert max(b.num_seqs for b in batches) == 4
    assert all(b.num_seqs <= 4 and b.num_tokens <= 10 for b in batches)
    assert sched.num_running == 0


def test_decodes_first_then_continuing_prefill_then_fcfs_admissions():
    sched = make(max_num_batched_tokens=8, max_num_seqs=8, num_blocks=64)
    model = FakeModel(sched)
    sched.add("a", [1, 2, 3], SamplingParams(max_tokens=10))
    sched.add("b", list(range(12)), SamplingParams(max_tokens=10))
    b1 = sched.schedule(0.0)
    assert [(s.request_id, len(s.token_ids)) for s in b1.sequences] == [("a", 3), ("b", 5)]
    assert [s.is_last_prefill_chunk for s in b1.sequences] == [True, False]
    assert (b1.num_prefill_tokens, b1.num_decode_tokens) == (8, 0)
    sched.update(b1, model.execute(b1))
    sched.add("c", [7, 7], SamplingParams(max_tokens=10), arrival_time=0.5)
    sched.add("d", [8], SamplingParams(max_tokens=10), arrival_time=0.4)
    b2 = sched.schedule(1.0)
    # a decodes, b continues (remaining 7, budget 7), no room for d and c
    assert [(s.request_id, len(s.token_ids)) for s in b2.sequences] == [("a", 1), ("b", 7)]
    assert b2.sequences[0].num_computed_tokens == 3 and b2.sequences[1].num_computed_tokens == 5
    assert (b2.num_prefill_tokens, b2.num_decode_tokens) == (7, 1)
    sched.update(b2, model.execute(b2))
    b3 = sched.schedule(2.0)
    # two decodes, then admissions in arrival order: d (arrived 0.4) before c (0.5)
    assert [(s.request_id, len(s.token_ids)) for s in b3.sequences] == \
        [("a", 1), ("b", 1), ("d", 1), ("c", 2)]
    assert (b3.num_prefill_tokens, b3.num_decode_tokens) == (3, 2)


def test_chunked_prefill_with_budget_smaller_than_prompt():
    sched = make(max_num_batched_tokens=16, max_num_seqs=4, block_size=4, num_blocks=32)
    sched.add("long", list(range(40)), SamplingParams(max_tokens=3))
    seen = []
    batches = run(sched, on_batch=lambda b: seen.append(
        [(len(s.token_ids), s.num_computed_tokens, s.is_last_prefill_chunk) for s in b.sequences]))
    assert seen[:3] == [[(16, 0, False)], [(16, 16, False)], [(8, 32, True)]]
    assert seen[3:] == [[(1, 40, True)], [(1, 41, True)]]
    assert len(sched.get_request("long").outputs()[0][0]) == 3
    # same tokens as an unchunked run
    ref = make(max_num_batched_tokens=64, block_size=4, num_blocks=32)
    ref.add("long", list(range(40)), SamplingParams(max_tokens=3))
    run(ref)
    assert ref.get_request("long").outputs() == sched.get_request("long").outputs()
    assert len(batches) == 5


def test_prefix_cache_hit_skips_cached_tokens():
    prefix = list(range(20, 36))  # 16 tokens = 4 blocks of 4
    sched = make(block_size=4, num_blocks=32, max_num_batched_tokens=64)
    model = FakeModel(sched)
    sched.add("first", prefix + [1, 2, 3], SamplingParams(max_tokens=2))
    b = sched.schedule(0.0)
    assert b.num_prefill_tokens == 19
    sched.update(b, model.execute(b))
    sched.add("second", prefix + [4, 5], SamplingParams(max_tokens=2))
    b = sched.schedule(1.0)
    second = [s for s in b.sequences if s.request_id == "second"][0]
    assert second.num_computed_tokens == 16 and second.token_ids == (4, 5)
    first = [s for s in b.sequences if s.request_id == "first"][0]
    assert second.full and not first.full
    assert sched.kv.block_table(second.seq_id)[:4] == sched.kv.block_table(first.seq_id)[:4]
    sched.update(b, model.execute(b))
    while sched.has_unfinished():
        b = sched.schedule(2.0)
        sched.update(b, model.execute(b))
    assert sched.kv.stats()["hits"] == 16
    # identical to a run without prefix caching
    ref = make(block_size=4, num_blocks=32, max_num_batched_tokens=64, prefix=False)
    ref.add("first", prefix + [1, 2, 3], SamplingParams(max_tokens=2))
    ref.add("second", prefix + [4, 5], SamplingParams(max_tokens=2))
    run(ref)
    assert outputs(ref, ["first", "second"]) == outputs(sched, ["first", "second"])
    assert sched.kv.num_free_blocks == sched.kv.num_blocks


def test_preemption_under_tiny_cache_matches_unconstrained_run():
    rng = np.random.default_rng(1)
    reqs = workload(rng, 12, prompt_range=(4, 20), out_range=(8, 20), shared_prefix=5)
    _, _, want = run_workload(reqs, num_blocks=400, max_num_batched_tokens=256, max_num_seqs=16)
    sched = make(num_blocks=12, block_size=4, max_num_batched_tokens=16, max_num_seqs=8)
    for rid, prompt, params in reqs:
        sched.add(rid, prompt, params)
    model = FakeModel(sched)
    preempt_steps = 0
    while sched.has_unfinished():
        running_before = list(sched._running)
        before = sched.num_preemptions
        b = sched.schedule(0.0)
        if sched.num_preemptions > before:
            preempt_steps += 1
            k = sched.num_preemptions - before
            # the newest running sequences went to the front of waiting, oldest of them first
            victims = running_before[-k:]
            assert list(sched._waiting)[:k] == [v for v in victims if v not in sched._running]
            assert all(v.num_computed_tokens == 0 for v in victims)
        check_batch(sched, b)
        sched.update(b, model.execute(b))
    assert preempt_steps > 0
    assert outputs(sched, [r[0] for r in reqs]) == want
    assert sched.kv.num_free_blocks == sched.kv.num_blocks
    check_finished(sched, [r[0] for r in reqs])


@pytest.mark.parametrize("n", [1, 3])
def test_guaranteed_no_evict_never_preempts_and_reserves_whole_requests(n):
    """TensorRT-LLM's capacity policy: a request is admitted only when its prompt + max_tokens
    (times its samples) fit beside the reservations of those admitted before it, so the cache
    that makes max_utilization preempt makes it wait instead, with the same tokens."""
    rng = np.random.default_rng(1)
    reqs = workload(rng, 12, prompt_range=(4, 20), out_range=(8, 20), shared_prefix=5, n=n)
    # the most any request reserves: 10 blocks for n=1, 30 for n=3
    kw = dict(num_blocks=12 if n == 1 else 30, block_size=4, max_num_batched_tokens=16,
              max_num_seqs=8)
    _, _, want = run_workload(reqs, **kw)
    utilize, _, _ = run_workload(reqs, **kw)
    assert utilize.num_preemptions > 0  # the cache is short for max_utilization

    sched = make(**kw, capacity_policy="guaranteed_no_evict")
    for rid, prompt, params in reqs:
        sched.add(rid, prompt, params)
    need = {rid: n * -(-(len(prompt) + params.max_tokens) // 4) for rid, prompt, params in reqs}

    def check(batch):
        # the reservations of the requests still running never exceed the cache
        running = {s.request.request_id for s in sched._running}
        assert sum(need[rid] for rid in running) <= sched.kv.num_blocks
        assert sched._reserved == sum(sched._reservations.values())

    run(sched, on_batch=check)
    assert sched.num_preemptions == 0
    assert sched._reserved == 0 and not sched._reservations
    assert outputs(sched, [r[0] for r in reqs]) == want
    check_finished(sched, [r[0] for r in reqs])


def test_capacity_policy_is_checked():
    with pytest.raises(ValueError, match="capacity_policy: expected one of max_utilization, "
                                         "guaranteed_no_evict, got 'fifo'"):
        make(capacity_policy="fifo")
    # a request whose samples' whole reservation exceeds the cache could never be admitted
    sched = make(num_blocks=11, block_size=4, capacity_policy="guaranteed_no_evict")
    with pytest.raises(ValueError, match=r"request 'x' can never run: its 3 samples reserve "
                                         r"3 x 4 blocks \(guaranteed_no_evict\)"):
        sched.add("x", list(range(8)), SamplingParams(max_tokens=8, n=3))
    assert not sched.has_unfinished()
    make(num_blocks=11, block_size=4).add("x", list(range(8)), SamplingParams(max_tokens=8, n=3))


def test_preempted_sequence_keeps_generated_tokens_as_prompt():
    sched = make(num_blocks=6, block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
                 prefix=False)
    sched.add("old", list(range(8)), SamplingParams(max_tokens=12))
    sched.add("new", list(range(10, 18)), SamplingParams(max_tokens=12))
    model = FakeModel(sched)
    recomputed = None
    while sched.has_unfinished():
        b = sched.schedule(0.0)
        for s in b.sequences:
            if s.request_id == "new" and s.num_computed_tokens == 0 and len(s.token_ids) > 8:
                recomputed = s.token_ids
        sched.update(b, model.execute(b))
    new = sched.get_request("new")
    assert new.sequences[0].num_preemptions >= 1
    assert recomputed is not None and recomputed[:8] == tuple(range(10, 18))
    assert recomputed[8:] == new.outputs()[0][0][:len(recomputed) - 8]
    check_finished(sched, ["old", "new"])


# --------------------------------------------------------------------------- stopping
def test_stop_conditions_and_finish_reasons():
    prompt = [3, 1, 4, 1, 5]
    ref = make()
    ref.add("r", prompt, SamplingParams(max_tokens=8, seed=3))
    run(ref)
    toks = ref.get_request("r").outputs()[0][0]
    assert len(toks) == 8 and ref.get_request("r").outputs()[0][1] == "length"
    target = toks[3]
    cut = toks.index(target)

    s = make(eos=(target,))
    s.add("eos", prompt, SamplingParams(max_tokens=8, seed=3))
    s.add("ignore", prompt, SamplingParams(max_tokens=8, seed=3, ignore_eos=True))
    run(s)
    assert s.get_request("eos").outputs()[0] == (toks[:cut + 1], "stop")
    assert s.get_request("ignore").outputs()[0] == (toks, "length")

    s = make()
    s.add("stop", prompt, SamplingParams(max_tokens=8, seed=3, stop_token_ids=(target,)))
    s.add("len", prompt, SamplingParams(max_tokens=2, seed=3))
    run(s)
    assert s.get_request("stop").outputs()[0] == (toks[:cut + 1], "stop")
    assert s.get_request("len").outputs()[0] == (toks[:2], "length")


def test_abort_frees_blocks_and_names_reason():
    s = make()
    model = FakeModel(s)
    s.add("a", list(range(9)), SamplingParams(max_tokens=20, n=3, seed=0))
    s.add("b", list(range(5)), SamplingParams(max_tokens=4))
    s.add("later", [1, 2], SamplingParams(max_tokens=4), arrival_time=100.0)
    b = s.schedule(0.0)
    s.update(b, model.execute(b))
    s.abort("a")
    s.abort("later")
    assert [r for _, r in s.get_request("a").outputs()] == ["abort"] * 3
    assert s.get_request("later").outputs() == (((), "abort"),)
    assert s.kv.num_free_blocks == s.kv.num_blocks - 2  # only b's blocks (5 tokens + 1 slot)
    b = s.schedule(1.0)
    assert set(b.finished_seq_ids) >= {q.seq_id for q in s.get_request("a").sequences[:1]}
    assert all(q.request_id == "b" for q in b.sequences)
    s.update(b, model.execute(b))
    run(s, model=model)
    assert s.get_request("b").outputs()[0][1] == "length"
    with pytest.raises(KeyError, match="nope"):
        s.abort("nope")


# --------------------------------------------------------------------------- parallel sampling
@pytest.mark.parametrize("plen", [1, 5, 9, 12])
def test_parallel_sampling_forks_and_all_samples_finish(plen):
    s = make(block_size=4, num_blocks=64)
    s.add("p", list(range(plen)), SamplingParams(max_tokens=6, n=4, seed=11))
    batches = run(s)
    req = s.get_request("p")
    outs = req.outputs()
    assert len(outs) == 4 and all(len(t) == 6 and r == "length" for t, r in outs)
    assert len({t for t, _ in outs}) > 1, "samples with different seeds should differ"
    assert [q.params.seed for q in req.sequences] == [sample_seed(11, i) for i in range(4)]
    assert len({q.params.seed for q in req.sequences}) == 4
    # the prompt up to its last token is computed once
    assert sum(b.num_prefill_tokens for b in batches) == (plen - 1) + 4
    if (plen - 1) % 4:
        assert any(b.block_copies for b in batches), "shared partial block needs copy-on-write"
    # a sample's tokens equal a single-sample request with that sample's seed
    for i, (toks, _) in enumerate(outs):
        one = make(block_size=4, num_blocks=64)
        one.add("x", list(range(plen)), SamplingParams(max_tokens=6, seed=sample_seed(11, i)))
        run(one)
        assert one.get_request("x").outputs()[0][0] == toks


def test_parallel_sampling_fully_cached_prompt_and_tiny_cache():
    prompt = list(range(9))  # 8 = two full blocks before the last token
    s = make(block_size=4, num_blocks=64)
    model = FakeModel(s)
    s.add("warm", prompt, SamplingParams(max_tokens=1))
    run(s, model=model)
    s.add("p", prompt, SamplingParams(max_tokens=5, n=3, seed=2))
    first = []
    run(s, on_batch=lambda b: first.append(b) if not first else None, model=model)
    assert [len(q.token_ids) for q in first[0].sequences] == [1, 1, 1]
    ref = make(block_size=4, num_blocks=64, prefix=False)
    ref.add("p", prompt, SamplingParams(max_tokens=5, n=3, seed=2))
    run(ref)
    assert ref.get_request("p").outputs() == s.get_request("p").outputs()
    # and under preemption
    rng = np.random.default_rng(5)
    reqs = workload(rng, 6, prompt_range=(2, 10), out_range=(4, 12), n=3)
    _, _, want = run_workload(reqs, num_blocks=300, max_num_batched_tokens=128, max_num_seqs=32)
    sched, _, got = run_workload(reqs, num_blocks=8, block_size=4, max_num_batched_tokens=8,
                                 max_num_seqs=6)
    assert sched.num_preemptions > 0
    assert got == want


# --------------------------------------------------------------------------- refusals
def test_impossible_requests_rejected_at_add():
    s = make(num_blocks=4, block_size=4, max_model_len=20, max_num_seqs=2, max_num_batched_tokens=8)
    s.add("ok", [1, 2, 3], SamplingParams(max_tokens=5))
    with pytest.raises(ValueError, match=r"'too-many-blocks'.*5 blocks.*has 4"):
        s.add("too-many-blocks", list(range(10)), SamplingParams(max_tokens=7))
    with pytest.raises(ValueError, match=r"'too-long'.*max_model_len=20"):
        s.add("too-long", list(range(3)), SamplingParams(max_tokens=18))
    with pytest.raises(ValueError, match=r"'too-wide'.*max_num_seqs=2"):
        s.add("too-wide", [1], SamplingParams(max_tokens=2, n=3))
    with pytest.raises(ValueError, match="'empty'.*non-empty"):
        s.add("empty", [], SamplingParams())
    with pytest.raises(ValueError, match="'neg'.*prompt_token_ids"):
        s.add("neg", [1, -2], SamplingParams())
    with pytest.raises(ValueError, match="'float'.*prompt_token_ids"):
        s.add("float", [1.5, 2], SamplingParams())
    with pytest.raises(ValueError, match="'2d'.*prompt_token_ids"):
        s.add("2d", [[1, 2]], SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        s.add("ok", [1], SamplingParams())
    with pytest.raises(TypeError, match="params"):
        s.add("x", [1], {"max_tokens": 1})
    with pytest.raises(KeyError):
        s.get_request("too-long")
    model = FakeModel(s)
    s.add("numpy", np.array([4, 5], dtype=np.int32), SamplingParams(max_tokens=2))
    assert s.get_request("numpy").prompt_token_ids == (4, 5)
    run(s, model=model)
    check_finished(s, ["ok", "numpy"])
    # exactly at the limit is accepted: 16 tokens in 4 blocks of 4
    s.add("edge", list(range(10)), SamplingParams(max_tokens=6, ignore_eos=True))
    run(s, model=model)
    assert len(s.get_request("edge").outputs()[0][0]) == 6


def test_constructor_arguments_checked():
    kv = KVCacheManager(8, 4)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(kv, EngineConfig(max_model_len=10, max_num_seqs=8, max_num_batched_tokens=4))
    with pytest.raises(ValueError, match="max_model_len"):
        Scheduler(kv, EngineConfig(max_model_len=0))
    with pytest.raises(ValueError, match="max_model_len"):
        Scheduler(kv, EngineConfig())  # the engine resolves it; the scheduler needs it
    with pytest.raises(TypeError, match="kv_cache"):
        Scheduler(object(), EngineConfig(max_model_len=10))
    with pytest.raises(TypeError, match="config"):
        Scheduler(kv, {"max_model_len": 10})
    with pytest.raises(ValueError, match="eos_token_ids"):
        Scheduler(kv, EngineConfig(max_model_len=10), eos_token_ids=(-1,))


# --------------------------------------------------------------------------- arrivals
def test_arrivals_respected():
    s = make()
    model = FakeModel(s)
    s.add("late", [1, 2, 3], SamplingParams(max_tokens=2), arrival_time=5.0)
    assert s.has_unfinished() and s.next_arrival_time() == 5.0
    b = s.schedule(4.999)
    assert b.is_empty and b == ScheduledBatch()
    b = s.schedule(5.0)
    assert [q.request_id for q in b.sequences] == ["late"]
    s.update(b, model.execute(b), now=5.5)
    req = s.get_request("late")
    assert (req.arrival_time, req.first_scheduled_time, req.first_token_time) == (5.0, 5.0, 5.5)


def test_update_checks_its_input():
    s = make()
    s.add("a", [1, 2], SamplingParams(max_tokens=2))
    b = s.schedule(0.0)
    with pytest.raises(RuntimeError, match="update"):
        s.schedule(0.0)
    with pytest.raises(ValueError, match="sampled_token_ids"):
        s.update(b, StepOutput(()))
    with pytest.raises(ValueError, match="sampled_token_ids"):
        s.update(b, StepOutput((None,)))
    with pytest.raises(ValueError, match="batch"):
        s.update(dataclasses.replace(b), StepOutput((1,)))
    s.update(b, StepOutput((1,), logprobs=((-0.5, ((1, -0.5),)),)))
    assert s.get_request("a").sequences[0].output_logprobs == [(-0.5, ((1, -0.5),))]


# --------------------------------------------------------------------------- kv cache sizing
def test_kv_cache_sizing():
    per = kv_bytes_per_block(num_layers=16, block_size=16, num_kv_heads=4, head_dim=64,
                             dtype_size=2)
    assert per == 2 * 16 * 16 * 4 * 64 * 2
    assert resolve_num_blocks(kv_cache_bytes=per * 10 + 5, bytes_per_block=per) == 10
    assert resolve_num_blocks(num_kv_blocks=7, bytes_per_block=per) == 7
    with pytest.raises(ValueError, match="exactly one"):
        resolve_num_blocks(num_kv_blocks=7, kv_cache_bytes=per, bytes_per_block=per)
    with pytest.raises(ValueError, match="exactly one"):
        resolve_num_blocks(bytes_per_block=per)
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        resolve_num_blocks(kv_cache_bytes=per - 1, bytes_per_block=per)
    with pytest.raises(ValueError, match="head_dim"):
        kv_bytes_per_block(num_layers=1, block_size=1, num_kv_heads=1, head_dim=0, dtype_size=2)
    kv = KVCacheManager.from_budget(groups=KVCacheGroups.full(2), num_kv_heads=2, head_dim=8,
                                    dtype_size=4, block_size=4,
                                    kv_cache_bytes=2 * 2 * 4 * 2 * 8 * 4 * 3)
    assert (kv.num_blocks, kv.block_size, kv.num_free_blocks) == (3, 4, 3)


# --------------------------------------------------------------------------- random workloads
def test_random_workloads_property():
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(seed=st.integers(0, 10**6), num_blocks=st.integers(6, 40),
           block_size=st.sampled_from([1, 2, 4, 8]), max_seqs=st.integers(1, 6),
           extra_budget=st.integers(0, 20), prefix=st.booleans(), n=st.integers(1, 3))
    def check(seed, num_blocks, block_size, max_seqs, extra_budget, prefix, n):
        rng = np.random.default_rng(seed)
        cap = num_blocks * block_size
        reqs = []
        for i in range(int(rng.integers(1, 16))):
            plen = int(rng.integers(1, max(2, min(cap // 2, 24))))
            mt = int(rng.integers(1, max(2, min(cap - plen, 12) + 1)))
            prompt = [int(x) for x in rng.integers(0, 4, plen)]  # small alphabet: prefix hits
            reqs.append((f"q{i}", prompt, SamplingParams(
                max_tokens=mt, seed=i, n=min(n, max_seqs), stop_token_ids=(7,))))
        arrivals = sorted(float(x) for x in rng.integers(0, 5, len(reqs)) * 0.002)
        _, _, want = run_workload(reqs, arrivals, num_blocks=2000, block_size=block_size,
                                  max_num_seqs=64, max_num_batched_tokens=4096)
        sched, _, got = run_workload(reqs, arrivals, num_blocks=num_blocks,
                                     block_size=block_size, max_num_seqs=max_seqs,
                                     max_num_batched_tokens=max_seqs + extra_budget,
                                     prefix=prefix)
        assert got == want

    check()


def test_finished_seq_ids_reported_once_in_the_next_batch():
    s = make()
    model = FakeModel(s)
    s.add("short", [1, 2], SamplingParams(max_tokens=1))
    s.add("long", [3, 4], SamplingParams(max_tokens=5))
    b = s.schedule(0.0)
    short_id = s.get_request("short").sequences[0].seq_id
    done = s.update(b, model.execute(b))
    assert {r.request_id for r in done} == {"short", "long"}
    assert s.get_request("short").finished and not s.get_request("long").finished
    b = s.schedule(1.0)
    assert b.finished_seq_ids == (short_id,)
    s.update(b, model.execute(b))
    b = s.schedule(2.0)
    assert b.finished_seq_ids == ()
    s.update(b, model.execute(b))
    run(s, model=model)
    # the last finished ids come in an empty batch
    last = s.schedule(3.0)
    assert last.is_empty and last.finished_seq_ids == (s.get_request("long").sequences[0].seq_id,)


def test_sample_seeds():
    assert sample_seed(None, 3) is None
    assert sample_seed(42, 0) == 42
    seeds = [sample_seed(42, i) for i in range(1, 50)]
    assert len(set(seeds)) == 49 and all(0 <= x < 2**63 for x in seeds)
    assert seeds == [sample_seed(42, i) for i in range(1, 50)]


# --------------------------------------------------------------------------- plain decode steps
def test_plain_decode_steps_keep_tables_and_kv_as_batched_steps_would():
    s = make(num_blocks=64, block_size=4)
    model = FakeModel(s)
    for i, (plen, out) in enumerate([(5, 30), (9, 12), (3, 20)]):
        s.add(f"r{i}", list(range(1, plen + 1)), SamplingParams(max_tokens=out, ignore_eos=True,
                                                                stop_token_ids=(VOCAB,)))
    now = 0.0
    while s.plain_decode_steps(7) == 0:  # prompts, then a step that reports no finish
        b = s.schedule(now)
        s.update(b, model.execute(b), now=now + 0.001)
        now += 0.001
    left = [q.params.max_tokens - q.num_output_tokens for q in s._running]
    assert s.plain_decode_steps(7) == min(left) - 1
    assert s.plain_decode_steps(VOCAB) == 0  # their stop token would finish them
    with pytest.raises(RuntimeError, match="end_decode: no plain decode step"):
        s.end_decode(7, now)
    for _ in range(s.plain_decode_steps(7)):
        pairs = s.begin_decode(now)
        assert [c for _, c in pairs] == [q.num_computed_tokens for q in s._running]
        with pytest.raises(RuntimeError, match="update"):
            s.schedule(now)
        for q in s._running:  # the runner's forward writes the token it computes
            bt = s.kv.block_table(q.seq_id)
            pos = q.num_computed_tokens
            model.slots[bt[pos // 4] * 4 + pos % 4] = q.token_ids[pos]
        now += 0.001
        s.end_decode(7, now)
    assert s.plain_decode_steps(7) == 0  # one sample has one token left: update finishes it
    # the batched steps after them get the tables' accumulated deltas and read back every token
    checked = model.checked_contexts
    run(s, model=model)
    assert model.checked_contexts > checked
    for i, out in enumerate([30, 12, 20]):
        assert s.get_request(f"r{i}").sequences[0].num_output_tokens == out
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_plain_decode_steps_wait_for_arrivals_and_queued_requests():
    s = make()
    model = FakeModel(s)
    s.add("a", [1, 2, 3], SamplingParams(max_tokens=10, ignore_eos=True))
    s.add("late", [4, 5], SamplingParams(max_tokens=10, ignore_eos=True), arrival_time=1.0)
    b = s.schedule(0.0)
    s.update(b, model.execute(b), now=0.1)
    assert s.plain_decode_steps(7) == 8
    assert s.begin_decode(1.0) is None  # "late" is due: schedule() must admit it
    assert s._outstanding is None
    b = s.schedule(1.0)
    assert [q.request_id for q in b.sequences] == ["a", "late"]
    s.update(b, model.execute(b), now=1.1)
    assert s.plain_decode_steps(7) == 7  # both decode now; "a" has 8 tokens left
    full = make(max_num_seqs=1)
    model = FakeModel(full)
    for rid in ("a", "b"):
        full.add(rid, [1, 2, 3], SamplingParams(max_tokens=10, ignore_eos=True))
    b = full.schedule(0.0)
    full.update(b, model.execute(b), now=0.1)
    assert full.plain_decode_steps(7) == 0  # "b" waits for a slot: schedule() decides


# --------------------------------------------------------------------------- batch waiting

def _waiting_scheduler(timeout_iters, ratio):
    kv = KVCacheManager(64, 4, True)
    return Scheduler(kv, EngineConfig(max_model_len=1024, max_num_seqs=8,
                                      max_num_batched_tokens=32,
                                      batch_wait_timeout_iters=timeout_iters,
                                      batch_wait_max_tokens_ratio=ratio))


def _first_step_of(sched, late_prompt, arrival=0.0025):
    """Steps a decoding request, adds `late_prompt` arriving at `arrival`; returns the index of
    the step that first schedules it, and the batches."""
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    sched.add("early", [1, 2, 3], params, arrival_time=0.0)
    sched.add("late", late_prompt, params, arrival_time=arrival)
    batches = []
    model = FakeModel(sched)
    now = 0.0
    while sched.has_unfinished():
        batch = sched.schedule(now)
        batches.append(batch)
        sched.update(batch, model.execute(batch))
        now += 0.001
    late = next(i for i, b in enumerate(batches)
                if any(s.request_id == "late" for s in b.sequences))
    return late, batches


def test_batch_waiting_holds_a_prompt_until_the_timeout_while_others_decode():
    # arrives before step 3 (t = 0.003); without waiting step 3 would run it
    assert _first_step_of(_waiting_scheduler(0, 0.0), [4, 5, 6, 7, 8])[0] == 3
    late, batches = _first_step_of(_waiting_scheduler(3, 0.9), [4, 5, 6, 7, 8])
    assert late == 3 + 3  # three steps of the early request's decode alone, then the prompt
    for b in batches[3:6]:
        assert [s.request_id for s in b.sequences] == ["early"]
        assert b.num_prefill_tokens == 0
    assert batches[6].num_prefill_tokens == 5


def test_batch_waiting_runs_a_prompt_at_once_when_the_step_has_enough_tokens_or_no_decodes():
    # 28 prompt tokens + 1 decode >= 0.9 x 32: no wait
    assert _first_step_of(_waiting_scheduler(3, 0.9), list(range(1, 29)))[0] == 3
    # timeout 0 with a ratio: TensorRT-LLM's rule then never waits (0 >= 0 iterations)
    assert _first_step_of(_waiting_scheduler(0, 0.9), [4, 5, 6])[0] == 3
    # nothing decoding: a prompt never waits for company
    sched = _waiting_scheduler(5, 0.9)
    sched.add("only", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    assert sched.schedule(0.0).num_prefill_tokens == 3


# --------------------------------------------------------------------------- prefill first

def _prefill_first_scheduler(max_num_seqs=8, batching="prefill_first"):
    kv = KVCacheManager(64, 4, True)
    return Scheduler(kv, EngineConfig(max_model_len=1024, max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=32, batching=batching))


def _ids(batch):
    return sorted(s.request_id for s in batch.sequences)


def test_prefill_first_runs_prompt_work_alone_and_the_decodes_after_it():
    late, batches = _first_step_of(_prefill_first_scheduler(), [4, 5, 6, 7, 8])
    assert late == 3  # admitted at once ...
    assert _ids(batches[3]) == ["late"] and batches[3].num_decode_tokens == 0  # ... alone
    assert _ids(batches[4]) == ["early", "late"] and batches[4].num_prefill_tokens == 0
    mixed_late, mixed = _first_step_of(_prefill_first_scheduler(batching="mixed"),
                                       [4, 5, 6, 7, 8])
    assert mixed_late == 3 and _ids(mixed[3]) == ["early", "late"]  # the default mixes
    # prefill first: "early" sits out one step, so it ends one step later than mixed
    last = [max(i for i, b in enumerate(bs) if any(s.request_id == "early" for s in b.sequences))
            for bs in (batches, mixed)]
    assert last[0] == last[1] + 1


def test_prefill_first_chunks_take_the_whole_budget_and_every_step_until_done():
    late, batches = _first_step_of(_prefill_first_scheduler(), list(range(1, 71)))  # 70 tokens
    chunks = batches[late:late + 3]
    assert [b.num_prefill_tokens for b in chunks] == [32, 32, 6]  # the whole budget, no decode
    assert all(_ids(b) == ["late"] for b in chunks)
    assert _ids(batches[late + 3]) == ["early", "late"]


def test_prefill_first_decodes_run_while_the_queue_head_cannot_be_admitted():
    sched = _prefill_first_scheduler(max_num_seqs=1)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    sched.add("a", [1, 2, 3], params)
    sched.add("b", [4, 5, 6], params)  # waits for a's slot
    model = FakeModel(sched)
    batches = []
    for _ in range(12):  # bounded: a step that schedules nothing would repeat forever
        if not sched.has_unfinished():
            break
        batch = sched.schedule()
        batches.append(batch)
        if batch.sequences:
            sched.update(batch, model.execute(batch))
    assert [_ids(b) for b in batches] == [["a"]] * 4 + [["b"]] * 4
    assert [b.num_prefill_tokens for b in batches] == [3, 0, 0, 0] * 2


def test_batch_waiting_settings_are_checked():
    kv = KVCacheManager(64, 4, True)
    for kw, match in (({"batch_wait_timeout_iters": -1}, "batch_wait_timeout_iters"),
                      ({"batch_wait_timeout_iters": 2.5}, "batch_wait_timeout_iters"),
                      ({"batch_wait_max_tokens_ratio": 1.5}, "batch_wait_max_tokens_ratio"),
                      ({"batch_wait_max_tokens_ratio": True}, "batch_wait_max_tokens_ratio")):
        with pytest.raises(ValueError, match=match):
            Scheduler(kv, EngineConfig(max_model_len=64, **kw))
