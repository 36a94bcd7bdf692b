"""KV-cache groups: one pool, one block table per group, sliding windows releasing what no token
still to compute can see. Each test states one rule of `gnomon.BlockAllocator`'s docstring."""

import numpy as np
import pytest

import gnomon
from allocator.model import hash_block
from allocator.snapshot import snapshot


def toks(start, n):
    return list(range(start, start + n))


def tables(a, seq_id):
    return [a.block_table(seq_id, g).tolist() for g in range(len(a.groups))]


def test_the_default_is_one_full_group():
    a = gnomon.BlockAllocator(8, 4)
    assert a.groups == (None,)
    assert a.group_stats() == [{"window": None, "blocks_in_use": 0, "cached_blocks": 0,
                                "evictions": 0, "released": 0}]


@pytest.mark.parametrize("groups, error, match", [
    ((), ValueError, "at least one"),
    ([None, 0], ValueError, "entry 1 is a sliding window of 0"),
    ((-3,), ValueError, "window must be >= 1"),
    ((None, "sliding"), TypeError, "entry 1 is str"),
    ((None, 2.5), TypeError, "entry 1 is float"),
    ((True,), TypeError, "entry 0 is bool"),
    ((1 << 70,), ValueError, "beyond int64"),
    ("full", TypeError, "list or tuple"),
])
def test_bad_groups_are_refused(groups, error, match):
    with pytest.raises(error, match=match):
        gnomon.BlockAllocator(8, 4, groups=groups)


def test_bad_group_index_is_refused():
    a = gnomon.BlockAllocator(8, 4, groups=(None, 4))
    assert a.allocate(1, [1, 2, 3], 3)
    for group in (-1, 2):
        with pytest.raises(ValueError, match="group: expected 0 <= group < 2"):
            a.block_table(1, group)


def test_every_group_gets_a_table_from_the_one_pool():
    a = gnomon.BlockAllocator(8, 4, groups=(None, 4))
    assert a.allocate(1, toks(0, 9), 9)  # 3 blocks per group
    full, sliding = tables(a, 1)
    assert len(full) == len(sliding) == 3 and not set(full) & set(sliding)
    assert a.num_free_blocks == 2
    # all or nothing over the groups: 2 more tokens need a block per group, 2 are free
    assert a.allocate(2, toks(50, 2), 2) and a.num_free_blocks == 0
    assert not a.allocate(3, [7], 1) and a.stats()["failed_allocations"] == 1


def test_a_sliding_group_releases_a_block_exactly_at_the_window_edge():
    # block_size 4, window 8: with c computed the next token (position c) sees c-7 .. c, so
    # block i (positions 4i .. 4i+3) goes once 4(i+1) <= c - 7
    a = gnomon.BlockAllocator(32, 4, False, groups=(None, 8))
    assert a.allocate(1, toks(0, 40), 40)
    for c in range(41):
        a.commit(1, c)
        full, sliding = tables(a, 1)
        released = max(0, c - 7) // 4
        assert sliding[:released] == [-1] * released and -1 not in sliding[released:], c
        assert -1 not in full
    assert a.group_stats()[1]["released"] == (40 - 7) // 4
    # at c = 10 position 3 is still in the window of the token at 10; at c = 11 it is not
    b = gnomon.BlockAllocator(8, 4, False, groups=(8,))
    assert b.allocate(1, toks(0, 12), 12)
    b.commit(1, 10)
    assert b.block_table(1).tolist()[0] != -1
    b.commit(1, 11)
    assert b.block_table(1).tolist()[0] == -1


def test_a_released_block_returns_to_the_pool():
    a = gnomon.BlockAllocator(6, 2, False, groups=(None, 2))
    assert a.allocate(1, toks(0, 6), 6)  # 3 blocks per group: the pool is full
    assert a.num_free_blocks == 0
    first = a.block_table(1, 1)[0]
    a.commit(1, 6)  # the token at 6 sees 5..6: blocks 0 and 1 (positions 0..3) go
    assert a.block_table(1, 1).tolist()[:2] == [-1, -1]
    assert a.num_free_blocks == 2 and a.ref_count(first) == 0 and first in a.free_queue()
    assert a.group_stats()[1]["blocks_in_use"] == 1
    assert a.blocks_in_use == tuple(g["blocks_in_use"] for g in a.group_stats()) == (3, 1)


def test_a_sliding_groups_footprint_stays_bounded_through_a_long_decode():
    window, bs = 8, 4
    a = gnomon.BlockAllocator(64, bs, True, groups=(None, window))
    assert a.allocate(1, toks(0, 10), 10)
    a.commit(1, 10)
    peak = 0
    for t in range(10, 200):
        assert a.allocate(1, [t], 1)
        peak = max(peak, a.group_stats()[1]["blocks_in_use"])
        a.commit(1, t + 1)
    assert peak <= -(-(window + 1) // bs) + 1
    assert a.group_stats()[0]["blocks_in_use"] == -(-200 // bs)


def test_released_entries_are_reported_as_null_in_place():
    a = gnomon.BlockAllocator(16, 2, False, groups=(None, 2))
    assert a.allocate(1, toks(0, 5), 5)
    full, appended, replaced = a.take_block_updates([1])[0]
    assert full and [list(ids) for ids in appended] == tables(a, 1) and replaced == ((), ())
    a.commit(1, 5)  # sliding blocks 0 and 1 are released
    assert a.take_block_updates([1]) == [(False, ((), ()), ((), ((0, -1), (1, -1))))]
    assert a.allocate(1, [5], 1)
    a.commit(1, 6)  # nothing new to release: block 2 holds 4..5, the token at 6 sees 5..6
    (full, (app_full, app_sliding), (rep_full, rep_sliding)), = a.take_block_updates([1])
    assert not full and app_full == app_sliding == () and rep_full == rep_sliding == ()


def test_a_prefix_hits_though_the_sliding_groups_older_blocks_were_evicted():
    bs, window = 4, 8
    a = gnomon.BlockAllocator(24, bs, True, groups=(None, window))
    prompt = toks(100, 42)  # 10 full blocks and 2 tokens
    assert a.allocate(1, prompt, 42)
    a.commit(1, 42)
    a.free(1)
    # sliding blocks 0..7 left the window during the prefill and are the oldest in the queue:
    # the next allocation (after the two uncached blocks and the two never used) evicts them
    assert a.allocate(2, toks(900, 24), 24)
    stats = a.group_stats()
    assert stats[1]["evictions"] == 8 and stats[0]["evictions"] == 0
    a.free(2)
    # a hit at 40 needs the full group's 10 blocks and only the sliding blocks its window sees:
    # the token at 40 attends 33..40, so blocks 8 and 9
    assert a.lookup(prompt) == 40
    assert a.allocate(3, prompt, 2)
    full, sliding = tables(a, 3)
    assert sliding[:8] == [-1] * 8 and -1 not in sliding[8:] and -1 not in full
    assert a.num_computed_tokens(3) == 40 and a.stats()["hits"] == 40


def test_the_hit_is_the_minimum_over_the_groups():
    # the window of the first new token must be cached in the sliding group; when it is not,
    # the hit falls back to a shorter prefix whose window is
    bs = 2
    a = gnomon.BlockAllocator(40, bs, True, groups=(None, 3))
    prompt = toks(0, 11)
    assert a.allocate(1, prompt, 11)
    a.commit(1, 11)
    full, sliding = tables(a, 1)
    a.free(1)
    assert a.lookup(prompt) == 10  # the token at 10 sees 8..10: sliding block 4 is cached
    # evict sliding block 4 only, by reusing it: take every free block up to it
    queue = a.free_queue().tolist()
    need = queue.index(sliding[4]) + 1
    if need % 2:
        need += 1  # the allocation takes the same count per group
    assert a.allocate(2, toks(500, need // 2 * bs), need // 2 * bs)
    a.free(2)
    assert sliding[4] not in a.cached_blocks().tolist()
    assert a.lookup(prompt) < 10
    hit = a.lookup(prompt)
    first_needed = max(0, hit - 3 + 1) // bs
    assert all(b in a.cached_blocks().tolist() for b in sliding[first_needed:hit // bs])


def test_fork_shares_every_group_and_copy_on_write_is_per_group():
    a = gnomon.BlockAllocator(32, 2, True, groups=(None, 2))
    assert a.allocate(1, toks(0, 5), 5)
    a.commit(1, 5)
    a.fork(1, 2)
    assert tables(a, 2) == tables(a, 1)
    for b in [b for t in tables(a, 1) for b in t if b != -1]:
        assert a.ref_count(b) == 2
    # both write position 5, in the shared last block of each group: the first gets a copy per
    # group (K and V of the computed position 4 to copy), the second keeps the originals
    before = tables(a, 1)
    assert a.allocate_batch([1, 2], [5, 6], [1, 1], [1, 1]) == 2
    copies = a.pending_copies()
    assert sorted(src for src, _ in copies) == sorted([before[0][2], before[1][2]])
    assert tables(a, 2) == before
    after = tables(a, 1)
    assert {t[2] for t in after} == {dst for _, dst in copies}
    assert [t[:2] for t in after] == [t[:2] for t in before]  # released entries stay null
    a.free(1)
    a.free(2)
    assert a.num_free_blocks == 32


def test_fork_leaves_null_entries_unshared():
    a = gnomon.BlockAllocator(16, 1, False, groups=(None, 2))
    assert a.allocate(1, toks(0, 6), 6)
    a.commit(1, 6)
    free = a.num_free_blocks
    a.fork(1, 2)
    assert a.block_table(2, 1).tolist()[:5] == [-1] * 5
    assert a.num_free_blocks == free  # a fork takes no block
    a.free(1)
    a.free(2)
    assert a.num_free_blocks == 16


def test_a_lone_sliding_group_hits_only_along_an_unbroken_chain():
    # no full group: the sliding group is its own anchor, verified from its first block
    a = gnomon.BlockAllocator(12, 2, True, groups=(2,))
    prompt = toks(0, 9)
    assert a.allocate(1, prompt, 9)
    table = a.block_table(1).tolist()
    a.commit(1, 9)  # blocks 0..3 leave the window (cached, to the queue's tail in that order)
    a.free(1)
    assert a.lookup(prompt) == 8  # the token at 8 needs block 3 only; the chain 0..3 is whole
    # the queue is: block 4 (uncached), the 7 never used, then blocks 0..3: take 9, evicting 0
    assert a.allocate(2, toks(100, 18), 18)
    cached = a.cached_blocks().tolist()
    assert table[0] not in cached and all(b in cached for b in table[1:4])
    assert a.lookup(prompt) == 0  # block 3 is cached, but nothing verifies it


def _key(parent, tokens, bits):
    return hash_block(parent, tokens, 0) & ((1 << bits) - 1)


def test_a_block_cached_against_an_evicted_anchor_entry_is_never_served():
    """A sliding block's anchor entry is evicted and its key recached with other content (a
    narrow hash collides): the stale block is never served, and the block computed for the new
    content takes its key."""
    bs, bits = 2, 1
    a = gnomon.BlockAllocator(12, bs, True, hash_bits=bits, groups=(None, 2))
    # two full blocks with distinct keys, so the anchor caches both
    prompt = next(p for p in (toks(s, 4) for s in range(100))
                  if _key(0, p[:2], bits) != _key(_key(0, p[:2], bits), p[2:], bits))
    k0, k1 = _key(0, prompt[:2], bits), _key(_key(0, prompt[:2], bits), prompt[2:], bits)
    # the same first block, another second block under the same key
    other = next(prompt[:2] + [x, y] for x in range(50, 60) for y in range(50, 60)
                 if _key(k0, [x, y], bits) == k1)
    # 1 computes the prompt and holds the anchor entries; 2 computes it at the same time: its
    # anchor blocks are duplicates, its sliding blocks are cached once 1's are evicted
    assert a.allocate(1, prompt + [0], 5) and a.allocate(2, prompt, 4)
    anchor_block_1 = a.block_table(1, 0).tolist()[1]
    a.commit(1, 5)  # 1's sliding blocks 0 and 1 leave the window
    fillers = []
    while a.group_stats()[1]["cached_blocks"]:  # evict them
        fillers.append(100 + len(fillers))
        assert a.allocate(fillers[-1], [1, 1], 2)
    a.commit(2, 4)  # 2's sliding block 1 is cached against 1's anchor entry for block 1
    stale = a.block_table(2, 1).tolist()[1]
    assert stale in a.cached_blocks().tolist()
    a.free(1)
    for f in fillers:
        a.free(f)
    fillers = []
    while anchor_block_1 in a.cached_blocks().tolist():  # evict that anchor entry
        fillers.append(200 + len(fillers))
        assert a.allocate(fillers[-1], [3, 3], 2)
    for f in fillers:
        a.free(f)
    assert stale in a.cached_blocks().tolist()  # 2 still holds it: cached, and stale
    assert a.lookup(prompt + [0]) <= 2  # no anchor entry for block 1 to verify it against

    hit = a.lookup(other + [0])
    assert a.allocate(3, other + [0], 5 - hit)
    a.commit(3, 5)
    assert stale not in a.cached_blocks().tolist()  # the new content took its key
    a.free(3)
    assert a.lookup(prompt + [0]) <= 2  # block 1's anchor entry holds other content now
    assert a.lookup(other + [0]) == 4
    assert a.allocate(4, other + [0], 1)
    assert stale not in a.block_table(4, 1).tolist()


def test_bad_input_leaves_a_grouped_allocator_unchanged():
    a = gnomon.BlockAllocator(16, 2, True, groups=(None, 2))
    assert a.allocate(1, toks(0, 5), 5)
    a.commit(1, 5)
    before = snapshot(a)
    with pytest.raises(ValueError, match="num_computed_tokens"):
        a.commit(1, 9)
    with pytest.raises(ValueError, match="num_computed_tokens"):
        a.commit_batch(np.array([1]), np.array([3]))
    with pytest.raises(KeyError, match="seq_id"):
        a.free(7)
    with pytest.raises(ValueError, match="group"):
        a.block_table(1, 5)
    assert snapshot(a) == before


def test_every_block_returns_after_a_mixed_workload():
    rng = np.random.default_rng(0)
    a = gnomon.BlockAllocator(64, 4, True, groups=(None, 6))
    live = {}
    for step in range(400):
        if live and rng.random() < 0.3:
            a.free(live.pop(int(rng.choice(list(live)))))
            continue
        seq_id = step
        prompt = [int(t) for t in rng.integers(0, 3, size=int(rng.integers(1, 20)))]
        cached = a.lookup(prompt)
        if a.allocate(seq_id, prompt, len(prompt) - cached):
            a.commit(seq_id, len(prompt))
            live[seq_id] = seq_id
    for seq_id in list(live):
        a.free(seq_id)
    assert a.num_free_blocks == 64 and len(a) == 0
    assert sum(s["blocks_in_use"] for s in a.group_stats()) == 0
    assert a.stats()["hits"] > 0 and a.group_stats()[1]["released"] > 0
