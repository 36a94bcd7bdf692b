"""Random weights: `random_weights` builds the dict `gnomon.engine.weights.load_weights` returns,
with seeded random values, for tests and benchmarks without a checkpoint."""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch

from gnomon.engine.config import ModelConfig
from gnomon.engine.models import weight_shapes
from gnomon.engine.weights import resolve_dtype, to_device
from gnomon.formats import MXFP4_BLOCK

def random_weights(config: ModelConfig, dtype: Union[None, str, torch.dtype] = None,
                   seed: int = 0, *, mxfp4: Optional[bool] = None,
                   device: Union[str, torch.device] = "cpu") -> Dict[str, torch.Tensor]:
    """The dict `load_weights` returns, filled with seeded random values: matrices and
    embeddings ``N(0, 0.02^2)``, biases ``N(0, 0.02^2)``, norm weights ``1 + N(0, 0.1^2)``,
    sinks ``N(0, 1)``. `mxfp4` (default: the config declares MXFP4 experts) quantises each
    expert's random weights with `gnomon.ops.mxfp4_quantize` (the "ceil" rule of gpt-oss's
    tooling), one expert at a time so the float copy stays small. Deterministic in `seed`."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config: expected a ModelConfig, got {type(config).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {seed!r}")
    dtype = resolve_dtype(dtype, config)
    if mxfp4 is None:
        mxfp4 = config.quantization == "mxfp4"
    shapes = weight_shapes(config, mxfp4=mxfp4)
    gen = torch.Generator().manual_seed(seed)

    def randn(shape, std: float, mean: float = 0.0) -> torch.Tensor:
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
        return (t.mul_(std).add_(mean)).to(dtype)

    out: Dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        leaf = name.rsplit(".", 1)[-1]
        if name == "lm_head" and config.tie_word_embeddings:
            out[name] = out["embed"]
        elif leaf.endswith("norm"):
            out[name] = randn(shape, 0.1, 1.0)
        elif leaf == "sinks":
            out[name] = randn(shape, 1.0)
        elif leaf.endswith("_scales"):
            continue  # made with their codes
        elif mxfp4 and leaf in ("w13", "w2"):
            out[name], out[name + "_scales"] = _random_mxfp4(shape, gen)
        else:
            out[name] = randn(shape, 0.02)
    return to_device({n: out[n] for n in shapes}, device)


def _random_mxfp4(shape: Tuple[int, ...], gen: torch.Generator
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    from gnomon.ops import mxfp4_quantize
    E, N, half_k = shape
    k = half_k * 2
    codes = torch.empty((E, N, half_k), dtype=torch.uint8)
    scales = torch.empty((E, N, k // MXFP4_BLOCK), dtype=torch.uint8)
    for e in range(E):
        w = torch.randn((N, k), generator=gen, dtype=torch.float32).mul_(0.02)
        codes[e], scales[e] = mxfp4_quantize(w, scale_rule="ceil")
    return codes, scales
