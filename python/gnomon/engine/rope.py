"""RoPE: the inverse frequencies (plain, ``llama3`` and ``yarn`` scaling) and the cos/sin table
that `gnomon.ops.rotary_embedding` takes. Its one owner; the runner imports it."""

from __future__ import annotations

import math
from typing import Tuple, Union

import torch

from gnomon.engine.config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> Tuple[torch.Tensor, float]:
    """The float32 inverse frequencies [rotary_dim / 2] and the attention scaling factor that
    multiplies cos and sin, for plain RoPE, ``llama3`` and ``yarn`` scaling."""
    dim, base, s = config.rotary_dim, config.rope_theta, config.rope_scaling
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    pos_freqs = base ** exponents
    inv_freq = 1.0 / pos_freqs
    if s is None:
        return inv_freq, 1.0
    if s.rope_type == "llama3":
        # Llama 3.1: wavelengths longer than orig/low are slowed by `factor`, shorter than
        # orig/high are kept, and the band between is blended linearly in orig/wavelength.
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
        smooth = ((s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                  / (s.high_freq_factor - s.low_freq_factor))
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    # YaRN (Peng et al. 2023): dims that rotate fewer than beta_slow times over the original
    # context are interpolated (divided by factor), those rotating more than beta_fast times
    # are kept, with a linear ramp between; cos and sin are scaled by 0.1 ln(factor) + 1.
    # The explicit `factor` is used, as current transformers does; some older releases used
    # max_position_embeddings / original_max_position_embeddings instead. The presets and tiny
    # configs keep the two equal, as gpt-oss's published config does.
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi))
                / (2 * math.log(base)))
    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (s.factor * pos_freqs)) * (1 - extrapolation) + inv_freq * extrapolation
    if s.attention_factor is not None:
        attention = s.attention_factor
    else:
        attention = 0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0
    return inv_freq, attention


def cos_sin_cache(config: ModelConfig, max_position: int, device: Union[str, torch.device] = "cpu",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The [max_position, rotary_dim] table that `gnomon.ops.rotary_embedding` takes: row p
    holds ``cos(p * inv_freq) * a`` in its first half and ``sin(p * inv_freq) * a`` in its
    second, `a` being the attention scaling (1 except for YaRN). Computed in float32 as
    transformers does, then cast to `dtype`."""
    if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position < 1:
        raise ValueError(f"max_position: expected an int >= 1, got {max_position!r}")
    inv_freq, attention = rope_inv_freq(config)
    positions = torch.arange(max_position, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    cache = torch.cat([freqs.cos() * attention, freqs.sin() * attention], dim=1)
    return cache.to(device=device, dtype=dtype).contiguous()
