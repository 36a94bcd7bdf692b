"""Model configs: `ModelConfig`, read from a Hugging Face ``config.json``
(`gnomon.engine.config_json` reads it, and refuses what the engine does not implement), and the
built-in presets. Importing it needs no torch (the simulation reads configs); the RoPE tables
live in `gnomon.engine.rope`. The architectures are those `gnomon.engine.models` registers
(`SUPPORTED_ARCHITECTURES`: the built-in ones)."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from gnomon.costing import kv_heads_per_gpu

from . import models
from .config_json import RopeScaling, check_dtype, read_config
from .kv_cache import KVCacheGroups
from .models.mla import MLA

SUPPORTED_ARCHITECTURES = models.architectures()  # the built-in ones (`models` registers more)


@dataclass(frozen=True)
class ModelConfig:
    """The shape and math of one model. Build it with `from_json`, `from_pretrained` or
    `preset`; all three check it.

    `layer_types` holds ``"full"`` or ``"sliding"`` per layer (sliding layers attend to the
    last `sliding_window` positions). `num_experts` is 0 for a dense MLP. `routing` is
    ``"softmax_topk"`` (Mixtral), ``"topk_softmax"`` (gpt-oss) or ``"sigmoid_group_topk"``
    (DeepSeek-V3), None for a dense model.
    `gate_up_layout` names how gnomon's w13 keeps gate and up rows (``"concat"`` or
    ``"interleaved"``). `quantization` is ``"mxfp4"`` when the config.json declares MXFP4
    experts (gpt-oss hub checkpoints), ``"int4"`` for INT4 routed experts (W4A16 in groups of
    32, Kimi-K2.5's), ``"fp8"``, ``"nvfp4"`` or ``"mxfp4-dense"`` for FP8 or FP4 linear weights
    (these four only a simulation runs yet), else None; the weight loader reads whichever
    layout the files hold.
    `kv_cache_dtype` is ``"fp8"`` when the config declares an FP8 KV cache.

    DeepSeek-style models: `mla` holds Multi-head Latent Attention's widths
    (`gnomon.engine.models.mla`; None for multi-head or grouped-query attention); the first
    `first_dense_layers` layers have a dense gated MLP `dense_intermediate_size` wide, the rest
    experts `intermediate_size` wide, with `shared_experts` always-active experts of that width
    beside the routed ones."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[RopeScaling]
    max_position_embeddings: int
    tie_word_embeddings: bool
    num_experts: int
    top_k: int
    layer_types: Tuple[str, ...]
    sliding_window: Optional[int]
    attention_bias: bool
    has_sinks: bool
    routing: Optional[str]
    activation: str
    gate_up_layout: str
    eos_token_ids: Tuple[int, ...]
    torch_dtype: str
    quantization: Optional[str] = None
    kv_cache_dtype: Optional[str] = None  # "fp8" where quantization_config declares an FP8 KV
    mla: Optional[MLA] = None
    first_dense_layers: int = 0
    dense_intermediate_size: int = 0
    shared_experts: int = 0

    # ---- derived -------------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rotary_dim(self) -> int:
        return self.head_dim

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_cache_width(self, tp: int = 1) -> int:
        """Elements one token adds to one layer's KV cache on one GPU of `tp`: its K and V
        heads (replicated where `tp` exceeds them), or MLA's latent (replicated on every rank)."""
        if self.mla is not None:
            return self.mla.latent
        return 2 * kv_heads_per_gpu(self, tp) * self.head_dim

    @property
    def dtype(self):
        """`torch_dtype` as a torch.dtype (imports torch)."""
        return torch_dtype(self.torch_dtype, "torch_dtype")

    def kv_cache_groups(self, hybrid: bool = True) -> KVCacheGroups:
        """This model's KV-cache groups (`kv_cache_groups`)."""
        return kv_cache_groups(self, hybrid)

    # ---- construction --------------------------------------------------------------------

    @classmethod
    def from_json(cls, path_or_dict: Union[str, os.PathLike, Mapping[str, Any]]) -> "ModelConfig":
        """Reads a Hugging Face ``config.json`` (a path) or its parsed contents (a mapping)."""
        if isinstance(path_or_dict, Mapping):
            return _parse(dict(path_or_dict), "<dict>")
        if not isinstance(path_or_dict, (str, os.PathLike)):
            raise TypeError(f"path_or_dict: expected a path to config.json or a dict, got "
                            f"{type(path_or_dict).__name__}")
        path = os.fspath(path_or_dict)
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"path_or_dict: no config file at {path}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        return _parse(raw, path)

    @classmethod
    def from_pretrained(cls, folder: Union[str, os.PathLike]) -> "ModelConfig":
        """Reads ``folder/config.json``."""
        folder = os.fspath(folder)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"folder: {folder} is not a directory")
        path = os.path.join(folder, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"folder: {folder} has no config.json")
        return cls.from_json(path)

    @classmethod
    def from_model(cls, model: Union[str, os.PathLike]) -> "ModelConfig":
        """`model` as ``gnomon.LLM`` and ``gnomon generate --model`` take it: a folder holding
        config.json, or else a preset name."""
        if isinstance(model, (str, os.PathLike)) and os.path.isdir(model):
            return cls.from_pretrained(model)
        if isinstance(model, str) and model in PRESETS:
            return cls.preset(model)
        raise ValueError(f"model: expected a folder with config.json or a preset "
                         f"({', '.join(PRESETS)}), got {model!r}")

    @classmethod
    def preset(cls, name: str) -> "ModelConfig":
        """A built-in preset (real model shapes, no weights) or tiny test config; see
        `PRESETS`."""
        return _parse(preset_json(name), f"<preset {name}>")


def kv_cache_groups(config: ModelConfig, hybrid: bool = True) -> KVCacheGroups:
    """The KV-cache groups of `config`, from its ``layer_types`` and ``sliding_window``: with
    `hybrid`, one group per distinct attention window (full attention first, then the sliding
    windows from the smallest), each of its layers in order; without, or with no sliding layer,
    one full group of every layer, whose sliding layers then keep every token's KV. Refuses
    groups of unequal layer counts (they share one K/V tensor per position), naming
    ``layer_types``."""
    if not isinstance(hybrid, bool):
        raise TypeError(f"enable_hybrid_kv: expected a bool, got {hybrid!r}")
    windows = [config.sliding_window if t == "sliding" else None for t in config.layer_types]
    if not hybrid or all(w is None for w in windows):
        return KVCacheGroups.full(config.num_layers)
    order = sorted(set(windows), key=lambda w: (w is not None, w or 0))
    layers = tuple(tuple(i for i, w in enumerate(windows) if w == window) for window in order)
    if len({len(group) for group in layers}) != 1:
        counts = ", ".join(f"{len(group)} {'full' if w is None else f'window-{w}'}"
                           for w, group in zip(order, layers))
        raise ValueError(f"layer_types: gnomon's hybrid KV cache needs as many layers in every "
                         f"attention group, got {counts}; pass enable_hybrid_kv=False to keep "
                         f"full KV on every layer")
    return KVCacheGroups(tuple(order), layers)


def preset_json(name: str) -> Dict[str, Any]:
    """The config.json contents (a fresh dict) of preset `name`, e.g. to write a model folder."""
    if name not in PRESETS:
        raise ValueError(f"name: unknown preset {name!r}; presets are {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])

# ---- parsing (gnomon.engine.config_json) ----------------------------------------------------

def torch_dtype(name: str, what: str):
    """The torch.dtype of an activation dtype name (imports torch)."""
    import torch

    return getattr(torch, check_dtype(name, what))

def _parse(raw: Dict[str, Any], source: str) -> ModelConfig:
    return ModelConfig(**read_config(raw, source))


# ---- presets ---------------------------------------------------------------------------------

# Every built-in architecture's presets (its module's ``PRESETS``): real models' config.json
# contents (no weights) and tiny test configs.
PRESETS: Dict[str, Dict[str, Any]] = {
    name: raw for arch in SUPPORTED_ARCHITECTURES
    for name, raw in models.model_module(arch).PRESETS.items()}
