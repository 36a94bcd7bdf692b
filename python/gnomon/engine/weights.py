"""Model weights: `load_weights` reads a Hugging Face safetensors checkpoint (one
``model.safetensors``, or shards listed by ``model.safetensors.index.json``) through
``safetensors.safe_open``, which memory-maps each file; `gnomon.engine.random_weights` builds
the same dict with random values. Both return a plain ``dict`` from gnomon's names to tensors.

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
from gnomon.engine.weight_shards import shard_weights

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class WeightsError(ValueError):
    """A checkpoint that cannot be loaded; the message names the tensor (where one is at
    fault) and the file."""


def resolve_dtype(dtype, config: ModelConfig) -> torch.dtype:
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
    dtype = resolve_dtype(dtype, config)
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
    return to_device(out, device)


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


def to_device(weights: Dict[str, torch.Tensor], device) -> Dict[str, torch.Tensor]:
    device = torch.device(device)
    if device.type == "cpu":
        return weights
    moved = {n: t.to(device) for n, t in weights.items() if n != "lm_head"}
    moved["lm_head"] = (moved["embed"] if weights["lm_head"] is weights["embed"]
                        else weights["lm_head"].to(device))
    return {n: moved[n] for n in weights}
