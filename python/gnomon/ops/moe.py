"""topk_routing and fused_moe: Mixture-of-Experts routing and the expert MLPs in one call."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from gnomon import _C
from gnomon.formats import MXFP4_BLOCK
from gnomon.ops._tensor import (FLOATING, call, check_choice, check_same_device, check_tensor,
                                custom_op, follow_torch_threads, view, view_like)

ROUTING_MODES = ("softmax_topk", "topk_softmax")
ACTIVATIONS = ("silu", "swiglu_oai")
GATE_UP_LAYOUTS = ("concat", "interleaved")
MAX_TOP_K = 64  # kMaxTopK in csrc/ops.h


@custom_op("topk_routing", mutates_args=())
def _topk_routing(router_logits: torch.Tensor, top_k: int, mode: str,
                  renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    follow_torch_threads()
    tokens = router_logits.shape[0]
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=router_logits.device)
    _C.topk_routing(view(weights), view(ids), view(router_logits), top_k, mode, renormalize)
    return weights, ids


@_topk_routing.register_fake
def _(router_logits, top_k, mode, renormalize):
    tokens = router_logits.shape[0]
    return (router_logits.new_empty((tokens, top_k), dtype=torch.float32),
            router_logits.new_empty((tokens, top_k), dtype=torch.int32))


def _check_topk_routing(router_logits, top_k, mode, renormalize) -> None:
    check_tensor(router_logits, "router_logits", dtypes=FLOATING, dim=2)
    num_experts = router_logits.shape[1]
    if not 1 <= top_k <= min(num_experts, MAX_TOP_K):
        raise ValueError(f"top_k: expected 1 <= top_k <= min(num_experts = {num_experts}, "
                         f"{MAX_TOP_K}), got {top_k}")


def topk_routing(router_logits: torch.Tensor, top_k: int, *, mode: str = "softmax_topk",
                 renormalize: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """Picks `top_k` experts per token from `router_logits` [T, E] (math in float32).

    ``mode="softmax_topk"`` (Mixtral): softmax over all E experts, then the top k, divided by
    their sum when `renormalize`. ``mode="topk_softmax"`` (gpt-oss): top k of the logits, then
    the softmax over those k (`renormalize` changes nothing). Ties go to the lower expert id.
    Returns ``(weights float32 [T, k], ids int32 [T, k])``, weights in descending order.
    """
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise TypeError(f"top_k: expected an int, got {type(top_k).__name__}")
    # here, before top_k sizes the outputs; _check_topk_routing bounds it by the experts too
    if not 1 <= top_k <= MAX_TOP_K:
        raise ValueError(f"top_k: expected 1 <= top_k <= min(num_experts, {MAX_TOP_K}), got "
                         f"{top_k}")
    check_choice(mode, "mode", ROUTING_MODES)
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: expected a bool, got {type(renormalize).__name__}")
    return call(_topk_routing, _check_topk_routing, router_logits, top_k, mode, renormalize)


@custom_op("fused_moe", mutates_args=())
def _fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
               topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: str,
               gate_up_layout: str, w13_bias: Optional[torch.Tensor],
               w2_bias: Optional[torch.Tensor], w13_scales: Optional[torch.Tensor],
               w2_scales: Optional[torch.Tensor]) -> torch.Tensor:
    follow_torch_threads()
    out = torch.empty_like(hidden)
    hidden_view = view(hidden)
    _C.fused_moe(view_like(out, hidden_view), hidden_view, view(w13), view(w2), view(topk_weights),
                 view(topk_ids), activation, gate_up_layout, view(w13_bias), view(w2_bias),
                 view(w13_scales), view(w2_scales))
    return out


@_fused_moe.register_fake
def _(hidden, w13, w2, topk_weights, topk_ids, activation, gate_up_layout, w13_bias, w2_bias,
      w13_scales, w2_scales):
    return torch.empty_like(hidden)


def _check_fused_moe(hidden, w13, w2, topk_weights, topk_ids, activation, gate_up_layout,
                     w13_bias, w2_bias, w13_scales, w2_scales) -> None:
    check_tensor(hidden, "hidden", dtypes=FLOATING, dim=2)
    tokens, hidden_size = hidden.shape
    check_tensor(w13, "w13", dtypes=(hidden.dtype, torch.uint8), dim=3)
    mxfp4 = w13.dtype == torch.uint8
    check_tensor(w2, "w2", dtypes=(w13.dtype,), dim=3)
    num_experts = w13.shape[0]
    intermediate = w2.shape[2] * (2 if mxfp4 else 1)
    if num_experts < 1 or intermediate < 1:
        raise ValueError(f"w13, w2: expected at least one expert and I >= 1, got w13 "
                         f"{tuple(w13.shape)} and w2 {tuple(w2.shape)}")
    if mxfp4:
        if hidden_size % MXFP4_BLOCK or intermediate % MXFP4_BLOCK:
            raise ValueError(f"w13, w2: MXFP4 experts need H and I divisible by {MXFP4_BLOCK}, "
                             f"got H = {hidden_size}, I = {intermediate}")
        check_tensor(w13, "w13", dtypes=(torch.uint8,),
                     shape=(num_experts, 2 * intermediate, hidden_size // 2))
        check_tensor(w2, "w2", dtypes=(torch.uint8,),
                     shape=(num_experts, hidden_size, intermediate // 2))
        nb_h, nb_i = hidden_size // MXFP4_BLOCK, intermediate // MXFP4_BLOCK  # scale blocks
        for name, scales, shape in (
                ("w13_scales", w13_scales, (num_experts, 2 * intermediate, nb_h)),
                ("w2_scales", w2_scales, (num_experts, hidden_size, nb_i))):
            if scales is None:
                raise ValueError(f"{name}: required (uint8 E8M0 {shape}) when the expert "
                                 f"weights are MXFP4 (uint8)")
            check_tensor(scales, name, dtypes=(torch.uint8,), shape=shape)
    else:
        check_tensor(w13, "w13", dtypes=(hidden.dtype,),
                     shape=(num_experts, 2 * intermediate, hidden_size))
        check_tensor(w2, "w2", dtypes=(hidden.dtype,),
                     shape=(num_experts, hidden_size, intermediate))
        for name, scales in (("w13_scales", w13_scales), ("w2_scales", w2_scales)):
            if scales is not None:
                raise ValueError(f"{name}: only MXFP4 (uint8) expert weights take scales; "
                                 f"pass None for {w13.dtype} experts")
    if w13_bias is not None:
        check_tensor(w13_bias, "w13_bias", dtypes=(hidden.dtype,),
                     shape=(num_experts, 2 * intermediate))
    if w2_bias is not None:
        check_tensor(w2_bias, "w2_bias", dtypes=(hidden.dtype,), shape=(num_experts, hidden_size))
    check_tensor(topk_weights, "topk_weights", dtypes=(torch.float32,), dim=2)
    if topk_weights.shape[0] != tokens:
        raise ValueError(f"topk_weights: expected {tokens} rows like hidden, got shape "
                         f"{tuple(topk_weights.shape)}")
    check_tensor(topk_ids, "topk_ids", dtypes=(torch.int32,), shape=tuple(topk_weights.shape))
    check_same_device(hidden=hidden, w13=w13, w2=w2, topk_weights=topk_weights,
                      topk_ids=topk_ids, w13_bias=w13_bias, w2_bias=w2_bias,
                      w13_scales=w13_scales, w2_scales=w2_scales)


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, *, activation: str = "silu",
              gate_up_layout: str = "concat", w13_bias: Optional[torch.Tensor] = None,
              w2_bias: Optional[torch.Tensor] = None, w13_scales: Optional[torch.Tensor] = None,
              w2_scales: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The MoE block's expert MLPs: ``out[t] = sum_k topk_weights[t, k] * expert(hidden[t])``
    with expert ``topk_ids[t, k]``, accumulated in float32. Returns [T, H] in hidden's dtype.

    `hidden` is [T, H]. Dense experts: `w13` [E, 2I, H] and `w2` [E, H, I] in hidden's dtype.
    MXFP4 experts: `w13` uint8 [E, 2I, H/2] with `w13_scales` uint8 [E, 2I, H/32], and `w2`
    uint8 [E, H, I/2] with `w2_scales` uint8 [E, H, I/32] (the layout in DESIGN.md; H and I
    must be multiples of 32). `gate_up_layout` names where w13 keeps its gate and up rows:
    "concat" (gate rows [0, I), up rows [I, 2I)) or "interleaved" (gpt-oss: gate even, up odd).
    `activation` is "silu" (``silu(gate) * up``) or "swiglu_oai" (gpt-oss: gate clamped at 7, up
    to [-7, 7], ``(up + 1) * gate * sigmoid(1.702 * gate)``). Optional biases in hidden's dtype:
    `w13_bias` [E, 2I] (rows as in w13) and `w2_bias` [E, H], added before the activation and
    before the routing weight respectively. `topk_weights` is float32 [T, k], `topk_ids` int32
    [T, k] with entries in [0, E) (checked).
    """
    check_choice(activation, "activation", ACTIVATIONS)
    check_choice(gate_up_layout, "gate_up_layout", GATE_UP_LAYOUTS)
    return call(_fused_moe, _check_fused_moe, hidden, w13, w2, topk_weights, topk_ids,
                activation, gate_up_layout, w13_bias, w2_bias, w13_scales, w2_scales)
