"""The GPU kernels against the CPU ops (themselves checked against independent references in the
other files here), on the same inputs, under the CPU tests' tolerances.

Marked ``gpu``: every test skips unless torch sees a GPU and this build of gnomon has a GPU
backend (`gnomon info`). `bench/gpu_check.sh` runs them on a GPU machine.
"""

import math

import pytest
import torch

from gnomon import _C
from gnomon import ops

HAS_GPU = torch.cuda.is_available() and bool(_C.build_info()["gpu_backends"])
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HAS_GPU, reason="needs a GPU and a GPU build of gnomon")]

FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ATOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}
RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def gpu(*tensors):
    return [None if t is None else t.cuda() for t in tensors]


def close(got, expected, dtype, scale=1.0):
    torch.testing.assert_close(got.cpu().float(), expected.float(), atol=ATOL[dtype] * scale,
                               rtol=RTOL[dtype] * scale)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(dtype, residual):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 4096, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(4096, generator=g)).to(dtype)
    r = torch.randn(37, 4096, generator=g).to(dtype) if residual else None
    r_cpu = None if r is None else r.clone()
    want = ops.rms_norm(x, w, 1e-5, residual=r_cpu)
    xg, wg, rg = gpu(x, w, r)
    got = ops.rms_norm(xg, wg, 1e-5, residual=rg)
    close(got, want, dtype)
    if residual:
        close(rg, r_cpu, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_embedding(dtype, is_neox):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(19, 8, 128, generator=g).to(dtype)
    k = torch.randn(19, 2, 128, generator=g).to(dtype)
    pos = torch.randint(0, 4096, (19,), generator=g)
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64))
    freqs = torch.outer(torch.arange(4096).float(), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=1)  # rotary_dim 64 < head dim 128
    qg, kg, pg, cg = gpu(q, k, pos, cache)
    ops.rotary_embedding(pos, q, k, cache, is_neox=is_neox)
    ops.rotary_embedding(pg, qg, kg, cg, is_neox=is_neox)
    close(qg, q, dtype)
    close(kg, k, dtype)


def _paged(dtype, q_lens, ctx_lens, hq=32, hkv=8, d=128, block=16, seed=2):
    g = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(q_lens, ctx_lens)]
    per_seq = [math.ceil(s / block) for s in seq_lens]
    num_blocks = sum(per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(len(q_lens), max(per_seq), dtype=torch.int32)
    at = 0
    for b, n in enumerate(per_seq):
        tables[b, :n] = perm[at:at + n].to(torch.int32)
        at += n
    kc = torch.randn(num_blocks, block, hkv, d, generator=g).to(dtype)
    vc = torch.randn(num_blocks, block, hkv, d, generator=g).to(dtype)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(dtype)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    return q, kc, vc, tables, torch.tensor(seq_lens, dtype=torch.int32), qsl


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", ["decode", "long_decode", "prefill", "chunked", "mixed"])
@pytest.mark.parametrize("window, sinks", [(None, False), (128, True)])
def test_paged_attention(dtype, case, window, sinks):
    q_lens, ctx = {"decode": ([1] * 8, [17, 300, 1, 64, 900, 31, 5, 128]),
                   "long_decode": ([1] * 4, [8191, 20000, 4096, 12345]),
                   "prefill": ([77, 5, 130], [0, 0, 0]),
                   "chunked": ([64, 33], [500, 1000]),
                   "mixed": ([1, 40, 1, 1, 7], [700, 0, 3000, 12, 90])}[case]
    q, kc, vc, tables, seq_lens, qsl = _paged(dtype, q_lens, ctx)
    s = torch.randn(q.shape[1]) if sinks else None
    want = ops.paged_attention(q, kc, vc, tables, seq_lens, qsl, sliding_window=window, sinks=s)
    got = ops.paged_attention(*gpu(q, kc, vc, tables, seq_lens, qsl), sliding_window=window,
                              sinks=None if s is None else s.cuda())
    close(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_never_reads_null_blocks(dtype):
    """A sliding KV-cache group's released blocks: their entries -1 and their KV NaN, the GPU
    output equals the CPU's with the blocks in place."""
    window, block = 128, 16
    q_lens, ctx = [1, 64, 1, 33], [2000, 700, 129, 400]
    q, kc, vc, tables, seq_lens, qsl = _paged(dtype, q_lens, ctx, block=block)
    want = ops.paged_attention(q, kc, vc, tables, seq_lens, qsl, sliding_window=window)
    released, kc, vc = tables.clone(), kc.clone(), vc.clone()
    for b, (n, c) in enumerate(zip(q_lens, ctx)):
        for i in range(max(0, c - window + 1) // block):
            kc[released[b, i]] = float("nan")
            vc[released[b, i]] = float("nan")
            released[b, i] = -1
    assert (released == -1).sum() > 100
    got = ops.paged_attention(*gpu(q, kc, vc, released, seq_lens, qsl), sliding_window=window)
    close(got, want, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_reshape_and_cache_skips_padding(dtype):
    g = torch.Generator().manual_seed(3)
    k = torch.randn(10, 4, 64, generator=g).to(dtype)
    v = torch.randn(10, 4, 64, generator=g).to(dtype)
    kc = torch.zeros(6, 16, 4, 64, dtype=dtype)
    vc = torch.zeros(6, 16, 4, 64, dtype=dtype)
    slots = torch.tensor([3, 17, -1, 40, 95, 0, -1, 60, 61, 2])
    kg, vg, kcg, vcg, sg = gpu(k, v, kc, vc, slots)
    ops.reshape_and_cache(k, v, kc, vc, slots)
    ops.reshape_and_cache(kg, vg, kcg, vcg, sg)
    assert torch.equal(kcg.cpu(), kc) and torch.equal(vcg.cpu(), vc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["decode", "chunked"])
def test_fused_qkv_views_on_the_gpu(dtype, case):
    """rotary, the cache write and attention on column slices of one QKV buffer on the GPU give
    what the CPU gives on contiguous copies: the GPU kernels index tokens by their stride."""
    from ops.fused_qkv import column_slices

    q_lens, ctx = {"decode": ([1] * 6, [17, 300, 1, 64, 900, 31]),
                   "chunked": ([64, 33, 1], [500, 1000, 70])}[case]
    q, kc, vc, tables, seq_lens, qsl = _paged(dtype, q_lens, ctx)
    g = torch.Generator().manual_seed(9)
    k, v = (torch.randn(q.shape[0], kc.shape[2], q.shape[2], generator=g).to(dtype)
            for _ in range(2))
    pos = (seq_lens.long().repeat_interleave(torch.tensor(q_lens)) - 1).clamp(max=4095)
    inv = 1.0 / (10000 ** (torch.arange(0, 128, 2).float() / 128))
    cache = torch.cat([torch.outer(torch.arange(4096).float(), inv).cos(),
                       torch.outer(torch.arange(4096).float(), inv).sin()], dim=1)
    slots = torch.randperm(kc.shape[0] * kc.shape[1], generator=g)[:q.shape[0]]
    _, (qg, kg, vg) = column_slices(gpu(q, k, v), pad=3)
    kcg, vcg, tg, sg, qslg, pg, cg, slg = gpu(kc, vc, tables, seq_lens, qsl, pos, cache, slots)
    ops.rotary_embedding(pos, q, k, cache)
    ops.rotary_embedding(pg, qg, kg, cg)
    close(qg, q, dtype)
    close(kg, k, dtype)
    ops.reshape_and_cache(k, v, kc, vc, slots)
    ops.reshape_and_cache(kg, vg, kcg, vcg, slg)
    close(kcg, kc, dtype)
    assert torch.equal(vcg.cpu(), vc)
    want = ops.paged_attention(q, kc, vc, tables, seq_lens, qsl)
    close(ops.paged_attention(qg, kcg, vcg, tg, sg, qslg), want, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode", ["softmax_topk", "topk_softmax"])
@pytest.mark.parametrize("experts, k", [(8, 2), (128, 4)])
def test_topk_routing(dtype, mode, experts, k):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(50, experts, generator=g).to(dtype)
    logits[3, :] = 0.5  # ties go to the lower id
    want_w, want_i = ops.topk_routing(logits, k, mode=mode)
    got_w, got_i = ops.topk_routing(logits.cuda(), k, mode=mode)
    assert torch.equal(got_i.cpu(), want_i)
    torch.testing.assert_close(got_w.cpu(), want_w, atol=1e-6, rtol=1e-5)


def _experts(dtype, E, H, I, mxfp4, seed=5):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype)
    if not mxfp4:
        return dict(w13=w13, w2=w2)
    (q13, s13), (q2, s2) = ops.mxfp4_quantize(w13.float()), ops.mxfp4_quantize(w2.float())
    return dict(w13=q13, w2=q2, w13_scales=s13, w2_scales=s2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("style", ["mixtral", "gpt-oss"])
@pytest.mark.parametrize("tokens", [1, 64])
def test_fused_moe(dtype, style, tokens):
    gpt_oss = style == "gpt-oss"
    E, k, H, I = (32, 4, 512, 256) if gpt_oss else (8, 2, 512, 384)
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(tokens, H, generator=g).to(dtype)
    weights = _experts(dtype, E, H, I, mxfp4=gpt_oss)
    if gpt_oss:
        weights.update(w13_bias=(0.1 * torch.randn(E, 2 * I, generator=g)).to(dtype),
                       w2_bias=(0.1 * torch.randn(E, H, generator=g)).to(dtype))
    logits = torch.randn(tokens, E, generator=g)
    mode = "topk_softmax" if gpt_oss else "softmax_topk"
    topk_w, topk_i = ops.topk_routing(logits, k, mode=mode)
    kw = dict(activation="swiglu_oai" if gpt_oss else "silu",
              gate_up_layout="interleaved" if gpt_oss else "concat")
    want = ops.fused_moe(hidden, topk_weights=topk_w, topk_ids=topk_i, **weights, **kw)
    got = ops.fused_moe(hidden.cuda(), topk_weights=topk_w.cuda(), topk_ids=topk_i.cuda(),
                        **{n: t.cuda() for n, t in weights.items()}, **kw)
    close(got, want, dtype, scale=2.0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_mxfp4_quantize_and_dequantize_match_bit_for_bit(dtype, rule):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(64, 1024, generator=g) * torch.logspace(-3, 3, 64)[:, None]).to(dtype)
    x[0, :32] = 0.0
    packed, scales = ops.mxfp4_quantize(x, scale_rule=rule)
    packed_g, scales_g = ops.mxfp4_quantize(x.cuda(), scale_rule=rule)
    assert torch.equal(packed_g.cpu(), packed) and torch.equal(scales_g.cpu(), scales)
    want = ops.mxfp4_dequantize(packed, scales, dtype=dtype)
    got = ops.mxfp4_dequantize(packed_g, scales_g, dtype=dtype)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 4, 16, 100, 512])
@pytest.mark.parametrize("bias", [False, True])
def test_mxfp4_gemm(dtype, m, bias):
    g = torch.Generator().manual_seed(8)
    n, k = 1536, 2048
    w, s = ops.mxfp4_quantize(torch.randn(n, k, generator=g) / k ** 0.5)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    want = ops.mxfp4_gemm(a, w, s, bias=b)
    got = ops.mxfp4_gemm(*gpu(a, w, s), bias=None if b is None else b.cuda())
    close(got, want, dtype, scale=2.0)


def test_ops_run_on_torchs_current_stream():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(8, 256, generator=g).cuda()
    w = torch.ones(256).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = ops.rms_norm(x, w, 1e-6)
    torch.cuda.current_stream().wait_stream(side)
    close(out, ops.rms_norm(x.cpu(), w.cpu(), 1e-6), torch.float32)


def test_cpu_and_gpu_tensors_mixed_are_refused():
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(torch.randn(2, 64).cuda(), torch.ones(64), 1e-6)
