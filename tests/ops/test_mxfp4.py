"""mxfp4_quantize / mxfp4_dequantize / mxfp4_gemm against an independent pure-torch reference.

The reference below shares no code with gnomon: it rounds by searching the E2M1 grid for the
nearest value (ties to the even code), derives scales from float64 log2, and dequantises in
float64. Quantize and dequantize must match it bit for bit; the GEMM is compared with a float64
matmul on the reference-dequantised weight, with the tolerances stated at `gemm_tolerance`.
"""

import math

import pytest
import torch

from gnomon import _C, ops
from gnomon.ops._tensor import view
from ops.fuzz import malformed_calls

# ---- the reference -------------------------------------------------------------------------------

# E2M1 codes 0-15: bit 3 is the sign, codes 0-7 are these magnitudes.
E2M1_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_VALUES = E2M1_MAGNITUDES + [-v for v in E2M1_MAGNITUDES]  # code 8 is -0.0


def ref_encode(v: torch.Tensor) -> torch.Tensor:
    """float64 values (already divided by the scale) -> E2M1 codes (int64), nearest-even, +-6."""
    grid = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)
    distance = (v.abs().unsqueeze(-1) - grid).abs()
    nearest = distance == distance.min(-1, keepdim=True).values
    index = torch.arange(8)
    # Among equally near grid values prefer the even code (its mantissa bit is 0).
    code = torch.where(nearest, index + 16 * (index % 2), 1000).argmin(-1)
    return code + 8 * torch.signbit(v).long()


def ref_scale_exponent(amax: torch.Tensor, rule: str) -> torch.Tensor:
    """Unbiased E8M0 exponent per block for finite amax > 0 (float64), clamped to [-127, 127]."""
    if rule == "floor":
        exponent = torch.floor(torch.log2(amax)) - 2
    else:  # the smallest power of two with amax / scale <= 6
        exponent = torch.ceil(torch.log2(amax / 6))
    return exponent.clamp(-127, 127)


def ref_quantize(x: torch.Tensor, rule: str = "floor"):
    """x [..., K] -> (packed uint8 [..., K/2], scales uint8 [..., K/32])."""
    blocks = x.double().reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = blocks.abs().amax(-1)
    bad = ~torch.isfinite(blocks).all(-1)
    zero = amax == 0
    exponent = ref_scale_exponent(torch.where(bad | zero, 1.0, amax), rule)
    exponent = torch.where(zero, -127.0, exponent)
    codes = ref_encode(blocks / torch.exp2(exponent).unsqueeze(-1))
    codes = torch.where(bad.unsqueeze(-1), 0, codes)
    scales = torch.where(bad, 255, exponent.long() + 127).to(torch.uint8)
    codes = codes.reshape(x.shape)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed, scales


def ref_dequantize(packed: torch.Tensor, scales: torch.Tensor, dtype=torch.float32):
    """The exact float64 value of every element, rounded once to float32, then to `dtype`."""
    codes = torch.stack([packed.long() & 15, packed.long() >> 4], -1).flatten(-2)
    values = torch.tensor(E2M1_VALUES, dtype=torch.float64)[codes]
    scale = torch.exp2(scales.double() - 127)
    scale = torch.where(scales == 255, math.nan, scale)
    values = values.reshape(*scales.shape, 32) * scale.unsqueeze(-1)
    return values.reshape(codes.shape).to(torch.float32).to(dtype)


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), nan)
    int_type = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[actual.element_size()]
    assert torch.equal(actual[~nan].view(int_type), expected[~nan].view(int_type))


def random_values(shape, seed, dtype=torch.float32):
    """Values spread over many binades (tiny, huge, subnormal, exact grid points, zeros)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-20, 20, shape, generator=g).double())
    # Some blocks on a small integer grid, so ties and exact codes occur.
    grid = (torch.randint(-14, 15, shape, generator=g) / 4).double()
    x = torch.where(torch.rand(shape, generator=g) < 0.3, grid, x)
    return x.to(dtype)


# ---- E2M1 codes, rounding and packing --------------------------------------------------------------


def block(values, pad=0.0):
    return torch.tensor(list(values) + [pad] * (32 - len(values)), dtype=torch.float32)


def codes_of(packed: torch.Tensor) -> list:
    flat = packed.reshape(-1).long()
    return torch.stack([flat & 15, flat >> 4], -1).flatten().tolist()


def test_all_16_codes_dequantize_exactly():
    packed = torch.tensor([c | (c << 4) for c in range(16)], dtype=torch.uint8)
    out = ops.mxfp4_dequantize(packed, torch.tensor([127], dtype=torch.uint8), dtype=torch.float32)
    assert out[0::2].tolist() == E2M1_VALUES and out[1::2].tolist() == E2M1_VALUES
    assert torch.signbit(out[16]) and torch.signbit(out[17])  # code 8 is -0.0


@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_all_16_values_quantize_to_their_codes(rule):
    packed, scales = ops.mxfp4_quantize(block(E2M1_VALUES + E2M1_VALUES), scale_rule=rule)
    assert scales.tolist() == [127]  # amax 6: scale 1 under both rules
    assert codes_of(packed) == list(range(16)) * 2


def test_ties_round_to_even_and_saturate():
    # amax 6.1 gives scale 1 (floor(log2 6.1) - 2 = 0), so these are the element values.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.1]
    expected = [0, 2, 2, 4, 4, 6, 6, 7]  # 0, 1, 1, 2, 2, 4, 4, 6
    packed, scales = ops.mxfp4_quantize(block(ties + [-t for t in ties]))
    assert scales.tolist() == [127]
    assert codes_of(packed)[:16] == expected + [c + 8 for c in expected]


@pytest.mark.parametrize("amax, floor_exponent, ceil_exponent", [
    (6.0, 0, 0),      # exactly representable under both
    (4.0, 0, 0),      # a power of two
    (8.0, 1, 1),
    (1.0, -2, -2),
    (0.5, -3, -3),
    (7.0, 0, 1),      # floor: 7 / 1 lies in (6, 8) and saturates; ceil: 3.5 rounds to 4
    (6.5, 0, 1),
    (12.0, 1, 1),
    (12.5, 1, 2),
    (2.0 ** 100, 98, 98),
    (3.4028234663852886e38, 125, 126),  # float32's largest: the top of both rules' range
    (2.0 ** -140, -127, -127),  # subnormal input: the exponent clamps at E8M0's minimum
])
def test_scale_rules(amax, floor_exponent, ceil_exponent):
    x = block([amax, -amax / 2, amax / 3])
    for rule, exponent in (("floor", floor_exponent), ("ceil", ceil_exponent)):
        packed, scales = ops.mxfp4_quantize(x, scale_rule=rule)
        assert scales.tolist() == [exponent + 127], rule
        expected_packed, expected_scales = ref_quantize(x, rule)
        assert torch.equal(packed, expected_packed) and torch.equal(scales, expected_scales)


def test_floor_saturates_and_ceil_does_not():
    x = block([7.0, 6.5, -7.0])
    floor_packed, _ = ops.mxfp4_quantize(x, scale_rule="floor")
    ceil_packed, _ = ops.mxfp4_quantize(x, scale_rule="ceil")
    assert codes_of(floor_packed)[:3] == [7, 7, 15]   # 6, 6, -6 at scale 1
    assert codes_of(ceil_packed)[:3] == [6, 5, 14]    # 3.5 -> 4, 3.25 -> 3, -3.5 -> -4 at scale 2


def test_nibble_order():
    # Element 2i in the low nibble: [1, 2] -> codes 2 and 4 -> byte 0x42.
    packed, _ = ops.mxfp4_quantize(block([1.0, 2.0, 4.0, -0.5]))
    assert packed[:2].tolist() == [0x42, 0x96]
    out = ops.mxfp4_dequantize(torch.tensor([0x42] + [0] * 15, dtype=torch.uint8),
                               torch.tensor([127], dtype=torch.uint8), dtype=torch.float32)
    assert out[:3].tolist() == [1.0, 2.0, 0.0]


def test_all_zero_blocks_get_scale_zero():
    x = torch.zeros(2, 96)
    x[1, 32:64] = -0.0
    x[1, 64] = 4.0
    packed, scales = ops.mxfp4_quantize(x)
    assert scales.tolist() == [[0, 0, 0], [0, 0, 127]]
    out = ops.mxfp4_dequantize(packed, scales, dtype=torch.float32)
    assert torch.equal(out, x) and torch.equal(torch.signbit(out), torch.signbit(x))


def test_e8m0_extremes():
    # One block per scale byte, holding codes 1 (0.5), 2 (1.0), 7 (6.0) and 15 (-6.0).
    packed = torch.zeros(4, 16, dtype=torch.uint8)
    packed[:, 0] = 1 | (2 << 4)
    packed[:, 1] = 7 | (15 << 4)
    scales = torch.tensor([[0x00], [0x7f], [0xfe], [0xff]], dtype=torch.uint8)
    out = ops.mxfp4_dequantize(packed, scales, dtype=torch.float32).double()
    assert out[0, :4].tolist() == [2.0 ** -128, 2.0 ** -127, 6 * 2.0 ** -127, -6 * 2.0 ** -127]
    assert out[1, :4].tolist() == [0.5, 1.0, 6.0, -6.0]
    assert out[2, :2].tolist() == [2.0 ** 126, 2.0 ** 127]
    assert out[2, 2:4].tolist() == [math.inf, -math.inf]  # 6 * 2^127 overflows float32
    assert torch.isnan(out[3]).all()  # 0xFF is NaN, zero codes included
    assert_bitwise_equal(ops.mxfp4_dequantize(packed, scales, dtype=torch.float32),
                         ref_dequantize(packed, scales))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_blocks_get_the_nan_scale(bad):
    x = random_values((2, 128), seed=1)
    x[1, 40] = bad
    packed, scales = ops.mxfp4_quantize(x)
    assert scales[1, 1] == 0xFF and (scales[0] != 0xFF).all() and (scales[1, [0, 2, 3]] != 0xFF).all()
    out = ops.mxfp4_dequantize(packed, scales, dtype=torch.float32)
    assert torch.isnan(out[1, 32:64]).all()
    assert not torch.isnan(out[0]).any() and not torch.isnan(out[1, 64:]).any()
    expected = ref_quantize(x)
    assert torch.equal(packed, expected[0]) and torch.equal(scales, expected[1])


# ---- round trip, bit-exact against the reference ----------------------------------------------------


@pytest.mark.parametrize("rule", ["floor", "ceil"])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(32,), (3, 64), (2, 5, 160), (1, 1, 1024), (0, 64), (4, 0, 32)])
def test_round_trip_matches_reference(rule, in_dtype, shape):
    x = random_values(shape, seed=len(shape) * 100 + shape[-1], dtype=in_dtype)
    packed, scales = ops.mxfp4_quantize(x, scale_rule=rule)
    expected_packed, expected_scales = ref_quantize(x, rule)
    assert packed.shape == (*shape[:-1], shape[-1] // 2) and scales.shape == (*shape[:-1], shape[-1] // 32)
    assert torch.equal(packed, expected_packed)
    assert torch.equal(scales, expected_scales)
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert_bitwise_equal(ops.mxfp4_dequantize(packed, scales, dtype=out_dtype),
                             ref_dequantize(packed, scales, out_dtype))


def test_dequantize_arbitrary_bytes_matches_reference():
    g = torch.Generator().manual_seed(7)
    packed = torch.randint(0, 256, (37, 3, 48), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 256, (37, 3, 3), generator=g, dtype=torch.uint8)  # all 256 bytes
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = ops.mxfp4_dequantize(packed, scales, dtype=dtype)
        assert out.shape == (37, 3, 96)
        assert_bitwise_equal(out, ref_dequantize(packed, scales, dtype))


def test_large_tensor_spans_threads():
    x = random_values((300, 2048), seed=3)
    packed, scales = ops.mxfp4_quantize(x)
    expected = ref_quantize(x)
    assert torch.equal(packed, expected[0]) and torch.equal(scales, expected[1])
    assert_bitwise_equal(ops.mxfp4_dequantize(packed, scales, dtype=torch.bfloat16),
                         ref_dequantize(packed, scales, torch.bfloat16))


# ---- GEMM ----------------------------------------------------------------------------------------


def random_weight(n, k, seed):
    """MXFP4 weight bytes and scales around 2^-4..2^2, plus the reference float64 weight."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    w_scales = torch.randint(123, 130, (n, k // 32), generator=g, dtype=torch.uint8)
    return w, w_scales


def gemm_reference(a, w, w_scales, bias=None):
    out = a.double() @ ref_dequantize(w, w_scales, torch.float64).T
    return out if bias is None else out + bias.double()


def gemm_tolerance(a, w, w_scales, out_dtype):
    """Per-element bound: float32 accumulation error, 2e-6 * sum_k |a_k w_k| (K <= 3k terms, in
    practice far below K * 2^-24), plus rounding the result to out_dtype (half an ulp: 2^-8
    relative for bfloat16, 2^-11 for float16)."""
    magnitude = a.double().abs() @ ref_dequantize(w, w_scales, torch.float64).abs().T
    tol = 2e-6 * magnitude
    if out_dtype == torch.bfloat16:
        tol = tol + 2.0 ** -8 * magnitude
    elif out_dtype == torch.float16:
        tol = tol + 2.0 ** -11 * magnitude
    return tol


def check_gemm(a, w, w_scales, bias=None, out_dtype=None):
    out = ops.mxfp4_gemm(a, w, w_scales, bias=bias, out_dtype=out_dtype)
    out_dtype = out_dtype or a.dtype
    assert out.dtype == out_dtype and out.shape == (a.shape[0], w.shape[0])
    expected = gemm_reference(a, w, w_scales, bias)
    tol = gemm_tolerance(a, w, w_scales, out_dtype)
    if bias is not None and out_dtype != torch.float32:
        tol = tol + 2.0 ** -8 * bias.double().abs()
    error = (out.double() - expected).abs()
    assert (error <= tol).all(), f"max error {error.max()} at tol {tol.flatten()[error.argmax()]}"
    return out


# The GEMM has four kernels: 16-lane float32 tiles (AVX-512), 8-lane float32 tiles (everything
# else) and, for bf16 activations, bf16 dot products (AVX512-BF16) and AMX tiles (from 4 rows on
# AMX-BF16 CPUs; from 32 rows the dot products run with the rows in the lanes too).
# GNOMON_CPU_KERNELS restricts the choice, so every kernel this CPU can run is tested here.
BF16_DOT_FAMILIES = ("avx512-bf16", "amx-bf16")


@pytest.fixture(params=["auto", "narrow", "wide", "bf16"])
def gemm_kernel(request, monkeypatch):
    if request.param != "auto":
        monkeypatch.setenv("GNOMON_CPU_KERNELS", request.param)
    return request.param


def test_gemm_kernel_override_is_checked(monkeypatch):
    w, w_scales = random_weight(4, 64, seed=0)
    monkeypatch.setenv("GNOMON_CPU_KERNELS", "fastest")
    with pytest.raises(ValueError, match="GNOMON_CPU_KERNELS: expected 'narrow', 'wide'"):
        ops.mxfp4_gemm(torch.randn(1, 64), w, w_scales)


# K covers every tail the kernels have: K % 128 in {0, 32, 64, 96}, K % 64 in {0, 32}.
@pytest.mark.parametrize("k", [32, 64, 96, 128, 160, 224, 288, 2880])
@pytest.mark.parametrize("m", [1, 3, 4, 8, 9])
def test_gemm_matches_reference_float32(gemm_kernel, m, k):
    n = 37  # not a multiple of the 4-row tile
    w, w_scales = random_weight(n, k, seed=m * 1000 + k)
    a = torch.randn(m, k, generator=torch.Generator().manual_seed(k))
    check_gemm(a, w, w_scales)


# M >= 32 bf16 rows on AVX512-BF16 run with the rows in the lanes (16 per vector).
@pytest.mark.parametrize("m", [1, 2, 5, 8, 16, 21, 32, 33, 48])
def test_gemm_bfloat16_and_float16(gemm_kernel, m):
    k, n = 320, 70
    w, w_scales = random_weight(n, k, seed=m)
    a = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    check_gemm(a.bfloat16(), w, w_scales)
    check_gemm(a.half(), w, w_scales)


def test_gemm_large_shape_spans_threads(gemm_kernel):
    w, w_scales = random_weight(2880, 2880, seed=5)
    a = torch.randn(4, 2880, generator=torch.Generator().manual_seed(5)).bfloat16()
    check_gemm(a, w, w_scales)


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gemm_bias(gemm_kernel, bias_dtype):
    w, w_scales = random_weight(19, 96, seed=11)
    a = torch.randn(3, 96)
    bias = (torch.randn(19) * 10).to(bias_dtype)
    check_gemm(a, w, w_scales, bias=bias)
    check_gemm(a.bfloat16(), w, w_scales, bias=bias)


@pytest.mark.parametrize("a_dtype, out_dtype", [
    (torch.float32, torch.bfloat16), (torch.float32, torch.float16),
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
])
def test_gemm_out_dtype(a_dtype, out_dtype):
    w, w_scales = random_weight(23, 192, seed=13)
    check_gemm(torch.randn(6, 192).to(a_dtype), w, w_scales, out_dtype=out_dtype)


def test_gemm_extreme_and_nan_scales(gemm_kernel):
    w, w_scales = random_weight(8, 128, seed=17)
    w_scales[0] = 0x00          # 2^-127: products far below float32's normal range
    w_scales[1] = 0xE0          # 2^97
    w_scales[2, 1] = 0xFF       # one NaN block poisons its whole output column
    a = torch.randn(5, 128)
    out = ops.mxfp4_gemm(a, w, w_scales)
    assert torch.isnan(out[:, 2]).all()
    assert torch.isnan(ops.mxfp4_gemm(a.bfloat16(), w, w_scales)[:, 2]).all()
    keep = [0, 1, 3, 4, 5, 6, 7]
    expected = gemm_reference(a, w, w_scales)[:, keep]
    tol = gemm_tolerance(a, w[keep], w_scales[keep], torch.float32)
    assert ((out[:, keep].double() - expected).abs() <= tol + 2.0 ** -140).all()
    check_gemm(a.bfloat16(), w[keep], w_scales[keep])
    check_gemm(a.bfloat16(), w[keep], w_scales[keep], out_dtype=torch.float32)


@pytest.mark.parametrize("m", [3, 32])
@pytest.mark.parametrize("a_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [0x00, 0x01, 0x02, 0xFC, 0xFD, 0xFE, 0xFF])
def test_gemm_scale_edges_on_zero_and_extreme_blocks(gemm_kernel, scale, a_dtype, m):
    """Scale bytes at both ends of E8M0 (2^-127, 2^-126, 2^-125, 2^125, 2^126, 2^127, NaN) on
    an all-zero block, a block of +6, a block of -6 and mixed codes, each in a row of its own
    beside ordinary rows, with activations of 2^-10..2^-9. With 32 bf16 rows the rows-in-lanes
    kernel folds scale bytes 2..252 into bf16 weights (2^-125 and 2^125 are its edges) and
    leaves the others to the tiles.

    At 2^126 and 2^127 a weight of 4 or more exceeds float32. The float32 kernels scale the
    decoded weights, so such a weight is +-inf, as the float32 dequantised weight is (and a row
    with both signs is NaN); the bf16 dot kernel scales the sums of unscaled products, so it
    gives the finite exact result. Each is checked against its own rule."""
    k = 128
    w, w_scales = random_weight(8, k, seed=23)
    w[0], w[1], w[2] = 0x00, 0x77, 0xFF  # codes 0 (+0), 7 (+6), 15 (-6) in every nibble
    w_scales[:4, 1] = scale  # rows 0..3: one block (of four) at the edge scale
    g = torch.Generator().manual_seed(5)
    a = ((torch.rand(m, k, generator=g) + 1.0) * 2.0 ** -10).to(a_dtype)
    out = ops.mxfp4_gemm(a, w, w_scales, out_dtype=torch.float32)
    bf16_dot = a_dtype == torch.bfloat16 and _C.cpu_kernel_isa() in BF16_DOT_FAMILIES
    if bf16_dot and scale != 0xFF:  # the exact weights, not rounded to float32 first
        codes = torch.stack([w.long() & 15, w.long() >> 4], -1).flatten(-2)
        exact = torch.tensor(E2M1_VALUES, dtype=torch.float64)[codes].reshape(8, k // 32, 32)
        exact = (exact * torch.exp2(w_scales.double() - 127).unsqueeze(-1)).reshape(8, k)
        expected = a.double() @ exact.T
        tol = 2e-6 * (a.double().abs() @ exact.abs().T) + 2.0 ** -140
    else:
        expected = gemm_reference(a, w, w_scales)
        tol = gemm_tolerance(a, w, w_scales, torch.float32) + 2.0 ** -140
    if scale == 0xFF:  # the NaN scale poisons its rows, the zero block's row included
        assert torch.isnan(out[:, :4]).all()
    special = ~torch.isfinite(expected)
    assert torch.equal(torch.isnan(out), torch.isnan(expected))
    assert torch.equal(torch.isinf(out) & (out > 0), torch.isinf(expected) & (expected > 0))
    assert torch.equal(torch.isinf(out) & (out < 0), torch.isinf(expected) & (expected < 0))
    assert ((out[~special].double() - expected[~special]).abs() <= tol[~special]).all()
    if scale in (0x00, 0x01):
        assert torch.isfinite(out).all() and (out[:, 1] > 0).all() and (out[:, 2] < 0).all()


def test_gemm_of_quantized_weight():
    x = torch.randn(48, 256)
    w, w_scales = ops.mxfp4_quantize(x)
    a = torch.randn(2, 256)
    out = ops.mxfp4_gemm(a, w, w_scales)
    dense = a @ ops.mxfp4_dequantize(w, w_scales, dtype=torch.float32).T
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-4)


def test_gemm_empty_dims():
    w, w_scales = random_weight(5, 64, seed=1)
    assert ops.mxfp4_gemm(torch.randn(0, 64), w, w_scales).shape == (0, 5)
    empty_w, empty_scales = random_weight(0, 64, seed=1)
    assert ops.mxfp4_gemm(torch.randn(3, 64), empty_w, empty_scales).shape == (3, 0)


# ---- torch.library: opcheck and torch.compile -------------------------------------------------------


def opcheck_cases():
    w, w_scales = random_weight(12, 64, seed=2)
    x = torch.randn(3, 2, 64)
    packed, scales = ref_quantize(x)
    return [
        (torch.ops.gnomon.mxfp4_quantize.default, (x, "floor")),
        (torch.ops.gnomon.mxfp4_quantize.default, (x.bfloat16(), "ceil")),
        (torch.ops.gnomon.mxfp4_dequantize.default, (packed, scales, torch.float32)),
        (torch.ops.gnomon.mxfp4_dequantize.default, (packed, scales, torch.bfloat16)),
        (torch.ops.gnomon.mxfp4_gemm.default, (torch.randn(3, 64), w, w_scales, None, torch.float32)),
        (torch.ops.gnomon.mxfp4_gemm.default,
         (torch.randn(2, 64).bfloat16(), w, w_scales, torch.randn(12).bfloat16(), torch.bfloat16)),
    ]


@pytest.mark.parametrize("case", range(6))
def test_opcheck(case):
    op, args = opcheck_cases()[case]
    torch.library.opcheck(op, args)


def test_traces_under_torch_compile_fullgraph():
    w, w_scales = random_weight(16, 64, seed=4)

    def layer(a):
        packed, scales = ops.mxfp4_quantize(a, scale_rule="ceil")
        a = ops.mxfp4_dequantize(packed, scales, dtype=torch.float32)
        return ops.mxfp4_gemm(a, w, w_scales, out_dtype=torch.bfloat16)

    a = torch.randn(3, 64)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(a), layer(a))


# ---- bad input -----------------------------------------------------------------------------------


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="x: K .* multiple of 32"):
        ops.mxfp4_quantize(torch.randn(2, 48))
    with pytest.raises(TypeError, match="x: expected dtype"):
        ops.mxfp4_quantize(torch.randn(2, 64).double())
    with pytest.raises(TypeError, match="x: expected dtype"):
        ops.mxfp4_quantize(torch.ones(2, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="x: expected at least 1 dim"):
        ops.mxfp4_quantize(torch.tensor(1.0))
    with pytest.raises(ValueError, match="x: expected a contiguous"):
        ops.mxfp4_quantize(torch.randn(64, 2).T)
    with pytest.raises(ValueError, match="scale_rule: expected one of 'floor', 'ceil'"):
        ops.mxfp4_quantize(torch.randn(2, 64), scale_rule="round")
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        ops.mxfp4_quantize([1.0] * 32)


def test_dequantize_rejects_bad_input():
    packed, scales = ref_quantize(torch.randn(2, 64))
    with pytest.raises(TypeError, match="packed: expected dtype uint8"):
        ops.mxfp4_dequantize(packed.float(), scales)
    with pytest.raises(TypeError, match="scales: expected dtype uint8"):
        ops.mxfp4_dequantize(packed, scales.int())
    with pytest.raises(ValueError, match="packed: the last dim"):
        ops.mxfp4_dequantize(packed[:, :24].contiguous(), scales)
    with pytest.raises(ValueError, match="scales: expected shape"):
        ops.mxfp4_dequantize(packed, scales[:, :1].contiguous())
    with pytest.raises(ValueError, match="scales: expected shape"):
        ops.mxfp4_dequantize(packed, scales[:1])
    with pytest.raises(TypeError, match="dtype: expected"):
        ops.mxfp4_dequantize(packed, scales, dtype=torch.int32)


def test_gemm_rejects_bad_input():
    w, w_scales = random_weight(8, 64, seed=0)
    a = torch.randn(2, 64)
    with pytest.raises(ValueError, match="a: K .* multiple of 32"):
        ops.mxfp4_gemm(torch.randn(2, 48), w[:, :24].contiguous(), w_scales[:, :1].contiguous())
    with pytest.raises(ValueError, match="a: expected a 2-D"):
        ops.mxfp4_gemm(a[None], w, w_scales)
    with pytest.raises(TypeError, match="a: expected dtype"):
        ops.mxfp4_gemm(a.double(), w, w_scales)
    with pytest.raises(TypeError, match="w: expected dtype uint8"):
        ops.mxfp4_gemm(a, w.float(), w_scales)
    with pytest.raises(ValueError, match=r"w: expected shape \(N, 32\)"):
        ops.mxfp4_gemm(a, w[:, :16].contiguous(), w_scales)
    with pytest.raises(ValueError, match="w_scales: expected shape"):
        ops.mxfp4_gemm(a, w, w_scales[:7].contiguous())
    with pytest.raises(ValueError, match="w_scales: expected shape"):
        ops.mxfp4_gemm(a, w, w_scales[:, :1].contiguous())
    with pytest.raises(TypeError, match="w_scales: expected dtype uint8"):
        ops.mxfp4_gemm(a, w, w_scales.float())
    with pytest.raises(ValueError, match="bias: expected shape"):
        ops.mxfp4_gemm(a, w, w_scales, bias=torch.randn(9))
    with pytest.raises(TypeError, match="bias: expected dtype"):
        ops.mxfp4_gemm(a, w, w_scales, bias=torch.ones(8, dtype=torch.int64))
    with pytest.raises(TypeError, match="out_dtype: expected"):
        ops.mxfp4_gemm(a, w, w_scales, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="w: expected a contiguous"):
        ops.mxfp4_gemm(a, torch.cat([w, w], 1)[:, ::2], w_scales)


def test_c_entries_check_their_own_shapes():
    a = torch.randn(2, 64)
    w, w_scales = random_weight(8, 64, seed=0)
    out = torch.empty(2, 8)
    with pytest.raises(ValueError, match="w_scales"):
        _C.mxfp4_gemm(view(out), view(a), view(w), view(w_scales[:, :1].contiguous()), None)
    with pytest.raises(ValueError, match="out"):
        _C.mxfp4_gemm(view(torch.empty(2, 9)), view(a), view(w), view(w_scales), None)
    with pytest.raises(ValueError, match="packed"):
        _C.mxfp4_quantize(view(torch.empty(2, 16, dtype=torch.uint8)),
                          view(torch.empty(2, 2, dtype=torch.uint8)), view(a), "floor")
    with pytest.raises(ValueError, match="scale_rule"):
        _C.mxfp4_quantize(view(torch.empty(2, 32, dtype=torch.uint8)),
                          view(torch.empty(2, 2, dtype=torch.uint8)), view(a), "nearest")
    with pytest.raises(ValueError, match="out: K"):
        _C.mxfp4_dequantize(view(torch.empty(2, 48)), view(torch.empty(2, 24, dtype=torch.uint8)),
                            view(torch.empty(2, 1, dtype=torch.uint8)))


def _quantize_kwargs():
    return dict(x=torch.randn(2, 64), scale_rule="floor")


_FUZZ_PACKED, _FUZZ_SCALES = random_weight(3, 64, seed=0)


def _dequantize_kwargs():
    return dict(packed=_FUZZ_PACKED.clone(), scales=_FUZZ_SCALES.clone(), dtype=torch.float32)


def _gemm_kwargs():
    w, w_scales = random_weight(6, 64, seed=0)
    return dict(a=torch.randn(2, 64), w=w, w_scales=w_scales, bias=torch.randn(6), out_dtype=None)


test_mxfp4_quantize_malformed_calls = malformed_calls(ops.mxfp4_quantize, _quantize_kwargs)
test_mxfp4_dequantize_malformed_calls = malformed_calls(ops.mxfp4_dequantize, _dequantize_kwargs)
test_mxfp4_gemm_malformed_calls = malformed_calls(ops.mxfp4_gemm, _gemm_kwargs)
