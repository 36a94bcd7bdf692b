"""The KV-cache manager: sizing, and the allocator calls the scheduler makes.

All block bookkeeping (ref counts, the free queue, prefix-cache hashes, copy-on-write) lives in
the C++ `gnomon.BlockAllocator`; this module keeps none of its own. It sizes the cache and turns
the scheduler's per-step lists into the numpy arrays the allocator's batch calls take.

Sizing: one block holds ``block_size`` tokens of K and V for every layer, so
``bytes_per_block = 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_size``.
The cache is sized by a block count (``num_kv_blocks``) or by a memory budget in bytes
(``kv_cache_bytes``), never both.

gpt-oss: its sliding-window layers keep full KV in this first version. There is no hybrid
allocator yet, so every layer (sliding or full) holds a block for every token and the cache is
sized as if all layers were full attention. A sliding-window layer's blocks past its window are
not reclaimed.
"""

from __future__ import annotations

from typing import Optional, Sequence as Seq, Tuple

import numpy as np

from .. import _C


def _positive_int(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


def kv_bytes_per_block(*, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype_size: int) -> int:
    """Bytes of K and V one block holds across all layers (full KV on every layer)."""
    return (2 * _positive_int("num_layers", num_layers) * _positive_int("block_size", block_size)
            * _positive_int("num_kv_heads", num_kv_heads) * _positive_int("head_dim", head_dim)
            * _positive_int("dtype_size", dtype_size))


def resolve_num_blocks(*, num_kv_blocks: Optional[int] = None,
                       kv_cache_bytes: Optional[int] = None, bytes_per_block: int) -> int:
    """The block count from exactly one of ``num_kv_blocks`` and ``kv_cache_bytes``."""
    if (num_kv_blocks is None) == (kv_cache_bytes is None):
        raise ValueError("num_kv_blocks / kv_cache_bytes: give exactly one of them, got "
                         f"num_kv_blocks={num_kv_blocks!r}, kv_cache_bytes={kv_cache_bytes!r}")
    if num_kv_blocks is not None:
        return _positive_int("num_kv_blocks", num_kv_blocks)
    budget = _positive_int("kv_cache_bytes", kv_cache_bytes)
    per_block = _positive_int("bytes_per_block", bytes_per_block)
    if budget < per_block:
        raise ValueError(f"kv_cache_bytes: {budget} bytes hold no block of {per_block} bytes; "
                         f"expected at least {per_block}")
    return budget // per_block


class KVCacheManager:
    """One `gnomon.BlockAllocator` and the calls the scheduler makes on it."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        if not isinstance(enable_prefix_caching, bool):
            raise ValueError("enable_prefix_caching: expected a bool, "
                             f"got {enable_prefix_caching!r}")
        self.allocator = _C.BlockAllocator(_positive_int("num_blocks", num_blocks),
                                           _positive_int("block_size", block_size),
                                           enable_prefix_caching)

    @classmethod
    def from_budget(cls, *, num_layers: int, num_kv_heads: int, head_dim: int, dtype_size: int,
                    block_size: int = 16, num_kv_blocks: Optional[int] = None,
                    kv_cache_bytes: Optional[int] = None,
                    enable_prefix_caching: bool = True) -> "KVCacheManager":
        per_block = kv_bytes_per_block(num_layers=num_layers, block_size=block_size,
                                       num_kv_heads=num_kv_heads, head_dim=head_dim,
                                       dtype_size=dtype_size)
        n = resolve_num_blocks(num_kv_blocks=num_kv_blocks, kv_cache_bytes=kv_cache_bytes,
                               bytes_per_block=per_block)
        return cls(n, block_size, enable_prefix_caching)

    # sizes
    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def block_size(self) -> int:
        return self.allocator.block_size

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    @property
    def usage(self) -> float:
        return self.allocator.usage

    def stats(self) -> dict:
        return self.allocator.stats()

    # admission
    def lookup(self, token_ids: Seq[int]) -> int:
        """Leading tokens with cached KV (whole blocks, at least one token left to compute)."""
        return self.allocator.lookup(token_ids)

    def allocate_new(self, seq_id: int, token_ids: Seq[int], num_new_tokens: int) -> bool:
        """Admit a sequence: claim its cached prefix, then slots for ``num_new_tokens`` more."""
        return self.allocator.allocate(seq_id, token_ids, num_new_tokens)

    # running sequences, once per step
    def allocate_running(self, seq_ids: Seq[int], new_token_ids: Seq[int],
                         new_token_counts: Seq[int], num_new_tokens: Seq[int]) -> int:
        """`allocate_batch`: how many leading sequences got their slots (each all or nothing).
        The arguments are lists or arrays of ints."""
        return self.allocator.allocate_batch(seq_ids, new_token_ids, new_token_counts,
                                             num_new_tokens)

    def commit_running(self, seq_ids: Seq[int], num_computed_tokens: Seq[int]) -> None:
        self.allocator.commit_batch(seq_ids, num_computed_tokens)

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        self.allocator.fork(parent_seq_id, child_seq_id)

    def free(self, seq_id: int) -> None:
        self.allocator.free(seq_id)

    def block_table(self, seq_id: int) -> Tuple[int, ...]:
        """The whole table, as a tuple (O(table); the step loop uses `take_block_updates`)."""
        return tuple(self.allocator.block_table(seq_id).tolist())

    def take_block_updates(self, seq_ids: Seq[int]) -> list:
        """Per sequence ``(full, appended ids, replaced (index, id) pairs)`` since its previous
        report (`BlockAllocator.take_block_updates`)."""
        return self.allocator.take_block_updates(seq_ids)

    def num_computed_tokens(self, seq_id: int) -> int:
        return self.allocator.num_computed_tokens(seq_id)

    def pending_copies(self) -> Tuple[Tuple[int, int], ...]:
        return tuple(self.allocator.pending_copies())

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.allocator

    def __repr__(self) -> str:
        return f"KVCacheManager({self.allocator!r})"
