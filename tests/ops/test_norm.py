"""rms_norm and rotary_embedding against pure-torch references."""

import pytest
import torch

import gnomon.ops as ops
from gnomon import _C
from gnomon.ops._tensor import view
from ops.fuzz import malformed_calls
from ops.fused_qkv import column_slices, head_strided, overlapping_rows

# Tolerances against a float64 reference: float32 accumulates in float32; bf16/fp16 round the output.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
FLOATING = list(TOLERANCE)


def rms_norm_reference(x, weight, eps):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("dtype", FLOATING)
@pytest.mark.parametrize("shape", [(1, 8), (5, 4096), (2, 3, 130), (7, 1)])
def test_rms_norm_matches_reference(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype) * 3
    weight = torch.randn(shape[-1], dtype=dtype)
    out = ops.rms_norm(x, weight, 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    expected = rms_norm_reference(x, weight, 1e-5)
    torch.testing.assert_close(out.double(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", FLOATING)
def test_rms_norm_with_residual_updates_it_in_place(dtype):
    torch.manual_seed(1)
    x = torch.randn(6, 256, dtype=dtype)
    residual = torch.randn(6, 256, dtype=dtype)
    weight = torch.rand(256, dtype=dtype) + 0.5
    summed = (x.float() + residual.float()).to(dtype)  # the residual stream keeps its dtype
    out = ops.rms_norm(x, weight, 1e-6, residual=residual)
    assert torch.equal(residual, summed)
    torch.testing.assert_close(out.double(), rms_norm_reference(summed, weight, 1e-6),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_rms_norm_of_zeros_is_zero_not_nan():
    out = ops.rms_norm(torch.zeros(2, 16), torch.ones(16), 1e-6)
    assert torch.equal(out, torch.zeros(2, 16))


def rotary_reference(positions, x, cos_sin_cache, is_neox):
    x = x.double().clone()
    rot = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache[positions].double().chunk(2, dim=-1)  # [T, rot/2]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = x[..., : rot // 2].clone(), x[..., rot // 2: rot].clone()
        x[..., : rot // 2] = x1 * cos - x2 * sin
        x[..., rot // 2: rot] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:rot:2].clone(), x[..., 1:rot:2].clone()
        x[..., 0:rot:2] = x1 * cos - x2 * sin
        x[..., 1:rot:2] = x2 * cos + x1 * sin
    return x


def cos_sin(max_position, rotary_dim, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


@pytest.mark.parametrize("dtype", FLOATING)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_rotary_embedding_matches_reference(dtype, is_neox, rotary_dim):
    torch.manual_seed(2)
    positions = torch.tensor([0, 5, 4095, 17, 3], dtype=torch.int64)
    query = torch.randn(5, 8, 64, dtype=dtype)
    key = torch.randn(5, 2, 64, dtype=dtype)
    cache = cos_sin(4096, rotary_dim)
    expected_q = rotary_reference(positions, query, cache, is_neox)
    expected_k = rotary_reference(positions, key, cache, is_neox)
    ops.rotary_embedding(positions, query, key, cache, is_neox=is_neox)
    tol = TOLERANCE[dtype] * 4
    torch.testing.assert_close(query.double(), expected_q, rtol=tol, atol=tol)
    torch.testing.assert_close(key.double(), expected_k, rtol=tol, atol=tol)


def test_rotary_leaves_dims_past_rotary_dim_untouched():
    query, key = torch.randn(3, 4, 64), torch.randn(3, 1, 64)
    tail_q, tail_k = query[..., 32:].clone(), key[..., 32:].clone()
    ops.rotary_embedding(torch.tensor([1, 2, 3]), query, key, cos_sin(8, 32))
    assert torch.equal(query[..., 32:], tail_q) and torch.equal(key[..., 32:], tail_k)


@pytest.mark.parametrize("dtype", FLOATING)
@pytest.mark.parametrize("pad", [0, 5])
def test_rotary_on_fused_qkv_views_rotates_only_q_and_k(dtype, pad):
    """Rotating column slices of one QKV buffer in place gives what rotating contiguous copies
    gives, bit for bit, and leaves the V columns and the spare (NaN) columns as they were."""
    g = torch.Generator().manual_seed(4)
    query, key, value = (torch.randn(9, h, 64, generator=g).to(dtype) for h in (8, 2, 2))
    positions = torch.randint(0, 4096, (9,), generator=g)
    buffer, (q_view, k_view, _) = column_slices([query, key, value], pad)
    untouched = buffer[:, (8 + 2) * 64:].clone()
    ops.rotary_embedding(positions, q_view, k_view, cos_sin(4096, 64))
    ops.rotary_embedding(positions, query, key, cos_sin(4096, 64))
    assert torch.equal(q_view, query) and torch.equal(k_view, key)
    torch.testing.assert_close(buffer[:, (8 + 2) * 64:], untouched, rtol=0, atol=0,
                               equal_nan=True)


@pytest.mark.parametrize("layout", [overlapping_rows, head_strided])
@pytest.mark.parametrize("argument", ["query", "key"])
def test_rotary_refuses_strides_it_cannot_honour(layout, argument):
    kwargs = _rotary_kwargs()
    kwargs[argument] = layout(kwargs[argument])
    before = {name: kwargs[name].clone() for name in ("query", "key")}
    with pytest.raises(ValueError, match=f"{argument}: expected each row"):
        ops.rotary_embedding(**kwargs)
    with pytest.raises(ValueError, match=f"{argument}: expected each row"):
        _C.rotary_embedding(*(view(kwargs[name]) for name in
                              ("positions", "query", "key", "cos_sin_cache")), True)
    assert all(torch.equal(kwargs[name], before[name]) for name in before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype):
    x, w = torch.randn(4, 64, dtype=dtype), torch.randn(64, dtype=dtype)
    torch.library.opcheck(torch.ops.gnomon.rms_norm.default, (x, w, 1e-6))
    torch.library.opcheck(torch.ops.gnomon.fused_add_rms_norm.default,
                          (x, torch.randn_like(x), w, 1e-6))
    torch.library.opcheck(torch.ops.gnomon.rotary_embedding.default,
                          (torch.tensor([0, 3, 1, 2]), torch.randn(4, 4, 32, dtype=dtype),
                           torch.randn(4, 2, 32, dtype=dtype), cos_sin(8, 32), True))


@pytest.mark.parametrize("call, match", [
    (lambda: ops.rms_norm(torch.randn(2, 8, dtype=torch.float64), torch.randn(8)), "x: expected dtype"),
    (lambda: ops.rms_norm(torch.randn(2, 8), torch.randn(9)), "weight: expected shape"),
    (lambda: ops.rms_norm(torch.randn(2, 8), torch.randn(8).bfloat16()), "weight: expected dtype"),
    (lambda: ops.rms_norm(torch.randn(8, 2).t(), torch.randn(8)), "x: expected a contiguous"),
    (lambda: ops.rms_norm(torch.randn(2, 8), torch.randn(8), residual=torch.randn(2, 9)), "residual"),
    (lambda: ops.rms_norm(torch.randn(2, 8), torch.randn(8), -1.0), "eps"),
    (lambda: ops.rms_norm(torch.randn(2, 8), torch.randn(8), float("nan")), "eps"),
    (lambda: ops.rotary_embedding(torch.tensor([0, 9]), torch.randn(2, 2, 8), torch.randn(2, 1, 8),
                                  cos_sin(8, 8)), "positions: entry 1 = 9"),
    (lambda: ops.rotary_embedding(torch.tensor([0, 1]), torch.randn(2, 2, 8), torch.randn(2, 1, 8),
                                  cos_sin(8, 16)), "cos_sin_cache: rotary dim"),
    (lambda: ops.rotary_embedding(torch.tensor([0, 1], dtype=torch.int32), torch.randn(2, 2, 8),
                                  torch.randn(2, 1, 8), cos_sin(8, 8)), "positions: expected dtype"),
    (lambda: ops.rotary_embedding(torch.tensor([0, 1]), torch.randn(2, 2, 8), torch.randn(2, 1, 4),
                                  cos_sin(8, 4)), "key: expected shape"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_rotary_bad_position_changes_nothing():
    query, key = torch.randn(2, 2, 8), torch.randn(2, 1, 8)
    before = query.clone(), key.clone()
    with pytest.raises(ValueError, match="positions"):
        ops.rotary_embedding(torch.tensor([0, -1]), query, key, cos_sin(8, 8))
    assert torch.equal(query, before[0]) and torch.equal(key, before[1])


def test_c_entry_rechecks_what_the_wrapper_checked():
    x, out = torch.randn(4, 8), torch.empty(4, 8)
    with pytest.raises(ValueError, match="weight: expected shape"):
        _C.rms_norm(view(out), view(x), view(torch.randn(16)), 1e-6, None)
    with pytest.raises(ValueError, match="out: expected shape"):
        _C.rms_norm(view(torch.empty(2, 8)), view(x), view(torch.randn(8)), 1e-6, None)
    with pytest.raises(TypeError, match="x: expected dtype"):
        _C.rms_norm(view(out), view(x.int()), view(torch.randn(8)), 1e-6, None)


def _rms_norm_kwargs():
    return dict(x=torch.randn(3, 64), weight=torch.randn(64), eps=1e-6, residual=torch.randn(3, 64))


def _rotary_kwargs():
    return dict(positions=torch.arange(3), query=torch.randn(3, 4, 16), key=torch.randn(3, 2, 16),
                cos_sin_cache=cos_sin(8, 16), is_neox=True)


test_rms_norm_malformed_calls = malformed_calls(ops.rms_norm, _rms_norm_kwargs)
test_rotary_embedding_malformed_calls = malformed_calls(ops.rotary_embedding, _rotary_kwargs,
                                                        index_args=("positions",))
