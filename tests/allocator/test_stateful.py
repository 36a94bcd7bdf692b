"""The C++ allocator against the pure-Python model, under random interleavings of every call.

Both are driven with the same calls; after each step every observable must agree, and the
structural invariants must hold on the C++ allocator. Small pools, small token alphabets and
narrow hashes make hits, evictions, copy-on-write and hash collisions common. KV-cache groups
(full and sliding windows, the anchor first or not) make window releases and sliding hits over
evicted older blocks common too.

Hypothesis explores and shrinks; `test_long_random_workloads` drives the same rules for many
more steps with a seeded generator, to reach deep states (full pools, long LRU chains).
"""

import copy
import inspect
import random
from collections import Counter

import numpy as np
from hypothesis import HealthCheck, event, settings, strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import gnomon
from allocator.model import M64, PyBlockAllocator

PREFIXES = ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 0, 0, 0, 0], [7] * 12)

picks = st.integers(0, 1 << 16)  # picks a live sequence: live[pick % len(live)]
tokens = st.lists(st.integers(0, 3), max_size=3)
prompts = st.builds(lambda prefix, cut, suffix: PREFIXES[prefix][:cut] + suffix,
                    st.integers(0, len(PREFIXES) - 1), st.integers(0, 12),
                    st.lists(st.integers(0, 3), max_size=9))
extra_keys = st.sampled_from([0, 0, 0, 5, -1])
int_dtypes = st.sampled_from([np.int32, np.int64])
batches = st.lists(st.tuples(picks, tokens, st.integers(0, 4)), min_size=1, max_size=6)
has_sequences = precondition(lambda self: self.model._seqs)
GROUPS = [(None,), (None,), (None, 2), (5, None), (3,), (None, 1, 6)]


class AllocatorMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 20), block_size=st.sampled_from([1, 2, 4]),
                caching=st.booleans(), hash_bits=st.sampled_from([1, 2, 3, 64]),
                groups=st.sampled_from(GROUPS))
    def create(self, num_blocks, block_size, caching, hash_bits, groups=(None,)):
        self.real = gnomon.BlockAllocator(num_blocks, block_size, caching, hash_bits=hash_bits,
                                          groups=groups)
        self.model = PyBlockAllocator(num_blocks, block_size, caching, hash_bits=hash_bits,
                                      groups=groups)
        self.next_id = 0
        self.copies_seen = 0
        self.reader = {}  # seq_id -> block tables rebuilt from take_block_updates' reports
        self.kv_of = {}  # block -> the prefix whose KV its last commit computed
        self.retries = Counter()  # retried admissions that fit, and that failed again

    def both(self, method, *args):
        """Calls `method` on both allocators; they must return the same or raise the same."""
        # a commit may cache a block and release it behind a window in one call: record the KV
        # from the tables as they were before it
        before = {seq_id: self.tables(seq_id) for seq_id in self.model._seqs} \
            if method in ("commit", "commit_batch") else {}
        outcomes = []
        for allocator in (self.real, self.model):
            try:
                outcomes.append(("ok", getattr(allocator, method)(*args)))
            except (ValueError, KeyError, TypeError) as error:
                outcomes.append(("raised", type(error)))
        assert outcomes[0] == outcomes[1], (method, args, outcomes)
        for seq_id, tables in before.items():
            s = self.model._seqs[seq_id]
            self.record(tables, s, s.num_computed)
        return outcomes[0]

    def live(self, pick):
        seq_ids = sorted(self.model._seqs)
        return seq_ids[pick % len(seq_ids)]

    def fresh_id(self):
        self.next_id += 1
        return self.next_id

    # -- calls ---------------------------------------------------------------------------------

    @rule(prompt=prompts, extra_key=extra_keys)
    def lookup(self, prompt, extra_key):
        self.both("lookup", prompt, extra_key)

    @rule(prompt=prompts, extra_key=extra_keys, chunk=st.integers(0, 12))
    def admit(self, prompt, extra_key, chunk):
        cached = self.model.lookup(prompt, extra_key)
        seq_id = self.fresh_id()
        if self.both("allocate", seq_id, prompt, min(len(prompt) - cached, chunk), extra_key)[1]:
            self.check_hit_kv(seq_id, prompt, extra_key)

    @rule(prompt=prompts, extra_key=extra_keys, chunk=st.integers(-1, 12),
          short=st.integers(-1, 2), existing=st.booleans())
    def admit_in_one_call(self, prompt, extra_key, chunk, short, existing):
        """`admit`: lookup and allocate in one call, its new tokens bounded by a target (a
        prefill's end) and a budget; now and then an id already present or a bad bound."""
        seq_id = self.live(0) if existing and self.model._seqs else self.fresh_id()
        cached = self.both("admit", seq_id, prompt, len(prompt) - short, chunk, extra_key)
        if cached[0] == "ok" and cached[1] >= 0:
            self.check_hit_kv(seq_id, prompt, extra_key)

    @rule(short=st.integers(-1, 2), chunk=st.integers(-1, 12), stranger=st.booleans(),
          key_override=st.sampled_from([None, None, 5]))
    def retry_failed_admission(self, short, chunk, stranger, key_override):
        """`admit` with no token ids: the last admission that did not fit, retried (its bound
        answering at once while nothing it could hit entered a cache); now and then of another
        sequence, with another extra key, or none to retry."""
        failed = self.model._failed
        seq_id = self.fresh_id() if stranger or failed is None else failed[0]
        prompt = failed[1] if failed else []
        key = failed[2] if failed and key_override is None else (key_override or 0)
        cached = self.both("admit", seq_id, None, len(prompt) - short, chunk, key)
        if cached[0] == "ok":
            self.retries["fit" if cached[1] >= 0 else "failed"] += 1
        if cached[0] == "ok" and cached[1] >= 0:
            self.check_hit_kv(seq_id, prompt, key)

    def check_hit_kv(self, seq_id, prompt, extra_key):
        """Every block a hit claimed, in every group, holds the KV of this very prompt's prefix."""
        bs = self.real.block_size
        for g in range(len(self.model.groups)):
            table = self.real.block_table(seq_id, g).tolist()
            for i in range(self.real.num_computed_tokens(seq_id) // bs):
                if table[i] != -1:
                    assert self.kv_of[table[i]] == (extra_key & M64, tuple(prompt[:(i + 1) * bs])), \
                        (g, i, table[i])

    @has_sequences
    @rule(pick=picks, new=tokens, num_new=st.integers(0, 6))
    def extend(self, pick, new, num_new):
        self.both("allocate", self.live(pick), new, num_new)

    @has_sequences
    @rule(pick=picks, token=st.integers(0, 3))
    def decode(self, pick, token):
        self.both("allocate", self.live(pick), [token], 1)

    @has_sequences
    @rule(pick=picks)
    def forward(self, pick):
        """What the engine does after a forward: everything allocated is now computed."""
        s = self.model._seqs[self.live(pick)]
        self.both("commit", self.live(pick), min(s.num_slots, len(s.tokens)))

    @has_sequences
    @rule(pick=picks, step=st.integers(0, 6), overshoot=st.integers(-1, 1))
    def commit(self, pick, step, overshoot):
        s = self.model._seqs[self.live(pick)]
        target = min(s.num_computed + step, s.num_slots, len(s.tokens)) + overshoot
        self.both("commit", self.live(pick), target)

    @has_sequences
    @rule(batch=batches, dtype=int_dtypes)
    def allocate_batch(self, batch, dtype):
        chosen = {self.live(pick): (new, num_new) for pick, new, num_new in batch}
        ids = list(chosen)
        self.both("allocate_batch", np.array(ids, dtype),
                  np.array([t for new, _ in chosen.values() for t in new], dtype),
                  np.array([len(new) for new, _ in chosen.values()], dtype),
                  np.array([num_new for _, num_new in chosen.values()], dtype))

    @has_sequences
    @rule(batch=batches, dtype=int_dtypes, spoil=st.sampled_from([0, 0, -1, 1]))
    def commit_batch(self, batch, dtype, spoil):
        targets = {}
        for pick, _, step in batch:
            s = self.model._seqs[self.live(pick)]
            targets[self.live(pick)] = min(s.num_computed + step, s.num_slots, len(s.tokens))
        values = list(targets.values())
        values[-1] += spoil  # now and then one entry is out of range: nothing may apply
        self.both("commit_batch", np.array(list(targets), dtype), np.array(values, dtype))

    @has_sequences
    @rule(pick=picks)
    def free(self, pick):
        self.both("free", self.live(pick))

    @has_sequences
    @rule(pick=picks)
    def fork(self, pick):
        self.both("fork", self.live(pick), self.fresh_id())

    @has_sequences
    @rule(pick=picks, other=picks)
    def fork_into_existing(self, pick, other):
        self.both("fork", self.live(pick), self.live(other))

    def apply_reports(self, seq_ids, reports):
        """Rebuild tables as a runner does; each must then equal the allocator's."""
        for seq_id, (full, appended, replaced) in zip(seq_ids, reports):
            assert len(appended) == len(replaced) == len(self.real.groups)
            if full:
                self.reader[seq_id] = [list(ids) for ids in appended]
            else:
                assert seq_id in self.reader, "a delta for a sequence never reported in full"
                for table, ids, pairs in zip(self.reader[seq_id], appended, replaced):
                    table.extend(ids)
                    for index, block in pairs:
                        assert 0 <= index < len(table) - len(ids)
                        table[index] = block
            assert self.reader[seq_id] == [self.real.block_table(seq_id, g).tolist()
                                           for g in range(len(self.real.groups))]

    @has_sequences
    @rule(batch=batches, dtype=int_dtypes)
    def report(self, batch, dtype):
        ids = list(dict.fromkeys(self.live(pick) for pick, _, _ in batch))
        self.apply_reports(ids, self.real.take_block_updates(np.array(ids, dtype)))

    @has_sequences
    @rule(batch=batches, frees=st.lists(picks, max_size=2),
          spoil=st.sampled_from([0, 0, 0, -1, 1]))
    def step(self, batch, frees, spoil):
        """One fused step against the model's commit_batch, free and allocate_batch."""
        commits = {}
        for pick, _, extra in batch:
            s = self.model._seqs[self.live(pick)]
            commits[self.live(pick)] = min(s.num_computed + extra, s.num_slots, len(s.tokens))
        computed = list(commits.values())
        computed[-1] += spoil
        freed = list(dict.fromkeys(self.live(p) for p in frees))
        chosen = {self.live(pick): (new, num_new) for pick, new, num_new in batch
                  if self.live(pick) not in freed}
        args = (list(commits), computed, freed, list(chosen),
                [t for new, _ in chosen.values() for t in new],
                [len(new) for new, _ in chosen.values()],
                [num_new for _, num_new in chosen.values()])
        model = copy.deepcopy(self.model)
        before = {seq_id: (self.tables(seq_id), copy.deepcopy(self.model._seqs[seq_id]))
                  for seq_id in commits}  # a sequence may commit and be freed in one step
        arrays = [np.array(a, np.int64) for a in args]
        try:
            model.commit_batch(arrays[0], arrays[1])
            for seq_id in freed:
                model.free(seq_id)
            expected = ("ok", model.allocate_batch(*arrays[3:]))
        except (ValueError, KeyError, TypeError) as error:
            expected, model = ("raised", type(error)), self.model
        try:
            fitted, reports = self.real.step(*args)
            outcome = ("ok", fitted)
        except (ValueError, KeyError, TypeError) as error:
            outcome = ("raised", type(error))
        assert outcome == expected, (args, outcome, expected)
        self.model = model
        if outcome[0] == "ok":
            for seq_id, n in zip(commits, computed):
                self.record(*before[seq_id], n)
            for seq_id in freed:
                self.reader.pop(seq_id, None)
            self.apply_reports(args[3][:fitted], reports)

    @rule(seq_id=st.integers(-3, 0))
    def unknown_sequence(self, seq_id):
        self.both("commit", seq_id, 0)
        self.both("free", seq_id)

    @rule()
    def pending_copies(self):
        copies = self.both("pending_copies")[1]
        self.copies_seen += len(copies)
        if copies and currently_in_test_context():
            event("copy-on-write")

    @rule()
    def reset_prefix_cache(self):
        self.both("reset_prefix_cache")

    # -- what must hold after every step -------------------------------------------------------

    @invariant()
    def observables_agree(self):
        real, model = self.real, self.model
        for seq_id in [s for s in self.reader if s not in model._seqs]:
            del self.reader[seq_id]  # freed: its next report (a re-admission) is in full
        assert real.free_queue().tolist() == model.free_queue()
        assert real.cached_blocks().tolist() == model.cached_blocks()
        assert [real.ref_count(b) for b in range(real.num_blocks)] == model._ref
        assert real.stats() == model.stats()
        assert real.group_stats() == model.group_stats()
        assert len(real) == len(model)
        for seq_id in model._seqs:
            for g in range(len(model.groups)):
                assert real.block_table(seq_id, g).tolist() == model.block_table(seq_id, g)
            assert real.num_computed_tokens(seq_id) == model.num_computed_tokens(seq_id)

    def tables(self, seq_id):
        return [self.real.block_table(seq_id, g).tolist() for g in range(len(self.model.groups))]

    def record(self, tables, s, num_computed):
        """What a runner computes: each committed full block holds its prefix's KV."""
        bs = self.real.block_size
        for table in tables:
            for i in range(num_computed // bs):
                if table[i] != -1:
                    self.kv_of[table[i]] = (s.extra_key, tuple(s.tokens[:(i + 1) * bs]))

    @invariant()
    def record_kv(self):
        for seq_id, s in self.model._seqs.items():
            self.record(self.tables(seq_id), s, s.num_computed)

    @invariant()
    def pool_is_consistent(self):
        real, groups = self.real, self.model.groups
        bs = real.block_size
        tables = {}  # (seq_id, group) -> table
        for seq_id in self.model._seqs:
            computed = real.num_computed_tokens(seq_id)
            held = []
            for g, window in enumerate(groups):
                table = real.block_table(seq_id, g).tolist()
                tables[seq_id, g] = table
                assert len(table) == len(real.block_table(seq_id, 0))
                # exactly the blocks wholly behind the window are released
                behind = 0 if window is None else max(0, computed - window + 1) // bs
                assert all(b == -1 for b in table[:behind]), (window, computed, table)
                held += [b for b in table[behind:]]
            assert -1 not in held and len(set(held)) == len(held)
        holders = [0] * real.num_blocks
        in_use = [0] * len(groups)
        for (_, g), table in tables.items():
            for b in table:
                if b != -1:
                    holders[b] += 1
                    in_use[g] += holders[b] == 1
        assert [s["blocks_in_use"] for s in real.group_stats()] == in_use
        refs = [real.ref_count(b) for b in range(real.num_blocks)]
        assert refs == holders  # each ref count is the number of sequences holding the block
        queue = real.free_queue().tolist()
        assert len(set(queue)) == len(queue) == real.num_free_blocks
        assert sorted(queue) == [b for b in range(real.num_blocks) if refs[b] == 0]  # never both
        assert real.num_free_blocks + sum(r > 0 for r in refs) == real.num_blocks
        for b in real.cached_blocks().tolist():  # only full, committed blocks are cached
            for (seq_id, _), table in tables.items():
                if b in table:
                    position = table.index(b)
                    assert (position + 1) * real.block_size <= real.num_computed_tokens(seq_id)

    @invariant()
    def note_reach(self):
        stats = self.real.stats()
        for name in ("hits", "evictions", "failed_allocations"):
            if stats[name]:
                event(name)
        for name in ("duplicates", "collisions"):
            if getattr(self.model, name):
                event(name)
        if any(s["released"] for s in self.real.group_stats()):
            event("released")


AllocatorMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestAllocatorAgainstModel = AllocatorMachine.TestCase


def _draw(rng, strategy_args):
    """Plain random values for one rule's arguments (the seeded twin of the strategies)."""
    def prompt():
        return rng.choice(PREFIXES)[:rng.randint(0, 12)] + [rng.randint(0, 3) for _ in range(rng.randint(0, 9))]

    def new_tokens():
        return [rng.randint(0, 3) for _ in range(rng.randint(0, 3))]

    values = {
        "prompt": prompt, "extra_key": lambda: rng.choice([0, 0, 0, 5, -1]),
        "chunk": lambda: rng.randint(0, 12), "pick": lambda: rng.getrandbits(16),
        "other": lambda: rng.getrandbits(16), "new": new_tokens,
        "num_new": lambda: rng.randint(0, 6), "token": lambda: rng.randint(0, 3),
        "step": lambda: rng.randint(0, 6), "overshoot": lambda: rng.randint(-1, 1),
        "dtype": lambda: rng.choice([np.int32, np.int64]), "spoil": lambda: rng.choice([0, 0, -1, 1]),
        "seq_id": lambda: rng.randint(-3, 0),
        "batch": lambda: [(rng.getrandbits(16), new_tokens(), rng.randint(0, 4))
                          for _ in range(rng.randint(1, 6))],
        "frees": lambda: [rng.getrandbits(16) for _ in range(rng.randint(0, 2))],
        "short": lambda: rng.randint(-1, 2), "existing": lambda: rng.random() < 0.1,
        "stranger": lambda: rng.random() < 0.1, "key_override": lambda: rng.choice([None] * 5 + [5]),
    }
    return {name: values[name]() for name in strategy_args}


WEIGHTS = {"lookup": 1, "admit": 4, "extend": 1, "decode": 6, "forward": 6, "commit": 1,
           "allocate_batch": 3, "commit_batch": 3, "free": 2, "fork": 1, "fork_into_existing": 1,
           "unknown_sequence": 1, "pending_copies": 1, "reset_prefix_cache": 1, "report": 2,
           "step": 3, "admit_in_one_call": 3, "retry_failed_admission": 3}


def _run_workload(seed, steps=1500):
    rng = random.Random(seed)
    machine = AllocatorMachine()
    machine.create(num_blocks=rng.randint(4, 48), block_size=rng.choice([1, 2, 4, 8]),
                   caching=seed % 6 != 0, hash_bits=rng.choice([2, 4, 64]),
                   groups=GROUPS[seed % len(GROUPS)])
    needs_sequences = {"extend", "decode", "forward", "commit", "allocate_batch",
                       "commit_batch", "free", "fork", "fork_into_existing", "report", "step"}
    names, weights = list(WEIGHTS), list(WEIGHTS.values())
    for _ in range(steps):
        name = rng.choices(names, weights)[0]
        if name in needs_sequences and not machine.model._seqs:
            name = "admit"
        method = getattr(machine, name)
        method(**_draw(rng, inspect.signature(method).parameters))
        machine.observables_agree()
        machine.record_kv()
        machine.pool_is_consistent()
    return machine


def test_long_random_workloads():
    reach = dict.fromkeys(["hits", "evictions", "failed_allocations", "copies", "duplicates",
                           "collisions", "released", "sliding hits", "retries that fit",
                           "retries that failed"], 0)
    for seed in range(12):
        machine = _run_workload(seed)
        stats = machine.real.stats()
        assert stats["allocations"] > 100, f"seed {seed} did little real work"
        for name in ("hits", "evictions", "failed_allocations"):
            reach[name] += stats[name]
        reach["copies"] += machine.copies_seen
        reach["duplicates"] += machine.model.duplicates
        reach["collisions"] += machine.model.collisions
        reach["released"] += sum(s["released"] for s in machine.real.group_stats())
        reach["retries that fit"] += machine.retries["fit"]
        reach["retries that failed"] += machine.retries["failed"]
        if any(w is not None for w in machine.model.groups):
            reach["sliding hits"] += stats["hits"]
    # The generator must keep reaching every mechanism, or the test would pass vacuously.
    assert all(count > 0 for count in reach.values()), reach
