"""Scenario tests for gnomon.BlockAllocator: one test per rule, exact block ids and queue orders.

Every scenario is small enough to follow by hand; the comments give the expected state. Most use
``block_size=4`` so a block's tokens are easy to count. These tests do not import torch: they also
run against the AddressSanitizer build.
"""

import numpy as np
import pytest

import gnomon
from allocator.snapshot import snapshot

BS = 4
STATS_KEYS = {"queries", "hits", "hit_rate", "allocations", "failed_allocations", "evictions"}


def snapshot_without_failures(a):
    snap = snapshot(a)
    snap["stats"] = {k: v for k, v in snap["stats"].items() if k != "failed_allocations"}
    return snap


def toks(start, n):
    """n distinct token ids starting at ``start``."""
    return list(range(start, start + n))


def cache_prompt(a, seq_id, prompt):
    """Admits ``prompt`` whole, commits it all; returns its block table."""
    assert a.allocate(seq_id, prompt, len(prompt) - a.lookup(prompt))
    a.commit(seq_id, len(prompt))
    return a.block_table(seq_id).tolist()


# ---------------------------------------------------------------------------------------------
# Structure


def test_initial_queue_and_allocation_takes_from_the_head():
    a = gnomon.BlockAllocator(6, BS)
    assert a.free_queue().tolist() == [0, 1, 2, 3, 4, 5]
    assert [a.ref_count(b) for b in range(6)] == [0] * 6
    assert a.num_free_blocks == 6 and a.usage == 0.0

    assert a.allocate(1, toks(100, 10), 10)  # 10 tokens -> 3 blocks
    assert a.block_table(1).tolist() == [0, 1, 2]
    assert a.free_queue().tolist() == [3, 4, 5]
    assert [a.ref_count(b) for b in range(6)] == [1, 1, 1, 0, 0, 0]

    assert a.allocate(2, toks(200, 5), 5)  # 5 tokens -> 2 blocks
    assert a.block_table(2).tolist() == [3, 4]
    assert a.free_queue().tolist() == [5]
    assert a.num_free_blocks == 1
    assert a.usage == pytest.approx(5 / 6)


def test_allocate_sizes_the_table_for_computed_plus_new_tokens():
    a = gnomon.BlockAllocator(8, BS)
    assert a.allocate(1, toks(100, 10), 3)  # only 3 of the 10 prompt tokens get slots
    assert a.block_table(1).tolist() == [0]
    assert a.allocate(1, [], 2)  # computed 0 + 2 -> still one block, nothing taken
    assert a.block_table(1).tolist() == [0]
    assert a.allocate(1, [], 5)  # 0 + 5 -> two blocks
    assert a.block_table(1).tolist() == [0, 1]
    assert a.free_queue().tolist() == [2, 3, 4, 5, 6, 7]


# ---------------------------------------------------------------------------------------------
# lookup


def test_lookup_counts_whole_blocks_and_leaves_one_token_to_compute():
    a = gnomon.BlockAllocator(8, BS)
    p = toks(100, 12)  # exactly three full blocks
    assert cache_prompt(a, 1, p) == [0, 1, 2]
    assert a.cached_blocks().tolist() == [0, 1, 2]

    assert a.lookup([]) == 0
    assert a.lookup(p[:3]) == 0
    assert a.lookup(p[:4]) == 0  # a one-block prompt recomputes that block
    assert a.lookup(p[:5]) == 4
    assert a.lookup(p[:7]) == 4  # whole blocks only
    assert a.lookup(p[:8]) == 4  # leaves one token: the last block is recomputed
    assert a.lookup(p[:9]) == 8
    assert a.lookup(p) == 8  # a fully cached prompt recomputes its last block
    assert a.lookup(p + [7]) == 12
    assert a.lookup(p + toks(500, 10)) == 12
    assert a.lookup([999] + p[1:] + [7]) == 0  # first block differs
    assert a.lookup(p[:4] + [999] + p[5:] + [7]) == 4  # second block differs
    # numpy arrays of either width work the same
    assert a.lookup(np.array(p + [7], np.int32)) == 12
    assert a.lookup(np.array(p[:9], np.int64)) == 8


def test_lookup_changes_no_state():
    a = gnomon.BlockAllocator(8, BS)
    p = toks(100, 9)
    cache_prompt(a, 1, p)
    a.free(1)
    # blocks 0, 1 cached and free at the tail; the uncached block 2 at the head
    assert a.free_queue().tolist() == [2, 3, 4, 5, 6, 7, 1, 0]
    before = snapshot(a)
    for _ in range(3):
        assert a.lookup(p) == 8
        assert a.lookup(p[:5]) == 4
        assert a.lookup(toks(300, 9)) == 0
    assert snapshot(a) == before
    assert a.stats()["queries"] == 9 and a.stats()["hits"] == 0


# ---------------------------------------------------------------------------------------------
# What enters the cache


def test_block_enters_cache_only_when_full_and_committed():
    a = gnomon.BlockAllocator(8, BS)
    p = toks(100, 9)
    assert a.allocate(1, p, 9)
    assert a.block_table(1).tolist() == [0, 1, 2]
    # all of p's slots are allocated, blocks 0 and 1 are full of token ids; nothing is computed
    assert a.lookup(p) == 0 and a.num_cached_blocks == 0

    a.commit(1, 3)  # block 0 is not full of computed tokens yet
    assert a.lookup(p) == 0 and a.cached_blocks().tolist() == []
    a.commit(1, 4)  # block 0 full and committed; block 1 full of ids but not computed
    assert a.lookup(p) == 4 and a.cached_blocks().tolist() == [0]
    a.commit(1, 9)
    assert a.lookup(p) == 8 and a.cached_blocks().tolist() == [0, 1]
    # block 2 holds one computed token: a partial block is never cached
    later = p + toks(200, 3)
    assert a.lookup(later + [7]) == 8

    assert a.allocate(1, toks(200, 3), 3)  # slots 12 -> still three blocks
    assert a.block_table(1).tolist() == [0, 1, 2]
    assert a.lookup(later + [7]) == 8  # full of ids now, still uncommitted
    a.commit(1, 12)
    assert a.lookup(later + [7]) == 12
    assert a.cached_blocks().tolist() == [0, 1, 2]


# ---------------------------------------------------------------------------------------------
# Admission


def test_admission_claims_exactly_the_blocks_lookup_counts():
    a = gnomon.BlockAllocator(8, BS)
    p = toks(100, 9)
    cache_prompt(a, 1, p)  # blocks [0, 1, 2]; 0 and 1 cached
    assert a.stats() == {"queries": 9, "hits": 0, "hit_rate": 0.0, "allocations": 1,
                         "failed_allocations": 0, "evictions": 0}
    a.free(1)
    assert a.free_queue().tolist() == [2, 3, 4, 5, 6, 7, 1, 0]

    # A hit on free cached blocks: they leave the queue, ref counts go up, tokens count as computed.
    q = p[:8] + [50, 51]
    assert a.lookup(q) == 8
    assert a.allocate(2, q, 2)
    assert a.block_table(2).tolist() == [0, 1, 2]  # claimed 0, 1; fresh 2 from the head
    assert a.free_queue().tolist() == [3, 4, 5, 6, 7]
    assert [a.ref_count(b) for b in range(8)] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert a.num_computed_tokens(2) == 8
    s = a.stats()
    assert (s["queries"], s["hits"], s["allocations"], s["evictions"]) == (19, 8, 2, 0)
    assert s["hit_rate"] == pytest.approx(8 / 19)

    # A hit on blocks in use: ref counts go up, the queue does not change.
    r = p[:8] + [60]
    assert a.allocate(3, r, 1)
    assert a.block_table(3).tolist() == [0, 1, 3]
    assert a.free_queue().tolist() == [4, 5, 6, 7]
    assert [a.ref_count(b) for b in range(8)] == [2, 2, 1, 1, 0, 0, 0, 0]
    assert a.num_computed_tokens(3) == 8

    # The cap: exactly p[:8] is fully cached, so only block 0 is claimed and block 1 is recomputed.
    assert a.lookup(p[:8]) == 4
    assert a.allocate(4, p[:8], 4)
    assert a.block_table(4).tolist() == [0, 4]
    assert a.num_computed_tokens(4) == 4
    assert [a.ref_count(b) for b in range(8)] == [3, 2, 1, 1, 1, 0, 0, 0]
    s = a.stats()
    assert (s["queries"], s["hits"], s["allocations"]) == (9 + 10 + 9 + 8, 8 + 8 + 4, 4)

    # Calls for running sequences count allocations but no queries or hits.
    a.commit(2, 10)
    assert a.allocate(2, [70], 1)
    assert a.allocate(3, [], 0)
    s = a.stats()
    assert (s["queries"], s["hits"], s["allocations"]) == (36, 20, 6)
    assert s["hit_rate"] == pytest.approx(20 / 36)


def test_chunked_prefill():
    a = gnomon.BlockAllocator(8, BS)
    p = toks(100, 10)
    assert a.lookup(p) == 0
    assert a.allocate(1, p, 4)  # first chunk: the whole prompt, slots for 4 tokens
    assert a.block_table(1).tolist() == [0]
    a.commit(1, 4)
    assert a.num_computed_tokens(1) == 4
    assert a.lookup(p) == 4  # the first chunk is already shareable

    assert a.allocate(1, [], 4)  # second chunk: no new ids
    assert a.block_table(1).tolist() == [0, 1]
    a.commit(1, 8)
    assert a.lookup(p) == 8

    assert a.allocate(1, [], 2)  # last chunk
    assert a.block_table(1).tolist() == [0, 1, 2]
    a.commit(1, 10)
    assert a.num_computed_tokens(1) == 10
    assert a.cached_blocks().tolist() == [0, 1]

    assert a.allocate(1, [7], 1)  # decode: one sampled token
    a.commit(1, 11)
    assert a.block_table(1).tolist() == [0, 1, 2]
    assert a.free_queue().tolist() == [3, 4, 5, 6, 7]
    s = a.stats()
    assert (s["queries"], s["hits"], s["allocations"]) == (10, 0, 4)


# ---------------------------------------------------------------------------------------------
# All or nothing


def test_failed_admission_changes_nothing_even_with_cached_free_blocks_to_claim():
    a = gnomon.BlockAllocator(4, BS)
    p = toks(100, 9)
    cache_prompt(a, 1, p)
    a.free(1)
    assert a.free_queue().tolist() == [2, 3, 1, 0]
    assert a.cached_blocks().tolist() == [0, 1]
    before = snapshot_without_failures(a)

    q = p[:8] + toks(200, 12)  # would claim blocks 0, 1 and need 3 fresh ones; only 2 remain
    assert a.lookup(q) == 8
    assert a.allocate(2, q, 12) is False
    assert 2 not in a and len(a) == 0
    assert snapshot_without_failures(a) == before  # queue order, ref counts, cache, other stats
    assert a.stats()["failed_allocations"] == 1
    assert a.lookup(q) == 8

    # The same id can be admitted afterwards with a request that fits.
    assert a.allocate(2, q, 8)
    assert a.block_table(2).tolist() == [0, 1, 2, 3]
    assert a.free_queue().tolist() == []
    assert a.num_computed_tokens(2) == 8
    s = a.stats()
    assert (s["queries"], s["hits"], s["allocations"], s["failed_allocations"]) == (29, 8, 2, 1)


def test_failed_allocation_for_running_sequence_changes_nothing():
    a = gnomon.BlockAllocator(4, BS)
    assert a.allocate(1, toks(100, 9), 9)
    a.commit(1, 9)
    assert a.block_table(1).tolist() == [0, 1, 2]
    before = snapshot_without_failures(a)

    assert a.allocate(1, toks(200, 5), 8) is False  # 17 slots -> 5 blocks, one free
    assert snapshot_without_failures(a) == before
    assert a.stats()["failed_allocations"] == 1
    # The failed call's token ids were not appended: only 9 ids are known, so a commit of 10 fails.
    assert a.allocate(1, [], 3)  # 12 slots, fits in block 2
    with pytest.raises(ValueError, match="num_computed_tokens"):
        a.commit(1, 10)
    assert a.num_computed_tokens(1) == 9


def test_failed_copy_on_write_changes_nothing():
    a = gnomon.BlockAllocator(2, BS)
    assert a.allocate(1, toks(100, 6), 6)
    a.commit(1, 6)
    a.fork(1, 2)
    assert a.free_queue().tolist() == []
    before = snapshot_without_failures(a)
    # seq 2 writes into the shared partial block 1 and needs a copy, but no block is free.
    assert a.allocate(2, [7], 1) is False
    assert snapshot_without_failures(a) == before
    assert a.pending_copies() == []
    assert a.stats()["failed_allocations"] == 1


# ---------------------------------------------------------------------------------------------
# free, LRU and eviction


def test_free_releases_in_reverse_order_cached_to_tail_uncached_to_head():
    a = gnomon.BlockAllocator(8, BS)
    assert a.allocate(1, toks(100, 10), 10)
    a.commit(1, 10)  # blocks 0, 1 cached; 2 partial
    assert a.allocate(2, toks(200, 3), 3)
    assert a.block_table(2).tolist() == [3]
    assert a.free_queue().tolist() == [4, 5, 6, 7]
    a.free(1)
    # release 2 -> head; then 1 -> tail; then 0 -> tail: the chain's tail is evicted first
    assert a.free_queue().tolist() == [2, 4, 5, 6, 7, 1, 0]
    assert [a.ref_count(b) for b in range(8)] == [0, 0, 0, 1, 0, 0, 0, 0]
    a.free(2)  # uncommitted block 3 -> head
    assert a.free_queue().tolist() == [3, 2, 4, 5, 6, 7, 1, 0]
    assert 1 not in a and 2 not in a
    assert a.num_cached_blocks == 2


def test_eviction_order_after_two_sequences_sharing_a_prefix_are_freed():
    a = gnomon.BlockAllocator(8, BS)
    prefix = toks(100, 8)
    pa = prefix + toks(200, 4) + [1]
    pb = prefix + toks(300, 4) + [2]
    assert cache_prompt(a, 1, pa) == [0, 1, 2, 3]  # 0, 1, 2 cached; 3 partial
    assert a.lookup(pb) == 8
    assert cache_prompt(a, 2, pb) == [0, 1, 4, 5]  # claims 0, 1; caches 4; 5 partial
    assert a.cached_blocks().tolist() == [0, 1, 2, 4]
    assert a.free_queue().tolist() == [6, 7]
    assert [a.ref_count(b) for b in range(8)] == [2, 2, 1, 1, 1, 1, 0, 0]

    a.free(1)  # 3 -> head, 2 -> tail; 1 and 0 are still held by seq 2
    assert a.free_queue().tolist() == [3, 6, 7, 2]
    a.free(2)  # 5 -> head, 4 -> tail, 1 -> tail, 0 -> tail
    assert a.free_queue().tolist() == [5, 3, 6, 7, 2, 4, 1, 0]

    # Fresh blocks come from the head: uncached ones first, then the LRU chain tails.
    assert a.allocate(3, toks(900, 17), 17)  # 5 blocks: 5, 3, 6, 7, then the cached 2
    assert a.block_table(3).tolist() == [5, 3, 6, 7, 2]
    assert a.stats()["evictions"] == 1
    assert a.cached_blocks().tolist() == [0, 1, 4]
    assert a.lookup(pa) == 8 and a.lookup(pb) == 12
    assert a.allocate(4, toks(950, 1), 1)  # next comes B's tail, 4
    assert a.block_table(4).tolist() == [4]
    assert a.stats()["evictions"] == 2
    assert a.lookup(pb) == 8
    assert a.free_queue().tolist() == [1, 0]


def test_reusing_a_cached_free_block_evicts_it():
    a = gnomon.BlockAllocator(4, BS)
    p = toks(100, 9)
    cache_prompt(a, 1, p)
    a.free(1)
    assert a.free_queue().tolist() == [2, 3, 1, 0]
    assert a.num_cached_blocks == 2 and a.lookup(p) == 8

    assert a.allocate(2, toks(500, 12), 12)  # takes 2, 3 (uncached), then 1 (cached: evicted)
    assert a.block_table(2).tolist() == [2, 3, 1]
    assert a.stats()["evictions"] == 1
    assert a.num_cached_blocks == 1 and a.cached_blocks().tolist() == [0]
    assert a.lookup(p) == 4  # block 1's entry is gone; block 0's remains
    assert a.free_queue().tolist() == [0]

    # Re-using a block as a hit is not an eviction: block 0 is claimed, not taken as fresh.
    assert a.allocate(3, p[:4] + [1], 0)
    assert a.block_table(3).tolist() == [0]
    assert a.stats()["evictions"] == 1
    assert a.free_queue().tolist() == []


def test_a_hit_refreshes_lru_position():
    a = gnomon.BlockAllocator(6, BS)
    x, y = toks(100, 5), toks(200, 5)
    assert cache_prompt(a, 1, x) == [0, 1]
    assert cache_prompt(a, 2, y) == [2, 3]
    a.free(1)
    a.free(2)
    assert a.free_queue().tolist() == [3, 1, 4, 5, 0, 2]
    assert a.allocate(3, x, 1)  # a hit on 0 takes it out of the middle of the queue
    assert a.block_table(3).tolist() == [0, 3]
    assert a.free_queue().tolist() == [1, 4, 5, 2]
    a.free(3)  # 3 -> head, 0 -> tail: now more recently used than y's block 2
    assert a.free_queue().tolist() == [3, 1, 4, 5, 2, 0]


def test_duplicate_block_stays_out_of_the_cache_and_is_freed_to_the_head():
    a = gnomon.BlockAllocator(8, BS)
    q = toks(100, 8)  # exactly two blocks
    assert cache_prompt(a, 1, q) == [0, 1]
    assert a.cached_blocks().tolist() == [0, 1]

    # A fully cached prompt recomputes its last block into a fresh block: a duplicate.
    assert a.lookup(q) == 4
    assert a.allocate(2, q, 4)
    assert a.block_table(2).tolist() == [0, 2]
    a.commit(2, 8)
    assert a.cached_blocks().tolist() == [0, 1]  # block 2 stays out
    assert a.num_cached_blocks == 2

    # The chain continues through the entry already cached: seq 2's next block is cacheable.
    assert a.allocate(2, toks(300, 4), 4)
    assert a.block_table(2).tolist() == [0, 2, 3]
    a.commit(2, 12)
    assert a.cached_blocks().tolist() == [0, 1, 3]
    assert a.lookup(q + toks(300, 4) + [9]) == 12

    a.free(2)  # 3 (cached) -> tail, 2 (duplicate, uncached) -> head, 0 still held by seq 1
    assert a.free_queue().tolist() == [2, 4, 5, 6, 7, 3]
    a.free(1)
    assert a.free_queue().tolist() == [2, 4, 5, 6, 7, 3, 1, 0]


def test_concurrent_recompute_is_a_duplicate():
    a = gnomon.BlockAllocator(8, BS)
    p = toks(100, 5)
    assert a.allocate(1, p, 5) and a.allocate(2, p, 5)  # both admitted before any commit
    assert a.block_table(1).tolist() == [0, 1]
    assert a.block_table(2).tolist() == [2, 3]
    a.commit(1, 5)
    a.commit(2, 5)
    assert a.cached_blocks().tolist() == [0]
    a.free(2)
    assert a.free_queue().tolist() == [2, 3, 4, 5, 6, 7]
    a.free(1)
    assert a.free_queue().tolist() == [1, 2, 3, 4, 5, 6, 7, 0]


# ---------------------------------------------------------------------------------------------
# Hash collisions and the extra key


def find_colliding_block(a_block, hash_bits, tries=256):
    """Searches for a block of tokens, different from ``a_block``, whose narrowed key equals its.

    A is cached in a fresh allocator; B's full block is then committed. B is never cached before,
    so lookup must miss it; if B's block could not enter the cache (num_cached_blocks stays 1)
    its key collided with A's. Returns (colliding block, whether a non-colliding one was seen).
    """
    seen_non_colliding = False
    for c in range(tries):
        b_block = [1000 + c, 2000 + c, 3000 + c, 4000 + c]
        assert b_block != a_block
        a = gnomon.BlockAllocator(4, BS, hash_bits=hash_bits)
        assert cache_prompt(a, 1, a_block + [9]) == [0, 1]
        assert a.lookup(b_block + [9]) == 0
        assert cache_prompt(a, 2, b_block + [9]) == [2, 3]
        assert a.lookup(b_block + [9]) in (0, 4)
        if a.num_cached_blocks == 1:
            assert a.cached_blocks().tolist() == [0]
            assert a.lookup(b_block + [9]) == 0
            return b_block, seen_non_colliding
        assert a.cached_blocks().tolist() == [0, 2]
        assert a.lookup(b_block + [9]) == 4
        seen_non_colliding = True
    raise AssertionError(f"no collision found in {tries} tries with hash_bits={hash_bits}")


@pytest.mark.parametrize("hash_bits", [1, 2])
def test_colliding_hash_with_different_tokens_is_a_miss(hash_bits):
    a_block = [1, 2, 3, 4]
    b_block, _ = find_colliding_block(a_block, hash_bits)

    a = gnomon.BlockAllocator(4, BS, hash_bits=hash_bits)
    assert a.hash_bits == hash_bits
    assert cache_prompt(a, 1, a_block + [9]) == [0, 1]
    a.free(1)
    assert a.free_queue().tolist() == [1, 2, 3, 0]  # A's cached block 0 free at the tail
    before = snapshot(a)
    assert a.lookup(b_block + [9]) == 0  # same key, different tokens: a miss
    assert snapshot(a) == before

    # Admitting B never hands out A's block.
    assert a.allocate(2, b_block + [9], 5)
    assert a.block_table(2).tolist() == [1, 2]
    assert a.num_computed_tokens(2) == 0
    assert a.ref_count(0) == 0
    assert a.free_queue().tolist() == [3, 0]
    assert a.stats()["hits"] == 0
    a.commit(2, 5)  # B's full block has A's key: it cannot enter the cache
    assert a.cached_blocks().tolist() == [0]
    assert a.lookup(a_block + [9]) == 4  # A's entry is intact
    assert a.lookup(b_block + [9]) == 0
    a.free(2)  # B's uncached blocks go to the head
    assert a.free_queue().tolist() == [1, 2, 3, 0]


@pytest.mark.parametrize("hash_bits", [1, 2])
def test_collision_search_sees_both_outcomes(hash_bits):
    """The search discriminates: some candidate's block entered the cache before one collided."""
    b_block, seen_non_colliding = find_colliding_block([1, 2, 3, 4], hash_bits)
    assert seen_non_colliding, b_block


def test_block_after_a_collision_is_not_cached():
    a_block = [1, 2, 3, 4]
    b_block, _ = find_colliding_block(a_block, 2)
    a = gnomon.BlockAllocator(8, BS, hash_bits=2)
    cache_prompt(a, 1, a_block + [9])
    assert cache_prompt(a, 2, b_block + toks(500, 4) + [9]) == [2, 3, 4]
    # b_block collides; the block after it has no cached parent, so it is not cached either
    assert a.cached_blocks().tolist() == [0]
    assert a.lookup(b_block + toks(500, 4) + [9]) == 0


def test_collision_never_hands_out_kv_computed_on_another_parent():
    """A block whose key and tokens match is still a miss when its parent entry is a different one.

    B0 collides with A0, so B0 + C1 and A0 + C1 have the same chained key for C1. Cache A0 + C1,
    evict A0 but keep C1, then cache B0 under the key A0 left: lookup(B0 + C1) must stop after B0.
    """
    a0 = [1, 2, 3, 4]
    b0, _ = find_colliding_block(a0, 2)
    c1 = toks(500, 4)
    a = gnomon.BlockAllocator(6, BS, hash_bits=2)
    # seq 1 caches a0 in block 0 while seq 2, admitted before that commit, computes a0 + c1 itself.
    assert a.allocate(1, a0 + [9], 5)
    assert a.allocate(2, a0 + c1 + [9], 9)
    assert a.block_table(1).tolist() == [0, 1]
    assert a.block_table(2).tolist() == [2, 3, 4]
    a.commit(1, 5)
    a.commit(2, 9)  # block 2 duplicates block 0; block 3 (c1) is cached on top of block 0's entry
    assert a.cached_blocks().tolist() == [0, 3]
    assert a.lookup(a0 + c1 + [9]) == 8
    a.free(1)
    a.free(2)
    assert a.free_queue().tolist() == [2, 4, 1, 5, 0, 3]
    assert a.allocate(3, toks(900, 20), 20)  # takes 2, 4, 1, 5 and evicts 0 (a0); c1 survives
    assert a.block_table(3).tolist() == [2, 4, 1, 5, 0]
    assert a.cached_blocks().tolist() == [3]
    assert a.stats()["evictions"] == 1
    a.free(3)
    assert a.free_queue().tolist() == [2, 4, 1, 5, 0, 3]

    assert cache_prompt(a, 4, b0 + [9]) == [2, 4]  # b0 now takes the key a0 left
    assert a.cached_blocks().tolist() == [2, 3]
    assert a.lookup(b0 + [9]) == 4
    # c1's entry matches key and tokens, but it was computed on top of a0, not b0.
    assert a.lookup(b0 + c1 + [9]) == 4
    assert a.allocate(5, b0 + c1 + [9], 5)
    assert a.block_table(5).tolist() == [2, 1, 5]
    assert a.ref_count(3) == 0
    assert a.num_computed_tokens(5) == 4


def test_colliding_hash_with_a_different_extra_key_is_a_miss():
    """The same tokens under another extra_key whose narrowed key collides: still a miss."""
    x = [1, 2, 3, 4, 9]
    for k in range(1, 257):
        a = gnomon.BlockAllocator(4, BS, hash_bits=1)
        cache_prompt(a, 1, x)
        assert a.lookup(x, k) == 0
        assert a.allocate(2, x, 5, k)
        assert a.block_table(2).tolist() == [2, 3]
        a.commit(2, 5)
        if a.num_cached_blocks == 1:  # k's key for x equals key 0's: found a collision
            break
    else:
        raise AssertionError("no extra_key collision found")
    a = gnomon.BlockAllocator(4, BS, hash_bits=1)
    cache_prompt(a, 1, x)
    a.free(1)
    assert a.lookup(x + [5]) == 4
    assert a.lookup(x + [5], k) == 0
    assert a.allocate(2, x + [5], 6, k)
    assert a.block_table(2).tolist() == [1, 2]
    assert a.ref_count(0) == 0 and a.num_computed_tokens(2) == 0
    a.commit(2, 6)
    assert a.cached_blocks().tolist() == [0]
    assert a.lookup(x + [5], k) == 0


def test_extra_key_separates_namespaces():
    a = gnomon.BlockAllocator(12, BS)
    p = toks(100, 9)
    assert a.allocate(1, p, 9, extra_key=7)
    a.commit(1, 9)
    assert a.cached_blocks().tolist() == [0, 1]
    assert a.lookup(p, extra_key=7) == 8
    assert a.lookup(p) == 0  # same tokens, default key 0: a miss
    assert a.lookup(p, extra_key=8) == 0
    assert a.lookup(p, 2**64 - 1) == 0
    assert a.lookup(p, -1) == 0

    assert a.allocate(2, p, 9)  # another namespace: no claim
    assert a.block_table(2).tolist() == [3, 4, 5]
    assert a.num_computed_tokens(2) == 0
    a.commit(2, 9)
    assert a.cached_blocks().tolist() == [0, 1, 3, 4]  # same tokens, two entries
    assert a.allocate(3, p, 1, extra_key=7)
    assert a.block_table(3).tolist() == [0, 1, 6]
    # A running sequence keeps the key it was admitted with.
    assert a.allocate(3, toks(200, 3), 4, extra_key=99)
    a.commit(3, 12)
    assert a.lookup(p + toks(200, 3) + [1], extra_key=7) == 12
    # -1 and 2**64 - 1 name the same namespace
    assert a.allocate(4, p, 9, extra_key=-1)
    a.commit(4, 9)
    assert a.lookup(p, 2**64 - 1) == 8


# ---------------------------------------------------------------------------------------------
# fork and copy-on-write


def test_fork_shares_every_block():
    a = gnomon.BlockAllocator(8, BS)
    assert a.allocate(1, toks(100, 6), 6)
    a.commit(1, 6)
    stats = a.stats()
    a.fork(1, 2)
    assert 2 in a and len(a) == 2
    assert a.block_table(2).tolist() == [0, 1]
    assert a.num_computed_tokens(2) == 6
    assert [a.ref_count(b) for b in range(3)] == [2, 2, 0]
    assert a.free_queue().tolist() == [2, 3, 4, 5, 6, 7]
    assert a.stats() == stats
    a.fork(2, 3)
    assert [a.ref_count(b) for b in range(3)] == [3, 3, 0]
    a.free(1)
    a.free(2)
    assert [a.ref_count(b) for b in range(3)] == [1, 1, 0]
    assert a.free_queue().tolist() == [2, 3, 4, 5, 6, 7]
    a.free(3)
    assert a.free_queue().tolist() == [1, 2, 3, 4, 5, 6, 7, 0]


def test_copy_on_write_of_a_shared_partial_block():
    a = gnomon.BlockAllocator(8, BS)
    assert a.allocate(1, toks(100, 6), 6)
    a.commit(1, 6)  # block 0 full and cached, block 1 holds 2 tokens
    a.fork(1, 2)

    # seq 2 writes into shared block 1: it gets a private copy from the queue's head
    assert a.allocate(2, [7], 1)
    assert a.block_table(2).tolist() == [0, 2]
    assert a.block_table(1).tolist() == [0, 1]
    assert [a.ref_count(b) for b in range(4)] == [2, 1, 1, 0]
    assert a.free_queue().tolist() == [3, 4, 5, 6, 7]
    assert a.pending_copies() == [(1, 2)]
    assert a.pending_copies() == []

    # seq 1 now holds block 1 alone and writes in place
    assert a.allocate(1, [8], 1)
    assert a.block_table(1).tolist() == [0, 1]
    assert a.free_queue().tolist() == [3, 4, 5, 6, 7]
    assert a.pending_copies() == []
    a.commit(1, 7)
    a.commit(2, 7)

    # the parent writing first gets the copy just the same
    a.fork(1, 3)
    assert a.allocate(1, [9], 1)
    assert a.block_table(1).tolist() == [0, 3]
    assert a.block_table(3).tolist() == [0, 1]
    assert a.pending_copies() == [(1, 3)]
    assert a.allocate(3, [10], 1)
    assert a.block_table(3).tolist() == [0, 1]
    assert a.pending_copies() == []


def test_no_copy_when_the_shared_last_block_is_full():
    a = gnomon.BlockAllocator(8, BS)
    assert a.allocate(1, toks(100, 8), 8)
    a.commit(1, 8)
    a.fork(1, 2)
    assert a.allocate(2, [1], 1)  # the write lands in a new block
    assert a.block_table(2).tolist() == [0, 1, 2]
    assert a.block_table(1).tolist() == [0, 1]
    assert a.pending_copies() == []
    assert [a.ref_count(b) for b in range(3)] == [2, 2, 1]


def test_fork_errors():
    a = gnomon.BlockAllocator(8, BS)
    assert a.allocate(1, toks(100, 6), 6)
    a.commit(1, 6)
    assert a.allocate(2, toks(200, 3), 3)
    before = snapshot(a)
    with pytest.raises(ValueError, match="child_seq_id"):
        a.fork(1, 2)  # into an id already present
    assert snapshot(a) == before
    with pytest.raises(ValueError, match="parent_seq_id"):
        a.fork(2, 3)  # seq 2 has 3 allocated tokens not yet committed
    assert snapshot(a) == before
    assert 3 not in a
    a.commit(2, 3)
    a.fork(2, 3)
    assert a.block_table(3).tolist() == [2]


def test_free_drops_pending_copies_nobody_holds():
    a = gnomon.BlockAllocator(8, BS)
    assert a.allocate(1, toks(100, 6), 6)
    a.commit(1, 6)
    a.fork(1, 2)
    a.fork(1, 3)
    assert a.allocate(2, [7], 1)  # copy 1 -> 2
    assert a.allocate(3, [8], 1)  # block 1 still shared by seqs 1 and 3: copy 1 -> 3
    assert a.block_table(2).tolist() == [0, 2]
    assert a.block_table(3).tolist() == [0, 3]
    assert [a.ref_count(b) for b in range(4)] == [3, 1, 1, 1]
    a.free(2)  # block 2 is free again: its pending copy goes; 3's stays
    assert a.free_queue().tolist() == [2, 4, 5, 6, 7]
    assert a.pending_copies() == [(1, 3)]

    assert a.allocate(4, toks(300, 6), 6)
    a.commit(4, 6)
    a.fork(4, 5)
    assert a.allocate(5, [1], 1)
    assert a.block_table(4).tolist() == [2, 4]
    assert a.block_table(5).tolist() == [2, 5]
    a.free(5)
    assert a.pending_copies() == []


# ---------------------------------------------------------------------------------------------
# Batch forms


def arr(values, dtype):
    return np.array(values, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_allocate_batch_and_commit_batch(dtype):
    a = gnomon.BlockAllocator(8, BS)
    for s, start in ((1, 100), (2, 200), (3, 300)):
        assert a.allocate(s, toks(start, 4), 4)
    assert [a.block_table(s).tolist() for s in (1, 2, 3)] == [[0], [1], [2]]
    a.commit_batch(arr([1, 2, 3], dtype), arr([4, 4, 4], dtype))
    assert [a.num_computed_tokens(s) for s in (1, 2, 3)] == [4, 4, 4]
    assert a.cached_blocks().tolist() == [0, 1, 2]

    # one decode step: each sequence one new token, processed in order
    n = a.allocate_batch(arr([3, 1, 2], dtype), arr([31, 11, 21], dtype), arr([1, 1, 1], dtype),
                         arr([1, 1, 1], dtype))
    assert n == 3
    assert [a.block_table(s).tolist() for s in (1, 2, 3)] == [[0, 4], [1, 5], [2, 3]]
    assert a.stats()["allocations"] == 6
    a.commit_batch(arr([1, 2, 3], dtype), arr([5, 5, 5], dtype))
    assert [a.num_computed_tokens(s) for s in (1, 2, 3)] == [5, 5, 5]
    assert a.free_queue().tolist() == [6, 7]

    # seq 1 fits, seq 2 does not; seq 3 (which would fit) is left untouched
    before3 = (a.block_table(3).tolist(), a.num_computed_tokens(3))
    stats = a.stats()
    n = a.allocate_batch(arr([1, 2, 3], dtype), arr([12, 22, 23, 32], dtype),
                         arr([1, 2, 1], dtype), arr([4, 8, 1], dtype))
    assert n == 1
    assert a.block_table(1).tolist() == [0, 4, 6]
    assert a.block_table(2).tolist() == [1, 5]
    assert (a.block_table(3).tolist(), a.num_computed_tokens(3)) == before3
    assert a.free_queue().tolist() == [7]
    s = a.stats()
    assert s["allocations"] == stats["allocations"] + 1
    assert s["failed_allocations"] == stats["failed_allocations"] + 1
    assert (s["queries"], s["hits"]) == (stats["queries"], stats["hits"])

    # the engine calls again for the rest
    n = a.allocate_batch(arr([3], dtype), arr([32], dtype), arr([1], dtype), arr([1], dtype))
    assert n == 1
    assert a.block_table(3).tolist() == [2, 3]
    # seq 2's failed tokens (22, 23) were not appended; 6 ids are known for seq 1 and 3
    a.commit_batch(arr([1, 3], dtype), arr([6, 6], dtype))
    assert a.lookup(toks(300, 4) + [31, 32, 0, 0, 1]) == 4  # block 3 not full
    assert a.allocate_batch(arr([], dtype), arr([], dtype), arr([], dtype), arr([], dtype)) == 0
    a.commit_batch(arr([], dtype), arr([], dtype))


def test_batch_arrays_may_mix_widths():
    a = gnomon.BlockAllocator(8, BS)
    assert a.allocate(1, toks(100, 4), 4)
    a.commit(1, 4)
    assert a.allocate_batch(arr([1], np.int64), arr([5], np.int32), arr([1], np.int64),
                            arr([1], np.int32)) == 1
    a.commit_batch(arr([1], np.int32), arr([5], np.int64))
    assert a.num_computed_tokens(1) == 5


def _batch_allocator():
    a = gnomon.BlockAllocator(8, BS)
    for s, start in ((1, 100), (2, 200)):
        assert a.allocate(s, toks(start, 6), 6)
        a.commit(s, 6)
    return a


I32 = np.int32
GOOD = dict(seq_ids=arr([1, 2], I32), new_token_ids=arr([7, 8], I32),
            new_token_counts=arr([1, 1], I32), num_new_tokens=arr([1, 1], I32))


def _with(**changes):
    args = dict(GOOD)
    args.update(changes)
    return args


BAD_ALLOCATE_BATCH = [
    ("unknown id", _with(seq_ids=arr([1, 99], I32)), KeyError, "seq_ids"),
    ("unknown first", _with(seq_ids=arr([99, 1], I32)), KeyError, "seq_ids"),
    ("duplicate id", _with(seq_ids=arr([1, 1], I32)), ValueError, "seq_ids"),
    ("short counts", _with(new_token_counts=arr([2], I32)), ValueError, "new_token_counts"),
    ("long num_new", _with(num_new_tokens=arr([1, 1, 1], I32)), ValueError, "num_new_tokens"),
    ("counts over", _with(new_token_counts=arr([1, 2], I32)), ValueError, "new_token_counts"),
    ("counts under", _with(new_token_counts=arr([0, 1], I32)), ValueError, "new_token_counts"),
    ("negative count", _with(new_token_counts=arr([3, -1], I32)), ValueError,
     "new_token_counts"),
    ("float ids", _with(seq_ids=arr([1, 2], np.float64)), TypeError, "seq_ids"),
    ("float tokens", _with(new_token_ids=arr([7, 8], np.float64)), TypeError, "new_token_ids"),
    ("float counts", _with(new_token_counts=arr([1, 1], np.float64)), TypeError,
     "new_token_counts"),
    ("float num_new", _with(num_new_tokens=arr([1, 1], np.float64)), TypeError,
     "num_new_tokens"),
    ("int16 tokens", _with(new_token_ids=arr([7, 8], np.int16)), TypeError, "new_token_ids"),
    ("uint32 ids", _with(seq_ids=arr([1, 2], np.uint32)), TypeError, "seq_ids"),
    ("2-D ids", _with(seq_ids=arr([[1, 2]], I32)), ValueError, "seq_ids"),
    ("2-D tokens", _with(new_token_ids=arr([[7], [8]], I32)), ValueError, "new_token_ids"),
    ("strided ids", _with(seq_ids=arr([1, 0, 2, 0], I32)[::2]), ValueError, "seq_ids"),
    ("strided num_new", _with(num_new_tokens=arr([1, 0, 1, 0], I32)[::2]), ValueError,
     "num_new_tokens"),
    ("float list ids", _with(seq_ids=[1.0, 2.0]), TypeError, "seq_ids"),
    ("bool list tokens", _with(new_token_ids=[True, 8]), TypeError, "new_token_ids"),
    ("str list counts", _with(new_token_counts=["1", 1]), TypeError, "new_token_counts"),
    ("huge list num_new", _with(num_new_tokens=(1, 2**70)), ValueError, "num_new_tokens"),
    ("set ids", _with(seq_ids={1, 2}), TypeError, "seq_ids"),
    ("unknown list id", _with(seq_ids=[1, 99]), KeyError, "seq_ids"),
]


def test_allocate_batch_takes_lists_and_tuples_as_arrays():
    by_array, by_list = _batch_allocator(), _batch_allocator()
    assert by_array.allocate_batch(**GOOD) == 2
    assert by_list.allocate_batch([1, 2], (7, 8), [1, 1], (1, 1)) == 2
    by_array.commit_batch(arr([1, 2], I32), arr([7, 7], I32))
    by_list.commit_batch((1, 2), [7, 7])
    assert snapshot(by_list) == snapshot(by_array)


@pytest.mark.parametrize("case, kwargs, error, arg", BAD_ALLOCATE_BATCH,
                         ids=[c[0] for c in BAD_ALLOCATE_BATCH])
def test_allocate_batch_rejections_change_nothing(case, kwargs, error, arg):
    a = _batch_allocator()
    before = snapshot(a)
    with pytest.raises(error, match=arg):
        a.allocate_batch(**kwargs)
    assert snapshot(a) == before
    # the allocator still works, and the rejected call marked nothing (no stale duplicates)
    assert a.allocate_batch(**GOOD) == 2
    assert a.block_table(1).tolist() == [0, 1] and a.block_table(2).tolist() == [2, 3]
    a.commit_batch(arr([1, 2], I32), arr([7, 7], I32))
    assert a.num_computed_tokens(1) == 7 and a.num_computed_tokens(2) == 7


BAD_COMMIT_BATCH = [
    ("unknown id", dict(seq_ids=arr([1, 99], I32)), KeyError, "seq_ids"),
    ("duplicate id", dict(seq_ids=arr([2, 2], I32)), ValueError, "seq_ids"),
    ("short counts", dict(num_computed_tokens=arr([10], I32)), ValueError,
     "num_computed_tokens"),
    ("beyond allocated", dict(num_computed_tokens=arr([10, 7], I32)), ValueError,
     "num_computed_tokens"),
    ("below computed", dict(num_computed_tokens=arr([10, 5], I32)), ValueError,
     "num_computed_tokens"),
    ("float", dict(num_computed_tokens=arr([10, 6], np.float64)), TypeError,
     "num_computed_tokens"),
    ("2-D", dict(seq_ids=arr([[1], [2]], I32)), ValueError, "seq_ids"),
    ("strided", dict(num_computed_tokens=arr([10, 0, 6, 0], I32)[::2]), ValueError,
     "num_computed_tokens"),
    ("float list", dict(seq_ids=[1, 2.5]), TypeError, "seq_ids"),
]


@pytest.mark.parametrize("case, changes, error, arg", BAD_COMMIT_BATCH,
                         ids=[c[0] for c in BAD_COMMIT_BATCH])
def test_commit_batch_rejections_change_nothing(case, changes, error, arg):
    a = _batch_allocator()
    assert a.allocate(1, toks(150, 4), 4)  # seq 1: 10 ids, 10 slots, 6 computed
    kwargs = dict(seq_ids=arr([1, 2], I32), num_computed_tokens=arr([10, 6], I32))
    kwargs.update(changes)
    before = snapshot(a)
    with pytest.raises(error, match=arg):
        a.commit_batch(**kwargs)
    assert snapshot(a) == before  # seq 1's valid entry was not applied either
    a.commit_batch(arr([1, 2], I32), arr([10, 6], I32))
    assert a.num_computed_tokens(1) == 10
    assert a.cached_blocks().tolist() == [0, 1, 2]


# ---------------------------------------------------------------------------------------------
# Inspection


def test_block_table_returns_a_new_int32_array():
    a = gnomon.BlockAllocator(8, BS)
    assert a.allocate(1, toks(100, 5), 5)
    t = a.block_table(1)
    assert t.dtype == np.int32 and t.ndim == 1 and t.tolist() == [0, 1]
    u = a.block_table(1)
    assert not np.shares_memory(t, u)
    t[0] = 7  # mutating the copy does not reach the allocator
    assert a.block_table(1).tolist() == [0, 1]
    assert a.ref_count(7) == 0
    a.commit(1, 5)
    assert a.allocate(1, toks(200, 8), 8)  # growth does not reach the old array
    assert a.block_table(1).tolist() == [0, 1, 2, 3]
    assert t.tolist() == [7, 1] and u.tolist() == [0, 1]
    q = a.free_queue()
    q[0] = 0
    assert a.free_queue().tolist() == [4, 5, 6, 7]


def test_properties_and_stats():
    a = gnomon.BlockAllocator(8, BS)
    assert (a.num_blocks, a.block_size, a.enable_prefix_caching, a.hash_bits) == (8, 4, True, 64)
    assert (a.num_free_blocks, a.num_cached_blocks, a.usage) == (8, 0, 0.0)
    s = a.stats()
    assert set(s) == STATS_KEYS and len(s) == 6
    assert s == {"queries": 0, "hits": 0, "hit_rate": 0.0, "allocations": 0,
                 "failed_allocations": 0, "evictions": 0}

    cache_prompt(a, 1, toks(100, 10))
    assert (a.num_free_blocks, a.num_cached_blocks) == (5, 2)
    assert a.usage == pytest.approx(3 / 8)
    a.free(1)
    assert (a.num_free_blocks, a.num_cached_blocks, a.usage) == (8, 2, 0.0)
    assert a.allocate(2, toks(100, 10), 2)
    assert (a.num_free_blocks, a.num_cached_blocks) == (5, 2)
    assert a.usage == pytest.approx(3 / 8)
    assert a.allocate(3, toks(300, 40), 40) is False
    s = a.stats()
    assert set(s) == STATS_KEYS
    assert s == {"queries": 20, "hits": 8, "hit_rate": pytest.approx(0.4), "allocations": 2,
                 "failed_allocations": 1, "evictions": 0}
    assert isinstance(s["hit_rate"], float)


def test_reset_prefix_cache():
    a = gnomon.BlockAllocator(8, BS)
    p = toks(100, 9)
    cache_prompt(a, 1, p)
    assert a.num_cached_blocks == 2
    before = snapshot(a)
    assert a.reset_prefix_cache() is False  # blocks in use
    assert snapshot(a) == before
    assert a.lookup(p) == 8
    a.free(1)
    assert a.free_queue().tolist() == [2, 3, 4, 5, 6, 7, 1, 0]
    assert a.reset_prefix_cache() is True
    assert a.num_cached_blocks == 0 and a.cached_blocks().tolist() == []
    assert a.lookup(p) == 0
    assert a.free_queue().tolist() == [2, 3, 4, 5, 6, 7, 1, 0]
    # re-using the formerly cached blocks is no eviction; admitting p again is a miss
    assert a.allocate(2, toks(500, 32), 32)
    assert a.block_table(2).tolist() == [2, 3, 4, 5, 6, 7, 1, 0]
    assert a.stats()["evictions"] == 0
    a.free(2)
    assert a.allocate(3, p, 9)
    assert a.num_computed_tokens(3) == 0


def test_prefix_caching_disabled():
    a = gnomon.BlockAllocator(8, BS, enable_prefix_caching=False)
    assert a.enable_prefix_caching is False
    p = toks(100, 9)
    assert a.allocate(1, p, 9)
    a.commit(1, 9)
    assert a.num_cached_blocks == 0 and a.cached_blocks().tolist() == []
    assert a.lookup(p) == 0 and a.lookup(p + [1]) == 0
    assert a.allocate(2, p, 9)
    assert a.block_table(2).tolist() == [3, 4, 5]
    assert a.num_computed_tokens(2) == 0
    a.commit(2, 9)
    a.free(1)  # nothing is cached: every block goes to the head, last block first
    assert a.free_queue().tolist() == [0, 1, 2, 6, 7]
    a.free(2)
    assert a.free_queue().tolist() == [3, 4, 5, 0, 1, 2, 6, 7]
    s = a.stats()
    assert s["hits"] == 0 and s["hit_rate"] == 0.0 and s["evictions"] == 0
    assert a.reset_prefix_cache() is True


# ---------------------------------------------------------------------------------------------
# block-table updates


def test_block_updates_report_the_table_then_only_what_changed():
    a = gnomon.BlockAllocator(16, 4)
    assert a.allocate(1, list(range(10)), 10)  # 3 blocks
    assert a.take_block_updates([1]) == [(True, ((0, 1, 2),), ((),))]  # one group: one entry
    assert a.take_block_updates([1]) == [(False, ((),), ((),))]
    a.commit(1, 10)
    assert a.allocate_batch([1], [10, 11, 12], [3], [3])  # 13 tokens: a 4th block
    assert a.take_block_updates([1]) == [(False, ((3,),), ((),))]
    a.commit(1, 13)
    a.fork(1, 2)  # the child is new to whoever reads the updates
    assert a.take_block_updates(np.array([2], np.int64)) == [(True, ((0, 1, 2, 3),), ((),))]
    # both write into the shared last block: the first gets a private copy, reported in place;
    # the second is then the block's only holder and keeps it
    assert a.allocate_batch([1, 2], [13, 14], [1, 1], [1, 1]) == 2
    (full1, (app1,), (rep1,)), (full2, (app2,), (rep2,)) = a.take_block_updates([1, 2])
    assert not full1 and not full2 and app1 == app2 == () and rep2 == ()
    assert rep1 == ((3, int(a.block_table(1)[3])),) and a.block_table(2)[3] == 3
    a.free(2)
    assert a.allocate(2, list(range(5)), 5)  # admitted again: reported in full again
    assert a.take_block_updates([2]) == [(True, (tuple(a.block_table(2).tolist()),), ((),))]


def test_block_updates_reject_unknown_and_duplicate_ids():
    a = gnomon.BlockAllocator(8, 4)
    assert a.allocate(1, [1, 2], 2)
    with pytest.raises(KeyError, match="seq_ids"):
        a.take_block_updates([1, 7])
    with pytest.raises(ValueError, match="seq_ids"):
        a.take_block_updates([1, 1])
    assert a.take_block_updates([1]) == [(True, ((0,),), ((),))]  # nothing was marked reported


# ---------------------------------------------------------------------------------------------
# step: commit + free + allocate in one call


def _step_allocator():
    a = _batch_allocator()  # sequences 1 and 2, 6 tokens each, committed
    assert a.allocate(3, toks(300, 5), 5)
    assert a.allocate_batch([1, 2], [7, 8], [1, 1], [1, 1]) == 2  # the step just computed
    return a


def test_step_equals_commit_free_allocate():
    fused, split = _step_allocator(), _step_allocator()
    fitted, updates = fused.step([1, 2], [7, 7], [3], [1, 2], [9, 10], [1, 1], [1, 1])
    split.commit_batch([1, 2], [7, 7])
    split.free(3)
    assert split.allocate_batch([1, 2], [9, 10], [1, 1], [1, 1]) == 2
    assert fitted == 2 and snapshot(fused) == snapshot(split)
    assert updates == split.take_block_updates([1, 2])
    assert fused.step([], [], [], [], [], [], []) == (0, [])


def test_step_commits_what_was_allocated_and_takes_one_int_for_every_sequence():
    # None commits each sequence up to its slots (what the forward computed); one int is the
    # same count for every sequence: the decode step's usual arguments, nothing packed
    short, full = _step_allocator(), _step_allocator()
    fitted, updates = short.step([1, 2], None, [3], [1, 2], [9, 10], 1, 1)
    assert (fitted, updates) == full.step([1, 2], [7, 7], [3], [1, 2], [9, 10], [1, 1], [1, 1])
    assert snapshot(short) == snapshot(full)
    assert [short.num_computed_tokens(s) for s in (1, 2)] == [7, 7]
    with pytest.raises(ValueError, match="new_token_counts"):  # 2 x 2 tokens, 2 given
        short.step([1, 2], None, [], [1, 2], [11, 12], 2, 1)
    with pytest.raises(TypeError, match="num_new_tokens"):
        short.step([1, 2], None, [], [1, 2], [11, 12], 1, True)
    assert snapshot(short) == snapshot(full)


def test_a_decode_steps_unchanged_reports_are_one_shared_tuple():
    a = gnomon.BlockAllocator(64, 4)
    for seq_id in (1, 2, 3):
        assert a.admit(seq_id, toks(10 * seq_id, 5), 5, 5) == 0
    fitted, first = a.step([], None, [], [1, 2, 3], [7, 7, 7], 1, 1)
    assert fitted == 3 and all(full for full, _, _ in first)
    fitted, later = a.step([1, 2, 3], None, [], [1, 2, 3], [8, 8, 8], 1, 1)  # 7 tokens: no block
    assert later == [(False, ((),), ((),))] * 3 and later[0] is later[1] is later[2]


def test_admit_is_lookup_and_allocate_in_one_call():
    one, two = _batch_allocator(), _batch_allocator()
    prompt = toks(100, 4) + toks(400, 9)  # sequence 1's first block, then its own
    cached = two.lookup(prompt)
    assert cached == 4
    assert two.allocate(5, prompt, min(len(prompt) - 1 - cached, 3))
    assert one.admit(5, prompt, len(prompt) - 1, 3) == cached
    assert snapshot(one) == snapshot(two)
    # a prompt cached up to its last block: the hit, and no new token past the target
    seq = toks(100, 6)  # sequence 1's own six tokens, committed: one full block of 4 cached
    assert one.lookup(seq) == 4 and one.admit(6, seq, 4, 10) == 4
    assert one.num_computed_tokens(6) == 4
    assert one.block_table(6).tolist()[0] == one.block_table(1).tolist()[0]
    full = gnomon.BlockAllocator(2, 4)
    assert full.admit(1, toks(0, 8), 8, 8) == 0
    before = snapshot(full)
    assert full.admit(2, toks(50, 4), 4, 4) == -1  # no free block: nothing changes but the count
    assert full.stats()["failed_allocations"] == 1
    for args, arg in [((1, toks(0, 4), 4, 4), "already present"), ((3, [], 1, 1), "target"),
                      ((3, toks(0, 4), -1, 1), "target"),
                      ((3, toks(0, 4), 5, 1), "target"), ((3, toks(0, 4), 4, -1),
                                                          "max_new_tokens")]:
        with pytest.raises(ValueError, match=arg):
            full.admit(*args)


BAD_STEP = [
    ("unknown commit", dict(commit_seq_ids=[1, 9]), KeyError, "commit_seq_ids"),
    ("commit too far", dict(num_computed_tokens=[7, 12]), ValueError, "num_computed_tokens"),
    ("short computed", dict(num_computed_tokens=[7]), ValueError, "num_computed_tokens"),
    ("free twice", dict(free_seq_ids=[3, 3]), ValueError, "free_seq_ids"),
    ("unknown free", dict(free_seq_ids=[5]), KeyError, "free_seq_ids"),
    ("freed and allocated", dict(free_seq_ids=[2]), ValueError, "also in free_seq_ids"),
    ("bad counts", dict(new_token_counts=[1, 2]), ValueError, "new_token_counts"),
    ("negative num_new", dict(num_new_tokens=[1, -1]), ValueError, "num_new_tokens"),
    ("float ids", dict(seq_ids=[1.0, 2]), TypeError, "seq_ids"),
]


@pytest.mark.parametrize("case, changes, error, arg", BAD_STEP, ids=[c[0] for c in BAD_STEP])
def test_step_rejections_change_nothing(case, changes, error, arg):
    a = _step_allocator()
    args = dict(commit_seq_ids=[1, 2], num_computed_tokens=[7, 7], free_seq_ids=[3],
                seq_ids=[1, 2], new_token_ids=[9, 10], new_token_counts=[1, 1],
                num_new_tokens=[1, 1])
    before = snapshot(a)
    with pytest.raises(error, match=arg):
        a.step(**{**args, **changes})
    assert snapshot(a) == before
    assert a.step(**args)[0] == 2  # still works, nothing half-marked
