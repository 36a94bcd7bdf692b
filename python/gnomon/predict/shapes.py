"""What a predictor sees: the model (`ModelSpec`), one step (`StepShape`) and the parallelism.

`StepShape.from_batch` is the one place an engine `ScheduledBatch` becomes a shape: per
sequence ``(new_tokens, context_len)`` with ``context_len`` the tokens cached before the step.
The pairs are kept as they are, never averaged: attention cost depends on each one.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, fields
from typing import Optional, Tuple, Union

from gnomon.engine.batch import ScheduledBatch
from gnomon.engine.config import ModelConfig
from gnomon.engine.config_json import INT4_GROUP
from gnomon.costing import Pricing
from gnomon.engine.models import weight_shapes
from gnomon.engine.parallel import Shard
from gnomon.formats import MXFP4_BITS, NVFP4_BITS

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
FP8_BYTES = 1
MXFP4_BYTES_PER_PARAM = MXFP4_BITS / 8  # 0.53125 (gnomon.formats)
NVFP4_BYTES_PER_PARAM = NVFP4_BITS / 8  # 0.5625 (gnomon.formats)
# INT4 in symmetric groups of 32 (compressed-tensors' pack-quantized W4A16, Kimi-K2.5's experts):
# a 4-bit code each and one bf16 scale per 32, no zero point: 4.5 bits
INT4_BYTES_PER_PARAM = (4 + 16 / INT4_GROUP) / 8  # 0.5625
_QUANT_BYTES = {"fp8": FP8_BYTES, "nvfp4": NVFP4_BYTES_PER_PARAM, "mxfp4": MXFP4_BYTES_PER_PARAM,
                "int4": INT4_BYTES_PER_PARAM}
# the math a weight dtype's GEMMs run in where the chip has it (else weight-only at bf16); INT4
# with bf16 activations is weight-only on every chip ("w4a16": bf16 math)
QUANT_COMPUTE = {"fp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4", "int4": "w4a16"}
WEIGHT_DTYPES = ("auto", "bfloat16", "float16", "fp8", "nvfp4", "mxfp4")  # --weight-dtype
KV_DTYPES = ("auto", "bfloat16", "float16", "fp8")  # what --kv-dtype accepts
MXFP4_TENSORS = ("w13", "w2", "w13_scales", "w2_scales")  # an MXFP4 expert's uint8 tensors
EXPERT_TENSORS = ("w13", "w2")  # a routed expert's matrices (stacked, one entry per expert)
_CONFIG_WEIGHTS = {"fp8": "fp8", "nvfp4": "nvfp4", "mxfp4-dense": "mxfp4"}  # quantization
# quantization -> the dtype a checkpoint holds its routed experts in, apart from its other
# linear layers: gpt-oss's MXFP4 experts, Kimi-K2.5's INT4 ones
_CONFIG_EXPERTS = {"mxfp4": "mxfp4", "int4": "int4"}
# the math the engines run such experts in. Both are weight-only checkpoints (bf16 activations).
# MXFP4 experts: "w4a8", MXFP8 activations at the FP8 peak on a chip with FP4 math (its MMA
# takes the mixed FP8 x FP4 operands), else weight-only: TensorRT-LLM's GPT-OSS deployment
# guide (MoE backend matrix: B200/GB200/B300/GB300 MXFP8 activations x MXFP4 weights, TRTLLM
# backend; H200 BF16 x MXFP4, Triton), and InferenceMAX's vLLM B200 launch
# (benchmarks/gptoss_fp4_b200_docker.sh: VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1). INT4: w4a16.
_EXPERT_COMPUTE = {"mxfp4": "w4a8", "int4": "w4a16"}


def _dtype_bytes(name: str) -> float:
    return _QUANT_BYTES.get(name) or _DTYPE_BYTES[name]


@dataclass(frozen=True)
class ModelSpec:
    """A model as the predictors count it: `config` (the engine's), the activation `dtype`,
    the dtype of the linear layers' weights (`weight_dtype`: the activation dtype, "fp8",
    "nvfp4" or "mxfp4"), the routed experts' where the checkpoint holds them in a dtype of
    their own (`expert_dtype`: "mxfp4" as gpt-oss's, "int4" as Kimi-K2.5's; None: the linear
    dtype) and the KV cache's (`kv_dtype`). Quantized weights cover every linear layer of the
    decoder (attention projections, MLP and experts) but experts of their own dtype; the
    embedding, lm_head, norms and router stay in `dtype`, as FP8 and FP4 checkpoints keep them.
    Bytes per weight: FP8 1, NVFP4 4.5 bits (a 16-element block shares an FP8 scale), MXFP4
    4.25 (32 share an E8M0 scale), INT4 4.5 (32 share a bf16 scale; symmetric, no zero point).
    The experts' math: FP4 for MXFP4 (weight-only at the bf16 peak where the chip has none),
    weight-only W4A16 at the bf16 peak for INT4 (bf16 activations)."""

    name: str
    config: ModelConfig
    dtype: str = "bfloat16"
    expert_dtype: Optional[str] = None  # None: the linear dtype
    weight_dtype: Optional[str] = None  # None: `dtype`
    kv_dtype: Optional[str] = None  # None: `dtype`

    @classmethod
    def from_config(cls, config: ModelConfig, name: str = "model", dtype: Optional[str] = None,
                    mxfp4_experts: Optional[bool] = None, weight_dtype: str = "auto",
                    kv_dtype: str = "auto") -> "ModelSpec":
        """`weight_dtype` / `kv_dtype` "auto" follow the config's ``quantization_config``
        (FP8 weights, an FP8 KV cache), else `dtype`. Experts the checkpoint holds in a dtype
        of their own (the config's, or MXFP4 where `mxfp4_experts` says so) keep it unless
        `weight_dtype` names another dtype no wider (a checkpoint quantized anew, experts
        included: NVIDIA's NVFP4 Kimi-K2.5 for its INT4 experts); a wider one, or the
        checkpoint's own linear dtype, leaves them as they are."""
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config: expected a ModelConfig, got {type(config).__name__}")
        dtype = config.torch_dtype if dtype is None else dtype
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype: expected one of {', '.join(_DTYPE_BYTES)}, got {dtype!r}")
        if weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight_dtype: expected one of {', '.join(WEIGHT_DTYPES)}, got "
                             f"{weight_dtype!r}")
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype: expected one of {', '.join(KV_DTYPES)}, got "
                             f"{kv_dtype!r}")
        if weight_dtype == "auto":
            weight_dtype = _CONFIG_WEIGHTS.get(config.quantization, dtype)
        if kv_dtype == "auto":
            kv_dtype = config.kv_cache_dtype or dtype
        if mxfp4_experts is None:
            experts = _CONFIG_EXPERTS.get(config.quantization)
        else:
            experts = "mxfp4" if mxfp4_experts else None
        if experts and not config.is_moe:
            raise ValueError(f"mxfp4_experts: {name} has no experts" if mxfp4_experts else
                             f"quantization_config: {name} declares {experts} experts and has "
                             f"none")
        if experts and weight_dtype != experts \
                and _dtype_bytes(weight_dtype) <= _dtype_bytes(experts):
            experts = None  # re-quantized, experts included: they follow weight_dtype
        if experts == "int4":
            for field in ("hidden_size", "intermediate_size"):  # the experts' GEMMs' K
                if getattr(config, field) % INT4_GROUP:
                    raise ValueError(f"quantization_config: INT4 experts in groups of "
                                     f"{INT4_GROUP} need {field} a multiple of {INT4_GROUP}, "
                                     f"got {getattr(config, field)}")
        return cls(name, config, dtype, experts,
                   None if weight_dtype == dtype else weight_dtype,
                   None if kv_dtype == dtype else kv_dtype)

    @classmethod
    def from_model(cls, model: Union[str, os.PathLike, ModelConfig],
                   dtype: Optional[str] = None, weight_dtype: str = "auto",
                   kv_dtype: str = "auto") -> "ModelSpec":
        """A preset name, a model folder (its config.json) or a `ModelConfig`."""
        if isinstance(model, ModelConfig):
            return cls.from_config(model, dtype=dtype, weight_dtype=weight_dtype,
                                   kv_dtype=kv_dtype)
        config = ModelConfig.from_model(model)
        name = os.path.basename(os.path.normpath(os.fspath(model)))
        return cls.from_config(config, name=name, dtype=dtype, weight_dtype=weight_dtype,
                               kv_dtype=kv_dtype)

    def __hash__(self) -> int:  # the predictors key their caches on the spec, every step
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        return hash(tuple(getattr(self, f.name) for f in fields(self)))

    @functools.cached_property
    def attention_groups(self) -> Tuple[Tuple[Optional[int], int], ...]:
        """``(sliding window or None, number of layers)`` per distinct attention window, full
        attention first."""
        c = self.config
        windows = [c.sliding_window if t == "sliding" else None for t in c.layer_types]
        return tuple((w, windows.count(w))
                     for w in sorted(set(windows), key=lambda w: (w is not None, w or 0)))

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.dtype]

    @property
    def linear_dtype(self) -> str:
        """The dtype of the decoder's linear weights."""
        return self.weight_dtype or self.dtype

    @property
    def linear_bytes(self) -> float:
        return _dtype_bytes(self.linear_dtype)

    @property
    def linear_compute(self) -> str:
        """The math of the linear layers' GEMMs: "fp8", "fp4" or "bfloat16" (the roofline runs
        a chip without that math weight-only at its bf16 peak)."""
        return QUANT_COMPUTE.get(self.linear_dtype, "bfloat16")

    @property
    def kv_bytes(self) -> int:
        return int(_dtype_bytes(self.kv_dtype or self.dtype))

    @property
    def experts_dtype(self) -> str:
        """The routed experts' weight dtype: `expert_dtype`, else the linear dtype."""
        return self.expert_dtype or self.linear_dtype

    @property
    def mxfp4_experts(self) -> bool:
        """Whether the experts are MXFP4 of their own (gpt-oss's; the engine runs them)."""
        return self.expert_dtype == "mxfp4"

    @property
    def expert_bytes_per_param(self) -> float:
        return _dtype_bytes(self.experts_dtype)

    @property
    def expert_compute(self) -> str:
        """The math of the routed experts' grouped GEMMs: for experts of their own dtype
        "w4a8" (MXFP4) or "w4a16" (INT4) (`_EXPERT_COMPUTE`), else the linear layers'."""
        if self.expert_dtype is not None:
            return _EXPERT_COMPUTE[self.expert_dtype]
        return self.linear_compute

    @functools.cached_property
    def pricing(self) -> Pricing:
        """What the architecture's ops are counted in (`gnomon.costing`)."""
        return Pricing(self.dtype_bytes, self.linear_bytes, self.linear_compute,
                       self.expert_bytes_per_param, self.expert_compute)

    @property
    def quantized(self) -> bool:
        """FP8, FP4 or INT4 weights or KV beyond what gnomon's real engine runs (MXFP4
        experts)."""
        return (self.weight_dtype in _QUANT_BYTES or self.kv_dtype == "fp8"
                or self.expert_dtype == "int4")

    def weight_bytes(self, tp: int = 1, dp: int = 1) -> float:
        """Bytes of weights one of `tp` GPUs holds, counted over the architecture's weight
        table (`gnomon.engine.models.weight_shapes`) for that rank's shard: the decoder's
        matrices in the linear dtype (the routed experts in theirs: MXFP4 ones as their uint8
        codes and scales, INT4 ones at 4.5 bits), the embedding, lm_head, router, norms, biases
        and sinks in the activation dtype. Under attention data parallelism over `dp` groups
        the routed experts (the tensors with one entry per expert) are split over all
        ``tp x dp`` GPUs, the rest within the group."""
        c, a, w = self.config, self.dtype_bytes, self.linear_bytes
        local = Shard(0, tp).local_config(c, self.mxfp4_experts)
        e = self.expert_bytes_per_param
        total = 0.0
        for name, shape in weight_shapes(local, mxfp4=self.mxfp4_experts).items():
            leaf, n = name.rsplit(".", 1)[-1], math.prod(shape)
            if name == "lm_head" and c.tie_word_embeddings:
                continue
            stacked = c.is_moe and len(shape) > 1 and shape[0] == c.num_experts
            if stacked and leaf != "router":
                n /= dp
            if self.mxfp4_experts and leaf in MXFP4_TENSORS:
                total += n  # uint8
            elif stacked and len(shape) == 3 and leaf in EXPERT_TENSORS:
                total += n * e
            elif len(shape) > 1 and name.startswith("layers.") and leaf != "router":
                total += n * w
            else:
                total += n * a
        return total

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """One token's KV over all layers on one GPU (`ModelConfig.kv_cache_width`): what one
        token adds to a full cache (a sliding layer keeps at most its window of them)."""
        return self.config.num_layers * self.config.kv_cache_width(tp) * self.kv_bytes


@dataclass(frozen=True)
class StepShape:
    """One step: per sequence ``(new_tokens, context_len)`` in batch order, how many sequences
    sample a token, the split into prefill and decode tokens, the model, ``tp``, the expert
    parallelism ``ep`` over the GPUs (`gnomon.engine.parallel.check_ep`) and, under attention
    data parallelism, the ``dp`` groups' step: the shape is one group's batch, and
    ``dp_tokens`` the tokens of every group, which the routed experts see (0: dp is 1).
    Under speculative decoding each decode verifies ``draft_tokens`` drafts: its entry is
    ``(1 + draft_tokens, context_len)``, and it samples (computes logits for) every one of
    those tokens."""

    model: ModelSpec
    requests: Tuple[Tuple[int, int], ...]
    num_sampled: int
    num_prefill_tokens: int
    num_decode_tokens: int
    tp: int = 1
    ep: int = 1
    dp: int = 1
    dp_tokens: int = 0
    draft_tokens: int = 0

    @classmethod
    def from_batch(cls, batch: ScheduledBatch, model: ModelSpec, tp: int = 1, ep: int = 1,
                   dp: int = 1, dp_tokens: int = 0) -> "StepShape":
        if not isinstance(batch, ScheduledBatch):
            raise TypeError(f"batch: expected a ScheduledBatch, got {type(batch).__name__}")
        seqs = batch.sequences
        drafts = max([s.num_draft_tokens for s in seqs], default=0)
        if drafts:
            return cls(model, tuple([(len(s.token_ids) + s.num_draft_tokens,
                                      s.num_computed_tokens) for s in seqs]),
                       sum([s.is_last_prefill_chunk * (1 + s.num_draft_tokens) for s in seqs]),
                       batch.num_prefill_tokens, batch.num_decode_tokens, tp, ep, dp, dp_tokens,
                       drafts)
        return cls(model, tuple([(len(s.token_ids), s.num_computed_tokens) for s in seqs]),
                   sum([s.is_last_prefill_chunk for s in seqs]),
                   batch.num_prefill_tokens, batch.num_decode_tokens, tp, ep, dp, dp_tokens)

    @classmethod
    def of(cls, model: ModelSpec, requests, tp: int = 1, num_sampled: Optional[int] = None,
           ep: int = 1) -> "StepShape":
        """A shape from ``(new_tokens, context_len)`` pairs: one-token entries with context
        count as decodes, every sequence samples unless `num_sampled` says otherwise."""
        pairs = tuple((int(n), int(c)) for n, c in requests)
        for i, (n, c) in enumerate(pairs):
            if n < 1 or c < 0:
                raise ValueError(f"requests[{i}]: expected new_tokens >= 1 and context_len >= "
                                 f"0, got ({n}, {c})")
        decode = sum(1 for n, c in pairs if n == 1 and c > 0)
        total = sum(n for n, _ in pairs)
        return cls(model, pairs, len(pairs) if num_sampled is None else num_sampled,
                   total - decode, decode, tp, ep)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.requests)

    @property
    def max_context(self) -> int:
        """The longest sequence after the step (cached plus new tokens)."""
        return max((n + c for n, c in self.requests), default=0)

    @property
    def kind(self) -> str:
        """"prefill", "decode" or "mixed" (by the tokens the step computes)."""
        if self.num_decode_tokens == 0:
            return "prefill"
        return "decode" if self.num_prefill_tokens == 0 else "mixed"
