"""Malformed-call fuzzing for the ops: every call must raise ValueError/TypeError or succeed.

`malformed_calls(op, make_kwargs, ...)` builds a hypothesis test. Each example starts from a fresh
set of valid arguments, corrupts one to three of them (dtype, rank, sizes, strides, token strides
valid or overlapping, device-less objects, out-of-range index values, unknown mode names, bad
numbers, wrong Python types) and calls the op. A crash, a hang or any other exception fails the test.

Each call is made twice: as an eager caller makes it, where the C++ entry is the first to check
the tensors, and with the wrapper's own checks first, as while torch.compile traces. The two must
refuse the same calls with the same error, so the eager path accepts nothing the checks refuse.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence
from unittest import mock

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from ops.fused_qkv import column_slices, overlapping_rows

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.uint8, torch.int8,
          torch.int32, torch.int64, torch.bool]


def _corrupt_tensor(t: torch.Tensor, data, is_index: bool):
    kinds = ["dtype", "drop_dim", "add_dim", "resize", "strided", "empty", "python", "none"]
    if t.is_floating_point() and t.dim() >= 2 and t.shape[0] > 1 and t[0].numel() > 1:
        kinds += ["row_slice", "overlapping_rows"]
    if is_index and t.numel() > 0:
        kinds += ["index_value"] * 4
    kind = data.draw(st.sampled_from(kinds))
    if kind == "dtype":
        return t.to(data.draw(st.sampled_from([d for d in DTYPES if d != t.dtype])))
    if kind == "drop_dim":
        return t.reshape(-1)[: max(1, t.numel() // 2)] if t.dim() > 1 else t.reshape(())[()] if t.numel() == 1 else t[:0].reshape(0, 1)
    if kind == "add_dim":
        return t.unsqueeze(data.draw(st.integers(0, t.dim())))
    if kind == "resize" and t.dim() > 0:
        dim = data.draw(st.integers(0, t.dim() - 1))
        size = list(t.shape)
        size[dim] = max(0, size[dim] + data.draw(st.sampled_from([-1, 1, 2, 7])))
        return torch.zeros(size, dtype=t.dtype)
    if kind == "strided" and t.dim() > 0 and t.shape[-1] > 1:
        return torch.cat([t, t], dim=-1)[..., ::2]  # same values, non-contiguous
    if kind == "row_slice":  # rows apart by more than a row: accepted where an op takes rows
        return column_slices([t], pad=data.draw(st.sampled_from([1, 7])))[1][0]
    if kind == "overlapping_rows":
        return overlapping_rows(t)
    if kind == "empty":
        return torch.empty((0,) * max(t.dim(), 1), dtype=t.dtype)
    if kind == "python":
        return data.draw(st.sampled_from([t.tolist(), "tensor", 3, 2.5]))
    if kind == "none":
        return None
    if kind == "index_value":
        bad = t.clone()
        flat = bad.view(-1)
        position = data.draw(st.integers(0, flat.numel() - 1))
        flat[position] = data.draw(st.sampled_from([-2, -1, 1 << 20, (1 << 31) - 1, -(1 << 31)]))
        return bad
    return t


def _corrupt_value(value, data):
    if isinstance(value, bool):
        return data.draw(st.sampled_from([None, "yes", 2]))
    if isinstance(value, str):
        return data.draw(st.sampled_from(["", value.upper(), value + "x", None, 1]))
    if isinstance(value, (int, float)):
        return data.draw(st.sampled_from([-1, 0, -1e30, float("nan"), float("inf"), None, "1",
                                          1 << 40]))
    if value is None:
        return data.draw(st.sampled_from([1, "x", torch.zeros(3)]))
    return None


def malformed_calls(op: Callable, make_kwargs: Callable[[], dict], *,
                    index_args: Sequence[str] = (), examples: int = 1000):
    """A test function making `examples` malformed calls of `op`; see the module docstring."""

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def test(data):
        kwargs = make_kwargs()
        names = data.draw(st.lists(st.sampled_from(sorted(kwargs)), min_size=1, max_size=3,
                                   unique=True))
        for name in names:
            value = kwargs[name]
            if isinstance(value, torch.Tensor):
                kwargs[name] = _corrupt_tensor(value, data, name in index_args)
            else:
                kwargs[name] = _corrupt_value(value, data)
        checked_first = _refusal(op, kwargs, checks_first=True)
        eager = _refusal(op, kwargs, checks_first=False)
        assert eager == checked_first, f"eager: {eager}; checks first: {checked_first}"

    return test


def _refusal(op: Callable, kwargs: dict, *, checks_first: bool) -> Optional[tuple]:
    """The (type, message) of the ValueError/TypeError `op(**kwargs)` raises, or None."""
    with mock.patch.object(torch.compiler, "is_compiling", return_value=checks_first):
        try:
            op(**kwargs)
        except (ValueError, TypeError) as error:
            return type(error), str(error)
    return None
