"""rms_norm and rotary_embedding."""

from __future__ import annotations

import math
from typing import Optional

import torch

from gnomon import _C
from gnomon.ops._tensor import (FLOATING, call, check_same_device, check_tensor, custom_op,
                                follow_torch_threads, view, view_like)


def _check_norm(x, weight, residual) -> None:
    check_tensor(x, "x", dtypes=FLOATING)
    if x.dim() < 1:
        raise ValueError("x: expected at least 1 dim, got a scalar")
    check_tensor(weight, "weight", dtypes=(x.dtype,), shape=(x.shape[-1],))
    if residual is not None:
        check_tensor(residual, "residual", dtypes=(x.dtype,), shape=tuple(x.shape))
    check_same_device(x=x, weight=weight, residual=residual)


def _normalise(x: torch.Tensor, weight: torch.Tensor, eps: float,
               residual: Optional[torch.Tensor]) -> torch.Tensor:
    follow_torch_threads()
    out = torch.empty_like(x)
    if x.dim() == 2:  # the common case: C++ sees the caller's tensors and checks them all
        x_view = view(x)
        _C.rms_norm(view_like(out, x_view), x_view, view(weight), eps, view(residual))
        return out
    _check_norm(x, weight, residual)  # C++ sees rows only, blind to how x and residual split them
    shape = (math.prod(x.shape[:-1]), x.shape[-1])
    rows = lambda t: None if t is None else t.view(shape)  # noqa: E731
    _C.rms_norm(view(rows(out)), view(rows(x)), view(weight), eps, view(rows(residual)))
    return out


# Two registered ops, as in vLLM: an optional mutated argument does not survive inductor.
@custom_op("rms_norm")
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _normalise(x, weight, eps, None)


@custom_op("fused_add_rms_norm", mutates_args=("residual",))
def _fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> torch.Tensor:
    return _normalise(x, weight, eps, residual)


@_rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@_fused_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return torch.empty_like(x)


def _check_rms_norm(x, weight, eps) -> None:
    _check_norm(x, weight, None)


def _check_fused_add_rms_norm(x, residual, weight, eps) -> None:
    _check_norm(x, weight, residual)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
             residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """RMS-normalises the last dim of `x` and scales by `weight` (accumulating in float32).

    With `residual`, normalises ``x + residual`` and updates `residual` in place to that sum
    (rounded to its dtype, which is also the value normalised).
    """
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
    if residual is None:
        return call(_rms_norm, _check_rms_norm, x, weight, float(eps))
    return call(_fused_add_rms_norm, _check_fused_add_rms_norm, x, residual, weight, float(eps))


@custom_op("rotary_embedding", mutates_args=("query", "key"))
def _rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                      cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    follow_torch_threads()
    _C.rotary_embedding(view(positions), view(query), view(key), view(cos_sin_cache), is_neox)


@_rotary_embedding.register_fake
def _(positions, query, key, cos_sin_cache, is_neox):
    return None


def _check_rotary_embedding(positions, query, key, cos_sin_cache, is_neox) -> None:
    check_tensor(query, "query", dtypes=FLOATING, dim=3, layout="rows")
    check_tensor(key, "key", dtypes=(query.dtype,), shape=(query.shape[0], None, query.shape[2]),
                 layout="rows")
    check_tensor(positions, "positions", dtypes=(torch.int64,), shape=(query.shape[0],))
    check_tensor(cos_sin_cache, "cos_sin_cache", dtypes=(torch.float32,), dim=2)
    rotary_dim = cos_sin_cache.shape[1]
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > query.shape[2]:
        raise ValueError(f"cos_sin_cache: rotary dim (its second size) must be even, >= 2 and at "
                         f"most the head dim {query.shape[2]}, got {rotary_dim}")
    check_same_device(query=query, key=key, positions=positions, cos_sin_cache=cos_sin_cache)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, *, is_neox: bool = True) -> None:
    """Rotates `query` [T, Hq, D] and `key` [T, Hkv, D] in place by the angles at `positions`.

    `query` and `key` may be column slices of a fused QKV projection's output
    (``qkv[:, a:b].view(T, H, D)``): each token's H * D elements contiguous, tokens any stride of
    at least H * D elements apart.

    `cos_sin_cache` is float32 [max_position, rotary_dim]: cosines in the first half of each row,
    sines in the second. Only the first rotary_dim dims of each head rotate. ``is_neox=True``
    rotates the two halves of the rotary dims against each other, False rotates adjacent pairs.
    """
    call(_rotary_embedding, _check_rotary_embedding, positions, query, key, cos_sin_cache,
         bool(is_neox))
