"""The model architectures: one module per architecture, found by its Hugging Face
``architectures`` name.

An architecture module holds exactly four things, and imports torch only inside its forward, so
that a simulation (which parses configs and counts weights) runs without torch:

1. **Its config.json mapping.** ``ARCHITECTURE`` (the HF name), ``DEFAULTS`` (transformers'
   config-class defaults for ``rms_norm_eps``, ``rope_theta`` and ``max_position_embeddings``),
   ``ROPE_SCALING`` (the ``rope_scaling`` types it accepts besides none), ``MXFP4_TENSOR`` (the
   checkpoint tensor of layer 0 whose presence means MXFP4 experts, or None), optionally
   ``INT4_LINEARS`` (HF linear module names a checkpoint of INT4 routed experts keeps and
   quantizes, checked against its compressed-tensors targets; without it INT4 is refused), and
   ``config_fields(r, base)``: its own `ModelConfig` fields (head dim, attention bias, experts and
   routing, layer types and window, sinks, activation, gate/up layout) read through the
   `gnomon.engine.config_json.ConfigReader` ``r``, given the architecture-independent ``base``
   fields.
   ``PRESETS``: its presets' config.json contents (real models and a tiny test config), which
   `gnomon.engine.config.PRESETS` gathers. A multimodal wrapper's module may define
   ``text_config(r)``: the text model's fields, read in place of the top-level ones
   (`gnomon.engine.config_json`).
2. **Its weight table.** ``layer_shapes(config, mxfp4)``: gnomon's names and shapes under
   ``layers.{i}.``; ``load_layer(read, config, i, mxfp4)``: which HF tensors of layer ``i``
   become those weights, how they are fused (``qkv``, ``w13``) and how each splits across
   tensor-parallel ranks (``read.dense`` / ``read.codes`` take the split, and read only the
   rank's rows); ``SHARDING``: how `gnomon.engine.weight_shards.shard_weights` splits each
   (``qkv``, ``gate_up``, ``down``, ``row``, ``heads``, ``once`` or ``replicate``, and the dim).
   The pieces several architectures share (a pre-norm layer's norms and attention, stacked
   experts, the tiny test config) are `gnomon.engine.models.common`'s.
3. **Its cost.** ``step_ops(ops)``: the ops of one step per GPU, as its forward runs them,
   from the blocks of `gnomon.costing.StepOps` (the predictors price them; the attention
   over the KV cache is counted per step by `gnomon.predict.opcount`).
4. **Its per-layer forward.** ``forward_layer(model, i, h, residual, step, kv, tick)`` returns
   ``(h, residual)`` after layer ``i``, built only from `gnomon.ops` and torch matmuls, given
   three frozen inputs (`gnomon.engine.models.layers`, which also holds the shared pieces): the
   `Model` on this rank, the step's `StepInputs` and the layer's `LayerKV`.

An architecture the engine has no kernel for (MLA's) sets ``SIMULATION_ONLY`` to the reason:
its ``load_layer`` and ``forward_layer`` refuse with it, ``gnomon.LLM`` refuses the model with it,
and the simulator prices it all the same (`simulation_only`).

`register` adds an architecture by its module path, so a model defined in a user's own module
works wherever gnomon looks architectures up; a new architecture is one new file and one
`register` call (or one line in ``_BUILTIN``).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import ModuleType
from typing import Dict, Tuple, Union

from gnomon.formats import MXFP4_BLOCK

_BUILTIN = {
    "LlamaForCausalLM": "gnomon.engine.models.llama",
    "MixtralForCausalLM": "gnomon.engine.models.mixtral",
    "GptOssForCausalLM": "gnomon.engine.models.gpt_oss",
    "Qwen3ForCausalLM": "gnomon.engine.models.qwen3",
    "Qwen3MoeForCausalLM": "gnomon.engine.models.qwen3_moe",
    "DeepseekV3ForCausalLM": "gnomon.engine.models.deepseek_v3",
    "KimiK25ForConditionalGeneration": "gnomon.engine.models.kimi_k25",
    "MiniMaxM2ForCausalLM": "gnomon.engine.models.minimax_m2",
}
_registry: Dict[str, str] = dict(_BUILTIN)
# Architectures gnomon knows of and cannot price yet, each refused with its reason
UNPRICED = {
    "GlmMoeDsaForCausalLM": (
        "GlmMoeDsaForCausalLM (GLM-5): Multi-head Latent Attention with DeepSeek Sparse "
        "Attention, an indexer picking index_topk keys per query, which gnomon does not price; "
        "priced as dense MLA its attention would be overstated"),
    "Qwen3_5MoeForConditionalGeneration": (
        "Qwen3_5MoeForConditionalGeneration (Qwen3.5): linear attention in 3 of every 4 layers, "
        "which gnomon does not price"),
}
_REQUIRED = ("ARCHITECTURE", "DEFAULTS", "ROPE_SCALING", "MXFP4_TENSOR", "config_fields",
             "PRESETS", "layer_shapes", "SHARDING", "load_layer", "step_ops", "forward_layer")


def register(architecture: str, module: Union[str, ModuleType]) -> None:
    """Registers `module` (a module, or its importable dotted path) as `architecture`'s. It must
    define the names the module docstring lists; a missing one is refused by name."""
    if not isinstance(architecture, str) or not architecture:
        raise TypeError(f"architecture: expected a non-empty str, got {architecture!r}")
    path = module.__name__ if isinstance(module, ModuleType) else module
    if not isinstance(path, str):
        raise TypeError(f"module: expected a module or a dotted module path, got {module!r}")
    loaded = importlib.import_module(path)
    missing = [name for name in _REQUIRED if not hasattr(loaded, name)]
    if missing:
        raise ValueError(f"module: {path} does not define {', '.join(missing)} (an architecture "
                         f"module defines {', '.join(_REQUIRED)})")
    if loaded.ARCHITECTURE != architecture:
        raise ValueError(f"module: {path} declares ARCHITECTURE {loaded.ARCHITECTURE!r}, not "
                         f"{architecture!r}")
    _registry[architecture] = path


def unregister(architecture: str) -> None:
    """Removes an architecture `register` added (the built-in ones stay)."""
    if architecture in _BUILTIN:
        raise ValueError(f"architecture: {architecture!r} is built in and stays registered")
    _registry.pop(architecture, None)


def architectures() -> Tuple[str, ...]:
    """The registered architecture names."""
    return tuple(_registry)


def module_path(architecture: str) -> str:
    """The dotted path of `architecture`'s module (what a worker process imports)."""
    try:
        return _registry[architecture]
    except KeyError:
        if architecture in UNPRICED:
            raise ValueError(UNPRICED[architecture]) from None
        raise ValueError(f"unsupported architecture {architecture!r}; supported: "
                         f"{', '.join(_registry)}") from None


def model_module(architecture: str) -> ModuleType:
    """`architecture`'s module; ValueError naming the supported ones when it is unknown."""
    return importlib.import_module(module_path(architecture))


def weight_shapes(config, *, mxfp4: bool = False) -> Dict[str, Tuple[int, ...]]:
    """Every gnomon weight name of `config` (a `gnomon.engine.config.ModelConfig`) with its
    shape: ``embed``, ``norm`` and ``lm_head``, then each layer's from its architecture's
    ``layer_shapes`` (uint8 shapes for the MXFP4 expert codes and scales when `mxfp4`). The one
    weight table: the engine loads and shards it, the predictors count its bytes."""
    if mxfp4:
        check_mxfp4(config)
    c, H = config, config.hidden_size
    shapes: Dict[str, Tuple[int, ...]] = {"embed": (c.vocab_size, H), "norm": (H,),
                                          "lm_head": (c.vocab_size, H)}
    module = model_module(c.architecture)
    layer = module.layer_shapes(c, mxfp4)
    dense = module.layer_shapes(dense_layer_config(c), False) if c.first_dense_layers else {}
    for i in range(c.num_layers):
        shapes.update((f"layers.{i}.{name}", shape)
                      for name, shape in (dense if i < c.first_dense_layers else layer).items())
    return shapes


def dense_layer_config(config):
    """`config` as its first ``first_dense_layers`` layers see it: the same attention and a
    dense MLP ``dense_intermediate_size`` wide (no experts)."""
    return replace(config, num_experts=0, top_k=0, routing=None, shared_experts=0,
                   intermediate_size=config.dense_intermediate_size, first_dense_layers=0)


def simulation_only(architecture: str):
    """Why the engine cannot run `architecture` (its module's ``SIMULATION_ONLY``), or None
    where it can."""
    return getattr(model_module(architecture), "SIMULATION_ONLY", None)


def check_mxfp4(config) -> None:
    """ValueError naming ``mxfp4`` unless `config` has experts whose sizes MXFP4 blocks fit."""
    if not config.is_moe:
        raise ValueError(f"mxfp4: MXFP4 weights are for MoE experts; {config.architecture} with "
                         f"num_experts=0 has none")
    for name, v in (("hidden_size", config.hidden_size),
                    ("intermediate_size", config.intermediate_size)):
        if v % MXFP4_BLOCK:
            raise ValueError(f"mxfp4: MXFP4 experts need {name} to be a multiple of "
                             f"{MXFP4_BLOCK}, got {v}")
