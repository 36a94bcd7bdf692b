"""MXFP4 (OCP MX v1.0): mxfp4_quantize, mxfp4_dequantize and mxfp4_gemm.

The format (DESIGN.md): a row of K elements (K a multiple of 32) is stored as uint8 ``[..., K/2]``
E2M1 codes, element ``2i`` in the low nibble of byte ``i``, and uint8 ``[..., K/32]`` E8M0 scales
(``2^(byte - 127)``, 0xFF = NaN), one per block of 32 elements. This is the layout of the HF
gpt-oss ``*_blocks`` / ``*_scales`` tensors with the last two dims of ``*_blocks`` flattened.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from gnomon import _C
from gnomon.formats import MXFP4_BLOCK
from gnomon.ops._tensor import (FLOATING, call, check_choice, check_same_device, check_tensor,
                                custom_op, follow_torch_threads, view)

SCALE_RULES = ("floor", "ceil")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`t` as the 2-D [rows, last dim] tensor the C++ entries take."""
    return t.view(math.prod(t.shape[:-1]), t.shape[-1])


def _check_k(k: int, name: str) -> None:
    if k % MXFP4_BLOCK:
        raise ValueError(f"{name}: K (the last dim) must be a multiple of {MXFP4_BLOCK}, got {k}")


def _check_quantize(x, scale_rule) -> None:
    check_tensor(x, "x", dtypes=FLOATING)
    if x.dim() < 1:
        raise ValueError("x: expected at least 1 dim [..., K], got a scalar")
    _check_k(x.shape[-1], "x")


@custom_op("mxfp4_quantize", mutates_args=())
def _mxfp4_quantize(x: torch.Tensor, scale_rule: str) -> Tuple[torch.Tensor, torch.Tensor]:
    follow_torch_threads()
    k = x.shape[-1]
    packed = x.new_empty((*x.shape[:-1], k // 2), dtype=torch.uint8)
    scales = x.new_empty((*x.shape[:-1], k // MXFP4_BLOCK), dtype=torch.uint8)
    if x.numel() == 0:  # nothing to do (and a view with no elements may carry any strides)
        _check_quantize(x, scale_rule)  # what C++ would have checked
        return packed, scales
    _C.mxfp4_quantize(view(_rows(packed)), view(_rows(scales)), view(_rows(x)), scale_rule)
    return packed, scales


@_mxfp4_quantize.register_fake
def _(x, scale_rule):
    k = x.shape[-1]
    return (x.new_empty((*x.shape[:-1], k // 2), dtype=torch.uint8),
            x.new_empty((*x.shape[:-1], k // MXFP4_BLOCK), dtype=torch.uint8))


def mxfp4_quantize(x: torch.Tensor, *,
                   scale_rule: str = "floor") -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantises `x` [..., K] (float32, bfloat16 or float16; K a multiple of 32) to MXFP4.

    Returns ``(packed uint8 [..., K/2], scales uint8 [..., K/32])``. Each block of 32 elements
    gets one E8M0 scale: ``"floor"`` (the OCP spec) is ``2^(floor(log2 amax) - 2)``, ``"ceil"``
    the smallest power of two with ``amax / scale <= 6``. Elements are ``x / scale`` rounded to
    nearest-even on the E2M1 grid and saturated to +-6. An all-zero block gets scale 0x00; a block
    holding a NaN or an Inf gets the NaN scale 0xFF (and zero codes), so it reads back as NaN.
    """
    check_choice(scale_rule, "scale_rule", SCALE_RULES)
    return call(_mxfp4_quantize, _check_quantize, x, scale_rule)


def _check_dequantize(packed, scales, dtype) -> None:
    check_tensor(packed, "packed", dtypes=(torch.uint8,))
    if packed.dim() < 1:
        raise ValueError("packed: expected at least 1 dim [..., K/2], got a scalar")
    if packed.shape[-1] % (MXFP4_BLOCK // 2):
        raise ValueError(f"packed: the last dim (K/2) must be a multiple of {MXFP4_BLOCK // 2}, "
                         f"got {packed.shape[-1]}")
    check_tensor(scales, "scales", dtypes=(torch.uint8,),
                 shape=(*packed.shape[:-1], packed.shape[-1] // (MXFP4_BLOCK // 2)))
    check_same_device(packed=packed, scales=scales)


@custom_op("mxfp4_dequantize", mutates_args=())
def _mxfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor,
                      dtype: torch.dtype) -> torch.Tensor:
    follow_torch_threads()
    # C++ sees rows only, blind to how packed and scales split them (a weight-loading op: the
    # check costs nothing that matters)
    _check_dequantize(packed, scales, dtype)
    out = packed.new_empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=dtype)
    if out.numel() == 0:
        return out
    _C.mxfp4_dequantize(view(_rows(out)), view(_rows(packed)), view(_rows(scales)))
    return out


@_mxfp4_dequantize.register_fake
def _(packed, scales, dtype):
    return packed.new_empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=dtype)


def mxfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor, *,
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Expands MXFP4 `packed` uint8 [..., K/2] with `scales` uint8 [..., K/32] to `dtype` [..., K].

    Each element is its E2M1 value times its block's scale, computed exactly in float32 and
    rounded once to `dtype` (float32, bfloat16 or float16). Scale 0xFF gives NaN.
    """
    if dtype not in FLOATING:
        raise TypeError(f"dtype: expected torch.float32, torch.bfloat16 or torch.float16, "
                        f"got {dtype!r}")
    return call(_mxfp4_dequantize, _check_dequantize, packed, scales, dtype)


def _check_gemm(a, w, w_scales, bias, out_dtype) -> None:
    check_tensor(a, "a", dtypes=FLOATING, dim=2)
    _check_k(a.shape[1], "a")
    k = a.shape[1]
    check_tensor(w, "w", dtypes=(torch.uint8,), dim=2)
    if w.shape[1] != k // 2:
        raise ValueError(f"w: expected shape (N, {k // 2}) for K = {k} (two codes a byte), got "
                         f"{tuple(w.shape)}")
    check_tensor(w_scales, "w_scales", dtypes=(torch.uint8,),
                 shape=(w.shape[0], k // MXFP4_BLOCK))
    if bias is not None:
        check_tensor(bias, "bias", dtypes=FLOATING, shape=(w.shape[0],))
    check_same_device(a=a, w=w, w_scales=w_scales, bias=bias)


@custom_op("mxfp4_gemm", mutates_args=())
def _mxfp4_gemm(a: torch.Tensor, w: torch.Tensor, w_scales: torch.Tensor,
                bias: Optional[torch.Tensor], out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    follow_torch_threads()
    out = a.new_empty((a.shape[0], w.shape[0]), dtype=out_dtype or a.dtype)
    if out.numel() > 0 and a.shape[1] > 0:
        _C.mxfp4_gemm(view(out), view(a), view(w), view(w_scales), view(bias))
        return out
    _check_gemm(a, w, w_scales, bias, out_dtype)  # what C++ would have checked
    if out.numel() == 0 or bias is None:
        return out.zero_()  # an empty sum, or nothing
    return out.copy_(bias.expand_as(out))


@_mxfp4_gemm.register_fake
def _(a, w, w_scales, bias, out_dtype):
    return a.new_empty((a.shape[0], w.shape[0]), dtype=out_dtype or a.dtype)


def mxfp4_gemm(a: torch.Tensor, w: torch.Tensor, w_scales: torch.Tensor, *,
               bias: Optional[torch.Tensor] = None,
               out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``a @ W^T (+ bias)`` with W in MXFP4: `a` [M, K], `w` uint8 [N, K/2], `w_scales` uint8
    [N, K/32], `bias` [N]. Returns [M, N] in `out_dtype` (default: `a`'s dtype).

    W is dequantised block by block in registers, never as a whole; products accumulate in
    float32. With bfloat16 `a` on a CPU with AVX512-BF16 the products come from bf16 dot
    products (exact, since E2M1 values are exact in bf16), which count bf16 subnormals in `a`
    (below 2^-126) as zero.
    """
    if out_dtype is not None and out_dtype not in FLOATING:
        raise TypeError(f"out_dtype: expected None, torch.float32, torch.bfloat16 or "
                        f"torch.float16, got {out_dtype!r}")
    return call(_mxfp4_gemm, _check_gemm, a, w, w_scales, bias, out_dtype)
