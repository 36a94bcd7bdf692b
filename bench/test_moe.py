"""fused_moe decode against a per-expert loop of torch bf16 matmuls, in the same run.

The baseline is what a plain PyTorch MoE block does: for each active expert, gather its tokens,
``x @ w13_e.T``, split gate/up, activation, ``@ w2_e.T``, and ``index_add_`` the routing-weighted
result. It runs on bf16 weights; for the MXFP4 cases those are the MXFP4 experts dequantised
once up front (exactly: every E2M1 value times a power-of-two scale is a bf16).

Cases (each a suite; the summary line prints the ratios):
  - gpt-oss-20b experts: 32 experts, top 4, H = I = 2880, gpt-oss routing/activation/layout and
    biases; decode with T = 1 and T = 4 tokens. gnomon with MXFP4 experts, gnomon with the bf16
    experts (the same bytes as the baseline, so any gain there comes from grouping and the
    kernel), and the torch loop on the bf16 experts.
  - Mixtral-style: 8 experts, top 2, SwiGLU, concat gate/up, no biases, with H = 1024 and
    I = 3584 (scaled down from 4096 / 14336 for this CPU), dense bf16, T = 1 and T = 4.

Each call routes the tokens by the next of 8 fixed routings (the same sequence for every
implementation), so calls do not keep re-reading the same few experts from cache.

extra_info per benchmark: the expert weight bytes it reads per call (averaged over the routings;
each active expert's weights once, scales included) and those bytes per second as a fraction of
this machine's copy bandwidth (the session's `memory_bandwidth`).
"""

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

import gnomon.ops as ops
from conftest import record

ROUTINGS = 8


class MoEBlock:
    """One MoE layer's experts in the formats a case compares, plus its routings."""

    def __init__(self, E, k, H, I, style, mxfp4, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.E, self.k, self.H, self.I, self.style = E, k, H, I, style
        if mxfp4:
            # Random codes (all 16 occur) with scales 2^-8 .. 2^-6: outputs of order one.
            self.w13_q = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.uint8)
            self.w13_scales = torch.randint(119, 122, (E, 2 * I, H // 32), generator=g,
                                            dtype=torch.uint8)
            self.w2_q = torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8)
            self.w2_scales = torch.randint(119, 122, (E, H, I // 32), generator=g,
                                           dtype=torch.uint8)
            self.w13 = dequantize_bf16(self.w13_q, self.w13_scales)
            self.w2 = dequantize_bf16(self.w2_q, self.w2_scales)
        else:
            self.w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).bfloat16()
            self.w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).bfloat16()
        gpt_oss = style == "gpt-oss"
        self.bias = {}
        if gpt_oss:
            self.bias = dict(w13_bias=(torch.randn(E, 2 * I, generator=g) * 0.1).bfloat16(),
                             w2_bias=(torch.randn(E, H, generator=g) * 0.1).bfloat16())
        self.activation = "swiglu_oai" if gpt_oss else "silu"
        self.layout = "interleaved" if gpt_oss else "concat"
        self.mode = "topk_softmax" if gpt_oss else "softmax_topk"

    def batch(self, tokens, seed=1):
        """These experts with the hidden states of `tokens` tokens and their routings."""
        g = torch.Generator().manual_seed(seed)
        self = copy.copy(self)
        self.hidden = torch.randn(tokens, self.H, generator=g).bfloat16()
        self.routings = [ops.topk_routing(torch.randn(tokens, self.E, generator=g), self.k,
                                          mode=self.mode)
                         for _ in range(ROUTINGS)]
        self.active_experts = sum(len(ids.unique()) for _, ids in self.routings) / ROUTINGS
        return self

    def gnomon(self, mxfp4):
        """A call of fused_moe per invocation, cycling through the routings."""
        if mxfp4:
            weights = dict(w13=self.w13_q, w2=self.w2_q, w13_scales=self.w13_scales,
                           w2_scales=self.w2_scales)
        else:
            weights = dict(w13=self.w13, w2=self.w2)
        routings = itertools.cycle(self.routings)

        def call():
            topk_weights, topk_ids = next(routings)
            return ops.fused_moe(self.hidden, topk_weights=topk_weights, topk_ids=topk_ids,
                                 activation=self.activation, gate_up_layout=self.layout,
                                 **weights, **self.bias)
        return call

    def torch_loop(self):
        routings = itertools.cycle(self.routings)
        w13_bias, w2_bias = self.bias.get("w13_bias"), self.bias.get("w2_bias")

        def call():
            topk_weights, topk_ids = next(routings)
            x = self.hidden
            out = torch.zeros(x.shape, dtype=torch.float32)
            for e in topk_ids.unique().tolist():
                token, slot = (topk_ids == e).nonzero(as_tuple=True)
                gate_up = x[token] @ self.w13[e].T
                if w13_bias is not None:
                    gate_up = gate_up + w13_bias[e]
                if self.layout == "interleaved":
                    gate, up = gate_up[:, 0::2], gate_up[:, 1::2]
                else:
                    gate, up = gate_up.chunk(2, dim=-1)
                if self.activation == "silu":
                    act = F.silu(gate) * up
                else:
                    gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
                    act = (up + 1) * gate * torch.sigmoid(1.702 * gate)
                y = act @ self.w2[e].T
                if w2_bias is not None:
                    y = y + w2_bias[e]
                out.index_add_(0, token, y.float() * topk_weights[token, slot, None])
            return out.to(x.dtype)
        return call

    def weight_bytes(self, mxfp4):
        """Expert weight bytes one call reads: each active expert's w13 and w2 once."""
        elements = 3 * self.H * self.I
        per_expert = elements * (0.5 + 1 / 32) if mxfp4 else elements * 2
        if self.bias:
            per_expert += (2 * self.I + self.H) * 2
        return self.active_experts * per_expert


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequantize_bf16(packed, scales):
    """MXFP4 -> bf16, one expert at a time. A 256-entry table maps each byte to its two bf16
    values (low nibble first) as one 32-bit word, then each 32-block is scaled by 2^(s - 127)."""
    bits = torch.tensor(E2M1, dtype=torch.bfloat16).view(torch.int16).int() & 0xFFFF
    byte = torch.arange(256)
    pairs = (bits[byte & 15] | (bits[byte >> 4] << 16)).int().view(torch.float32)[:, None]
    E, N, half_k = packed.shape
    out = torch.empty(E, N, 2 * half_k, dtype=torch.bfloat16)
    for e in range(E):
        values = F.embedding(packed[e].int(), pairs).view(torch.bfloat16).view(N, -1, 32)
        scale = torch.pow(2.0, scales[e].float() - 127).bfloat16()
        out[e] = (values * scale[..., None]).view(N, 2 * half_k)
    return out


GPT_OSS = dict(E=32, k=4, H=2880, I=2880, style="gpt-oss")
MIXTRAL = dict(E=8, k=2, H=1024, I=3584, style="mixtral")


@pytest.fixture(scope="module")
def gpt_oss_experts():
    return MoEBlock(**GPT_OSS, mxfp4=True)


@pytest.fixture(scope="module")
def mixtral_experts():
    return MoEBlock(**MIXTRAL, mxfp4=False)


@pytest.fixture(scope="module", params=[1, 4], ids=lambda t: f"T={t}")
def gpt_oss_block(request, gpt_oss_experts):
    block = gpt_oss_experts.batch(request.param)
    # The three implementations compute the same block (bf16 rounding apart).
    expected = block.gnomon(mxfp4=True)().float()
    for other in (block.gnomon(mxfp4=False)(), block.torch_loop()()):
        torch.testing.assert_close(other.float(), expected, rtol=0.05,
                                   atol=0.05 * expected.abs().max().item())
    return block


@pytest.fixture(scope="module", params=[1, 4], ids=lambda t: f"T={t}")
def mixtral_block(request, mixtral_experts):
    block = mixtral_experts.batch(request.param)
    expected = block.gnomon(mxfp4=False)().float()
    torch.testing.assert_close(block.torch_loop()().float(), expected, rtol=0.05,
                               atol=0.05 * expected.abs().max().item())
    return block


def run(benchmark, memory_bandwidth, block, suite, implementation, call, weight_bytes, rounds):
    benchmark.group = suite
    benchmark.pedantic(call, rounds=rounds, warmup_rounds=2)
    record(suite, implementation, benchmark)
    if benchmark.stats is not None:
        seconds = benchmark.stats.stats.median
        benchmark.extra_info.update(
            experts=block.E, top_k=block.k, hidden=block.H, intermediate=block.I,
            tokens=block.hidden.shape[0], active_experts_per_call=block.active_experts,
            weight_bytes_per_call=weight_bytes, weight_bytes_per_s=weight_bytes / seconds,
            fraction_of_memory_bandwidth=weight_bytes / seconds / memory_bandwidth,
            memory_bandwidth=memory_bandwidth)


@pytest.mark.parametrize("implementation", ["gnomon mxfp4", "gnomon bf16", "torch bf16 loop"])
def test_gpt_oss_20b_decode(benchmark, memory_bandwidth, gpt_oss_block, implementation):
    block = gpt_oss_block
    suite = f"fused_moe gpt-oss-20b decode T={block.hidden.shape[0]}"
    if implementation == "torch bf16 loop":
        call, mxfp4, rounds = block.torch_loop(), False, 15
    else:
        mxfp4 = implementation == "gnomon mxfp4"
        call, rounds = block.gnomon(mxfp4), 40
    run(benchmark, memory_bandwidth, block, suite, implementation, call,
        block.weight_bytes(mxfp4), rounds)


@pytest.mark.parametrize("implementation", ["gnomon bf16", "torch bf16 loop"])
def test_mixtral_style_decode(benchmark, memory_bandwidth, mixtral_block, implementation):
    block = mixtral_block
    suite = f"fused_moe mixtral-style (H=1024, I=3584) decode T={block.hidden.shape[0]}"
    call = block.torch_loop() if implementation == "torch bf16 loop" else block.gnomon(False)
    run(benchmark, memory_bandwidth, block, suite, implementation, call,
        block.weight_bytes(False), 40)
