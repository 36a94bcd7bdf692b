"""The benchmark suites: every op in `gnomon.ops` at shapes from real model configs.

Shapes come from each model's published config.json on the Hugging Face hub:

- Llama-3.1-8B: hidden 4096, 32 query / 8 KV heads of 128, intermediate 14336, rope theta 5e5;
- Mixtral-8x7B: hidden 4096, intermediate 14336, 8 experts, top 2, softmax-then-top-k routing;
- gpt-oss-20b / -120b: hidden 2880, 64 query / 8 KV heads of 64, intermediate 2880, 32 / 128
  experts, top 4, top-k-then-softmax routing, sliding window 128 and sinks, MXFP4 experts.

The ``comm`` suite times the collectives a tensor-parallel step makes, at the engine's message
sizes, over a process group of ``world`` ranks that the harness starts (`gnomon.bench.comm`): the
all-reduce of the hidden states [tokens, hidden] (after the embedding, the attention and the
MLP) and the all-gather of the sampled rows' float32 logits [rows, vocab / world]. Its sizes are
the models' own on every target; a CPU runs fewer of them, in float32 (the dtype CPU engines
run), a GPU in bfloat16.

On a GPU the cases run at those shapes. On a CPU some sizes are scaled down so that a case takes
milliseconds, and ``--quick`` scales further; every scaled case carries a ``scaling`` param
naming each changed size and its model value (``"cpu: batch 32->4"``). The model's head counts,
head dims, expert counts and top-k are kept wherever the scaling allows.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from gnomon.bench.cases import Case

SUITES = ("attention", "moe", "mxfp4", "norm", "comm")
TARGETS = ("gpu", "cpu", "quick")

LLAMA_ATTN = dict(model="llama-3.1-8b", heads=32, kv_heads=8, head_dim=128)
GPT_OSS_ATTN = dict(model="gpt-oss-20b", heads=64, kv_heads=8, head_dim=64)
BF16 = {"act": "bfloat16"}


def _case(suite: str, op: str, variant: str, target: str, base: Mapping, dtypes: Mapping,
          cpu: Optional[Mapping] = None, quick: Optional[Mapping] = None) -> Case:
    """`base` holds the model's sizes (what a GPU runs). A CPU applies `cpu`; quick applies
    `cpu` and then `quick`. The changes are recorded in the ``scaling`` param."""
    params = dict(base)
    changes: List[str] = []
    overrides: Dict = {}
    if target in ("cpu", "quick"):
        overrides.update(cpu or {})
    if target == "quick":
        overrides.update(quick or {})
    for name, value in overrides.items():
        if name not in base:
            raise KeyError(f"scaling names {name!r}, which {op} has no param for")
        if value != base[name]:
            changes.append(f"{name} {base[name]}->{value}")
        params[name] = value
    if changes:
        params["scaling"] = f"{target}: " + ", ".join(changes)
    return Case.make(suite, op, variant, params, dtypes)


def _attention(t: str) -> List[Case]:
    attn = dict(block_size=16, window=0, sinks=0)
    return [
        _case("attention", "paged_attention", "decode", t,
              dict(LLAMA_ATTN, batch=32, context=4095, q_len=1, **attn), BF16,
              cpu=dict(batch=4, context=2047), quick=dict(batch=2, context=255)),
        _case("attention", "paged_attention", "prefill", t,
              dict(LLAMA_ATTN, batch=1, context=0, q_len=4096, **attn), BF16,
              cpu=dict(q_len=512), quick=dict(q_len=64)),
        _case("attention", "paged_attention", "decode_window_sinks", t,
              dict(GPT_OSS_ATTN, batch=32, context=4095, q_len=1, block_size=16, window=128,
                   sinks=1), BF16,
              cpu=dict(batch=4, context=2047), quick=dict(batch=2, context=255)),
        _case("attention", "reshape_and_cache", "", t,
              dict(model="llama-3.1-8b", tokens=4096, kv_heads=8, head_dim=128, block_size=16,
                   cache_blocks=512), BF16,
              cpu=dict(tokens=512, cache_blocks=64), quick=dict(tokens=64, cache_blocks=8)),
    ]


def _moe(t: str) -> List[Case]:
    mixtral = dict(model="mixtral-8x7b", experts=8, top_k=2, hidden=4096, intermediate=14336,
                   activation="silu", layout="concat", routing="softmax_topk", bias=0,
                   routing_seed=0)
    gpt_oss = dict(top_k=4, hidden=2880, intermediate=2880, activation="swiglu_oai",
                   layout="interleaved", routing="topk_softmax", bias=1, routing_seed=0)
    return [
        _case("moe", "topk_routing", "mixtral", t,
              dict(model="mixtral-8x7b", tokens=4096, experts=8, top_k=2, mode="softmax_topk",
                   renormalize=1), BF16, cpu=dict(tokens=1024), quick=dict(tokens=64)),
        _case("moe", "topk_routing", "gpt_oss", t,
              dict(model="gpt-oss-120b", tokens=4096, experts=128, top_k=4, mode="topk_softmax",
                   renormalize=0), BF16, cpu=dict(tokens=1024), quick=dict(tokens=64)),
        _case("moe", "fused_moe", "dense", t, dict(mixtral, tokens=16),
              {"act": "bfloat16", "weights": "bfloat16"},
              cpu=dict(hidden=2048, intermediate=1792, tokens=4),
              quick=dict(hidden=512, intermediate=512)),
        _case("moe", "fused_moe", "mxfp4", t,
              dict(gpt_oss, model="gpt-oss-20b", experts=32, tokens=16),
              {"act": "bfloat16", "weights": "mxfp4"},
              cpu=dict(tokens=4), quick=dict(tokens=2, hidden=576, intermediate=576)),
        _case("moe", "fused_moe", "mxfp4", t,
              dict(gpt_oss, model="gpt-oss-120b", experts=128, tokens=64),
              {"act": "bfloat16", "weights": "mxfp4"},
              cpu=dict(tokens=8, intermediate=576),
              quick=dict(tokens=4, hidden=576, intermediate=160)),
    ]


def _mxfp4(t: str) -> List[Case]:
    # One gpt-oss expert's gate/up projection: [2I, H] = [5760, 2880].
    weight = dict(model="gpt-oss-20b", rows=5760, cols=2880)
    return [
        _case("mxfp4", "mxfp4_quantize", "", t, dict(weight, scale_rule="ceil"), BF16,
              quick=dict(rows=256)),
        _case("mxfp4", "mxfp4_dequantize", "", t, dict(weight), BF16, quick=dict(rows=256)),
        _case("mxfp4", "mxfp4_gemm", "decode", t,
              dict(model="gpt-oss-20b", m=16, n=5760, k=2880, bias=1), BF16,
              quick=dict(m=4, n=512)),
        _case("mxfp4", "mxfp4_gemm", "prefill", t,
              dict(model="gpt-oss-20b", m=4096, n=5760, k=2880, bias=1), BF16,
              cpu=dict(m=64), quick=dict(m=16, n=512)),
    ]


def _norm(t: str) -> List[Case]:
    return [
        _case("norm", "rms_norm", "", t,
              dict(model="llama-3.1-8b", tokens=4096, hidden=4096, residual=0, eps=1e-5), BF16,
              cpu=dict(tokens=1024), quick=dict(tokens=64)),
        _case("norm", "rms_norm", "fused_add", t,
              dict(model="llama-3.1-8b", tokens=4096, hidden=4096, residual=1, eps=1e-5), BF16,
              cpu=dict(tokens=1024), quick=dict(tokens=64)),
        _case("norm", "rms_norm", "", t,
              dict(model="gpt-oss-20b", tokens=4096, hidden=2880, residual=0, eps=1e-5), BF16,
              cpu=dict(tokens=1024), quick=dict(tokens=64)),
        _case("norm", "rotary_embedding", "", t,
              dict(model="llama-3.1-8b", tokens=4096, heads=32, kv_heads=8, head_dim=128,
                   rotary_dim=128, max_position=8192, theta=500000, is_neox=1), BF16,
              cpu=dict(tokens=1024), quick=dict(tokens=64)),
        _case("norm", "rotary_embedding", "", t,
              dict(model="gpt-oss-20b", tokens=4096, heads=64, kv_heads=8, head_dim=64,
                   rotary_dim=64, max_position=4096, theta=150000, is_neox=1), BF16,
              cpu=dict(tokens=1024), quick=dict(tokens=64)),
    ]


COMM_WORLD = 2
# (model, hidden, vocab padded for the world) -> hidden-state tokens and logit rows per target
_COMM_SHAPES = (
    ("llama-3.1-8b", 4096, 128256, {"gpu": (1, 32, 256, 2048, 8192), "cpu": (1, 32, 256),
                                    "quick": (1, 256)},
     {"gpu": (1, 32, 256), "cpu": (1, 32), "quick": (1, 32)}),
    ("gpt-oss-120b", 2880, 201088, {"gpu": (1, 256, 8192), "cpu": (1, 256), "quick": ()},
     {"gpu": (1, 256), "cpu": (1,), "quick": ()}),
)


def _comm(t: str) -> List[Case]:
    act = "bfloat16" if t == "gpu" else "float32"
    out = []
    for model, hidden, vocab, tokens, rows in _COMM_SHAPES:
        out += [Case.make("comm", "all_reduce", "", dict(model=model, world=COMM_WORLD,
                                                         tokens=n, hidden=hidden), {"act": act})
                for n in tokens[t]]
        out += [Case.make("comm", "all_gather", "", dict(model=model, world=COMM_WORLD, rows=n,
                                                         vocab=vocab), {"logits": "float32"})
                for n in rows[t]]
    return out


_BUILDERS = {"attention": _attention, "moe": _moe, "mxfp4": _mxfp4, "norm": _norm,
             "comm": _comm}


def parse_suites(spec: Optional[str]) -> List[str]:
    """``"attention,moe"`` -> the suite names in that order; None or "" -> all of them.
    Raises ValueError naming an unknown suite and the known ones."""
    if not spec:
        return list(SUITES)
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in SUITES]
    if unknown or not names:
        raise ValueError(f"unknown suite {', '.join(map(repr, unknown)) or repr(spec)}; "
                         f"known: {', '.join(SUITES)}")
    return list(dict.fromkeys(names))


def cases(suites: Sequence[str], device: str, quick: bool = False) -> List[Case]:
    """The cases of `suites` for `device` ("cpu", or a GPU: "cuda"/"hip"), quick or full."""
    target = "quick" if quick else ("cpu" if device == "cpu" else "gpu")
    result: List[Case] = []
    for suite in suites:
        if suite not in _BUILDERS:
            raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
        result.extend(_BUILDERS[suite](target))
    keys = [c.key for c in result]
    if len(set(keys)) != len(keys):
        raise AssertionError(f"duplicate case keys in {suites}: {keys}")
    return result
