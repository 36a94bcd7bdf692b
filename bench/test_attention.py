"""paged_attention against the torch paths it replaces, on real model shapes, in the same run.

Shapes (the models' config.json files): Llama-3.1-8B attention (32 query heads, 8 KV heads,
head dim 128) and gpt-oss-20b attention (64 query heads, 8 KV heads, head dim 64, sinks, sliding
window 128 on alternate layers); KV block size 16, bfloat16 (one float32 case for comparison).
Block tables are shuffled, as an allocator that has run a while leaves them.

Baselines, timed beside gnomon in the same run:
- "gather+sdpa": gather each sequence's K/V through its block table into contiguous
  [B, Hkv, L, D] tensors, then torch.nn.functional.scaled_dot_product_attention with
  enable_gqa=True (and an explicit bottom-right causal mask for chunked prefill);
- "gather+eager-sinks" (gpt-oss, whose sinks SDPA cannot express): gather the window's K/V, then
  the Hugging Face gpt-oss eager path: repeat_kv, q @ k^T, a sink column, softmax, @ v.

Every case runs at one thread and at torch's default thread count (both implementations alike):
on a machine shared with other work, a parallel region can wait a scheduler tick for a busy
core, which torch's many small parallel ops in the baselines suffer far more than one gnomon
call; the one-thread figures are the steady comparison.

extra_info: the K/V bytes one call must read (each KV head's rows over each sequence's attended
key range), the achieved read rate, and that rate as a fraction of `memory_bandwidth` (this
machine's copy bandwidth, measured in the same session). Decode is memory-bound, so that
fraction is its figure of merit; chunked prefill is compute-bound and also reports GFLOP/s.

The chunked-prefill goal (>= 1.3x, issue 17) is also timed back to back, call by call
(`test_chunked_prefill_paired`), so that a drift in the machine's speed between the two
benchmarks cannot bias the ratio.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import gnomon.ops as ops
from conftest import paired_speedup, record

BLOCK_SIZE = 16
LLAMA = dict(num_heads=32, num_kv_heads=8, head_dim=128)
GPT_OSS = dict(num_heads=64, num_kv_heads=8, head_dim=64)


class Case:
    """A uniform batch: `batch` sequences of `context` cached tokens plus `q_len` new ones."""

    def __init__(self, name, *, batch, context, q_len, num_heads, num_kv_heads, head_dim,
                 dtype=torch.bfloat16, window=None, sinks=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.name, self.batch, self.q_len, self.window = name, batch, q_len, window
        self.seq_len = context + q_len
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        blocks_per_seq = -(-self.seq_len // BLOCK_SIZE)
        num_blocks = batch * blocks_per_seq
        shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
        self.key_cache = torch.randn(shape, generator=g).to(dtype)
        self.value_cache = torch.randn(shape, generator=g).to(dtype)
        self.block_tables = torch.randperm(num_blocks, generator=g).int().view(batch, -1)
        self.query = torch.randn(batch * q_len, num_heads, head_dim, generator=g).to(dtype)
        self.seq_lens = torch.full((batch,), self.seq_len, dtype=torch.int32)
        self.query_start_loc = torch.arange(batch + 1, dtype=torch.int32) * q_len
        self.sinks = torch.randn(num_heads, generator=g) if sinks else None
        self.scale = 1.0 / math.sqrt(head_dim)

    def gnomon(self):
        return ops.paged_attention(self.query, self.key_cache, self.value_cache,
                                   self.block_tables, self.seq_lens, self.query_start_loc,
                                   sliding_window=self.window, sinks=self.sinks)

    def attended_keys(self):
        """Key positions per query, summed over a sequence's queries' union: its read range."""
        return self.seq_len if self.window is None else min(self.seq_len,
                                                            self.window + self.q_len - 1)

    def kv_bytes(self):
        per_key = 2 * self.num_kv_heads * self.head_dim * self.key_cache.element_size()
        return self.batch * self.attended_keys() * per_key

    def flops(self):
        """2 matmuls of 2 * D flops per (query head, attended key), causal pairs only."""
        pairs = sum(min(self.seq_len - self.q_len + j + 1, self.window or self.seq_len)
                    for j in range(self.q_len))
        return self.batch * self.num_heads * pairs * 4 * self.head_dim

    def _gather(self, first_position):
        """K and V of positions [first_position, seq_len) as contiguous [B, Hkv, L, D]."""
        first_block = first_position // BLOCK_SIZE
        tables = self.block_tables[:, first_block:].long()
        skip = first_position - first_block * BLOCK_SIZE
        length = self.seq_len - first_position
        k = self.key_cache[tables].flatten(1, 2)[:, skip:skip + length]
        v = self.value_cache[tables].flatten(1, 2)[:, skip:skip + length]
        return k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()

    def gather_sdpa(self):
        assert self.window is None and self.sinks is None
        k, v = self._gather(0)
        q = self.query.view(self.batch, self.q_len, self.num_heads, self.head_dim).transpose(1, 2)
        mask = None
        if self.q_len > 1:  # bottom-right causal: query j sits at context + j
            query_pos = self.seq_len - self.q_len + torch.arange(self.q_len)
            mask = torch.arange(self.seq_len)[None, :] <= query_pos[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                             enable_gqa=True)
        return out.transpose(1, 2).reshape(-1, self.num_heads, self.head_dim)

    def gather_eager_sinks(self):
        assert self.q_len == 1  # decode: the window is the last `window` keys
        k, v = self._gather(self.seq_len - self.attended_keys())
        group = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        q = self.query.view(self.batch, 1, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scale
        sinks = self.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(self.batch, -1, 1, 1)
        combined = torch.cat([scores, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = F.softmax(combined.float(), dim=-1).to(v.dtype)[..., :-1]
        out = torch.matmul(probs, v)
        return out.transpose(1, 2).reshape(-1, self.num_heads, self.head_dim)


CASES = {
    "llama-3.1-8b decode 4x2048": dict(batch=4, context=2047, q_len=1, **LLAMA),
    "llama-3.1-8b decode 1x8192": dict(batch=1, context=8191, q_len=1, **LLAMA),
    "llama-3.1-8b decode 4x2048 fp32": dict(batch=4, context=2047, q_len=1, dtype=torch.float32,
                                            **LLAMA),
    "llama-3.1-8b chunked prefill 256 on 2048": dict(batch=1, context=2048, q_len=256, **LLAMA),
    "gpt-oss-20b decode 4x2048 window 128 sinks": dict(batch=4, context=2047, q_len=1,
                                                       window=128, sinks=True, **GPT_OSS),
}
BASELINES = {name: "gather+eager-sinks" if "sinks" in name else "gather+sdpa" for name in CASES}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    case = Case(request.param, **CASES[request.param])
    baseline = getattr(case, BASELINES[case.name].replace("+", "_").replace("-", "_"))
    # Both compute the same thing (bf16 outputs differ by output rounding and summation order).
    torch.testing.assert_close(case.gnomon().float(), baseline().float(), atol=3e-2, rtol=3e-2)
    return case


@pytest.fixture(params=["1-thread", "all-threads"])
def threads(request):
    """Both implementations at one thread (steady on a shared machine) and at torch's default."""
    default = torch.get_num_threads()
    count = 1 if request.param == "1-thread" else default
    torch.set_num_threads(count)
    yield count
    torch.set_num_threads(default)


@pytest.mark.parametrize("implementation", ["gnomon", "baseline"])
def test_paged_attention(benchmark, case, threads, implementation, memory_bandwidth):
    baseline = BASELINES[case.name]
    label = "gnomon" if implementation == "gnomon" else baseline
    fn = case.gnomon if implementation == "gnomon" else getattr(
        case, baseline.replace("+", "_").replace("-", "_"))
    suite = f"{case.name}, {threads} thread{'s' if threads > 1 else ''}"
    benchmark.group = suite
    benchmark.pedantic(fn, rounds=20 if implementation == "gnomon" else 5, warmup_rounds=1)
    record(suite, label, benchmark)
    if benchmark.stats is not None:
        seconds = benchmark.stats.stats.median
        read_rate = case.kv_bytes() / seconds
        benchmark.extra_info.update(
            implementation=label, threads=ops.num_threads(), kv_bytes_per_call=case.kv_bytes(),
            kv_read_gb_per_s=read_rate / 1e9,
            fraction_of_memory_bandwidth=read_rate / memory_bandwidth,
            memory_bandwidth_gb_per_s=memory_bandwidth / 1e9,
            gflop_per_s=case.flops() / seconds / 1e9)


PREFILL = "llama-3.1-8b chunked prefill 256 on 2048"


def test_chunked_prefill_paired(benchmarks_enabled, threads):
    """The chunked-prefill goal timed back to back (conftest.paired_speedup)."""
    case = Case(PREFILL, **CASES[PREFILL])
    paired_speedup(f"{PREFILL}, {threads} thread{'s' if threads > 1 else ''}", "gnomon",
                   case.gnomon, BASELINES[PREFILL], case.gather_sdpa,
                   pairs=20 if benchmarks_enabled else 1, goal=1.3)
