"""Reading a Hugging Face ``config.json``: `read_config` gives `gnomon.engine.config.ModelConfig`'s
fields. Needs no torch.

This module reads the fields every architecture shares (``quantization_config`` and
``rope_scaling`` too) and asks the architecture's module (`gnomon.engine.models`) for the rest;
`ConfigReader` is what both read them with. An architecture gnomon does not register is refused
with a ValueError that lists those it does. A key the model cannot be built without
(``hidden_size``, ...) is required; a missing one raises a KeyError naming the key and the file.
Optional keys default to the values of the matching transformers config class (for example
``rms_norm_eps`` 1e-6 for Llama, 1e-5 for Mixtral and gpt-oss). Features the engine does not
implement (an MLP bias, a partial rotary dim, rope scaling types other than ``llama3``/``yarn``,
a gpt-oss ``swiglu_limit`` other than 7) are refused, not ignored.

A multimodal wrapper's config (Kimi-K2.5's ``KimiK25ForConditionalGeneration``) keeps its text
model under ``text_config``: where the architecture's module defines ``text_config(r)``, the
fields are read from the dict it returns (the text model's, with what the wrapper holds at the
top level where the text model has none, such as its ``quantization_config``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from gnomon.formats import MXFP4_BLOCK, NVFP4_BLOCK

from . import models


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling. ``rope_type`` is ``"llama3"`` (uses `factor`, `low_freq_factor`,
    `high_freq_factor`, `original_max_position_embeddings`) or ``"yarn"`` (uses `factor`,
    `original_max_position_embeddings`, `beta_fast`, `beta_slow`, `truncate` and
    `attention_factor`; `attention_factor` None means ``0.1 * ln(factor) + 1``)."""

    rope_type: str
    factor: float
    original_max_position_embeddings: int
    low_freq_factor: Optional[float] = None
    high_freq_factor: Optional[float] = None
    beta_fast: Optional[float] = None
    beta_slow: Optional[float] = None
    truncate: bool = True
    attention_factor: Optional[float] = None


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # the activation dtypes, by name


def check_dtype(name: str, what: str) -> str:
    if name not in DTYPE_BYTES:
        raise ValueError(f"{what}: expected one of {', '.join(DTYPE_BYTES)}, got {name!r}")
    return name


class ConfigReader:
    """Reads config.json values with named errors (the file's path, the key, what it accepts);
    the architecture modules read their own fields through it (`gnomon.engine.models`)."""

    def __init__(self, raw: Dict[str, Any], source: str):
        self.raw, self.source = raw, source

    def required(self, key: str, kind=int):
        if key not in self.raw or self.raw[key] is None:
            raise KeyError(f"{self.source}: config is missing the required key {key!r}")
        return self.value(key, self.raw[key], kind)

    def optional(self, key: str, default, kind=int):
        v = self.raw.get(key)
        return default if v is None else self.value(key, v, kind)

    def value(self, key: str, v, kind):
        if kind is int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{self.source}: {key} must be an integer, got {v!r}")
        elif kind is float:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{self.source}: {key} must be a number, got {v!r}")
            v = float(v)
        elif kind is bool:
            if not isinstance(v, bool):
                raise ValueError(f"{self.source}: {key} must be true or false, got {v!r}")
        return v

    def fail(self, msg: str):
        raise ValueError(f"{self.source}: {msg}")

    # ---- fields several architectures read alike

    def head_dim(self) -> int:
        """``head_dim``; by default ``hidden_size / num_attention_heads``, which must divide."""
        hidden, heads = self.raw["hidden_size"], self.raw["num_attention_heads"]
        if hidden % heads and self.raw.get("head_dim") is None:
            self.fail(f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}) "
                      f"and head_dim is not given")
        return self.optional("head_dim", hidden // heads)

    def require_silu_mlp(self) -> None:
        act = self.raw.get("hidden_act", "silu")
        if act != "silu":
            self.fail(f"hidden_act must be 'silu', got {act!r}")
        if self.raw.get("mlp_bias"):
            self.fail("mlp_bias=true is not supported")

    def sliding_window(self) -> Optional[int]:
        window = self.raw.get("sliding_window")
        if window is None:
            return None
        window = self.value("sliding_window", window, int)
        if window < 1:
            self.fail(f"sliding_window must be >= 1 or null, got {window}")
        return window

    def experts_per_token(self, key: str, num_experts: int,
                          fallback: Optional[str] = None) -> int:
        """The experts per token under `key` (or `fallback`), in ``[1, num_experts]``."""
        top_k = self.raw.get(key)
        if top_k is None and fallback is not None:
            top_k = self.raw.get(fallback)
        if top_k is None:
            raise KeyError(f"{self.source}: config is missing the required key {key!r}")
        top_k = self.value(key, top_k, int)
        if not 1 <= top_k <= num_experts:
            self.fail(f"the experts per token ({top_k}) must be in [1, num_local_experts = "
                      f"{num_experts}]")
        return top_k


def read_config(raw: Dict[str, Any], source: str) -> Dict[str, Any]:
    """`gnomon.engine.config.ModelConfig`'s fields from a parsed config.json: the
    architecture-independent ones here, the rest from the architecture's module."""
    r = ConfigReader(raw, source)
    archs = raw.get("architectures")
    if archs is None:
        raise KeyError(f"{source}: config is missing the required key 'architectures'")
    if isinstance(archs, str):
        archs = [archs]
    if isinstance(archs, list) and len(archs) == 1 and archs[0] in models.UNPRICED:
        r.fail(models.UNPRICED[archs[0]])
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in models.architectures():
        r.fail(f"unsupported architecture {archs!r}; supported: "
               f"{', '.join(models.architectures())}")
    arch = archs[0]
    model = models.model_module(arch)
    text_config = getattr(model, "text_config", None)  # a multimodal wrapper's text model
    if text_config is not None:
        raw = text_config(r)
        r = ConfigReader(raw, f"{source} text_config")

    base = dict(vocab_size=r.required("vocab_size"), hidden_size=r.required("hidden_size"),
                intermediate_size=r.required("intermediate_size"),
                num_layers=r.required("num_hidden_layers"),
                num_heads=r.required("num_attention_heads"))
    base["num_kv_heads"] = r.optional("num_key_value_heads", base["num_heads"])
    for key, field in (("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"),
                       ("intermediate_size", "intermediate_size"),
                       ("num_hidden_layers", "num_layers"), ("num_attention_heads", "num_heads"),
                       ("num_key_value_heads", "num_kv_heads")):
        if base[field] < 1:
            r.fail(f"{key} must be >= 1, got {base[field]}")
    heads, kv_heads = base["num_heads"], base["num_kv_heads"]
    if heads % kv_heads:
        r.fail(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads "
               f"({kv_heads})")
    fields = model.config_fields(r, base)  # may replace a base field (MoE: the experts' width)
    head_dim = fields["head_dim"]
    if head_dim < 2 or head_dim % 2:
        r.fail(f"head_dim must be even and >= 2, got {head_dim}")
    if r.optional("partial_rotary_factor", 1.0, float) != 1.0:
        r.fail("partial_rotary_factor other than 1 is not supported")

    defaults = model.DEFAULTS  # transformers' config-class defaults
    eps = r.optional("rms_norm_eps", defaults["rms_norm_eps"], float)
    theta = r.optional("rope_theta", defaults["rope_theta"], float)
    max_pos = r.optional("max_position_embeddings", defaults["max_position_embeddings"])
    if eps <= 0 or theta <= 0 or max_pos < 1:
        r.fail("rms_norm_eps and rope_theta must be > 0 and max_position_embeddings >= 1")
    scaling = _parse_rope_scaling(r, raw.get("rope_scaling"), arch, model.ROPE_SCALING,
                                  runs=models.simulation_only(arch) is None)
    tie = r.optional("tie_word_embeddings", False, bool)
    quantization, kv_cache_dtype = _parse_quantization(r, raw.get("quantization_config"), model)

    eos = raw.get("eos_token_id")
    if eos is None:
        eos_ids: Tuple[int, ...] = ()
    elif isinstance(eos, list):
        eos_ids = tuple(r.value("eos_token_id", e, int) for e in eos)
    else:
        eos_ids = (r.value("eos_token_id", eos, int),)

    dtype = raw.get("torch_dtype", raw.get("dtype")) or "float32"
    check_dtype(dtype, f"{source}: torch_dtype")

    return dict(
        architecture=arch, **{**base, **fields}, rms_norm_eps=eps, rope_theta=theta,
        rope_scaling=scaling, max_position_embeddings=max_pos, tie_word_embeddings=tie,
        eos_token_ids=eos_ids, torch_dtype=dtype, quantization=quantization,
        kv_cache_dtype=kv_cache_dtype)


QUANT_METHODS = ("mxfp4 (gpt-oss)", "fp8", "fbgemm_fp8", "modelopt (FP8, NVFP4)",
                 "compressed-tensors (fp8, nvfp4, mxfp4, INT4 routed experts)",
                 "quark (fp8_e4m3)")
INT4_GROUP = 32  # elements that share one bf16 scale in INT4 experts (Kimi-K2.5's group_size)
INT4_EXPERTS = (f"INT4 on the routed experts alone (W4A16: num_bits 4, type int, symmetric, "
                f"strategy group, group_size {INT4_GROUP}, no input_activations; an ignore list "
                f"that keeps attention, the dense MLP and the shared experts unquantized, as "
                f"Kimi-K2.5's)")


def _fp4_spec(spec) -> Optional[str]:
    """"nvfp4" (16-element groups) or "mxfp4-dense" (32) for a compressed-tensors weight spec
    of 4-bit floats, else None."""
    if not isinstance(spec, dict) or spec.get("num_bits") != 4 or spec.get("type") != "float":
        return None
    return {NVFP4_BLOCK: "nvfp4", MXFP4_BLOCK: "mxfp4-dense"}.get(spec.get("group_size"))


def _is_fp8_spec(spec) -> bool:
    """A compressed-tensors / quark tensor spec that says FP8."""
    if not isinstance(spec, dict):
        return False
    return (spec.get("num_bits") == 8 and spec.get("type") == "float") \
        or spec.get("dtype") == "fp8_e4m3"


def _matches(target: str, name: str) -> bool:
    """Whether a compressed-tensors target or ignore entry names the linear module `name`:
    ``"Linear"`` (the class) every one, ``"re:..."`` by a regex match from the start, else the
    name itself (compressed-tensors' matching)."""
    if target == "Linear":
        return True
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def _int4_experts_problem(groups: Dict[str, Any], ignore, linears) -> Optional[str]:
    """Why a compressed-tensors config of integer weights is not `INT4_EXPERTS` for an
    architecture whose ``INT4_LINEARS`` are ``linears`` (its HF linear module names, ``(kept,
    quantized)``), or None."""
    if linears is None:
        return "this architecture declares no INT4 experts (INT4_LINEARS)"
    kept, routed = linears
    targets = []
    for key, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            return f"{key} has no weights scheme"
        for field, want in (("num_bits", 4), ("type", "int"), ("symmetric", True),
                            ("strategy", "group"), ("group_size", INT4_GROUP)):
            if weights.get(field) != want:
                return f"{key}'s weights have {field} {weights.get(field)!r}, not {want!r}"
        if group.get("input_activations"):
            return f"{key} quantizes its input activations too, not W4A16"
        targets += [t for t in group.get("targets") or () if isinstance(t, str)]
    ignore = [p for p in ignore or () if isinstance(p, str)]

    def quantized(name):
        return any(_matches(t, name) for t in targets) and not any(
            _matches(p, name) for p in ignore)

    for name in kept:
        if quantized(name):
            return f"it would quantize {name} too (ignore {ignore!r})"
    for name in routed:
        if not quantized(name):
            return f"it would leave the routed experts' {name} unquantized"
    return None


def _parse_quantization(r: ConfigReader, quant, model):
    """``(quantization, kv_cache_dtype)`` from a ``quantization_config``: "mxfp4" (gpt-oss's
    experts), "int4" (the routed experts alone in INT4, `INT4_EXPERTS`: Kimi-K2.5's), or the
    linear layers' weights: "fp8", "nvfp4" (ModelOpt or compressed-tensors, FP4 in 16-element
    groups with FP8 scales) or "mxfp4-dense" (compressed-tensors FP4 in 32-element groups); and
    "fp8" where the config also declares an FP8 KV cache (compressed-tensors' and ModelOpt's
    ``kv_cache_scheme``, ModelOpt's ``kv_cache_quant_algo``, quark's k/v output tensors).
    ``model`` is the architecture's module: its ``MXFP4_TENSOR`` allows "mxfp4", its
    ``INT4_LINEARS`` (optional) "int4"."""
    if quant is None:
        return None, None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "mxfp4":
        if model.MXFP4_TENSOR is None:
            r.fail("quantization_config: quant_method 'mxfp4' is supported on gpt-oss only")
        return "mxfp4", None
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", "fp8" if _is_fp8_spec(quant.get("kv_cache_scheme")) else None
    if method == "modelopt":
        algo = str(quant.get("quant_algo", "")).upper()
        if algo not in ("FP8", "NVFP4"):
            r.fail(f"quantization_config: modelopt is supported with quant_algo FP8 or "
                   f"NVFP4, got {quant.get('quant_algo')!r}")
        kv = str(quant.get("kv_cache_quant_algo") or "").upper()
        fp8_kv = kv == "FP8" or _is_fp8_spec(quant.get("kv_cache_scheme"))
        return algo.lower(), "fp8" if fp8_kv else None
    if method == "compressed-tensors":
        groups = quant.get("config_groups") or {}
        weights = [g.get("weights") for g in groups.values() if isinstance(g, dict)]
        formats = ("one weight format for every group, FP8 (num_bits 8, type float), FP4 "
                   "(num_bits 4, type float, group_size 16 or 32) or " + INT4_EXPERTS)
        kv = "fp8" if _is_fp8_spec(quant.get("kv_cache_scheme")) else None
        if weights and all(isinstance(w, dict) and w.get("type") == "int" for w in weights):
            problem = _int4_experts_problem(groups, quant.get("ignore"),
                                            getattr(model, "INT4_LINEARS", None))
            if problem:
                r.fail(f"quantization_config: compressed-tensors is supported with {formats}; "
                       f"its integer weights are not: {problem}")
            return "int4", kv
        kinds = {"fp8" if _is_fp8_spec(w) else _fp4_spec(w) for w in weights}
        if len(kinds) != 1 or None in kinds:
            r.fail(f"quantization_config: compressed-tensors is supported with {formats}, got "
                   f"config_groups {groups!r}")
        return kinds.pop(), kv
    if method == "quark":
        weight = (quant.get("global_quant_config") or {}).get("weight")
        if not _is_fp8_spec(weight):
            r.fail(f"quantization_config: quark is supported with fp8_e4m3 weights, got "
                   f"global_quant_config.weight {weight!r}")
        layers = quant.get("layer_quant_config") or {}
        kv = [spec.get("output_tensors") for name, spec in layers.items()
              if isinstance(spec, dict) and name.rstrip("*").endswith(("k_proj", "v_proj"))]
        kv += list((quant.get("kv_cache_quant_config") or {}).values())
        return "fp8", "fp8" if kv and all(_is_fp8_spec(x) for x in kv) else None
    r.fail(f"quantization_config: unknown quant_method {method!r}; supported: "
           f"{', '.join(QUANT_METHODS)}")


def _parse_rope_scaling(r: ConfigReader, raw, arch: str, allowed: Tuple[str, ...],
                        runs: bool = True) -> Optional[RopeScaling]:
    """The config's RoPE scaling; `runs` False for a simulation-only architecture, whose RoPE
    tables are never built, so that DeepSeek's YaRN ``mscale`` (which only changes the
    forward) is read past rather than refused."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        r.fail(f"rope_scaling must be an object or null, got {raw!r}")
    kind = raw.get("rope_type", raw.get("type"))
    if kind == "default":
        return None
    if kind not in allowed:
        r.fail(f"rope_scaling type {kind!r} is not supported for {arch}; supported: "
               f"{', '.join(('none',) + allowed)}")

    def need(key, kind_=float):
        if raw.get(key) is None:
            raise KeyError(f"{r.source}: config is missing the required key "
                           f"'rope_scaling.{key}'")
        return r.value(f"rope_scaling.{key}", raw[key], kind_)

    factor = need("factor")
    if factor < 1:
        r.fail(f"rope_scaling.factor must be >= 1, got {factor}")
    orig = need("original_max_position_embeddings", int)
    if kind == "llama3":
        low, high = need("low_freq_factor"), need("high_freq_factor")
        if not 0 < low < high:
            r.fail(f"rope_scaling needs 0 < low_freq_factor < high_freq_factor, got {low}, "
                   f"{high}")
        return RopeScaling("llama3", factor, orig, low_freq_factor=low, high_freq_factor=high)
    for key in ("mscale", "mscale_all_dim"):
        if raw.get(key) and runs:
            r.fail(f"rope_scaling.{key} is not supported")
    attention_factor = raw.get("attention_factor")
    if attention_factor is not None:
        attention_factor = r.value("rope_scaling.attention_factor", attention_factor, float)
    truncate = raw.get("truncate", True)
    r.value("rope_scaling.truncate", truncate, bool)
    return RopeScaling("yarn", factor, orig,
                       beta_fast=r.value("rope_scaling.beta_fast", raw.get("beta_fast") or 32.0,
                                         float),
                       beta_slow=r.value("rope_scaling.beta_slow", raw.get("beta_slow") or 1.0,
                                         float),
                       truncate=truncate, attention_factor=attention_factor)
