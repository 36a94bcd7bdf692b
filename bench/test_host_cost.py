"""Per-call host cost of an op through its public wrapper: a [1, 64] rms_norm, eager, where the
kernel itself takes well under a microsecond, against torch's own rms_norm on the same tensors.
Goal (issue 17): <= 4 us per gnomon call. Also each other op at decode size, for its figure."""

import pytest
import torch

import gnomon.ops as ops
from conftest import note, record, speedup

SUITE = "host cost [1, 64] rms_norm"
GOAL_US = 4.0


@pytest.mark.parametrize("implementation", ["gnomon", "torch"])
def test_rms_norm_call(benchmark, implementation):
    x, weight = torch.randn(1, 64), torch.randn(64)
    if implementation == "gnomon":
        call = lambda: ops.rms_norm(x, weight, 1e-6)  # noqa: E731
    else:
        call = lambda: torch.nn.functional.rms_norm(x, (64,), weight, 1e-6)  # noqa: E731
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6),
                               torch.nn.functional.rms_norm(x, (64,), weight, 1e-6))
    benchmark.pedantic(call, rounds=20, iterations=2000, warmup_rounds=2)
    record(SUITE, implementation, benchmark)
    speedup(SUITE, "gnomon", "torch")
    if benchmark.stats is not None and implementation == "gnomon":
        per_call = benchmark.stats.stats.min * 1e6  # the quietest round: host cost, not noise
        note(f"{SUITE}: gnomon {per_call:.2f} us per call, best round "
             f"(goal <= {GOAL_US:g} us: {'met' if per_call <= GOAL_US else 'NOT met'})")


def _decode_sized_calls():
    """One call of each other op at decode size (one token, a few cached, tiny experts), where
    the kernels take a microsecond or two and the rest is the call's host cost."""
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    heads, kv_heads, head_dim, block = 4, 2, 64, 16
    q, k, v = rand(1, heads, head_dim), rand(1, kv_heads, head_dim), rand(1, kv_heads, head_dim)
    key_cache, value_cache = rand(4, block, kv_heads, head_dim), rand(4, block, kv_heads, head_dim)
    angles = torch.arange(64)[:, None] * 0.01 * torch.arange(1, head_dim // 2 + 1)[None, :]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    int32 = lambda *values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    block_tables, seq_lens, query_start_loc = int32([0]), int32(6), int32(0, 1)
    position = slot = torch.tensor([5])
    hidden, logits = rand(1, 64), rand(1, 4)
    w13, w2 = rand(4, 128, 64), rand(4, 64, 64)
    weights, ids = ops.topk_routing(logits, 2)
    return {
        "rotary_embedding": lambda: ops.rotary_embedding(position, q, k, cos_sin),
        "reshape_and_cache": lambda: ops.reshape_and_cache(k, v, key_cache, value_cache, slot),
        "paged_attention": lambda: ops.paged_attention(q, key_cache, value_cache, block_tables,
                                                       seq_lens, query_start_loc),
        "topk_routing": lambda: ops.topk_routing(logits, 2),
        "fused_moe": lambda: ops.fused_moe(hidden, w13, w2, weights, ids),
    }


@pytest.mark.parametrize("op", ["rotary_embedding", "reshape_and_cache", "paged_attention",
                                "topk_routing", "fused_moe"])
def test_decode_sized_call(benchmark, op):
    """Per-call cost of the other ops at decode size, through their public wrappers (no goal:
    figures to watch, as a decode step of a small model makes about ten such calls a layer)."""
    call = _decode_sized_calls()[op]
    benchmark.pedantic(call, rounds=20, iterations=500, warmup_rounds=2)
    if benchmark.stats is not None:
        note(f"host cost, decode-sized {op}: {benchmark.stats.stats.min * 1e6:.2f} us per "
             f"call, best round")
