"""Bad input to gnomon.BlockAllocator: each raises ValueError, KeyError or TypeError naming the
argument, and none leaves a partial change behind.

The allocator is first brought into a state with cached free blocks, running and forked sequences
and a shared partial block, so that a partial change would show. These tests do not import torch.
"""

import numpy as np
import pytest

import gnomon
from allocator.snapshot import snapshot

BS = 4
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


@pytest.fixture
def a():
    """Seq 1: 9 tokens, 6 computed. Seq 2: a fork of seq 3 (6 tokens, all computed).
    Blocks of a freed sequence sit cached in the free queue."""
    al = gnomon.BlockAllocator(16, BS)
    assert al.allocate(9, list(range(500, 509)), 9)
    al.commit(9, 9)
    al.free(9)
    assert al.allocate(1, list(range(100, 109)), 9)
    al.commit(1, 6)
    assert al.allocate(3, list(range(300, 306)), 6)
    al.commit(3, 6)
    al.fork(3, 2)
    assert al.num_cached_blocks == 4
    assert al.pending_copies() == []
    return al


def check_unchanged(a, call, error, arg):
    before = snapshot(a)
    with pytest.raises(error, match=arg):
        call()
    assert snapshot(a) == before
    assert a.pending_copies() == []


def check_still_works(a):
    """After rejected calls the allocator goes on as if they never happened."""
    assert a.allocate(1, [], 3)
    a.commit(1, 9)
    assert a.allocate(2, [7], 1)  # copy-on-write of the shared partial block
    assert len(a.pending_copies()) == 1
    a.commit(2, 7)
    for s in (1, 2, 3):
        a.free(s)
    assert a.num_free_blocks == a.num_blocks


# ---------------------------------------------------------------------------------------------
# Unknown sequence ids


@pytest.mark.parametrize("method, args, arg", [
    ("commit", (42, 0), "seq_id"),
    ("free", (42,), "seq_id"),
    ("fork", (42, 43), "parent_seq_id"),
    ("block_table", (42,), "seq_id"),
    ("num_computed_tokens", (42,), "seq_id"),
])
def test_unknown_sequence_id(a, method, args, arg):
    check_unchanged(a, lambda: getattr(a, method)(*args), KeyError, arg)
    assert 42 not in a and 43 not in a
    check_still_works(a)


def test_free_twice(a):
    a.free(1)
    check_unchanged(a, lambda: a.free(1), KeyError, "seq_id")


def test_fork_into_a_present_id(a):
    check_unchanged(a, lambda: a.fork(3, 1), ValueError, "child_seq_id")
    check_unchanged(a, lambda: a.fork(3, 3), ValueError, "child_seq_id")
    check_still_works(a)


def test_fork_of_a_parent_with_uncommitted_tokens(a):
    check_unchanged(a, lambda: a.fork(1, 5), ValueError, "parent_seq_id")
    assert 5 not in a
    check_still_works(a)


# ---------------------------------------------------------------------------------------------
# Constructor


@pytest.mark.parametrize("kwargs, arg", [
    pytest.param(dict(num_blocks=0), "num_blocks", id="num_blocks=0"),
    pytest.param(dict(num_blocks=-1), "num_blocks", id="num_blocks=-1"),
    pytest.param(dict(num_blocks=2**40), "num_blocks", id="num_blocks=2**40"),
    pytest.param(dict(num_blocks=4, block_size=0), "block_size", id="block_size=0"),
    pytest.param(dict(num_blocks=4, block_size=-16), "block_size", id="block_size=-16"),
    pytest.param(dict(num_blocks=4, hash_bits=0), "hash_bits", id="hash_bits=0"),
    # Regression (found under UBSan): the constructor once computed its key mask, 1 << hash_bits,
    # before checking hash_bits, so a negative value shifted by a negative amount.
    pytest.param(dict(num_blocks=4, hash_bits=-1), "hash_bits", id="hash_bits=-1"),
    pytest.param(dict(num_blocks=4, hash_bits=65), "hash_bits", id="hash_bits=65"),
])
def test_bad_constructor_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        gnomon.BlockAllocator(**kwargs)


@pytest.mark.parametrize("hash_bits", [1, 64])
def test_hash_bits_bounds_are_accepted(hash_bits):
    assert gnomon.BlockAllocator(4, hash_bits=hash_bits).hash_bits == hash_bits
    assert gnomon.BlockAllocator(1, 1).num_blocks == 1


# ---------------------------------------------------------------------------------------------
# Token ids


OUT_OF_RANGE = {
    "max+1": [1, 2, INT32_MAX + 1],
    "min-1": [INT32_MIN - 1, 2],
    "2**62": [5, 2**62],
    "2**70": [2**70],
    "-(2**70)": [-(2**70)],
}
TOKEN_CASES = []
for name, values in OUT_OF_RANGE.items():
    TOKEN_CASES += [pytest.param(values, id=f"list {name}"),
                    pytest.param(tuple(values), id=f"tuple {name}")]
    if all(abs(v) < 2**63 for v in values):
        TOKEN_CASES.append(pytest.param(np.array(values, np.int64), id=f"int64 array {name}"))


@pytest.mark.parametrize("ids", TOKEN_CASES)
def test_token_ids_outside_int32(a, ids):
    check_unchanged(a, lambda: a.allocate(7, ids, 3), ValueError, "new_token_ids")  # a new seq
    assert 7 not in a
    check_unchanged(a, lambda: a.allocate(1, ids, 3), ValueError, "new_token_ids")  # running
    check_unchanged(a, lambda: a.allocate(2, ids, 3), ValueError, "new_token_ids")  # would CoW
    check_unchanged(a, lambda: a.lookup(ids), ValueError, "token_ids")
    check_still_works(a)


def test_token_ids_at_the_int32_bounds_are_accepted():
    a = gnomon.BlockAllocator(4, BS)
    ids = [INT32_MIN, INT32_MAX, 0, -1, 5]
    assert a.lookup(ids) == 0
    assert a.allocate(1, ids, 5)
    a.commit(1, 5)
    assert a.lookup(np.array(ids, np.int64)) == 4
    assert a.allocate(1, np.array([INT32_MAX], np.int64), 1)


@pytest.mark.parametrize("bad", [INT32_MAX + 1, INT32_MIN - 1, 2**62])
def test_allocate_batch_token_ids_outside_int32(a, bad):
    # Entry 0 alone would fit; the bad id is in entry 1: nothing may be applied.
    call = lambda: a.allocate_batch(np.array([1, 2], np.int64), np.array([7, 8, bad], np.int64),
                                    np.array([1, 2], np.int64), np.array([3, 3], np.int64))
    check_unchanged(a, call, ValueError, "new_token_ids")
    check_still_works(a)


@pytest.mark.parametrize("ids", ["abc", b"abc", "", 3, 3.0, None, [1, 2.0], [1, "2"],
                                 np.array([1.0, 2.0])], ids=repr)
def test_token_ids_of_the_wrong_type(a, ids):
    check_unchanged(a, lambda: a.allocate(7, ids, 1), TypeError, "new_token_ids")
    check_unchanged(a, lambda: a.allocate(1, ids, 1), TypeError, "new_token_ids")
    check_unchanged(a, lambda: a.lookup(ids), TypeError, "token_ids")
    assert 7 not in a
    check_still_works(a)


# ---------------------------------------------------------------------------------------------
# num_new_tokens


@pytest.mark.parametrize("seq_id", [1, 2, 7], ids=["running", "forked", "new"])
@pytest.mark.parametrize("n", [-1, -(2**40)])
def test_negative_num_new_tokens(a, seq_id, n):
    check_unchanged(a, lambda: a.allocate(seq_id, [5], n), ValueError, "num_new_tokens")
    assert 7 not in a
    check_still_works(a)


def test_negative_num_new_tokens_in_a_batch(a):
    call = lambda: a.allocate_batch(np.array([1, 2], np.int32), np.array([7, 8], np.int32),
                                    np.array([1, 1], np.int32), np.array([3, -1], np.int32))
    check_unchanged(a, call, ValueError, "num_new_tokens")
    check_still_works(a)


# ---------------------------------------------------------------------------------------------
# commit


def test_commit_beyond_what_was_allocated(a):
    check_unchanged(a, lambda: a.commit(1, 10), ValueError, "num_computed_tokens")
    check_unchanged(a, lambda: a.commit(3, 7), ValueError, "num_computed_tokens")
    check_unchanged(a, lambda: a.commit(1, 2**40), ValueError, "num_computed_tokens")
    # slots allocated beyond the token ids known: still no commit past the known ids
    assert a.allocate(1, [], 7)
    assert a.block_table(1).tolist() == [2, 3, 4, 7]
    check_unchanged(a, lambda: a.commit(1, 10), ValueError, "num_computed_tokens")
    check_still_works(a)


def test_commit_below_the_computed_count(a):
    check_unchanged(a, lambda: a.commit(1, 5), ValueError, "num_computed_tokens")
    check_unchanged(a, lambda: a.commit(1, -1), ValueError, "num_computed_tokens")
    a.commit(1, 6)  # the same count again is fine
    check_still_works(a)


def test_commit_batch_beyond_allocated_applies_nothing(a):
    call = lambda: a.commit_batch(np.array([1, 3], np.int64), np.array([9, 7], np.int64))
    check_unchanged(a, call, ValueError, "num_computed_tokens")
    assert a.num_computed_tokens(1) == 6
    check_still_works(a)


# ---------------------------------------------------------------------------------------------
# ref_count, extra_key


@pytest.mark.parametrize("block_id", [-1, 16, 2**40, -(2**40)])
def test_ref_count_of_an_out_of_range_block(a, block_id):
    check_unchanged(a, lambda: a.ref_count(block_id), ValueError, "block_id")


@pytest.mark.parametrize("extra_key", [2**64, -(2**63) - 1, 2**100])
def test_extra_key_out_of_range(a, extra_key):
    check_unchanged(a, lambda: a.allocate(7, [1, 2, 3], 3, extra_key), ValueError, "extra_key")
    check_unchanged(a, lambda: a.allocate(1, [1], 1, extra_key=extra_key), ValueError,
                    "extra_key")
    check_unchanged(a, lambda: a.lookup([1, 2, 3, 4, 5], extra_key), ValueError, "extra_key")
    assert 7 not in a
    check_still_works(a)


@pytest.mark.parametrize("extra_key", [0, 2**64 - 1, -(2**63), 2**63])
def test_extra_key_bounds_are_accepted(extra_key):
    a = gnomon.BlockAllocator(4, BS)
    assert a.allocate(1, list(range(5)), 5, extra_key)
    a.commit(1, 5)
    assert a.lookup(list(range(5)), extra_key) == 4
