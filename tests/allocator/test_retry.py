"""`BlockAllocator.admit(seq_id, None, ...)`: retrying the last admission that did not fit.

A retry gives the answer a fresh admit with the same token ids would (the stateful machine
checks that against the reference model over random workloads); these scenarios pin the cases
its shortcut must get right by hand: the bound that answers -1 at once, a hit that grows
because a block of the prompt's chain entered the cache after the failure, and the errors.
These tests do not import torch: they also run against the AddressSanitizer build.
"""

import pytest

import gnomon
from allocator.snapshot import snapshot

BS = 4


def toks(start, n):
    return list(range(start, start + n))


def test_a_retry_fails_while_too_few_blocks_are_free_and_fits_once_they_are():
    a = gnomon.BlockAllocator(8, BS)
    assert a.admit(1, toks(0, 24), 24, 24) == 0  # 6 of the 8 blocks
    prompt = toks(100, 20)  # 5 blocks
    assert a.admit(2, prompt, 20, 20) == -1
    before = snapshot(a)
    assert a.admit(2, None, 20, 20) == -1  # still 2 free: answered without the prompt
    after = snapshot(a)
    assert after["stats"]["failed_allocations"] == before["stats"]["failed_allocations"] + 1
    after["stats"]["failed_allocations"] = before["stats"]["failed_allocations"]
    assert after == before  # nothing else changed
    assert a.admit(2, None, 20, 8) == 0  # a smaller budget fits in the 2 free blocks
    assert a.block_table(2).tolist() and a.num_computed_tokens(2) == 0
    a.free(2)
    a.free(1)
    assert a.admit(3, prompt, 20, 20) == 0  # an admit that fits forgets the failed one
    with pytest.raises(ValueError, match="there is none"):
        a.admit(4, None, 20, 20)


def test_a_retry_finds_the_blocks_of_its_prompt_cached_since_it_failed():
    """The failed admission saw no cached prefix; then a running sequence with the same prefix
    committed two full blocks. With that hit the retry needs one fresh block where two are
    free, so it fits, as a fresh admit does, though its failure's hit alone said it could not."""
    prefix = toks(0, 8)
    a = gnomon.BlockAllocator(6, BS)
    assert a.admit(1, prefix + [50], 9, 9) == 0  # 3 blocks, nothing committed yet
    assert a.admit(9, toks(200, 4), 4, 4) == 0  # 1 more: 2 free
    prompt = prefix + toks(60, 4)  # 3 blocks
    assert a.admit(2, prompt, 12, 12) == -1
    a.commit(1, 9)  # its two full blocks enter the cache (still held by it)
    fresh = gnomon.BlockAllocator(6, BS)
    assert fresh.admit(1, prefix + [50], 9, 9) == 0 and fresh.admit(9, toks(200, 4), 4, 4) == 0
    fresh.commit(1, 9)
    assert fresh.admit(2, prompt, 12, 12) == 8
    assert a.admit(2, None, 12, 12) == 8
    assert a.block_table(2).tolist() == fresh.block_table(2).tolist()
    assert snapshot(a)["stats"]["hits"] == snapshot(fresh)["stats"]["hits"]


@pytest.mark.parametrize("seq_id, extra_key, target, match", [
    (3, 0, 20, "which was of sequence 2, not 3"),
    (2, 5, 20, "extra_key: a retry .* keeps the failed admission's 0, got 5"),
    (2, 0, 21, "target: expected 0 <= target <= len"),
])
def test_a_bad_retry_is_refused_by_name_and_changes_nothing(seq_id, extra_key, target, match):
    a = gnomon.BlockAllocator(4, BS)
    assert a.admit(2, toks(0, 20), 20, 20) == -1
    before = snapshot(a)
    with pytest.raises(ValueError, match=match):
        a.admit(seq_id, None, target, 20, extra_key)
    assert snapshot(a) == before
    assert a.admit(2, None, 16, 16) == 0  # the failed admission is still there to retry
