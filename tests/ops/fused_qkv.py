"""Strided q/k/v as a fused QKV projection's split gives them: column slices of one buffer."""

from __future__ import annotations

from typing import Sequence

import torch


def column_slices(tensors: Sequence[torch.Tensor], pad: int = 0):
    """Copies `tensors` (each [T, H_i, D], one dtype and device) side by side into one
    [T, sum(H_i * D) + pad] buffer whose spare columns hold NaN, and returns the buffer and the
    views of it shaped as the tensors: each row (token) contiguous, rows the buffer's width
    apart. A kernel that reads a view as if it were dense meets the next slice's values or NaN."""
    num_tokens = tensors[0].shape[0]
    widths = [t[0].numel() if num_tokens else t.shape[1] * t.shape[2] for t in tensors]
    buffer = torch.full((num_tokens, sum(widths) + pad), float("nan"), dtype=tensors[0].dtype,
                        device=tensors[0].device)
    views, column = [], 0
    for t, width in zip(tensors, widths):
        buffer[:, column:column + width] = t.reshape(num_tokens, width)
        views.append(buffer[:, column:column + width].view(t.shape))
        column += width
    return buffer, views


def overlapping_rows(t: torch.Tensor) -> torch.Tensor:
    """A view of `t`'s storage shaped as `t` whose rows overlap: a token stride one element short
    of a row, which no kernel can honour."""
    row = t[0].numel()
    return t.as_strided(t.shape, (row - 1,) + t.stride()[1:])


def head_strided(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values with a gap between heads: each row no longer contiguous."""
    wide = torch.cat([t, torch.zeros_like(t)], dim=-1)
    return wide[..., : t.shape[-1]]
