"""The KV-cache manager: groups, sizing, and the allocator calls the scheduler makes.

All block bookkeeping (ref counts, the free queue, prefix-cache hashes, copy-on-write, window
releases) lives in the C++ `gnomon.BlockAllocator`; this module keeps none of its own. It sizes
the cache and hands the scheduler's per-step lists to the allocator's batch calls.

KV-cache groups (`KVCacheGroups`): layers that attend alike share one block table. A model with
no sliding layers has one full-attention group. gpt-oss has two, its full layers and its
128-token sliding layers: the sliding group keeps only the blocks its window still sees. As in
vLLM's hybrid KV-cache manager, all groups hold the same number of layers and share one pool:
layer ``j`` of every group reads and writes the same K/V tensor pair
``[num_blocks, block_size, num_kv_heads, head_dim]``, each through its own group's table, since
a block belongs to one group at a time.

Sizing: one block holds ``block_size`` tokens of K and V for the layers of one group, so
``bytes_per_block = 2 * layers_per_group * block_size * num_kv_heads * head_dim * dtype_size``.
The cache is sized by a block count (``num_kv_blocks``) or by a memory budget in bytes
(``kv_cache_bytes``), never both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence as Seq, Tuple

import numpy as np

from .. import _C


def _positive_int(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


def kv_bytes_per_block(*, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype_size: int) -> int:
    """Bytes of K and V one block holds across `num_layers` layers."""
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


@dataclass(frozen=True)
class KVCacheGroups:
    """The KV-cache groups of a model: per group its sliding window (None for full attention)
    and its layers, in order. Every layer is in exactly one group, and every group holds the
    same number of layers (module docstring)."""

    windows: Tuple[Optional[int], ...]
    layers: Tuple[Tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.windows or len(self.windows) != len(self.layers):
            raise ValueError(f"groups: expected one window per layer group and at least one, got "
                             f"windows {self.windows} for layers {self.layers}")
        for w in self.windows:
            if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
                raise ValueError(f"groups: a window must be None or an int >= 1, got {w!r}")
        counts = {len(layers) for layers in self.layers}
        if len(counts) != 1 or 0 in counts:
            raise ValueError(f"groups: every KV-cache group must hold the same number of layers "
                             f"(they share one tensor per position), got "
                             f"{[len(g) for g in self.layers]} layers for windows {self.windows}")
        flat = sorted(i for layers in self.layers for i in layers)
        if flat != list(range(len(flat))):
            raise ValueError(f"groups: every layer must be in exactly one group, got {self.layers}")

    @classmethod
    def full(cls, num_layers: int) -> "KVCacheGroups":
        """One full-attention group of every layer: the plain cache."""
        return cls((None,), (tuple(range(_positive_int("num_layers", num_layers))),))

    @property
    def layers_per_group(self) -> int:
        return len(self.layers[0])

    def slot_of(self, layer: int) -> Tuple[int, int]:
        """``(group, position)`` of a layer: its table, and the shared K/V tensor it uses."""
        for g, layers in enumerate(self.layers):
            if layer in layers:
                return g, layers.index(layer)
        raise ValueError(f"layer: {layer} is in no KV-cache group")

    def bytes_per_block(self, *, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype_size: int) -> int:
        return kv_bytes_per_block(num_layers=self.layers_per_group, block_size=block_size,
                                  num_kv_heads=num_kv_heads, head_dim=head_dim,
                                  dtype_size=dtype_size)


def max_blocks_held(windows: Seq[Optional[int]], num_tokens: int, *, block_size: int,
                    max_step_tokens: int) -> int:
    """The most blocks one sequence of `num_tokens` tokens holds at once over groups with these
    windows, when a step computes at most `max_step_tokens` of its tokens: a full group one
    per `block_size` tokens; a sliding group at most those its window and one step span,
    ``ceil((window + max_step_tokens) / block_size) + 1``."""
    table = -(-num_tokens // block_size)
    return sum(table if w is None else min(table, -(-(w + max_step_tokens) // block_size) + 1)
               for w in windows)


class KVCacheManager:
    """One `gnomon.BlockAllocator` and the calls the scheduler makes on it. `windows` has one
    entry per KV-cache group (`KVCacheGroups.windows`); the default is one full group."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 windows: Seq[Optional[int]] = (None,)):
        if not isinstance(enable_prefix_caching, bool):
            raise ValueError("enable_prefix_caching: expected a bool, "
                             f"got {enable_prefix_caching!r}")
        self.allocator = _C.BlockAllocator(_positive_int("num_blocks", num_blocks),
                                           _positive_int("block_size", block_size),
                                           enable_prefix_caching, groups=tuple(windows))
        self._failed: Optional[int] = None  # the sequence whose admission last did not fit

    @classmethod
    def from_budget(cls, *, groups: KVCacheGroups, num_kv_heads: int, head_dim: int,
                    dtype_size: int, block_size: int = 16, num_kv_blocks: Optional[int] = None,
                    kv_cache_bytes: Optional[int] = None,
                    enable_prefix_caching: bool = True) -> "KVCacheManager":
        per_block = groups.bytes_per_block(block_size=block_size, num_kv_heads=num_kv_heads,
                                           head_dim=head_dim, dtype_size=dtype_size)
        n = resolve_num_blocks(num_kv_blocks=num_kv_blocks, kv_cache_bytes=kv_cache_bytes,
                               bytes_per_block=per_block)
        return cls(n, block_size, enable_prefix_caching, groups.windows)

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

    @property
    def windows(self) -> Tuple[Optional[int], ...]:
        return self.allocator.groups

    def stats(self) -> dict:
        return self.allocator.stats()

    @property
    def blocks_in_use(self) -> Tuple[int, ...]:
        """Blocks each group's tables hold now."""
        return self.allocator.blocks_in_use

    def group_stats(self) -> list:
        """Per group: window, blocks_in_use, cached_blocks, evictions, released."""
        return self.allocator.group_stats()

    def max_blocks(self, num_tokens: int, max_step_tokens: int) -> int:
        """The most blocks a sequence of `num_tokens` tokens holds at once
        (`max_blocks_held`): whether it can ever fit the cache alone."""
        return max_blocks_held(self.windows, num_tokens, block_size=self.block_size,
                               max_step_tokens=max_step_tokens)

    # admission
    def admit(self, seq_id: int, token_ids: Seq[int], target: int, max_new_tokens: int) -> int:
        """Lookup and allocation in one call: claim the cached prefix, then slots for
        ``min(target - cached, max_new_tokens)`` more; the cached tokens, or -1 where they do
        not fit (nothing changes). A waiting sequence's tokens do not change while it waits, so
        the admission that last did not fit is retried without them (the allocator keeps
        them, and answers at once while it can tell they still do not fit)."""
        retry = seq_id == self._failed
        cached = self.allocator.admit(seq_id, None if retry else token_ids, target,
                                      max_new_tokens)
        self._failed = seq_id if cached < 0 else None
        return cached

    # running sequences, once per step
    def allocate_running(self, seq_ids: Seq[int], new_token_ids: Seq[int],
                         new_token_counts: Seq[int], num_new_tokens: Seq[int]) -> int:
        """`allocate_batch`: how many leading sequences got their slots (each all or nothing).
        The arguments are lists or arrays of ints."""
        return self.allocator.allocate_batch(seq_ids, new_token_ids, new_token_counts,
                                             num_new_tokens)

    def commit_running(self, seq_ids: Seq[int], num_computed_tokens: Seq[int]) -> None:
        self.allocator.commit_batch(seq_ids, num_computed_tokens)

    def step(self, commit_seq_ids, num_computed_tokens, free_seq_ids, seq_ids, new_token_ids,
             new_token_counts, num_new_tokens) -> Tuple[int, list]:
        """One call for a step's allocator work (`BlockAllocator.step`): commit, free, then
        allocate; how many leading `seq_ids` got their slots, and their block-table reports."""
        return self.allocator.step(commit_seq_ids, num_computed_tokens, free_seq_ids, seq_ids,
                                   new_token_ids, new_token_counts, num_new_tokens)

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        self.allocator.fork(parent_seq_id, child_seq_id)

    def free(self, seq_id: int) -> None:
        self.allocator.free(seq_id)

    def block_table(self, seq_id: int, group: int = 0) -> Tuple[int, ...]:
        """One group's whole table, as a tuple (O(table); the step loop uses
        `take_block_updates`). -1 marks a block a sliding window released."""
        return tuple(self.allocator.block_table(seq_id, group).tolist())

    def take_block_updates(self, seq_ids: Seq[int]) -> list:
        """Per sequence ``(full, appended ids per group, replaced (index, id) pairs per group)``
        since its previous report (`BlockAllocator.take_block_updates`)."""
        return self.allocator.take_block_updates(seq_ids)

    def num_computed_tokens(self, seq_id: int) -> int:
        return self.allocator.num_computed_tokens(seq_id)

    def pending_copies(self) -> Tuple[Tuple[int, int], ...]:
        return tuple(self.allocator.pending_copies())

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.allocator

    def __repr__(self) -> str:
        return f"KVCacheManager({self.allocator!r})"
