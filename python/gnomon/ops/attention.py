"""reshape_and_cache and paged_attention over the paged KV cache.

The cache layout is fixed (DESIGN.md): K and V are each [num_blocks, block_size, num_kv_heads,
head_dim], and a token's slot is ``block_id * block_size + offset``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from gnomon import _C
from gnomon.ops._tensor import (FLOATING, call, check_same_device, check_tensor, custom_op,
                                follow_torch_threads, view)


@custom_op("reshape_and_cache", mutates_args=("key_cache", "value_cache"))
def _reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    follow_torch_threads()
    _C.reshape_and_cache(view(key), view(value), view(key_cache), view(value_cache),
                         view(slot_mapping))


@_reshape_and_cache.register_fake
def _(key, value, key_cache, value_cache, slot_mapping):
    return None


def _check_caches(key_cache, value_cache, dtype) -> None:
    check_tensor(key_cache, "key_cache", dtypes=(dtype,), dim=4)
    check_tensor(value_cache, "value_cache", dtypes=(dtype,), shape=tuple(key_cache.shape))
    if key_cache.shape[1] < 1 or key_cache.shape[2] < 1:
        raise ValueError(f"key_cache: block_size and num_kv_heads (dims 1 and 2) must be >= 1, "
                         f"got shape {tuple(key_cache.shape)}")


def _check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    check_tensor(key, "key", dtypes=FLOATING, dim=3, layout="rows")
    check_tensor(value, "value", dtypes=(key.dtype,), shape=tuple(key.shape), layout="rows")
    _check_caches(key_cache, value_cache, key.dtype)
    if tuple(key_cache.shape[2:]) != tuple(key.shape[1:]):
        raise ValueError(f"key_cache: expected shape (*, *, {key.shape[1]}, {key.shape[2]}) to "
                         f"match key's heads and head dim, got {tuple(key_cache.shape)}")
    check_tensor(slot_mapping, "slot_mapping", dtypes=(torch.int64,), shape=(key.shape[0],))
    check_same_device(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                      slot_mapping=slot_mapping)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Writes token t's `key`/`value` rows [T, Hkv, D] into the caches at ``slot_mapping[t]``.

    `key` and `value` may be column slices of a fused QKV projection's output
    (``qkv[:, a:b].view(T, Hkv, D)``): each token's Hkv * D elements contiguous, tokens any stride
    of at least Hkv * D elements apart.

    In place. `slot_mapping` is int64 [T]; a slot of -1 skips the token (padding). Slots must be
    below ``num_blocks * block_size`` (checked in C++). If two tokens name the same slot, which
    one the slot ends up holding is unspecified.
    """
    call(_reshape_and_cache, _check_reshape_and_cache, key, value, key_cache, value_cache,
         slot_mapping)


@custom_op("paged_attention", mutates_args=())
def _paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor,
                     query_start_loc: torch.Tensor, scale: Optional[float], sliding_window: int,
                     sinks: Optional[torch.Tensor]) -> torch.Tensor:
    follow_torch_threads()
    if scale is None:
        head_dim = query.shape[2]
        scale = 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    # contiguous whatever query's row stride
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    _C.paged_attention(view(out), view(query), view(key_cache), view(value_cache),
                       view(block_tables), view(seq_lens), view(query_start_loc), scale,
                       sliding_window, view(sinks))
    return out


@_paged_attention.register_fake
def _(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale,
      sliding_window, sinks):
    return torch.empty_like(query, memory_format=torch.contiguous_format)


def _check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                           scale, sliding_window, sinks) -> None:
    check_tensor(query, "query", dtypes=FLOATING, dim=3, layout="rows")
    _check_caches(key_cache, value_cache, query.dtype)
    num_heads, head_dim = query.shape[1], query.shape[2]
    if key_cache.shape[3] != head_dim:
        raise ValueError(f"key_cache: head dim (dim 3) {key_cache.shape[3]} does not match "
                         f"query's {head_dim}")
    if num_heads % key_cache.shape[2]:
        raise ValueError(f"query: the number of query heads ({num_heads}) must be a multiple of "
                         f"key_cache's KV heads ({key_cache.shape[2]})")
    check_tensor(block_tables, "block_tables", dtypes=(torch.int32,), dim=2)
    batch = block_tables.shape[0]
    check_tensor(seq_lens, "seq_lens", dtypes=(torch.int32,), shape=(batch,))
    check_tensor(query_start_loc, "query_start_loc", dtypes=(torch.int32,), shape=(batch + 1,))
    if sinks is not None:
        check_tensor(sinks, "sinks", dtypes=(torch.float32,), shape=(num_heads,))
    check_same_device(query=query, key_cache=key_cache, value_cache=value_cache,
                      block_tables=block_tables, seq_lens=seq_lens,
                      query_start_loc=query_start_loc, sinks=sinks)


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, *, scale: Optional[float] = None,
                    sliding_window: Optional[int] = None,
                    sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Causal attention of packed new tokens over the paged KV cache; returns [T, Hq, D].

    One call serves prefill, chunked prefill over cached context, decode and mixes of them.
    `query` [T, Hq, D] packs the new tokens of B sequences (each token's Hq * D elements
    contiguous, tokens any stride of at least Hq * D apart, as a column slice of a fused QKV
    projection's output is); sequence b's are rows
    ``query_start_loc[b]:query_start_loc[b + 1]`` (int32 [B + 1], non-decreasing, from 0 to T).
    ``seq_lens[b]`` (int32 [B]) is its total KV length, the new tokens included, all already in
    the cache; ``block_tables[b]`` (int32 [B, max_blocks]) lists its blocks. Query j of q_len new
    tokens sits at position ``seq_lens[b] - q_len + j`` and attends to keys at positions <= its
    own (bottom-right causal), and with `sliding_window` W only to the last W of them. Query head
    h reads KV head ``h // (Hq // Hkv)``. `scale` defaults to 1/sqrt(D). `sinks` (float32 [Hq])
    adds one logit per head to the softmax denominator, contributing no value (gpt-oss).
    Block-table entries and lengths are range-checked in C++. With `sliding_window`, the entries
    wholly before the window of a sequence's first new query are never read and may be -1, the
    null block a sliding KV-cache group leaves where it released a block.
    """
    if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)
                              or not math.isfinite(scale)):
        raise ValueError(f"scale: expected None or a finite number, got {scale!r}")
    if sliding_window is None:
        window = 0
    elif (not isinstance(sliding_window, int) or isinstance(sliding_window, bool)
          or not 1 <= sliding_window < 1 << 62):
        raise ValueError(f"sliding_window: expected None or a positive integer, got "
                         f"{sliding_window!r}")
    else:
        window = sliding_window
    return call(_paged_attention, _check_paged_attention, query, key_cache, value_cache,
                block_tables, seq_lens, query_start_loc, None if scale is None else float(scale),
                window, sinks)
