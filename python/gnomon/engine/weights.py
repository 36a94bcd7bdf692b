"""Model weights: `load_weights` reads a Hugging Face safetensors checkpoint (one
``model.safetensors``, or shards listed by ``model.safetensors.index.json``) through
``safetensors.safe_open``, which memory-maps each file; `random_weights` builds the same dict
with random values. Both return a plain ``dict`` from gnomon's names to tensors.

gnomon's names (`weight_shapes` gives every name's shape for a config): ``embed`` [V, H]
(``model.embed_tokens.weight``), ``norm`` [H] (``model.norm.weight``) and ``lm_head`` [V, H]
(``lm_head.weight``; with tied embeddings the ``embed`` tensor), then each layer's weights under
``layers.{i}.``, which the architecture's module (`gnomon.engine.models`) names, shapes, reads
from the checkpoint and shards (``layer_shapes``, ``load_layer``, ``SHARDING``; the attention
the modules share, ``qkv`` fused from q, k and v rows, is `gnomon.engine.models.common`'s).
The w13/w2 layouts, gate/up orders (`ModelConfig.gate_up_layout`) and MXFP4 format are
DESIGN.md's. Floating tensors are converted to the requested dtype; MXFP4 codes and scales
stay uint8. The checkpoint must hold exactly the tensors the config calls for (besides
``*.rotary_emb.inv_freq`` and an ``lm_head.weight`` that tied embeddings make redundant): a
missing, misshaped, unreadable or unexpected tensor raises `WeightsError` naming the tensor and
the file.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch
from safetensors import SafetensorError, safe_open

from gnomon.engine import models
from gnomon.engine.models import check_mxfp4, weight_shapes
from gnomon.engine.config import ModelConfig, torch_dtype
from gnomon.engine.parallel import Shard
from gnomon.formats import E8M0_BIAS, MXFP4_BLOCK

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class WeightsError(ValueError):
    """A checkpoint that cannot be loaded; the message names the tensor (where one is at
    fault) and the file."""


def _resolve_dtype(dtype, config: ModelConfig) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return config.dtype
    if isinstance(dtype, str):
        return torch_dtype(dtype, "dtype")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"dtype: expected None, 'auto', torch.float32, torch.bfloat16 or "
                        f"torch.float16, got {dtype!r}")
    return dtype


# ---- the checkpoint --------------------------------------------------------------------------

class _Checkpoint:
    """The tensors of a safetensors checkpoint folder, each file opened (memory-mapped) once."""

    def __init__(self, folder: str):
        self.folder = folder
        index = os.path.join(folder, INDEX_FILE)
        single = os.path.join(folder, SINGLE_FILE)
        self._handles: Dict[str, object] = {}
        self._keys: Dict[str, set] = {}
        if os.path.isfile(index):
            try:
                with open(index, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (ValueError, KeyError, TypeError) as e:
                raise WeightsError(f"{index}: not a safetensors index with a weight_map "
                                   f"({type(e).__name__}: {e})") from None
            self.file_of = {name: os.path.join(folder, fn) for name, fn in weight_map.items()}
            for path in sorted(set(self.file_of.values())):
                if not os.path.isfile(path):
                    raise WeightsError(f"{index}: lists shard {path}, which does not exist")
            self.where = index
        elif os.path.isfile(single):
            self._open(single)
            self.file_of = {name: single for name in self._keys[single]}
            self.where = single
        else:
            raise FileNotFoundError(f"folder: {folder} has neither {SINGLE_FILE} nor "
                                    f"{INDEX_FILE}")
        self.used: set = set()

    def _open(self, path: str):
        handle = self._handles.get(path)
        if handle is None:
            try:
                handle = safe_open(path, framework="pt", device="cpu")
            except (SafetensorError, OSError, ValueError) as e:
                raise WeightsError(f"{path}: cannot read this safetensors file (truncated or "
                                   f"corrupt?): {e}") from None
            self._handles[path] = handle
            self._keys[path] = set(handle.keys())
        return handle

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def get(self, name: str, shape: Tuple[int, ...], *, uint8: bool = False,
            index: Optional[tuple] = None) -> torch.Tensor:
        """Tensor `name`, checked to have `shape` (and dtype uint8 when `uint8`, else a
        floating dtype); with `index` (a tuple of slices) only those elements are read."""
        if name not in self.file_of:
            raise WeightsError(f"{self.where}: missing tensor {name!r}")
        path = self.file_of[name]
        handle = self._open(path)
        if name not in self._keys[path]:
            raise WeightsError(f"{path}: missing tensor {name!r} (the index puts it in this "
                               f"file)")
        try:
            part = handle.get_slice(name)
            found = tuple(part.get_shape())
            if found != tuple(shape):
                raise WeightsError(f"{path}: tensor {name!r} has shape {list(found)}, expected "
                                   f"{list(shape)}")
            tensor = handle.get_tensor(name) if index is None else part[index]
        except WeightsError:
            raise
        except Exception as e:  # safetensors raises several types for unreadable data
            raise WeightsError(f"{path}: cannot read tensor {name!r}: {e}") from None
        if uint8 and tensor.dtype != torch.uint8:
            raise WeightsError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, expected "
                               f"torch.uint8 (MXFP4)")
        if not uint8 and not tensor.is_floating_point():
            raise WeightsError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, expected a "
                               f"floating dtype")
        self.used.add(name)
        return tensor

    def check_all_used(self, ignorable: Iterable[str]) -> None:
        ignorable = set(ignorable)
        left = sorted(n for n in self.file_of if n not in self.used and n not in ignorable
                      and not n.endswith("rotary_emb.inv_freq"))
        if left:
            shown = ", ".join(f"{n!r} ({self.file_of[n]})" for n in left[:5])
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            raise WeightsError(f"{self.where}: unexpected tensors for this config: {shown}{more}")


# ---- loading ---------------------------------------------------------------------------------

def load_weights(folder: Union[str, os.PathLike], config: Optional[ModelConfig] = None, *,
                 dtype: Union[None, str, torch.dtype] = None,
                 device: Union[str, torch.device] = "cpu",
                 shard: Optional[Shard] = None) -> Dict[str, torch.Tensor]:
    """Loads the checkpoint in `folder` into gnomon's names (see the module doc); with a
    tensor-parallel `shard`, only that rank's part (what `shard_weights` would cut), each
    tensor's rows read through ``get_slice`` (MXFP4 experts that need padding: one layer's
    experts at a time, then cut), so no rank reads the whole checkpoint.

    `config` defaults to ``folder/config.json``; `dtype` (None or "auto": the config's
    torch_dtype) is the dtype of every floating tensor. gpt-oss experts load as MXFP4 when the
    files hold ``*_blocks``/``*_scales`` and as dense weights when they hold
    ``gate_up_proj``/``down_proj``; every layer must use the same form.
    """
    folder = os.fspath(folder)
    if config is None:
        config = ModelConfig.from_pretrained(folder)
    elif not isinstance(config, ModelConfig):
        raise TypeError(f"config: expected a ModelConfig or None, got {type(config).__name__}")
    dtype = _resolve_dtype(dtype, config)
    ckpt = _Checkpoint(folder)
    c, H = config, config.hidden_size
    model = models.model_module(c.architecture)
    mxfp4 = model.MXFP4_TENSOR is not None and model.MXFP4_TENSOR in ckpt
    if mxfp4:
        check_mxfp4(c)

    shard = shard or Shard()
    read = _ShardReader(ckpt, c, shard, dtype)
    # MXFP4 experts padded to whole scale blocks are read whole, a layer at a time, and cut
    whole_mlp = shard.intermediate(c, mxfp4) != c.intermediate_size
    f = read.dense

    out: Dict[str, torch.Tensor] = {"embed": f("model.embed_tokens.weight", (c.vocab_size, H),
                                               "vocab"),
                                    "norm": f("model.norm.weight", (H,))}
    ignorable: List[str] = []
    if c.tie_word_embeddings:
        out["lm_head"] = out["embed"]
        ignorable.append("lm_head.weight")
    else:
        out["lm_head"] = f("lm_head.weight", (c.vocab_size, H), "vocab")

    for i in range(c.num_layers):
        if whole_mlp:
            layer = shard_weights(model.load_layer(_ShardReader(ckpt, c, Shard(), dtype), c, i,
                                                   mxfp4), c, shard, mxfp4=mxfp4)
        else:
            layer = model.load_layer(read, c, i, mxfp4)
        out.update((f"layers.{i}.{name}", t) for name, t in layer.items())
    ckpt.check_all_used(ignorable)

    expected = weight_shapes(shard.local_config(c, mxfp4), mxfp4=mxfp4)
    assert set(out) == set(expected), sorted(set(out) ^ set(expected))
    return _to_device(out, device)


class _ShardReader:
    """Reads checkpoint tensors for one tensor-parallel rank: each read names how its tensor
    splits (in the checkpoint's own layout), and only this rank's rows are read, through
    ``safe_open(...).get_slice``. Splits: None (the whole tensor), ``("span", dim)`` (an even
    part of `dim`), ``"kv"`` (this rank's KV heads of dim 0, replicated when ranks exceed them),
    ``"vocab"`` (its rows of the vocabulary padded to a multiple of the ranks, zeros past the
    end) and ``"once"`` (a bias added after the all-reduce: rank 0 reads it, the others hold
    zeros)."""

    def __init__(self, ckpt: _Checkpoint, config: ModelConfig, shard: Shard, dtype) -> None:
        self.ckpt, self.config, self.shard, self.dtype = ckpt, config, shard, dtype

    def _index(self, shape, split):
        s, c = self.shard, self.config
        if split is None or s.size == 1:
            return None, None
        if split == "once":
            return None, "zeros" if s.rank else None
        if split == "vocab":
            rows = s.span(s.vocab(c))
            return (slice(rows.start, min(rows.stop, shape[0])),), rows.stop - rows.start
        if split == "kv":
            heads = s.kv_heads(c)
            return (slice(heads.start * c.head_dim, heads.stop * c.head_dim),), None
        _, dim = split
        return (slice(None),) * dim + (s.span(shape[dim]),), None

    def _read(self, name, shape, split, uint8: bool) -> torch.Tensor:
        """This rank's part of tensor `name`, always contiguous: a slice of a non-leading
        dimension (``("span", dim)`` with dim > 0) comes back from ``get_slice`` as a strided
        view, which the kernels refuse."""
        index, extra = self._index(shape, split)
        if extra == "zeros":
            self.ckpt.used.add(name)  # rank 0 reads it; here it is known to be all zeros
            return torch.zeros(shape, dtype=torch.uint8 if uint8 else self.dtype)
        t = self.ckpt.get(name, shape, uint8=uint8, index=index)
        if not uint8:
            t = t.to(self.dtype)
        if isinstance(extra, int) and extra > t.shape[0]:  # the vocabulary's padding rows
            t = torch.cat([t, t.new_zeros((extra - t.shape[0],) + tuple(t.shape[1:]))])
        return t.contiguous()

    def dense(self, name: str, shape: Tuple[int, ...], split=None) -> torch.Tensor:
        """A floating tensor, in the load's dtype."""
        return self._read(name, shape, split, uint8=False)

    def codes(self, name: str, shape: Tuple[int, ...], split=None) -> torch.Tensor:
        """A uint8 tensor (MXFP4 codes or scales)."""
        return self._read(name, shape, split, uint8=True)


# ---- tensor-parallel shards -------------------------------------------------------------------

# How the weights outside the layers split (`gnomon.engine.parallel` states the rules); each
# architecture's module gives its layers' (``SHARDING``).
_SHARDING = {"embed": ("vocab", 0), "lm_head": ("vocab", 0), "norm": ("replicate", None)}
_PAD = {"_scales": E8M0_BIAS}  # an MXFP4 scale that pads: 2**0; padded codes are 0
INTERMEDIATE_SPLITS = ("gate_up", "down")  # the MLP's splits along its intermediate dimension


def shard_weights(weights: Dict[str, torch.Tensor], config: ModelConfig, shard: Shard, *,
                  mxfp4: Optional[bool] = None) -> Dict[str, torch.Tensor]:
    """Rank ``shard.rank``'s part of gnomon-named `weights` (all of a model's, or any subset),
    by the sharding rules of `gnomon.engine.parallel` and the architecture's ``SHARDING``:
    each fused tensor is split per component (Q, K and V heads of ``qkv``; gate and up rows of
    ``w13``), never as one contiguous slice. `mxfp4` defaults to whether `weights` hold scales."""
    if shard.size == 1:
        return dict(weights)
    if mxfp4 is None:
        mxfp4 = any(n.endswith("_scales") for n in weights)
    rules = {**_SHARDING, **models.model_module(config.architecture).SHARDING}
    padded = shard.intermediate(config, mxfp4)
    out: Dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        leaf = name.rsplit(".", 1)[-1]
        if name == "lm_head" and config.tie_word_embeddings and "embed" in out:
            out[name] = out["embed"]
            continue
        kind, dim = rules[leaf]
        if kind in INTERMEDIATE_SPLITS and padded != config.intermediate_size:
            fill = next((v for suffix, v in _PAD.items() if leaf.endswith(suffix)), 0)
            tensor = _pad_intermediate(tensor, dim, padded / config.intermediate_size,
                                       fill, kind == "gate_up" and
                                       config.gate_up_layout == "concat")
        out[name] = _split(tensor, kind, dim, config, shard)
    return out


def _split(t: torch.Tensor, kind: str, dim, config: ModelConfig, shard: Shard) -> torch.Tensor:
    if kind == "replicate":
        return t
    if kind == "once":  # a bias added after the all-reduce: rank 0's alone
        return t if shard.rank == 0 else torch.zeros_like(t)
    if kind == "vocab":
        rows = shard.vocab(config)
        if rows != t.shape[0]:
            t = torch.cat([t, t.new_zeros((rows - t.shape[0],) + tuple(t.shape[1:]))])
        return t[shard.span(rows)].contiguous()
    D = config.head_dim
    if kind == "heads":
        return t[shard.span(config.num_heads)].contiguous()
    if kind == "qkv":
        q, kv = config.num_heads * D, config.num_kv_heads * D
        heads = shard.span(config.num_heads)
        kv_heads = shard.kv_heads(config)
        return torch.cat([t[heads.start * D:heads.stop * D],
                          t[q + kv_heads.start * D:q + kv_heads.stop * D],
                          t[q + kv + kv_heads.start * D:q + kv + kv_heads.stop * D]]).contiguous()
    n = t.shape[dim]
    if kind == "gate_up" and config.gate_up_layout == "concat":
        gate, up = t.split(n // 2, dim=dim)
        part = shard.span(n // 2)
        return torch.cat([gate.narrow(dim, part.start, part.stop - part.start),
                          up.narrow(dim, part.start, part.stop - part.start)], dim=dim)
    part = shard.span(n)  # row, down, or gate/up interleaved: contiguous pairs
    return t.narrow(dim, part.start, part.stop - part.start).contiguous()


def _pad_intermediate(t: torch.Tensor, dim: int, ratio: float, fill: int,
                      halves: bool) -> torch.Tensor:
    """`t` with its intermediate dimension `dim` grown by `ratio` (each half when `halves`)."""
    def grow(part: torch.Tensor) -> torch.Tensor:
        extra = list(part.shape)
        extra[dim] = round(part.shape[dim] * ratio) - part.shape[dim]
        return torch.cat([part, torch.full(extra, fill, dtype=part.dtype)], dim=dim)

    if halves:
        return torch.cat([grow(h) for h in t.split(t.shape[dim] // 2, dim=dim)], dim=dim)
    return grow(t)


def _to_device(weights: Dict[str, torch.Tensor], device) -> Dict[str, torch.Tensor]:
    device = torch.device(device)
    if device.type == "cpu":
        return weights
    moved = {n: t.to(device) for n, t in weights.items() if n != "lm_head"}
    moved["lm_head"] = (moved["embed"] if weights["lm_head"] is weights["embed"]
                        else weights["lm_head"].to(device))
    return {n: moved[n] for n in weights}


# ---- random weights --------------------------------------------------------------------------

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
    dtype = _resolve_dtype(dtype, config)
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
    return _to_device({n: out[n] for n in shapes}, device)


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
