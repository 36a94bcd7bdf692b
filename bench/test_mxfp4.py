"""MXFP4 GEMM at decode sizes against torch's bf16 matmul on the already-dequantised weight, plus
quantize/dequantize throughput against plain-torch implementations, all in the same run.

Shapes are gpt-oss-20b's expert projections: gate_up [N = 2I = 5760, K = H = 2880] and down
[N = H = 2880, K = I = 2880], at M in {1, 4, 8, 16} rows of bf16 activations (issue 17's goals
at N = 5760: >= 2x at M = 8, >= 1.5x at M = 16; the summary prints each ratio, and that of the
goal shapes timed back to back, call by call, `test_mxfp4_gemm_paired`) and at M = 64, a
prefill chunk, which runs with the rows in the vector lanes. Each call
reads the next of several weight copies, together larger than this machine's last-level cache,
so the weight streams from memory as in a real decode step (every layer's weights are
different).

extra_info: weight bytes read per call, the rate that makes, and its fraction of the copy
bandwidth measured in the same session (`memory_bandwidth`). MXFP4 reads 0.53125 bytes per
weight, bf16 2 bytes: about 3.8x fewer.
"""

import itertools

import pytest
import torch

from conftest import paired_speedup, record, speedup
from gnomon import ops
from gnomon.formats import MXFP4_BLOCK

ROTATION_BYTES = 256 << 20  # the weight copies of one benchmark together: well above an LLC

GEMM_SHAPES = [(5760, 2880), (2880, 2880)]  # (N, K)


def mxfp4_bytes(n, k):
    return n * k // 2 + n * k // MXFP4_BLOCK


def copies(enabled, nbytes):
    return max(2, -(-ROTATION_BYTES // nbytes)) if enabled else 1


def rotating(make, count):
    """A callable returning a fresh one of `count` objects from `make(i)` on each call."""
    return itertools.cycle([make(i) for i in range(count)]).__next__


def report(benchmark, suite, implementation, nbytes, memory_bandwidth, **extra):
    record(suite, implementation, benchmark)
    if benchmark.stats is not None:
        seconds = benchmark.stats.stats.median
        benchmark.extra_info.update(
            weight_bytes_per_call=nbytes, gb_per_s=nbytes / seconds / 1e9,
            fraction_of_memory_bandwidth=nbytes / seconds / memory_bandwidth,
            memory_bandwidth_gb_per_s=memory_bandwidth / 1e9, **extra)


@pytest.fixture(params=["1", "all"], ids=["threads1", "threadsall"])
def threads(request):
    """Both implementations run on 1 thread, then on torch's default count (gnomon's kernels
    follow torch.get_num_threads()). On a machine shared with other work the single-thread
    figures are the steadier ones."""
    before = torch.get_num_threads()
    if request.param == "1":
        torch.set_num_threads(1)
    yield torch.get_num_threads()
    torch.set_num_threads(before)


GOALS = {(8, 5760): 2, (16, 5760): 1.5}  # (M, N) -> speed multiple of torch bf16 (issue 17)


def gemm_call(implementation, m, n, k, enabled):
    """A call of `implementation` on [m, k] activations and the next of its weight copies, and
    the weight bytes it reads."""
    a = torch.randn(m, k).bfloat16()
    g = torch.Generator().manual_seed(0)

    def weight(i):
        return (torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8),
                torch.randint(120, 128, (n, k // MXFP4_BLOCK), generator=g, dtype=torch.uint8))

    if implementation == "gnomon":
        nbytes = mxfp4_bytes(n, k)
        next_weight = rotating(weight, copies(enabled, nbytes))
        return lambda: ops.mxfp4_gemm(a, *next_weight()), nbytes
    nbytes = n * k * 2
    next_weight = rotating(lambda i: ops.mxfp4_dequantize(*weight(i)), copies(enabled, nbytes))
    return lambda: a @ next_weight().T, nbytes


@pytest.mark.parametrize("m", [1, 4, 8, 16, 64])
@pytest.mark.parametrize("n, k", GEMM_SHAPES, ids=[f"N{n}-K{k}" for n, k in GEMM_SHAPES])
@pytest.mark.parametrize("implementation", ["gnomon", "torch-bf16"])
def test_mxfp4_gemm(benchmark, memory_bandwidth, threads, implementation, n, k, m):
    suite = f"mxfp4_gemm M={m} N={n} K={k} threads={threads}"
    benchmark.group = suite
    run, nbytes = gemm_call(implementation, m, n, k, benchmark.enabled)
    benchmark.pedantic(run, rounds=100, warmup_rounds=5)
    report(benchmark, suite, implementation, nbytes, memory_bandwidth, m=m, n=n, k=k,
           threads=threads)
    speedup(suite, "gnomon", "torch-bf16", goal=GOALS.get((m, n)))


@pytest.mark.parametrize("m, n", sorted(GOALS))
def test_mxfp4_gemm_paired(benchmarks_enabled, threads, m, n):
    """The goal shapes timed back to back (conftest.paired_speedup)."""
    k = 2880
    paired_speedup(f"mxfp4_gemm M={m} N={n} K={k} threads={threads}",
                   "gnomon", gemm_call("gnomon", m, n, k, benchmarks_enabled)[0],
                   "torch-bf16", gemm_call("torch-bf16", m, n, k, benchmarks_enabled)[0],
                   pairs=60 if benchmarks_enabled else 1, goal=GOALS[(m, n)])


# ---- quantize / dequantize ------------------------------------------------------------------------

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def torch_dequantize(packed, scales, dtype=torch.bfloat16):
    """Table lookup per nibble times the block scale, in plain torch."""
    table = torch.tensor(E2M1)
    values = torch.stack([table[(packed & 15).long()], table[(packed >> 4).long()]], -1)
    scale = torch.exp2(scales.float() - 127).masked_fill(scales == 255, float("nan"))
    return (values.view(*scales.shape, 32) * scale[..., None]).view(*packed.shape[:-1], -1).to(dtype)


def torch_quantize(x):
    """The "floor" rule in plain torch (NaN blocks not special-cased)."""
    blocks = x.float().view(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    exponent = (torch.frexp(amax).exponent - 3).clamp(-127, 127)
    v = (blocks * torch.exp2(-exponent.float())).abs()
    thresholds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    code = torch.bucketize(v, thresholds, right=False)  # ties: <= goes down
    code = code + (v == 0.75) + (v == 1.75) + (v == 3.5)  # ...except where the even code is up
    code = (code + 8 * torch.signbit(blocks)).view(*x.shape[:-1], -1)
    scales = torch.where(amax == 0, 0, exponent + 127).squeeze(-1).to(torch.uint8)
    return (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8), scales


QUANT_SHAPE = (5760, 2880)


@pytest.mark.parametrize("implementation", ["gnomon", "torch"])
def test_mxfp4_quantize(benchmark, memory_bandwidth, implementation):
    suite = "mxfp4_quantize bf16 [5760, 2880]"
    benchmark.group = suite
    x = torch.randn(QUANT_SHAPE).bfloat16()
    quantize = ops.mxfp4_quantize if implementation == "gnomon" else torch_quantize
    if implementation == "torch":  # the baseline agrees with gnomon on this input
        assert all(torch.equal(p, q) for p, q in zip(torch_quantize(x), ops.mxfp4_quantize(x)))
    benchmark.pedantic(quantize, args=(x,), rounds=5 if implementation == "torch" else 20)
    nbytes = x.numel() * 2 + mxfp4_bytes(*QUANT_SHAPE)
    report(benchmark, suite, implementation, nbytes, memory_bandwidth, elements=x.numel())


@pytest.mark.parametrize("implementation", ["gnomon", "torch"])
def test_mxfp4_dequantize(benchmark, memory_bandwidth, implementation):
    suite = "mxfp4_dequantize to bf16 [5760, 2880]"
    benchmark.group = suite
    packed, scales = ops.mxfp4_quantize(torch.randn(QUANT_SHAPE))
    dequantize = ops.mxfp4_dequantize if implementation == "gnomon" else torch_dequantize
    if implementation == "torch":
        assert torch.equal(torch_dequantize(packed, scales), ops.mxfp4_dequantize(packed, scales))
    benchmark.pedantic(dequantize, args=(packed, scales), rounds=5 if implementation == "torch" else 20)
    nbytes = packed.numel() * 2 * 2 + mxfp4_bytes(*QUANT_SHAPE)
    report(benchmark, suite, implementation, nbytes, memory_bandwidth,
           elements=packed.numel() * 2)
