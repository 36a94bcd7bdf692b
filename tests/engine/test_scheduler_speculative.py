"""Speculative decoding in the scheduler, driven with the real C++ allocator: a decode verifies
its drafts, the accepted ones are committed, and a run gives the very tokens plain decoding
gives (`DraftingModel`, on `test_scheduler`'s fake model and helpers)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.test_scheduler import VOCAB, FakeModel, make, run_workload, workload
from gnomon.engine.batch import ScheduledBatch, StepOutput
from gnomon.engine.sampling_params import SamplingParams


def _token(ctx, seed):
    """FakeModel's sample after `ctx`."""
    return hash((tuple(ctx), -1 if seed is None else seed)) % VOCAB


class DraftingModel(FakeModel):
    """FakeModel with a drafter: a decode's k drafts are the target's true continuation, but
    every third one (by sequence, step and position) is wrong. It writes the last token and the
    drafts into their slots, then verifies them by reading the cache back, position by
    position, as one forward over the k + 1 tokens does: it returns the drafts up to the first
    the target disagrees with, then the target's token there. Lossless, so a run must give the
    very tokens FakeModel gives without drafts."""

    steps = 0
    drafted = accepted = 0

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        bs = self.bs
        for src, dst in batch.block_copies:
            self.slots[dst * bs:(dst + 1) * bs] = self.slots[src * bs:(src + 1) * bs]
        self.tables.apply(batch)
        self.steps += 1
        out = []
        for s in batch.sequences:
            bt = np.asarray(self.tables.table(s.seq_id))
            assert tuple(bt) == self.sched.kv.block_table(s.seq_id), "delta mismatch"
            seq = next(q for q in self.sched.get_request(s.request_id).sequences
                       if q.seq_id == s.seq_id)
            seed, c = s.sampling_params.seed, s.num_computed_tokens
            write = list(s.token_ids)
            ctx = seq.token_ids[:s.context_len]
            for j in range(s.num_draft_tokens):
                true = _token(ctx, seed)
                ctx = ctx + [true]
                write.append(true if (s.seq_id + self.steps + j) % 3 else (true + 1) % VOCAB)
            pos = np.arange(c, c + len(write))
            self.slots[bt[pos // bs] * bs + pos % bs] = write

            def read(n):
                p = np.arange(n)
                return self.slots[bt[p // bs] * bs + p % bs].tolist()

            if not s.is_last_prefill_chunk:
                out.append(None)
                continue
            assert read(s.context_len) == seq.token_ids[:s.context_len], "KV content is wrong"
            got = []
            for j in range(s.num_draft_tokens + 1):
                got.append(_token(read(s.context_len + j), seed))
                if j == s.num_draft_tokens or write[len(s.token_ids) + j] != got[-1]:
                    break
            self.drafted += s.num_draft_tokens
            self.accepted += len(got) - 1
            out.append(tuple(got) if s.num_draft_tokens else got[0])
        return StepOutput(tuple(out), seconds=0.001, breakdown={"fake": 0.001})


@pytest.mark.parametrize("spec, kw", [
    (1, {}), (3, {}),
    (2, {"num_blocks": 14}),  # preemptions: a decode's drafts need slots the cache lacks
    (3, {"capacity_policy": "guaranteed_no_evict", "num_blocks": 40}),
])
def test_speculative_decoding_gives_the_tokens_plain_decoding_gives(spec, kw):
    rng = np.random.default_rng(7)
    reqs = workload(rng, 12, prompt_range=(1, 20), out_range=(1, 16), shared_prefix=6)
    _, plain_batches, plain = run_workload(reqs, max_num_batched_tokens=64, **kw)
    models = []
    sched, batches, drafted = run_workload(
        reqs, max_num_batched_tokens=64, spec=spec, **kw,
        model=lambda s: models.append(DraftingModel(s)) or models[0])
    assert drafted == plain
    model = models[0]
    assert 0 < model.accepted < model.drafted  # some drafts accepted, some not
    assert len(batches) < len(plain_batches)  # accepted drafts save steps
    drafts = [s.num_draft_tokens for b in batches for s in b.sequences]
    assert set(drafts) == {0, spec}  # prompt chunks draft nothing, decodes spec each
    for s in (s for b in batches for s in b.sequences if s.num_draft_tokens):
        assert len(s.token_ids) == 1 and s.is_last_prefill_chunk
    if kw.get("num_blocks") == 14:
        assert sched.num_preemptions > 0


def test_a_decode_verifies_its_drafts_and_commits_the_accepted_ones():
    sched = make(num_blocks=16, block_size=4, max_num_batched_tokens=32, spec=3)
    sched.add("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=6, ignore_eos=True))
    prefill = sched.schedule()
    sched.update(prefill, StepOutput((10,)))
    decode = sched.schedule()
    (s,) = decode.sequences
    # its last token, 3 drafts after it: 4 tokens of the step and slots through position 8
    assert (s.token_ids, s.num_computed_tokens, s.num_draft_tokens) == ((10,), 5, 3)
    assert decode.num_decode_tokens == 4 and decode.num_prefill_tokens == 0
    assert len(sched.kv.block_table(s.seq_id)) == 3  # ceil(9 / 4)
    # 2 drafts accepted, then the target's token: 3 tokens; 5 + 1 + 2 have KV
    deltas = sched.update(decode, StepOutput(((11, 12, 13),)))
    assert deltas[0].new_token_ids == (11, 12, 13)
    seq = sched.get_request("a").sequences[0]
    assert seq.token_ids[5:] == [10, 11, 12, 13] and seq.num_computed_tokens == 8
    assert sched.kv.num_computed_tokens(seq.seq_id) == 8
    nxt = sched.schedule()
    assert (nxt.sequences[0].token_ids, nxt.sequences[0].num_computed_tokens) == ((13,), 8)
    # the rest cross max_tokens (6): the tokens past it are dropped, the request ends
    deltas = sched.update(nxt, StepOutput(((14, 15, 16, 17),)))
    assert deltas[0].new_token_ids == (14, 15) and deltas[0].finish_reason == "length"
    assert sched.get_request("a").outputs()[0] == ((10, 11, 12, 13, 14, 15), "length")
    assert not sched.has_unfinished() and sched.kv.num_free_blocks == 16


def test_a_stop_token_among_accepted_drafts_drops_the_rest():
    sched = make(spec=2, eos=(7,))
    sched.add("a", [1, 2, 3], SamplingParams(max_tokens=20))
    sched.update(sched.schedule(), StepOutput((4,)))
    deltas = sched.update(sched.schedule(), StepOutput(((7, 8, 9),)))
    assert deltas[0].new_token_ids == (7,) and deltas[0].finish_reason == "stop"


def test_speculative_decoding_checks_what_it_is_given():
    sched = make(spec=2)
    with pytest.raises(ValueError, match="n=2 with speculative decoding"):
        sched.add("a", [1, 2], SamplingParams(max_tokens=3, n=2))
    sched.add("b", [1, 2], SamplingParams(max_tokens=8, ignore_eos=True))
    sched.update(sched.schedule(), StepOutput((3,)))
    assert sched.plain_decode_steps(3) == 0  # its steps verify drafts: always batched
    batch = sched.schedule()
    for bad in (((1, 2, 3, 4),), ((),)):  # 1 to 1 + 2 tokens
        with pytest.raises(ValueError, match=r"output.sampled_token_ids: sequence 0 verified "
                                             r"2 draft tokens, so it takes 1 to 3 tokens"):
            sched.update(batch, StepOutput(bad))
    assert sched.update(batch, StepOutput((5,)))[0].new_token_ids == (5,)  # a bare token: 1
    # a request's drafts need slots past its last token: 8 blocks of 4 hold 30 + 2 tokens
    tight = make(num_blocks=8, block_size=4, spec=2, prefix=False)
    tight.add("fits", [1] * 20, SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="can never run"):
        tight.add("over", [1] * 21, SamplingParams(max_tokens=10))


def test_speculative_decoding_random_workloads_property():
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=100, deadline=None, derandomize=True)
    @given(seed=st.integers(0, 10**6), num_blocks=st.integers(8, 40),
           block_size=st.sampled_from([1, 2, 4, 8]), max_seqs=st.integers(1, 6),
           extra_budget=st.integers(0, 20), prefix=st.booleans(), spec=st.integers(1, 3),
           policy=st.sampled_from(["max_utilization", "guaranteed_no_evict"]))
    def check(seed, num_blocks, block_size, max_seqs, extra_budget, prefix, spec, policy):
        rng = np.random.default_rng(seed)
        cap = num_blocks * block_size - spec  # a request's drafts take slots past its end
        reqs = []
        for i in range(int(rng.integers(1, 16))):
            plen = int(rng.integers(1, max(2, min(cap // 2, 24))))
            mt = int(rng.integers(1, max(2, min(cap - plen, 12) + 1)))
            prompt = [int(x) for x in rng.integers(0, 4, plen)]  # small alphabet: prefix hits
            reqs.append((f"q{i}", prompt, SamplingParams(max_tokens=mt, seed=i,
                                                          stop_token_ids=(7,))))
        arrivals = sorted(float(x) for x in rng.integers(0, 5, len(reqs)) * 0.002)
        _, _, want = run_workload(reqs, arrivals, num_blocks=2000, block_size=block_size,
                                  max_num_seqs=64, max_num_batched_tokens=4096)
        _, _, got = run_workload(reqs, arrivals, num_blocks=num_blocks, block_size=block_size,
                                 max_num_seqs=max_seqs,
                                 max_num_batched_tokens=max_seqs * (1 + spec) + extra_budget,
                                 prefix=prefix, spec=spec, capacity_policy=policy,
                                 model=DraftingModel)
        assert got == want

    check()
