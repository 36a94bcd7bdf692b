"""reshape_and_cache and paged_attention against pure-torch references written here.

The attention reference gathers each sequence's K/V through its block table into dense tensors,
builds the bottom-right causal mask, the sliding window and the sink column explicitly, and takes
the softmax in float64 over the full [q, kv] score matrix, one sequence at a time.
"""

import math

import pytest
import torch

import gnomon.ops as ops
from gnomon import _C
from gnomon.ops._tensor import has_contiguous_rows, view
from ops.fuzz import malformed_calls
from ops.fused_qkv import column_slices, head_strided, overlapping_rows

# Tolerances against the float64 reference. float32: the kernel accumulates dot products of at
# most 128 terms and softmax sums in float32 (errors ~1e-6 at these magnitudes). bf16/fp16: the
# inputs are the same as the reference's, the output is rounded once to the dtype (half an ulp,
# 2^-9 / 2^-12 relative), plus float32 accumulation; outputs here are O(1).
ATOL = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
RTOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


# ---- references ------------------------------------------------------------------------------

def reference_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                        scale=None, sliding_window=None, sinks=None):
    num_tokens, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float64)
    for b in range(block_tables.shape[0]):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        q_len, seq_len = end - start, int(seq_lens[b])
        if q_len == 0:
            continue
        positions = torch.arange(seq_len)
        blocks = block_tables[b].long()[positions // block_size]
        k = key_cache[blocks, positions % block_size].double()  # [seq_len, Hkv, D]
        v = value_cache[blocks, positions % block_size].double()
        k = k.repeat_interleave(group, dim=1)  # query head h reads KV head h // group
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end].double(), k) * scale
        query_pos = seq_len - q_len + torch.arange(q_len)  # bottom-right aligned
        allowed = positions[None, :] <= query_pos[:, None]
        if sliding_window is not None:
            allowed &= positions[None, :] > query_pos[:, None] - sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is not None:
            sink_column = sinks.double()[:, None, None].expand(num_heads, q_len, 1)
            scores = torch.cat([scores, sink_column], dim=-1)
        probs = torch.softmax(scores, dim=-1)
        if sinks is not None:
            probs = probs[..., :-1]  # the sink takes weight but has no value
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def make_batch(q_lens, seq_lens, *, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16,
               dtype=torch.float32, seed=0, spare_blocks=3):
    """Random query and caches; each sequence's blocks are a random subset of the pool, in random
    order, and unused block-table entries hold an out-of-range value (never read)."""
    g = torch.Generator().manual_seed(seed)
    needed = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(needed) + spare_blocks
    pool = torch.randperm(num_blocks, generator=g)
    max_blocks = max(needed + [1]) + 1
    block_tables = torch.full((len(q_lens), max_blocks), 1 << 30, dtype=torch.int32)
    used = 0
    for b, n in enumerate(needed):
        block_tables[b, :n] = pool[used:used + n].int()
        used += n
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=g).to(dtype)
    query_start_loc = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    return dict(query=query, key_cache=key_cache, value_cache=value_cache,
                block_tables=block_tables, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                query_start_loc=query_start_loc)


def check_attention(batch, **options):
    out = ops.paged_attention(**batch, **options)
    expected = reference_attention(*batch.values(), **options)
    dtype = batch["query"].dtype
    assert out.dtype == dtype and out.shape == batch["query"].shape
    torch.testing.assert_close(out.double(), expected, atol=ATOL[dtype], rtol=RTOL[dtype])
    return out


# ---- paged_attention -------------------------------------------------------------------------

# (q_lens, seq_lens): prefill, chunked prefill over cached context, decode, and q_len 0, mixed.
MIXED = ([1, 37, 0, 5, 1, 16], [70, 100, 9, 5, 1, 50])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 5])
def test_mixed_batch(dtype, block_size):
    check_attention(make_batch(*MIXED, block_size=block_size, dtype=dtype))


# Prefill items with 16 or more (query, head) rows per KV head run the rows-in-lanes GEMM
# kernels (AMX tiles for bf16 head dims that are a multiple of 32, where the CPU has them);
# GNOMON_CPU_KERNELS caps the family so each one this CPU has is checked (where the CPU
# lacks a family the cap falls back and the case checks the one below it). The bf16 dot path
# also rounds the softmax weights P to bfloat16 before P.V, from exponentials within 1.1e-4:
# per weight a relative error of at most 2^-9 + 1.1e-4, about the bf16 output's own rounding, so
# its bound is twice that: measured against the float64 reference with rtol = atol = 2 * 2^-8
# (about 0.8%), tighter than ATOL.
LANES_BF16_TOL = 2 * 2.0 ** -8


@pytest.mark.parametrize("family", ["narrow", "wide", "bf16", "best"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape, options", [
    (dict(num_heads=8, num_kv_heads=2, head_dim=64), {}),  # group 4: 4 queries fill 16 rows
    (dict(num_heads=8, num_kv_heads=1, head_dim=128), dict(sinks="random")),  # group 8
    (dict(num_heads=3, num_kv_heads=3, head_dim=80), dict(sliding_window=9)),  # group 1
    (dict(num_heads=16, num_kv_heads=4, head_dim=66), dict(sliding_window=30)),  # 66: no whole
])                                                                                # 32-lane pairs
def test_prefill_kernel_families(family, dtype, shape, options, monkeypatch):
    if family != "best":
        monkeypatch.setenv("GNOMON_CPU_KERNELS", family)
    # prefill from scratch, chunked prefill over a context of four key tiles (cut mid-block, so
    # every row's softmax rescales its output), a 17-row item beside full ones, and a one-token
    # decode row in the same call
    batch = make_batch([40, 23, 17, 1], [40, 250, 61, 33], dtype=dtype, block_size=16, **shape)
    if options.get("sinks"):
        options = dict(sinks=torch.randn(shape["num_heads"], generator=torch.Generator().manual_seed(3)))
    out = ops.paged_attention(**batch, **options)
    expected = reference_attention(*batch.values(), **options)
    tol = LANES_BF16_TOL if dtype == torch.bfloat16 else ATOL[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("family", ["narrow", "best"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_reads_each_calls_cache(family, dtype, monkeypatch):
    """A thread packs a KV head's key tiles once for all of the prefill items it runs over them
    (one per tile of queries); the next call, over the same tensors after the cache changed in
    place, must read the new keys and values, not the tiles packed in the last call. One KV
    head: every item of both calls has the same sequence, KV head and key range."""
    if family != "best":
        monkeypatch.setenv("GNOMON_CPU_KERNELS", family)
    batch = make_batch([300], [700], dtype=dtype, num_heads=4, num_kv_heads=1, head_dim=64)
    first = ops.paged_attention(**batch)
    g = torch.Generator().manual_seed(11)
    for name in ("key_cache", "value_cache"):
        batch[name].copy_(torch.randn(batch[name].shape, generator=g))
    out = ops.paged_attention(**batch)
    expected = reference_attention(*batch.values())
    tol = LANES_BF16_TOL if dtype == torch.bfloat16 else ATOL[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)
    assert not torch.equal(out, first)


@pytest.mark.parametrize("family", ["narrow", "wide", "bf16", "best"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_after_a_nan_call_is_clean(family, dtype, monkeypatch):
    """The kernels keep per-thread scratch from call to call (the transposed queries, P, the
    packed key tiles); a call whose queries are all NaN must leave nothing that reaches the next
    call's outputs. The longer sequence's keys end mid-tile, past which the AMX product reads P
    pairs against zero values."""
    if family != "best":
        monkeypatch.setenv("GNOMON_CPU_KERNELS", family)
    batch = make_batch([40, 23], [40, 250], dtype=dtype, num_heads=8, num_kv_heads=2,
                       head_dim=64)
    clean = ops.paged_attention(**batch)
    assert not clean.isnan().any()
    poisoned = dict(batch, query=torch.full_like(batch["query"], float("nan")))
    assert ops.paged_attention(**poisoned).isnan().all()
    torch.testing.assert_close(ops.paged_attention(**batch), clean, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_past_the_packed_tiles_a_thread_keeps(dtype):
    """A thread keeps at most 4 MiB of packed key tiles (4,096 keys of float32 K and V at head
    dim 128, 8,192 of bf16); an item reading further packs the later tiles each time into one
    spare slot. Several items per KV head over 9,000 keys cross that bound."""
    batch = make_batch([40, 1], [9000, 300], dtype=dtype, num_heads=4, num_kv_heads=1,
                       head_dim=128)
    out = ops.paged_attention(**batch)
    expected = reference_attention(*batch.values())
    tol = LANES_BF16_TOL if dtype == torch.bfloat16 else ATOL[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("family", ["narrow", "wide", "bf16", "best"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_rising_scores(family, dtype, monkeypatch):
    """Scores that climb along the keys, slowly (a few nats per key tile, under the lanes
    kernels' slack before a row's max moves) and in jumps of 25 and 60 nats, up to about 110:
    e^110 overflows float32, so every row's max must move with the jumps and its output be
    rescaled."""
    if family != "best":
        monkeypatch.setenv("GNOMON_CPU_KERNELS", family)
    head_dim, seq_len, q_len = 64, 600, 64
    batch = make_batch([q_len], [seq_len], num_heads=8, num_kv_heads=2, head_dim=head_dim,
                       dtype=dtype, seed=5)
    g = torch.Generator().manual_seed(6)
    direction = torch.randn(head_dim, generator=g)
    direction /= direction.norm()
    positions = torch.arange(seq_len)
    rise = 0.04 * positions + 25.0 * (positions >= 200) + 60.0 * (positions >= 420)
    keys = rise[:, None, None] * direction + 0.5 * torch.randn(seq_len, 2, head_dim, generator=g)
    table = batch["block_tables"][0].long()
    batch["key_cache"][table[positions // 16], positions % 16] = keys.to(dtype)
    # scale 1/8 and |query| = 8: each score is the key's component along the direction
    batch["query"] = (8.0 * direction).expand(q_len, 8, head_dim).to(dtype).contiguous()
    out = ops.paged_attention(**batch)
    expected = reference_attention(*batch.values())
    tol = LANES_BF16_TOL if dtype == torch.bfloat16 else ATOL[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


def test_cpu_kernels_cap_is_checked(monkeypatch):
    monkeypatch.setenv("GNOMON_CPU_KERNELS", "fastest")
    batch = make_batch([20], [20])
    with pytest.raises(ValueError, match="GNOMON_CPU_KERNELS: expected 'narrow', 'wide'"):
        ops.paged_attention(**batch)


@pytest.mark.parametrize("options", [
    dict(sliding_window=7),
    dict(sliding_window=1),
    dict(sliding_window=1000),  # longer than every sequence: no effect
    dict(sinks="random"),
    dict(sinks="random", sliding_window=20),
    dict(scale=0.3),
], ids=["window7", "window1", "window_long", "sinks", "sinks_window", "scale"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_options(options, dtype):
    batch = make_batch(*MIXED, block_size=5, dtype=dtype, seed=1)
    if options.get("sinks") == "random":
        options = dict(options, sinks=torch.randn(8, generator=torch.Generator().manual_seed(2)))
    check_attention(batch, **options)


def test_sinks_take_weight():
    """A large sink soaks up the softmax: the output shrinks towards zero, as the reference says."""
    batch = make_batch([3], [10])
    out = check_attention(batch, sinks=torch.full((8,), 30.0))
    assert out.abs().max() < 1e-6


@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (12, 3), (16, 1), (64, 8)],
                         ids=["mha", "gqa4", "gqa4_odd_kv", "mqa", "gptoss"])
def test_head_layouts(heads):
    num_heads, num_kv_heads = heads
    check_attention(make_batch([1, 20, 3], [40, 20, 35], num_heads=num_heads,
                               num_kv_heads=num_kv_heads, block_size=16, seed=3))


@pytest.mark.parametrize("head_dim", [8, 40, 64, 80, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_dims(head_dim, dtype):
    # 8 and 40 are padded to 16-float chunks; 64 and 128 have fixed-size register tiles.
    check_attention(make_batch([1, 9], [33, 30], head_dim=head_dim, block_size=5, dtype=dtype,
                               seed=4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 3, 16])
def test_long_decode_split(dtype, threads):
    """One decode sequence of 2500 tokens (crossing blocks at odd offsets) and a short one: the
    long key range is split over items whose partial softmaxes are merged."""
    before = ops.num_threads()
    ops.set_num_threads(threads)
    try:
        batch = make_batch([1, 1], [2500, 7], num_heads=8, num_kv_heads=2, head_dim=64,
                           block_size=16, dtype=dtype, seed=5)
        check_attention(batch)
        check_attention(batch, sinks=torch.randn(8), sliding_window=1500)
    finally:
        ops.set_num_threads(None)
    assert ops.num_threads() == before


def test_long_chunked_prefill():
    """A 70-token chunk over 600 cached tokens, across query tiles and key tiles."""
    check_attention(make_batch([70, 1], [670, 300], block_size=16, seed=6), sliding_window=100)
    check_attention(make_batch([70, 1], [670, 300], block_size=16, seed=6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_null_blocks_before_the_window_are_never_read(dtype):
    """A sliding KV-cache group releases the blocks wholly before the window of a sequence's
    first new query and leaves -1 in their entries: with those entries at -1 and their blocks
    full of NaN, the output is identical."""
    window, block_size = 20, 8
    batch = make_batch([1, 30, 1, 5], [90, 75, 21, 40], block_size=block_size, dtype=dtype,
                       seed=21)
    out = ops.paged_attention(**batch, sliding_window=window)
    released = batch["block_tables"].clone()
    poisoned = dict(batch, block_tables=released, key_cache=batch["key_cache"].clone(),
                    value_cache=batch["value_cache"].clone())
    q_lens = batch["query_start_loc"].diff()
    num_released = 0
    for b, (q_len, seq_len) in enumerate(zip(q_lens.tolist(), batch["seq_lens"].tolist())):
        first_key = max(0, seq_len - q_len - window + 1)
        for i in range(first_key // block_size):
            block = int(released[b, i])
            poisoned["key_cache"][block] = float("nan")
            poisoned["value_cache"][block] = float("nan")
            released[b, i] = -1
            num_released += 1
    assert num_released >= 10
    assert torch.equal(ops.paged_attention(**poisoned, sliding_window=window), out)
    torch.testing.assert_close(out.double(), reference_attention(*batch.values(),
                                                                  sliding_window=window),
                               atol=ATOL[dtype], rtol=RTOL[dtype])


def test_null_blocks_are_refused_where_they_would_be_read():
    batch = make_batch([1], [40], block_size=8, seed=3)
    table = batch["block_tables"]
    table[0, 0] = -1  # positions 0..7; the query at 39 with window 32 sees 8..39
    assert ops.paged_attention(**batch, sliding_window=32).isfinite().all()
    with pytest.raises(ValueError, match=r"block_tables: entry \[0, 0\] = -1 is outside \[0,"):
        ops.paged_attention(**batch, sliding_window=33)  # sees 7..39: block 0 is read
    with pytest.raises(ValueError, match="block_tables"):
        ops.paged_attention(**batch)  # no window: every entry is read
    table[0, 0] = -2
    with pytest.raises(ValueError, match=r"outside \[-1, .*the null block, is allowed"):
        ops.paged_attention(**batch, sliding_window=32)


def test_thread_counts_agree():
    batch = make_batch(*MIXED, block_size=5, seed=7)
    outs = []
    for threads in (1, 2, 5):
        ops.set_num_threads(threads)
        outs.append(ops.paged_attention(**batch))
    ops.set_num_threads(None)
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-6, rtol=1e-6)


def test_no_query_tokens():
    batch = make_batch([0, 0], [4, 0])
    out = ops.paged_attention(**batch)
    assert out.shape == (0, 8, 64)


def test_one_shot_prefill_matches_causal_attention():
    """A plain prefill (seq_len == q_len) is ordinary causal attention."""
    batch = make_batch([33], [33], num_heads=4, num_kv_heads=4, head_dim=16, block_size=4)
    out = ops.paged_attention(**batch)
    q = batch["query"].double()
    positions = torch.arange(33)
    blocks = batch["block_tables"][0].long()[positions // 4]
    k = batch["key_cache"][blocks, positions % 4].double()
    v = batch["value_cache"][blocks, positions % 4].double()
    scores = torch.einsum("qhd,khd->hqk", q, k) / 4.0
    scores = scores.masked_fill(torch.ones(33, 33, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)


# ---- reshape_and_cache ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reshape_and_cache(dtype):
    g = torch.Generator().manual_seed(8)
    num_blocks, block_size, num_kv_heads, head_dim = 6, 5, 2, 24
    key = torch.randn(11, num_kv_heads, head_dim, generator=g).to(dtype)
    value = torch.randn(11, num_kv_heads, head_dim, generator=g).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:11]
    slots[[2, 7]] = -1  # padding tokens
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    value_cache = torch.randn_like(key_cache)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    keep = slots >= 0
    expected_k.view(-1, num_kv_heads, head_dim)[slots[keep]] = key[keep]
    expected_v.view(-1, num_kv_heads, head_dim)[slots[keep]] = value[keep]
    ops.reshape_and_cache(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_cache_then_attend_like_an_engine():
    """Chunked prefill of two prompts, then decode steps, all through reshape_and_cache and
    paged_attention, against causal attention over the dense sequences."""
    g = torch.Generator().manual_seed(9)
    num_heads, num_kv_heads, head_dim, block_size = 4, 2, 32, 4
    key_cache = torch.zeros(20, block_size, num_kv_heads, head_dim)
    value_cache = torch.zeros_like(key_cache)
    tables = torch.tensor([[3, 7, 1, 12, 9, 0], [5, 2, 14, 8, 11, 4]], dtype=torch.int32)
    # Steps: new tokens per sequence (the second joins late; 0 means idle this step).
    steps = [(6, 0), (5, 3), (1, 4), (1, 1), (1, 1)]
    keys = [torch.empty(0, num_kv_heads, head_dim)] * 2
    values = [torch.empty(0, num_kv_heads, head_dim)] * 2
    for new in steps:
        lens_before = [k.shape[0] for k in keys]
        q = torch.randn(sum(new), num_heads, head_dim, generator=g)
        k_new = torch.randn(sum(new), num_kv_heads, head_dim, generator=g)
        v_new = torch.randn(sum(new), num_kv_heads, head_dim, generator=g)
        slots = []
        for b, n in enumerate(new):
            for pos in range(lens_before[b], lens_before[b] + n):
                slots.append(int(tables[b, pos // block_size]) * block_size + pos % block_size)
        ops.reshape_and_cache(k_new, v_new, key_cache, value_cache, torch.tensor(slots))
        split = [0, new[0], sum(new)]
        for b in range(2):
            keys[b] = torch.cat([keys[b], k_new[split[b]:split[b + 1]]])
            values[b] = torch.cat([values[b], v_new[split[b]:split[b + 1]]])
        seq_lens = torch.tensor([k.shape[0] for k in keys], dtype=torch.int32)
        out = ops.paged_attention(q, key_cache, value_cache, tables, seq_lens,
                                  torch.tensor(split, dtype=torch.int32))
        for b in range(2):
            if new[b] == 0:
                continue
            qb = q[split[b]:split[b + 1]].double()
            k = keys[b].double().repeat_interleave(2, dim=1)
            v = values[b].double().repeat_interleave(2, dim=1)
            scores = torch.einsum("qhd,khd->hqk", qb, k) / math.sqrt(head_dim)
            query_pos = keys[b].shape[0] - new[b] + torch.arange(new[b])
            future = torch.arange(keys[b].shape[0])[None, :] > query_pos[:, None]
            expected = torch.einsum("hqk,khd->qhd", scores.masked_fill(future, -math.inf)
                                    .softmax(-1), v)
            torch.testing.assert_close(out[split[b]:split[b + 1]].double(), expected,
                                       atol=2e-5, rtol=2e-5)


# ---- registration: opcheck and torch.compile ---------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype):
    batch = make_batch([1, 6, 0], [20, 6, 3], block_size=5, dtype=dtype, seed=10)
    args = tuple(batch.values())
    torch.library.opcheck(torch.ops.gnomon.paged_attention.default,
                          args + (0.125, 0, None))
    torch.library.opcheck(torch.ops.gnomon.paged_attention.default,
                          args + (0.2, 4, torch.randn(8)))
    key = torch.randn(4, 2, 64).to(dtype)
    torch.library.opcheck(torch.ops.gnomon.reshape_and_cache.default,
                          (key, torch.randn_like(key), batch["key_cache"].clone(),
                           batch["value_cache"].clone(), torch.tensor([0, -1, 7, 3])))


def test_traces_under_torch_compile():
    batch = make_batch([2, 1], [9, 4], block_size=4, seed=11)

    def layer(query, key, value, key_cache, value_cache, slots, block_tables, seq_lens,
              query_start_loc, sinks):
        ops.reshape_and_cache(key, value, key_cache, value_cache, slots)
        return ops.paged_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                   query_start_loc, sliding_window=5, sinks=sinks) * 2

    key = torch.randn(3, 2, 64)
    slots = torch.tensor([int(batch["block_tables"][0, 1]) * 4 + 3,
                          int(batch["block_tables"][0, 2]) * 4, -1])
    args = (batch["query"], key, torch.randn_like(key), batch["key_cache"].clone(),
            batch["value_cache"].clone(), slots, batch["block_tables"], batch["seq_lens"],
            batch["query_start_loc"], torch.randn(8))
    expected = layer(*[a.clone() for a in args])
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args), expected)


# ---- strided q/k/v -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["narrow", "best"])
@pytest.mark.parametrize("pad", [0, 3])
def test_fused_qkv_views_give_what_their_contiguous_copies_give(dtype, family, pad, monkeypatch):
    """Attention and the cache write over column slices of one QKV buffer (NaN in its spare
    columns) are bit-identical to the same calls on contiguous copies: decode rows and the
    rows-in-lanes prefill kernel both index tokens by their stride."""
    if family != "best":
        monkeypatch.setenv("GNOMON_CPU_KERNELS", family)
    batch = make_batch(*MIXED, dtype=dtype, seed=21)
    g = torch.Generator().manual_seed(22)
    num_tokens, (_, block_size, num_kv_heads, head_dim) = (batch["query"].shape[0],
                                                          batch["key_cache"].shape)
    key, value = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=g).to(dtype)
                  for _ in range(2))
    _, (query, key_view, value_view) = column_slices([batch["query"], key, value], pad)
    assert not query.is_contiguous() and has_contiguous_rows(query)
    slots = torch.randperm(batch["key_cache"].shape[0] * block_size, generator=g)[:num_tokens]
    caches = {name: (batch["key_cache"].clone(), batch["value_cache"].clone())
              for name in ("views", "copies")}
    ops.reshape_and_cache(key_view, value_view, *caches["views"], slots)
    ops.reshape_and_cache(key, value, *caches["copies"], slots)
    assert all(torch.equal(a, b) for a, b in zip(caches["views"], caches["copies"]))
    rest = {k: batch[k] for k in ("block_tables", "seq_lens", "query_start_loc")}
    got = ops.paged_attention(query, *caches["views"], **rest, sliding_window=40)
    want = ops.paged_attention(batch["query"], *caches["copies"], **rest, sliding_window=40)
    assert got.is_contiguous() and torch.equal(got, want)


@pytest.mark.parametrize("layout, match", [(overlapping_rows, "each row"),
                                           (head_strided, "each row")])
@pytest.mark.parametrize("argument", ["query", "key", "value"])
def test_strides_no_kernel_can_honour_are_refused_by_name(layout, match, argument):
    """Rows that overlap, or heads with gaps between them, raise naming the argument, in the
    wrapper and again in the C++ entry, and leave the caches untouched."""
    if argument == "query":
        kwargs = valid_attention_kwargs()
        kwargs["query"] = layout(kwargs["query"])
        with pytest.raises(ValueError, match=f"query: expected {match}"):
            ops.paged_attention(**kwargs)
        out = torch.empty(kwargs["query"].shape)
        views = [view(kwargs[name]) for name in ("query", "key_cache", "value_cache",
                                                 "block_tables", "seq_lens", "query_start_loc")]
        with pytest.raises(ValueError, match=f"query: expected {match}"):
            _C.paged_attention(view(out), *views, 0.5, 0, None)
        return
    kwargs = valid_cache_kwargs()
    kwargs[argument] = layout(kwargs[argument])
    with pytest.raises(ValueError, match=f"{argument}: expected {match}"):
        ops.reshape_and_cache(**kwargs)
    with pytest.raises(ValueError, match=f"{argument}: expected {match}"):
        _C.reshape_and_cache(*(view(kwargs[name]) for name in
                               ("key", "value", "key_cache", "value_cache", "slot_mapping")))
    assert not kwargs["key_cache"].any() and not kwargs["value_cache"].any()


# ---- bad input ---------------------------------------------------------------------------------

def valid_attention_kwargs():
    batch = make_batch([2, 1], [5, 7], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4,
                       seed=12, spare_blocks=1)
    return dict(batch, scale=0.5, sliding_window=3, sinks=torch.zeros(4))


def valid_cache_kwargs():
    return dict(key=torch.randn(3, 2, 8), value=torch.randn(3, 2, 8),
                key_cache=torch.zeros(4, 4, 2, 8), value_cache=torch.zeros(4, 4, 2, 8),
                slot_mapping=torch.tensor([0, -1, 9]))


def attention_with(**changes):
    kwargs = valid_attention_kwargs()
    kwargs.update(changes)
    return ops.paged_attention(**kwargs)


@pytest.mark.parametrize("changes, error, argument", [
    (dict(query=torch.randn(3, 3, 8)), ValueError, "query"),  # 3 heads over 2 KV heads
    (dict(query=torch.randn(3, 4, 16)), ValueError, "head dim"),
    (dict(query=torch.randn(3, 4, 8, dtype=torch.float64)), TypeError, "query"),
    (dict(query=torch.randn(3, 4, 8).bfloat16()), TypeError, "key_cache"),
    (dict(query=torch.randn(3, 8, 4).transpose(1, 2)), ValueError, "query"),
    (dict(key_cache=torch.randn(4, 4, 2, 16).narrow(3, 0, 8)), ValueError, "key_cache"),
    (dict(value_cache=torch.randn(6, 4, 2, 8)), ValueError, "value_cache"),
    (dict(block_tables=torch.tensor([[0, 1], [2, 9]], dtype=torch.int32)), ValueError,
     "block_tables"),
    (dict(block_tables=torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)), ValueError,
     "block_tables"),
    (dict(block_tables=torch.tensor([[0, 1], [2, 3]])), TypeError, "block_tables"),
    (dict(seq_lens=torch.tensor([5, 13], dtype=torch.int32)), ValueError, "seq_lens"),  # > 12 slots
    (dict(seq_lens=torch.tensor([1, 7], dtype=torch.int32)), ValueError, "seq_lens"),  # < q_len
    (dict(seq_lens=torch.tensor([5, 7, 1], dtype=torch.int32)), ValueError, "seq_lens"),
    (dict(query_start_loc=torch.tensor([0, 3], dtype=torch.int32)), ValueError,
     "query_start_loc"),
    (dict(query_start_loc=torch.tensor([0, 4, 3], dtype=torch.int32),
          seq_lens=torch.tensor([7, 7], dtype=torch.int32)), ValueError, "query_start_loc"),
    (dict(query_start_loc=torch.tensor([1, 2, 3], dtype=torch.int32)), ValueError,
     "query_start_loc"),
    (dict(query_start_loc=torch.tensor([0, 2, 3])), TypeError, "query_start_loc"),
    (dict(sinks=torch.zeros(2)), ValueError, "sinks"),
    (dict(sinks=torch.zeros(4).bfloat16()), TypeError, "sinks"),
    (dict(sinks=torch.zeros(4, device="meta")), ValueError, "sinks"),
    (dict(key_cache=torch.zeros(5, 4, 2, 8, device="meta")), ValueError, "key_cache"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(scale="0.5"), ValueError, "scale"),
    (dict(sliding_window=0), ValueError, "sliding_window"),
    (dict(sliding_window=-3), ValueError, "sliding_window"),
    (dict(sliding_window=2.5), ValueError, "sliding_window"),
    (dict(query=[[1.0]]), TypeError, "query"),
])
def test_attention_bad_input(changes, error, argument):
    with pytest.raises(error, match=argument):
        attention_with(**changes)


@pytest.mark.parametrize("changes, error, argument", [
    (dict(slot_mapping=torch.tensor([0, -2, 9])), ValueError, "slot_mapping"),
    (dict(slot_mapping=torch.tensor([0, 1, 16])), ValueError, "slot_mapping"),
    (dict(slot_mapping=torch.tensor([0, 1, 2], dtype=torch.int32)), TypeError, "slot_mapping"),
    (dict(slot_mapping=torch.tensor([0, 1])), ValueError, "slot_mapping"),
    (dict(value=torch.randn(3, 2, 8).half()), TypeError, "value"),
    (dict(key_cache=torch.zeros(4, 4, 2, 8).bfloat16()), TypeError, "key_cache"),
    (dict(key_cache=torch.zeros(4, 4, 1, 8), value_cache=torch.zeros(4, 4, 1, 8)), ValueError,
     "key_cache"),
    (dict(value_cache=torch.zeros(4, 4, 2, 16)[..., ::2]), ValueError, "value_cache"),
    (dict(key=torch.randn(3, 2, 8, device="meta")), ValueError, "value"),
])
def test_cache_bad_input(changes, error, argument):
    kwargs = valid_cache_kwargs()
    kwargs.update(changes)
    with pytest.raises(error, match=argument):
        ops.reshape_and_cache(**kwargs)


def test_bad_input_leaves_cache_untouched():
    kwargs = valid_cache_kwargs()
    kwargs["slot_mapping"] = torch.tensor([0, 5, 99])
    with pytest.raises(ValueError, match="slot_mapping"):
        ops.reshape_and_cache(**kwargs)
    assert not kwargs["key_cache"].any() and not kwargs["value_cache"].any()


def test_c_entry_checks_its_own_invariants():
    """_C called directly with views that lie about sizes raises instead of reading past them."""
    kwargs = valid_attention_kwargs()
    out = torch.empty_like(kwargs["query"])
    views = [view(out)] + [view(kwargs[name]) for name in
                           ("query", "key_cache", "value_cache", "block_tables", "seq_lens",
                            "query_start_loc")]
    _C.paged_attention(*views, 0.5, 3, view(kwargs["sinks"]))  # the honest call works
    kwargs["block_tables"][1, 1] = 100
    with pytest.raises(ValueError, match="block_tables"):
        _C.paged_attention(*views, 0.5, 3, None)
    kwargs["block_tables"][1, 1] = 3
    with pytest.raises(ValueError, match="sliding_window"):
        _C.paged_attention(*views, 0.5, -1, None)
    with pytest.raises(ValueError, match="out"):
        _C.paged_attention(view(out[:2]), *views[1:], 0.5, 0, None)
    with pytest.raises(ValueError, match="sinks"):
        _C.paged_attention(*views, 0.5, 0, view(torch.zeros(3)))
    cache = valid_cache_kwargs()
    with pytest.raises(ValueError, match="slot_mapping"):
        _C.reshape_and_cache(view(cache["key"]), view(cache["value"]), view(cache["key_cache"]),
                             view(cache["value_cache"]), view(cache["slot_mapping"][:2]))


test_paged_attention_malformed_calls = malformed_calls(
    ops.paged_attention, valid_attention_kwargs,
    index_args=("block_tables", "seq_lens", "query_start_loc"))

test_reshape_and_cache_malformed_calls = malformed_calls(
    ops.reshape_and_cache, valid_cache_kwargs, index_args=("slot_mapping",))
