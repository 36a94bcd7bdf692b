"""topk_routing and fused_moe against pure-torch references written here.

The fused_moe reference loops over tokens and each token's k experts, splits gate and up by the
named layout, applies the named activation (gpt-oss clamps included) and the biases, all in
float64. MXFP4 weights are dequantised by this file's own E2M1/E8M0 decode.
"""

import pytest
import torch
import torch.nn.functional as F

import gnomon.ops as ops
from gnomon import _C
from gnomon.ops._tensor import view
from ops.fuzz import malformed_calls

# fused_moe against a float64 reference: float32 accumulates in float32 over at most a few
# hundred terms; bf16/fp16 round the output once (half an ulp: 2^-9 and 2^-12 relative), so
# their tolerance is relative to each element, plus a small absolute part for accumulation.
RTOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}
ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-4, torch.float16: 1e-4}  # times max |reference|


# ---- references ----------------------------------------------------------------------------------

def routing_reference(logits, k, mode, renormalize):
    logits = logits.double()
    if mode == "softmax_topk":
        weights, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
    else:
        values, ids = logits.topk(k, dim=-1)
        weights = torch.softmax(values, dim=-1)
    return weights, ids


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)


def dequantize_reference(packed, scales):
    """[..., K/2] uint8 codes (element 2i in the low nibble) and [..., K/32] E8M0 -> float64."""
    low, high = E2M1[(packed & 0x0F).long()], E2M1[(packed >> 4).long()]
    values = torch.stack([low, high], dim=-1).flatten(-2)
    scale = torch.pow(2.0, scales.double() - 127)
    scale[scales == 0xFF] = float("nan")
    return values * scale.repeat_interleave(32, dim=-1)


def moe_reference(hidden, w13, w2, topk_weights, topk_ids, activation="silu",
                  gate_up_layout="concat", w13_bias=None, w2_bias=None, w13_scales=None,
                  w2_scales=None, magnitudes=False):
    """The MoE block's output in float64; with `magnitudes`, also the sum over each token's
    experts of |routing weight| * (|w2| @ |activation|), the scale of rounding the activations."""
    if w13.dtype == torch.uint8:
        w13, w2 = dequantize_reference(w13, w13_scales), dequantize_reference(w2, w2_scales)
    w13, w2 = w13.double(), w2.double()
    intermediate = w2.shape[2]
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    magnitude = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        x = hidden[t].double()
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate_up = w13[e] @ x
            if w13_bias is not None:
                gate_up = gate_up + w13_bias[e].double()
            if gate_up_layout == "concat":
                gate, up = gate_up[:intermediate], gate_up[intermediate:]
            else:
                gate, up = gate_up[0::2], gate_up[1::2]
            if activation == "silu":
                act = F.silu(gate) * up
            else:
                gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
                act = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            y = w2[e] @ act
            if w2_bias is not None:
                y = y + w2_bias[e].double()
            out[t] += float(topk_weights[t, j]) * y
            magnitude[t] += abs(float(topk_weights[t, j])) * (w2[e].abs() @ act.abs())
    return (out, magnitude) if magnitudes else out


def assert_close_to_reference(out, expected, dtype, magnitude=None):
    """bf16 with `magnitude` (moe_reference's): the kernels' bf16 dot path rounds the
    intermediate activations to bf16 before the down projection (as a bf16 torch MoE does), so
    each output may be off by the unit roundoff u = 2^-8 times |reference| + magnitude (the
    activations' rounding, then the output's), plus float32 accumulation."""
    assert out.dtype == dtype
    scale = max(expected.abs().max().item(), 1.0) if expected.numel() else 1.0
    if dtype == torch.bfloat16 and magnitude is not None:
        bound = 2.0 ** -8 * (expected.abs() + magnitude) + ATOL[dtype] * scale
        excess = (out.double() - expected).abs() - bound
        assert (excess <= 0).all(), f"off by up to {excess.max().item():.3g} beyond the bound"
        return
    torch.testing.assert_close(out.double(), expected, rtol=RTOL[dtype],
                               atol=ATOL[dtype] * scale)


# ---- inputs ----------------------------------------------------------------------------------------

def dense_experts(E, H, I, dtype, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype)
    extra = {}
    if bias:
        extra = dict(w13_bias=(torch.randn(E, 2 * I, generator=g) * 0.5).to(dtype),
                     w2_bias=(torch.randn(E, H, generator=g) * 0.5).to(dtype))
    return w13, w2, extra


def mxfp4_experts(E, H, I, dtype, bias=False, seed=0):
    """Random codes (every nibble value occurs) with scales around 2^-3 / sqrt(K)."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8)
    w13_scales = torch.randint(117, 122, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8)
    w2_scales = torch.randint(117, 122, (E, H, I // 32), generator=g, dtype=torch.uint8)
    extra = dict(w13_scales=w13_scales, w2_scales=w2_scales)
    if bias:
        extra.update(w13_bias=(torch.randn(E, 2 * I, generator=g) * 0.5).to(dtype),
                     w2_bias=(torch.randn(E, H, generator=g) * 0.5).to(dtype))
    return w13, w2, extra


def routed(T, E, k, mode, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ops.topk_routing(torch.randn(T, E, generator=g) * 2, k, mode=mode)


# Mixtral: softmax over all experts, renormalised top k, SwiGLU, gate rows then up rows.
MIXTRAL = dict(mode="softmax_topk", activation="silu", gate_up_layout="concat", bias=False)
# gpt-oss: top k of the logits then softmax, clamped SwiGLU, interleaved gate/up, biases.
GPT_OSS = dict(mode="topk_softmax", activation="swiglu_oai", gate_up_layout="interleaved",
               bias=True)
STYLES = {"mixtral": MIXTRAL, "gpt-oss": GPT_OSS}


def run_block(style, experts, T, E, k, H, I, dtype, seed=0):
    """fused_moe's output, and moe_reference's output and magnitudes, on one random block."""
    torch.manual_seed(seed)
    hidden = torch.randn(T, H).to(dtype)
    w13, w2, extra = experts(E, H, I, dtype, bias=style["bias"], seed=seed)
    weights, ids = routed(T, E, k, style["mode"], seed)
    kwargs = dict(activation=style["activation"], gate_up_layout=style["gate_up_layout"], **extra)
    out = ops.fused_moe(hidden, w13, w2, weights, ids, **kwargs)
    return out, moe_reference(hidden, w13, w2, weights, ids, **kwargs, magnitudes=True)


# ---- topk_routing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode, renormalize", [("softmax_topk", True), ("softmax_topk", False),
                                               ("topk_softmax", True), ("topk_softmax", False)])
@pytest.mark.parametrize("T, E, k", [(1, 8, 2), (37, 32, 4), (5, 128, 8), (3, 4, 4), (2, 1, 1)])
def test_topk_routing_matches_reference(dtype, mode, renormalize, T, E, k):
    torch.manual_seed(T * E + k)
    # Distinct logits 0.25 apart (exact in every dtype), so the top k has no ties.
    logits = ((torch.stack([torch.randperm(E) for _ in range(T)]) - E / 2) * 0.25).to(dtype)
    weights, ids = ops.topk_routing(logits, k, mode=mode, renormalize=renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert weights.shape == ids.shape == (T, k)
    expected_weights, expected_ids = routing_reference(logits, k, mode, renormalize)
    # The same experts in the same (descending) order.
    assert torch.equal(ids.long(), expected_ids)
    torch.testing.assert_close(weights.double(), expected_weights, rtol=1e-5, atol=1e-6)


def test_topk_routing_breaks_ties_by_lower_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    for mode in ("softmax_topk", "topk_softmax"):
        weights, ids = ops.topk_routing(logits, 3, mode=mode)
        assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]
        torch.testing.assert_close(weights, torch.full((2, 3), 1 / 3))


def test_topk_routing_of_no_tokens():
    weights, ids = ops.topk_routing(torch.empty(0, 8), 2)
    assert weights.shape == ids.shape == (0, 2)


# ---- fused_moe -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("T, E, k, H, I", [
    (1, 8, 2, 64, 96),       # decode
    (9, 8, 2, 40, 24),       # H and I off the vector widths: tails
    (23, 6, 3, 100, 33),
])
def test_fused_moe_dense_matches_reference(dtype, style, T, E, k, H, I):
    out, (expected, magnitude) = run_block(STYLES[style], dense_experts, T, E, k, H, I, dtype)
    assert_close_to_reference(out, expected, dtype, magnitude)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("T, E, k, H, I", [
    (1, 8, 4, 64, 64),
    (4, 32, 4, 96, 64),      # gpt-oss routing width, scaled down
    (19, 4, 2, 64, 160),
])
def test_fused_moe_mxfp4_matches_reference(dtype, style, T, E, k, H, I):
    out, (expected, magnitude) = run_block(STYLES[style], mxfp4_experts, T, E, k, H, I, dtype)
    assert_close_to_reference(out, expected, dtype, magnitude)


@pytest.mark.parametrize("family", ["narrow", "wide", "bf16", "best"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("experts, H, I", [(dense_experts, 101, 33), (mxfp4_experts, 96, 64)])
@pytest.mark.parametrize("style", STYLES)
def test_fused_moe_kernel_families(family, dtype, experts, H, I, style, monkeypatch):
    """Experts with many tokens run the tokens-in-lanes GEMM (8 or more tokens, 4 or more on
    AMX), the rest the dot-product tiles, in one call, on each kernel family; odd H and I leave
    tails and, on the bf16 dot path, a half-empty last pair (see assert_close_to_reference for
    its tolerance)."""
    if family != "best":
        monkeypatch.setenv("GNOMON_CPU_KERNELS", family)
    T, E, k = 24, 6, 2  # about 8 tokens per expert: counts on each side of 4 and of 8
    out, (expected, magnitude) = run_block(STYLES[style], experts, T, E, k, H, I, dtype, seed=8)
    counts = routed(T, E, k, STYLES[style]["mode"], seed=8)[1].flatten().bincount(minlength=E)
    assert (counts >= 8).any() and ((counts >= 4) & (counts < 8)).any()
    assert ((counts > 0) & (counts < 4)).any()
    assert_close_to_reference(out, expected, dtype, magnitude)


@pytest.mark.parametrize("experts, H, I", [(dense_experts, 72, 40), (mxfp4_experts, 64, 96)])
def test_fused_moe_float16(experts, H, I):
    out, (expected, _) = run_block(GPT_OSS, experts, 6, 4, 2, H, I, torch.float16)
    assert_close_to_reference(out, expected, torch.float16)


@pytest.mark.parametrize("experts", [dense_experts, mxfp4_experts])
def test_fused_moe_many_tokens_on_one_expert_and_idle_experts(experts):
    # Every token picks expert 5 (37 tokens: nine 4-token tiles and one left over); a second
    # choice spreads over experts 0-2; experts 3, 4, 6, 7 get nothing.
    torch.manual_seed(3)
    T, E, H, I = 37, 8, 64, 96
    hidden = torch.randn(T, H)
    w13, w2, extra = experts(E, H, I, torch.float32, bias=True)
    ids = torch.stack([torch.full((T,), 5), torch.arange(T) % 3], dim=1).int()
    weights = torch.rand(T, 2)
    kwargs = dict(activation="swiglu_oai", gate_up_layout="interleaved", **extra)
    out = ops.fused_moe(hidden, w13, w2, weights, ids, **kwargs)
    expected = moe_reference(hidden, w13, w2, weights, ids, **kwargs)
    assert_close_to_reference(out, expected, torch.float32)


def test_fused_moe_sums_a_repeated_expert():
    # Routing never repeats an expert for a token, but the op's contract is a plain sum over k.
    torch.manual_seed(4)
    hidden = torch.randn(3, 32)
    w13, w2, _ = dense_experts(2, 32, 16, torch.float32)
    ids = torch.tensor([[1, 1], [0, 1], [0, 0]], dtype=torch.int32)
    weights = torch.rand(3, 2)
    out = ops.fused_moe(hidden, w13, w2, weights, ids)
    assert_close_to_reference(out, moe_reference(hidden, w13, w2, weights, ids), torch.float32)


def test_fused_moe_many_tokens_go_through_in_chunks():
    # The kernel bounds its float32 buffers to 64 MiB per chunk of tokens; 64 experts of H = I =
    # 64 with top_k 64 need 16.6 KB per token, so 4,500 tokens take two chunks. The reference
    # runs every expert on every token at once, then weights them by the routing.
    torch.manual_seed(5)
    T, E, k, H, I = 4500, 64, 64, 64, 64
    hidden = torch.randn(T, H)
    w13, w2, extra = dense_experts(E, H, I, torch.float32, bias=True)
    weights, ids = ops.topk_routing(torch.randn(T, E), k, mode="topk_softmax")
    out = ops.fused_moe(hidden, w13, w2, weights, ids, activation="swiglu_oai",
                        gate_up_layout="interleaved", **extra)
    h = hidden.double()
    gate_up = torch.einsum("eoh,th->teo", w13.double(), h) + extra["w13_bias"].double()
    gate, up = gate_up[..., 0::2].clamp(max=7.0), gate_up[..., 1::2].clamp(-7.0, 7.0)
    act = (up + 1) * gate * torch.sigmoid(1.702 * gate)
    y = torch.einsum("ehi,tei->teh", w2.double(), act) + extra["w2_bias"].double()
    routing = torch.zeros(T, E, dtype=torch.float64).scatter_add_(1, ids.long(), weights.double())
    expected = torch.einsum("te,teh->th", routing, y)
    assert_close_to_reference(out, expected, torch.float32)


def test_fused_moe_of_no_tokens():
    w13, w2, _ = dense_experts(4, 32, 16, torch.bfloat16)
    out = ops.fused_moe(torch.empty(0, 32, dtype=torch.bfloat16), w13, w2, torch.empty(0, 2),
                        torch.empty(0, 2, dtype=torch.int32))
    assert out.shape == (0, 32) and out.dtype == torch.bfloat16


def test_fused_moe_mxfp4_nan_scale_poisons_only_its_expert():
    torch.manual_seed(6)
    hidden = torch.randn(4, 64)
    w13, w2, extra = mxfp4_experts(4, 64, 64, torch.float32)
    extra["w13_scales"][2, 7, 1] = 0xFF  # E8M0 NaN in one block of expert 2's w13
    ids = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]], dtype=torch.int32)
    out = ops.fused_moe(hidden, w13, w2, torch.rand(4, 2), ids, **extra)
    assert out[[1, 3]].isnan().any(dim=1).all()
    assert not out[[0, 2]].isnan().any()


def test_fused_moe_mxfp4_equals_dense_on_the_decoded_weights():
    # Decoding is exact, so MXFP4 experts and float32 experts holding the decoded values agree
    # to float32 accumulation order.
    torch.manual_seed(7)
    hidden = torch.randn(5, 128)
    w13, w2, extra = mxfp4_experts(4, 128, 64, torch.float32)
    weights, ids = routed(5, 4, 2, "softmax_topk")
    out = ops.fused_moe(hidden, w13, w2, weights, ids, **extra)
    dense = ops.fused_moe(hidden, dequantize_reference(w13, extra["w13_scales"]).float(),
                          dequantize_reference(w2, extra["w2_scales"]).float(), weights, ids)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)


# ---- opcheck ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype):
    torch.manual_seed(8)
    logits = torch.randn(5, 8, dtype=dtype)
    torch.library.opcheck(torch.ops.gnomon.topk_routing.default, (logits, 2, "softmax_topk", True))
    torch.library.opcheck(torch.ops.gnomon.topk_routing.default, (logits, 3, "topk_softmax", False))
    weights, ids = ops.topk_routing(logits, 2)
    hidden = torch.randn(5, 64, dtype=dtype)
    w13, w2, _ = dense_experts(8, 64, 32, dtype)
    torch.library.opcheck(torch.ops.gnomon.fused_moe.default,
                          (hidden, w13, w2, weights, ids, "silu", "concat", None, None, None, None))
    q13, q2, extra = mxfp4_experts(8, 64, 32, dtype, bias=True)
    torch.library.opcheck(torch.ops.gnomon.fused_moe.default,
                          (hidden, q13, q2, weights, ids, "swiglu_oai", "interleaved",
                           extra["w13_bias"], extra["w2_bias"], extra["w13_scales"],
                           extra["w2_scales"]))


# ---- bad input -------------------------------------------------------------------------------------

def _moe_args(mxfp4=False, dtype=torch.float32, T=3, E=4, k=2, H=64, I=32):
    hidden = torch.randn(T, H, dtype=dtype)
    experts = mxfp4_experts if mxfp4 else dense_experts
    w13, w2, extra = experts(E, H, I, dtype, bias=True)
    weights, ids = routed(T, E, k, "softmax_topk")
    return dict(hidden=hidden, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids, **extra)


def _with(mxfp4=False, **changes):
    kwargs = _moe_args(mxfp4)
    kwargs.update(changes)
    return kwargs


def _bad_ids():
    kwargs = _moe_args()
    kwargs["topk_ids"][1, 1] = 4
    return kwargs


@pytest.mark.parametrize("call, match", [
    (lambda: ops.topk_routing(torch.randn(3, 4), 5), r"top_k: expected 1 <= top_k <= min\(num_experts = 4"),
    (lambda: ops.topk_routing(torch.randn(3, 4), 0), "top_k"),
    (lambda: ops.topk_routing(torch.randn(3, 4), 2.0), "top_k: expected an int"),
    (lambda: ops.topk_routing(torch.randn(3, 4), 2, mode="softmax"), "mode: expected one of"),
    (lambda: ops.topk_routing(torch.randn(3, 4), 2, renormalize=1), "renormalize"),
    (lambda: ops.topk_routing(torch.randn(3, 4).double(), 2), "router_logits: expected dtype"),
    (lambda: ops.topk_routing(torch.randn(3, 4, 2), 2), "router_logits: expected a 2-D"),
    (lambda: ops.topk_routing(torch.randn(4, 3).t(), 2), "router_logits: expected a contiguous"),
    (lambda: ops.fused_moe(**_with(), activation="gelu"), "activation: expected one of"),
    (lambda: ops.fused_moe(**_with(), gate_up_layout="split"), "gate_up_layout: expected one of"),
    (lambda: ops.fused_moe(**_bad_ids()), r"topk_ids: entry \[1, 1\] = 4 is outside \[0, 4\)"),
    (lambda: ops.fused_moe(**_with(True, w13_scales=None)), "w13_scales: required"),
    (lambda: ops.fused_moe(**_with(True, w2_scales=None)), "w2_scales: required"),
    (lambda: ops.fused_moe(**_with(w13_scales=torch.zeros(4, 64, 2, dtype=torch.uint8))),
     "w13_scales: only MXFP4"),
    (lambda: ops.fused_moe(**_with(True, hidden=torch.randn(3, 48), w13=torch.zeros(4, 64, 24, dtype=torch.uint8))),
     "H and I divisible by 32"),
    (lambda: ops.fused_moe(**_with(True, w2=torch.zeros(4, 64, 8, dtype=torch.uint8))),
     "H and I divisible by 32"),
    (lambda: ops.fused_moe(**_with(True, w13_scales=torch.zeros(4, 64, 3, dtype=torch.uint8))),
     "w13_scales: expected shape"),
    (lambda: ops.fused_moe(**_with(hidden=torch.randn(3, 64).bfloat16())), "w13: expected dtype"),
    (lambda: ops.fused_moe(**_with(w2=torch.randn(4, 64, 32).bfloat16())), "w2: expected dtype"),
    (lambda: ops.fused_moe(**_with(w13_bias=torch.randn(4, 64).bfloat16())), "w13_bias: expected dtype"),
    (lambda: ops.fused_moe(**_with(w2_bias=torch.randn(4, 32))), "w2_bias: expected shape"),
    (lambda: ops.fused_moe(**_with(w13=torch.randn(4, 62, 64))), "w13: expected shape"),
    (lambda: ops.fused_moe(**_with(w2=torch.randn(4, 63, 32))), "w2: expected shape"),
    (lambda: ops.fused_moe(**_with(topk_weights=torch.rand(3, 2).double())), "topk_weights: expected dtype"),
    (lambda: ops.fused_moe(**_with(topk_ids=torch.zeros(3, 2, dtype=torch.int64))), "topk_ids: expected dtype"),
    (lambda: ops.fused_moe(**_with(topk_ids=torch.zeros(3, 3, dtype=torch.int32))), "topk_ids: expected shape"),
    (lambda: ops.fused_moe(**_with(topk_weights=torch.rand(2, 2))), "topk_weights: expected 3 rows"),
    (lambda: ops.fused_moe(**_with(hidden=torch.randn(64, 3).t())), "hidden: expected a contiguous"),
    (lambda: ops.fused_moe(**_with(w2_bias=torch.randn(4, 64, device="meta"))), "w2_bias: expected a tensor on cpu"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_c_entries_recheck_what_the_wrappers_checked():
    kwargs = _moe_args()
    out = torch.empty_like(kwargs["hidden"])

    def call(**changes):
        a = dict(kwargs, **changes)
        _C.fused_moe(view(out), view(a["hidden"]), view(a["w13"]), view(a["w2"]),
                     view(a["topk_weights"]), view(a["topk_ids"]), "silu", "concat",
                     view(a["w13_bias"]), view(a["w2_bias"]), None, None)

    call()
    with pytest.raises(ValueError, match="topk_ids: entry"):
        call(topk_ids=torch.full((3, 2), -1, dtype=torch.int32))
    with pytest.raises(ValueError, match="w2: expected shape"):
        call(w2=torch.randn(4, 63, 32))
    with pytest.raises(ValueError, match="w13_bias: expected shape"):
        call(w13_bias=torch.randn(4, 32))
    with pytest.raises(ValueError, match="activation"):
        _C.fused_moe(view(out), view(kwargs["hidden"]), view(kwargs["w13"]), view(kwargs["w2"]),
                     view(kwargs["topk_weights"]), view(kwargs["topk_ids"]), "relu", "concat",
                     None, None, None, None)
    with pytest.raises(ValueError, match="top_k"):
        _C.topk_routing(view(torch.empty(3, 5)), view(torch.empty(3, 5, dtype=torch.int32)),
                        view(torch.randn(3, 4)), 5, "softmax_topk", True)


# ---- fuzz ------------------------------------------------------------------------------------------

def _routing_kwargs():
    return dict(router_logits=torch.randn(3, 8), top_k=2, mode="topk_softmax", renormalize=True)


def _dense_moe_kwargs():
    kwargs = _moe_args(T=3, E=4, k=2, H=32, I=32)
    return dict(kwargs, activation="swiglu_oai", gate_up_layout="interleaved")


def _mxfp4_moe_kwargs():
    return dict(_moe_args(mxfp4=True, T=3, E=4, k=2, H=32, I=32), activation="silu",
                gate_up_layout="concat")


test_topk_routing_malformed_calls = malformed_calls(ops.topk_routing, _routing_kwargs)
test_fused_moe_dense_malformed_calls = malformed_calls(ops.fused_moe, _dense_moe_kwargs,
                                                       index_args=("topk_ids",))
test_fused_moe_mxfp4_malformed_calls = malformed_calls(ops.fused_moe, _mxfp4_moe_kwargs,
                                                       index_args=("topk_ids",))


def test_nan_logit_is_selected_like_torch_topk_and_poisons_only_its_token():
    logits = torch.tensor([[1.0, float("nan"), 3.0, 2.0], [0.5, 4.0, -1.0, 2.0]])
    weights, ids = ops.topk_routing(logits, 2, mode="topk_softmax")
    assert ids.tolist() == torch.topk(logits, 2).indices.tolist()
    assert weights[0].isnan().all() and not weights[1].isnan().any()
