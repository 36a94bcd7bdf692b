"""Benchmark cases: an op of `gnomon.ops`, its shape parameters and its dtypes.

A case knows its key, its definition hash, the FLOPs and bytes one call does (computed from the
shape), and how to build its inputs on a device. Counting conventions, the same for every op:

- FLOPs count one per multiply, add, divide or exp in the op's defining math (a matmul is
  ``2 * M * N * K``); comparisons, rounding, clamps and data movement count zero. Ops that only
  move data (reshape_and_cache) have 0 FLOPs and report no compute fraction.
- Bytes are the least traffic one call needs: every input read once, every output written once
  (in-place tensors both). MXFP4 weights count 4.25 bits each (4-bit codes plus one E8M0 byte per
  32). A MoE call counts only the experts its routing touched.

The definition hash covers the op, the params, the dtypes and the op's definition version
(``OpSpec.version``): bump the version when what a case measures changes without its params
changing (new inputs, new counting), so that history restarts.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Tuple, Union

from gnomon.formats import E8M0_BIAS, MXFP4_BITS, MXFP4_BLOCK

Scalar = Union[int, float, str]

MXFP4_BITS_PER_WEIGHT = MXFP4_BITS  # 4.25 (gnomon.formats)

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def _mxfp4_bytes(weights: int) -> int:
    """Bytes of `weights` MXFP4 weights (a multiple of 32): weights * 4.25 / 8."""
    if weights % MXFP4_BLOCK:
        raise ValueError(f"MXFP4 weights come in blocks of {MXFP4_BLOCK}, got {weights}")
    return weights // 2 + weights // MXFP4_BLOCK  # a 4-bit code each, an E8M0 byte a block


@dataclass(frozen=True)
class OpSpec:
    """How to count and build one op's cases. `version` is part of each case's definition hash."""

    version: int
    flops: Callable[[Mapping[str, Scalar], Mapping[str, str]], int]
    bytes: Callable[[Mapping[str, Scalar], Mapping[str, str]], int]
    build: Callable[..., Tuple[Callable[..., Any], tuple]]


@dataclass(frozen=True)
class Case:
    """One benchmark: `op` (a name in ``gnomon.ops``) at `params` with `dtypes`.

    `name` is the op, or ``op.variant`` where one op has several benchmarks in a suite. Params
    and dtypes are stored sorted, so equal definitions compare, hash and key equal.
    """

    suite: str
    op: str
    variant: str
    params: Tuple[Tuple[str, Scalar], ...]
    dtypes: Tuple[Tuple[str, str], ...]

    @staticmethod
    def make(suite: str, op: str, variant: str, params: Mapping[str, Scalar],
             dtypes: Mapping[str, str]) -> "Case":
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; known: {', '.join(sorted(OPS))}")
        for name, value in params.items():
            if not isinstance(value, (int, float, str)) or isinstance(value, bool):
                raise TypeError(f"param {name!r}: expected int, float or str, got {value!r}")
        return Case(suite, op, variant, tuple(sorted(params.items())),
                    tuple(sorted(dtypes.items())))

    @property
    def p(self) -> Dict[str, Scalar]:
        return dict(self.params)

    @property
    def d(self) -> Dict[str, str]:
        return dict(self.dtypes)

    @property
    def name(self) -> str:
        return f"{self.op}.{self.variant}" if self.variant else self.op

    @property
    def key(self) -> str:
        """``<suite>/<name>[k=v,...,dtype:role=name,...]``: stable across processes."""
        fields = [f"{k}={v}" for k, v in self.params if k != "scaling"]
        fields += [f"{role}:{dtype}" for role, dtype in self.dtypes]
        return f"{self.suite}/{self.name}[{','.join(fields)}]"

    @property
    def definition_hash(self) -> str:
        blob = json.dumps({"op": self.op, "variant": self.variant, "params": self.params,
                           "dtypes": self.dtypes, "version": OPS[self.op].version},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def flops(self) -> int:
        return int(OPS[self.op].flops(self.p, self.d))

    @property
    def bytes(self) -> int:
        return int(OPS[self.op].bytes(self.p, self.d))

    @property
    def compute_dtype(self) -> str:
        """The dtype whose peak FLOP rate bounds this case (the activations'; MXFP4 weights are
        dequantised to it, as on every target without native FP4 math in gnomon's kernels)."""
        return self.d.get("act", "float32")

    def build(self, device: Any, seed: int = 0) -> Tuple[Callable[..., Any], tuple]:
        """``(fn, args)``: ``fn(*args)`` runs one call on `device`. Args are freshly allocated,
        so several builds (or clones of args) give independent inputs."""
        return OPS[self.op].build(self.p, self.d, device, seed)


# --------------------------------------------------------------------------------------------
# Helpers for building inputs (torch is imported only when a case is built or routed).

def _torch():
    import torch

    return torch


def _dtype(name: str):
    return getattr(_torch(), name)


def _randn(shape, dtype: str, device, g, scale: float = 1.0):
    torch = _torch()
    return (torch.randn(shape, generator=g) * scale).to(device=device, dtype=_dtype(dtype))


def _generator(seed: int):
    return _torch().Generator().manual_seed(seed)


# --- attention --------------------------------------------------------------------------------

def _attended_keys(p) -> int:
    seq_len = p["context"] + p["q_len"]
    window = p["window"]
    return seq_len if not window else min(seq_len, window + p["q_len"] - 1)


def _attention_pairs(p) -> int:
    """Causal (query, key) pairs per sequence and head: query j sees context + j + 1 keys, or
    the last `window` of them."""
    context, q_len, window = p["context"], p["q_len"], p["window"]
    if not window:
        return q_len * context + q_len * (q_len + 1) // 2
    return sum(min(context + j + 1, window) for j in range(q_len))


def _paged_attention_flops(p, d) -> int:
    # q.k and p.v: 2 * D FLOPs each per pair; softmax (exp, add, divide) 3 per pair.
    return p["batch"] * p["heads"] * _attention_pairs(p) * (4 * p["head_dim"] + 3)


def _blocks_per_seq(p) -> int:
    return -(-(p["context"] + p["q_len"]) // p["block_size"])


def _paged_attention_bytes(p, d) -> int:
    es = _ITEMSIZE[d["act"]]
    b, t = p["batch"], p["batch"] * p["q_len"]
    kv = b * _attended_keys(p) * 2 * p["kv_heads"] * p["head_dim"] * es
    q_and_out = 2 * t * p["heads"] * p["head_dim"] * es
    metadata = 4 * (b * _blocks_per_seq(p) + b + b + 1) + (4 * p["heads"] if p["sinks"] else 0)
    return kv + q_and_out + metadata


def _paged_attention_build(p, d, device, seed):
    torch = _torch()
    from gnomon import ops

    g = _generator(seed)
    b, q_len, seq_len = p["batch"], p["q_len"], p["context"] + p["q_len"]
    blocks = b * _blocks_per_seq(p)
    shape = (blocks, p["block_size"], p["kv_heads"], p["head_dim"])
    key_cache = _randn(shape, d["act"], device, g)
    value_cache = _randn(shape, d["act"], device, g)
    # Shuffled, as an allocator that has run a while leaves them.
    tables = torch.randperm(blocks, generator=g).int().view(b, -1).to(device)
    query = _randn((b * q_len, p["heads"], p["head_dim"]), d["act"], device, g)
    seq_lens = torch.full((b,), seq_len, dtype=torch.int32, device=device)
    starts = (torch.arange(b + 1, dtype=torch.int32) * q_len).to(device)
    sinks = _randn((p["heads"],), "float32", device, g) if p["sinks"] else None
    window = p["window"] or None

    def fn(query, key_cache, value_cache, tables, seq_lens, starts, sinks):
        return ops.paged_attention(query, key_cache, value_cache, tables, seq_lens, starts,
                                   sliding_window=window, sinks=sinks)

    return fn, (query, key_cache, value_cache, tables, seq_lens, starts, sinks)


def _reshape_and_cache_bytes(p, d) -> int:
    rows = p["tokens"] * p["kv_heads"] * p["head_dim"] * _ITEMSIZE[d["act"]]
    return 2 * 2 * rows + 8 * p["tokens"]  # K and V read and written; int64 slots


def _reshape_and_cache_build(p, d, device, seed):
    torch = _torch()
    from gnomon import ops

    g = _generator(seed)
    t = p["tokens"]
    shape = (p["cache_blocks"], p["block_size"], p["kv_heads"], p["head_dim"])
    key_cache = torch.zeros(shape, dtype=_dtype(d["act"]), device=device)
    value_cache = torch.zeros_like(key_cache)
    key = _randn((t, p["kv_heads"], p["head_dim"]), d["act"], device, g)
    value = _randn((t, p["kv_heads"], p["head_dim"]), d["act"], device, g)
    slots = torch.randperm(p["cache_blocks"] * p["block_size"], generator=g)[:t].to(device)
    return ops.reshape_and_cache, (key, value, key_cache, value_cache, slots)


# --- MoE --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _routing(tokens: int, experts: int, top_k: int, mode: str, seed: int):
    """Deterministic routing for a MoE case: float32 weights [T, k] and int32 ids [T, k] on the
    CPU, from seeded random router logits, routed as `mode` routes."""
    torch = _torch()
    logits = torch.randn((tokens, experts), generator=_generator(seed))
    if mode == "softmax_topk":
        weights, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
    else:
        top, ids = logits.topk(top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
    return weights.contiguous(), ids.int().contiguous()


def touched_experts(p) -> int:
    """The number of distinct experts a fused_moe case's routing sends tokens to."""
    _, ids = _routing(p["tokens"], p["experts"], p["top_k"], p["routing"], p["routing_seed"])
    return int(ids.unique().numel())


def _topk_routing_flops(p, d) -> int:
    t, e, k = p["tokens"], p["experts"], p["top_k"]
    if p["mode"] == "softmax_topk":  # subtract max, exp, sum over E; k divides; renormalise
        return t * (3 * e + k + (2 * k if p["renormalize"] else 0))
    return t * 4 * k  # softmax over the k: subtract, exp, add, divide


def _topk_routing_bytes(p, d) -> int:
    return p["tokens"] * (p["experts"] * _ITEMSIZE[d["act"]] + p["top_k"] * (4 + 4))


def _topk_routing_build(p, d, device, seed):
    from gnomon import ops

    logits = _randn((p["tokens"], p["experts"]), d["act"], device, _generator(seed))
    mode, top_k, renormalize = p["mode"], p["top_k"], bool(p["renormalize"])

    def fn(logits):
        return ops.topk_routing(logits, top_k, mode=mode, renormalize=renormalize)

    return fn, (logits,)


def _fused_moe_flops(p, d) -> int:
    # Per (token, chosen expert): gate/up matmul 2 * 2I * H, down matmul 2 * H * I.
    return 6 * p["tokens"] * p["top_k"] * p["hidden"] * p["intermediate"]


def _fused_moe_bytes(p, d) -> int:
    es = _ITEMSIZE[d["act"]]
    h, i, t, k = p["hidden"], p["intermediate"], p["tokens"], p["top_k"]
    per_expert = 3 * h * i
    weight_bytes = (_mxfp4_bytes(per_expert) if d["weights"] == "mxfp4"
                    else per_expert * _ITEMSIZE[d["weights"]])
    bias_bytes = (2 * i + h) * es if p["bias"] else 0
    activations = 2 * t * h * es + t * k * (4 + 4)  # hidden in, out, routing weights and ids
    return touched_experts(p) * (weight_bytes + bias_bytes) + activations


def _fused_moe_build(p, d, device, seed):
    torch = _torch()
    from gnomon import ops

    g = _generator(seed)
    e, h, i, t = p["experts"], p["hidden"], p["intermediate"], p["tokens"]
    act = d["act"]
    hidden = _randn((t, h), act, device, g)
    if d["weights"] == "mxfp4":  # random codes; scales 2^-9..2^0 keep values moderate
        w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, generator=g)
        w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, generator=g)
        s13 = _random_scales((e, 2 * i, h // MXFP4_BLOCK), g)
        s2 = _random_scales((e, h, i // MXFP4_BLOCK), g)
        w13, w2, s13, s2 = (x.to(device) for x in (w13, w2, s13, s2))
    else:
        w13 = _randn((e, 2 * i, h), d["weights"], device, g, scale=h ** -0.5)
        w2 = _randn((e, h, i), d["weights"], device, g, scale=i ** -0.5)
        s13 = s2 = None
    b13 = _randn((e, 2 * i), act, device, g) if p["bias"] else None
    b2 = _randn((e, h), act, device, g) if p["bias"] else None
    weights, ids = _routing(t, e, p["top_k"], p["routing"], p["routing_seed"])
    weights, ids = weights.to(device), ids.to(device)
    activation, layout = p["activation"], p["layout"]

    def fn(hidden, w13, w2, weights, ids, b13, b2, s13, s2):
        return ops.fused_moe(hidden, w13, w2, weights, ids, activation=activation,
                             gate_up_layout=layout, w13_bias=b13, w2_bias=b2, w13_scales=s13,
                             w2_scales=s2)

    return fn, (hidden, w13, w2, weights, ids, b13, b2, s13, s2)


# --- MXFP4 ------------------------------------------------------------------------------------

def _mxfp4_quantize_bytes(p, d) -> int:
    n, k = p["rows"], p["cols"]
    return n * k * _ITEMSIZE[d["act"]] + _mxfp4_bytes(n * k)


def _mxfp4_quantize_build(p, d, device, seed):
    from gnomon import ops

    x = _randn((p["rows"], p["cols"]), d["act"], device, _generator(seed))
    rule = p["scale_rule"]
    return (lambda x: ops.mxfp4_quantize(x, scale_rule=rule)), (x,)


def _random_mxfp4(n, k, device, g):
    torch = _torch()
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g).to(device)
    s = _random_scales((n, k // MXFP4_BLOCK), g).to(device)
    return w, s


def _random_scales(shape, g):
    """E8M0 scales 2^-9..2^0, which keep random codes' values moderate."""
    return _torch().randint(E8M0_BIAS - 9, E8M0_BIAS + 1, shape, dtype=_torch().uint8,
                            generator=g)


def _mxfp4_dequantize_build(p, d, device, seed):
    from gnomon import ops

    packed, scales = _random_mxfp4(p["rows"], p["cols"], device, _generator(seed))
    dtype = _dtype(d["act"])
    return (lambda w, s: ops.mxfp4_dequantize(w, s, dtype=dtype)), (packed, scales)


def _mxfp4_gemm_bytes(p, d) -> int:
    es = _ITEMSIZE[d["act"]]
    m, n, k = p["m"], p["n"], p["k"]
    return m * k * es + _mxfp4_bytes(n * k) + m * n * es + (n * es if p["bias"] else 0)


def _mxfp4_gemm_build(p, d, device, seed):
    from gnomon import ops

    g = _generator(seed)
    a = _randn((p["m"], p["k"]), d["act"], device, g)
    w, s = _random_mxfp4(p["n"], p["k"], device, g)
    bias = _randn((p["n"],), d["act"], device, g) if p["bias"] else None
    return (lambda a, w, s, bias: ops.mxfp4_gemm(a, w, s, bias=bias)), (a, w, s, bias)


# --- norm -------------------------------------------------------------------------------------

def _rms_norm_flops(p, d) -> int:
    # square and add; times rstd and times weight (+ the residual add); one rsqrt per row.
    t, h = p["tokens"], p["hidden"]
    return t * h * (4 + (1 if p["residual"] else 0)) + t


def _rms_norm_bytes(p, d) -> int:
    es = _ITEMSIZE[d["act"]]
    t, h = p["tokens"], p["hidden"]
    return (2 * t * h + h + (2 * t * h if p["residual"] else 0)) * es


def _rms_norm_build(p, d, device, seed):
    from gnomon import ops

    g = _generator(seed)
    t, h = p["tokens"], p["hidden"]
    x = _randn((t, h), d["act"], device, g)
    weight = _randn((h,), d["act"], device, g)
    # The fused-add form updates `residual` to x + residual each call; scaled so that thousands
    # of calls stay far from overflow.
    residual = _randn((t, h), d["act"], device, g, scale=1e-3) if p["residual"] else None
    eps = float(p["eps"])
    return (lambda x, w, r: ops.rms_norm(x, w, eps, residual=r)), (x, weight, residual)


def _rotary_flops(p, d) -> int:
    # Per rotated pair: 4 multiplies and 2 adds, over query and key heads.
    return 3 * p["tokens"] * (p["heads"] + p["kv_heads"]) * p["rotary_dim"]


def _rotary_bytes(p, d) -> int:
    t, rot = p["tokens"], p["rotary_dim"]
    qk = 2 * t * (p["heads"] + p["kv_heads"]) * rot * _ITEMSIZE[d["act"]]  # read and write
    return qk + 8 * t + 4 * t * rot  # positions, one cos/sin row per token


def _rotary_build(p, d, device, seed):
    torch = _torch()
    from gnomon import ops

    g = _generator(seed)
    t, dim, rot = p["tokens"], p["head_dim"], p["rotary_dim"]
    positions = torch.randint(0, p["max_position"], (t,), generator=g).to(device)
    query = _randn((t, p["heads"], dim), d["act"], device, g)
    key = _randn((t, p["kv_heads"], dim), d["act"], device, g)
    inv_freq = 1.0 / (float(p["theta"]) ** (torch.arange(0, rot, 2).float() / rot))
    angles = torch.arange(p["max_position"]).float()[:, None] * inv_freq[None, :]
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)
    is_neox = bool(p["is_neox"])
    return ((lambda pos, q, k, c: ops.rotary_embedding(pos, q, k, c, is_neox=is_neox)),
            (positions, query, key, cache))


def _elementwise(p, d) -> int:  # one multiply or divide per element (by its block's scale)
    return p["rows"] * p["cols"]


def _no_flops(p, d) -> int:
    return 0


# --- communication ----------------------------------------------------------------------------
# A collective's bytes are what one rank sends in a ring (`gnomon.costing.ring_bytes`), so its
# gbps is the link's bus bandwidth; it counts no FLOPs (a link bounds it, not the adds). The
# case runs the engine's own `Collectives` over the process group `gnomon.bench.comm` starts.

def _ring(collective: str, payload_elements) -> Callable:
    def count(p, d) -> int:
        from gnomon.costing import ring_bytes

        dtype = d["act"] if collective == "all_reduce" else d["logits"]
        return int(ring_bytes(collective, payload_elements(p) * _ITEMSIZE[dtype], p["world"]))
    return count


def _collectives(p):
    """The engine's `Collectives` for this rank, and the rank; the group must exist."""
    import torch.distributed as dist

    from gnomon.engine.distributed import Collectives
    from gnomon.engine.parallel import Shard

    if not dist.is_initialized() or dist.get_world_size() != p["world"]:
        raise RuntimeError(f"a comm case runs in a process group of {p['world']} ranks "
                           "(gnomon bench --suite comm starts one)")
    return Collectives(Shard(dist.get_rank(), p["world"])), dist.get_rank()


def _all_reduce_build(p, d, device, seed):
    comm, _ = _collectives(p)
    # zeros: summed in place call after call, they stay finite
    x = _torch().zeros(p["tokens"], p["hidden"], dtype=_dtype(d["act"]), device=device)
    return comm.all_reduce, (x,)


def _all_gather_build(p, d, device, seed):
    comm, rank = _collectives(p)
    if p["vocab"] % p["world"]:
        raise ValueError(f"all_gather: vocab {p['vocab']} is not padded to a multiple of "
                         f"world {p['world']}")
    x = _torch().full((p["rows"], p["vocab"] // p["world"]), rank + 1.0,
                      dtype=_dtype(d["logits"]), device=device)
    return comm.all_gather_last, (x,)


OPS: Dict[str, OpSpec] = {
    "paged_attention": OpSpec(1, _paged_attention_flops, _paged_attention_bytes,
                              _paged_attention_build),
    "reshape_and_cache": OpSpec(1, _no_flops, _reshape_and_cache_bytes,
                                _reshape_and_cache_build),
    "topk_routing": OpSpec(1, _topk_routing_flops, _topk_routing_bytes, _topk_routing_build),
    "fused_moe": OpSpec(1, _fused_moe_flops, _fused_moe_bytes, _fused_moe_build),
    "mxfp4_quantize": OpSpec(1, _elementwise, _mxfp4_quantize_bytes, _mxfp4_quantize_build),
    "mxfp4_dequantize": OpSpec(1, _elementwise, _mxfp4_quantize_bytes, _mxfp4_dequantize_build),
    "mxfp4_gemm": OpSpec(1, lambda p, d: 2 * p["m"] * p["n"] * p["k"], _mxfp4_gemm_bytes,
                         _mxfp4_gemm_build),
    "rms_norm": OpSpec(1, _rms_norm_flops, _rms_norm_bytes, _rms_norm_build),
    "rotary_embedding": OpSpec(1, _rotary_flops, _rotary_bytes, _rotary_build),
    "all_reduce": OpSpec(1, _no_flops, _ring("all_reduce", lambda p: p["tokens"] * p["hidden"]),
                         _all_reduce_build),
    "all_gather": OpSpec(1, _no_flops, _ring("all_gather", lambda p: p["rows"] * p["vocab"]),
                         _all_gather_build),
}
COMM_OPS = ("all_reduce", "all_gather")


def bandwidth_peak(op: str, peaks: Mapping[str, Any]):
    """The peak GB/s an `op`'s bytes count against: the interconnect's for a collective (none
    is known for a CPU's loopback), the memory's for the rest."""
    return peaks.get("interconnect_gbps" if op in COMM_OPS else "memory_gbps")


def args_nbytes(args: tuple) -> int:
    """Bytes held by the tensors in `args`."""
    return sum(a.numel() * a.element_size() for a in args if hasattr(a, "element_size"))


def clone_args(args: tuple) -> tuple:
    return tuple(a.clone() if hasattr(a, "clone") else a for a in args)


__all__ = ["COMM_OPS", "Case", "MXFP4_BITS_PER_WEIGHT", "OPS", "OpSpec", "args_nbytes",
           "bandwidth_peak", "clone_args", "touched_experts"]
