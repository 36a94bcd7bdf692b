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
  - gpt-oss-20b experts at T = 256 tokens (a prefill chunk): gnomon with MXFP4 experts against
    the torch loop on the bf16 experts (goal >= 2x, issue 17), also timed back to back, call by
    call (`test_gpt_oss_20b_t256_paired`).
  - Mixtral-style: 8 experts, top 2, SwiGLU, concat gate/up, no biases, with H = 1024 and
    I = 3584 (scaled down from 4096 / 14336 for this CPU), dense bf16, T = 1 and T = 4.
  - A decode shape sweep: gpt-oss-style MXFP4 experts, 32 experts, top 4, hidden =
    intermediate size in {512, 1024, 2048, 4096}, T = 1 and T = 4; gnomon against the torch
    loop on the bf16 experts (goal >= 2x at every size, issue 17). The experts are two random
    ones repeated, each in its own memory (`MoEBlock.replicated`), and when timing, as many
    layers of them as make the MXFP4 weights at least ROTATION_BYTES, one layer per call, so
    that even the smallest size streams its weights from memory.

The summary prints gnomon's speed as a multiple of the torch loop's per case (`speedup`).

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
from gnomon.formats import MXFP4_BLOCK
from conftest import paired_speedup, record, speedup

ROUTINGS = 8
ROTATION_BYTES = 256 << 20  # a sweep case's MXFP4 expert layers together: well above an LLC


class MoEBlock:
    """One MoE layer's experts in the formats a case compares, plus its routings. With
    `layers` > 1 the expert tensors hold that many layers' experts ([layers * E, ...]) and each
    call uses the next layer's, so the weights stream from memory as in a decode step through
    a model's layers."""

    def __init__(self, E, k, H, I, style, mxfp4, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.E, self.k, self.H, self.I, self.style = E, k, H, I, style
        self.layers = 1
        if mxfp4:
            # Random codes (all 16 occur) with scales 2^-8 .. 2^-6: outputs of order one.
            self.w13_q = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.uint8)
            self.w13_scales = torch.randint(119, 122, (E, 2 * I, H // MXFP4_BLOCK), generator=g,
                                            dtype=torch.uint8)
            self.w2_q = torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8)
            self.w2_scales = torch.randint(119, 122, (E, H, I // MXFP4_BLOCK), generator=g,
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

    @classmethod
    def replicated(cls, E, k, H, I, style, distinct=2, layers=1, own_memory=True, seed=0):
        """`layers` layers of E MXFP4 experts made of `distinct` random experts repeated
        (expert e is random expert e % distinct), with their bf16 dequantisations as a list
        (indexed like the tensor). Random codes and the dequantisation cost per random expert,
        not per expert, so a shape sweep sets up quickly; a call's time does not depend on the
        codes' values, and the same-block check still sees different experts. The MXFP4
        experts each have their own memory; the bf16 ones too with `own_memory` (for timing:
        otherwise the baseline would read `distinct` experts from cache), else they are the
        random experts themselves (enough to check, and no gigabytes of copies). The bf16
        experts serve the torch loop only: such a block has no gnomon-bf16 form."""
        base = cls(distinct, k, H, I, style, mxfp4=True, seed=seed)
        index = torch.arange(layers * E) % distinct
        for name in ("w13_q", "w13_scales", "w2_q", "w2_scales"):
            setattr(base, name, getattr(base, name)[index])  # a copy: distinct memory
        for name in ("w13", "w2"):
            experts = getattr(base, name)
            setattr(base, name, [experts[i].clone() if own_memory else experts[i]
                                 for i in index.tolist()])
        base.bias = {name: b[index[:E]] for name, b in base.bias.items()}
        base.E, base.layers = E, layers
        return base

    def _layer_views(self, names):
        """Per layer, the named expert tensors' views of that layer's E experts."""
        E = self.E
        return [{n: getattr(self, n)[layer * E:(layer + 1) * E] for n in names}
                for layer in range(self.layers)]

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
            names = dict(w13="w13_q", w2="w2_q", w13_scales="w13_scales", w2_scales="w2_scales")
        else:
            names = dict(w13="w13", w2="w2")
        layers = itertools.cycle([{arg: views[name] for arg, name in names.items()}
                                  for views in self._layer_views(names.values())])
        routings = itertools.cycle(self.routings)

        def call():
            topk_weights, topk_ids = next(routings)
            return ops.fused_moe(self.hidden, topk_weights=topk_weights, topk_ids=topk_ids,
                                 activation=self.activation, gate_up_layout=self.layout,
                                 **next(layers), **self.bias)
        return call

    def torch_loop(self):
        routings = itertools.cycle(self.routings)
        layers = itertools.cycle(self._layer_views(("w13", "w2")))
        w13_bias, w2_bias = self.bias.get("w13_bias"), self.bias.get("w2_bias")

        def call():
            topk_weights, topk_ids = next(routings)
            layer = next(layers)
            w13, w2 = layer["w13"], layer["w2"]
            x = self.hidden
            out = torch.zeros(x.shape, dtype=torch.float32)
            for e in topk_ids.unique().tolist():
                token, slot = (topk_ids == e).nonzero(as_tuple=True)
                gate_up = x[token] @ w13[e].T
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
                y = act @ w2[e].T
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


def check_same_block(block, implementations):
    """The implementations compute the same block as gnomon with MXFP4 experts (bf16 rounding
    apart)."""
    expected = block.gnomon(mxfp4=True)().float()
    for other in implementations:
        torch.testing.assert_close(other().float(), expected, rtol=0.05,
                                   atol=0.05 * expected.abs().max().item())


@pytest.fixture(scope="module")
def gpt_oss_experts():
    return MoEBlock(**GPT_OSS, mxfp4=True)


@pytest.fixture(scope="module")
def mixtral_experts():
    return MoEBlock(**MIXTRAL, mxfp4=False)


@pytest.fixture(scope="module", params=[1, 4], ids=lambda t: f"T={t}")
def gpt_oss_block(request, gpt_oss_experts):
    block = gpt_oss_experts.batch(request.param)
    check_same_block(block, [block.gnomon(mxfp4=False), block.torch_loop()])
    return block


@pytest.fixture(scope="module")
def gpt_oss_t256_block(gpt_oss_experts):
    block = gpt_oss_experts.batch(256)
    check_same_block(block, [block.torch_loop()])
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


@pytest.mark.parametrize("implementation", ["gnomon mxfp4", "torch bf16 loop"])
def test_gpt_oss_20b_t256(benchmark, memory_bandwidth, gpt_oss_t256_block, implementation):
    block = gpt_oss_t256_block
    suite = "fused_moe gpt-oss-20b T=256"
    if implementation == "torch bf16 loop":
        call, mxfp4, rounds = block.torch_loop(), False, 10
    else:
        call, mxfp4, rounds = block.gnomon(True), True, 20
    run(benchmark, memory_bandwidth, block, suite, implementation, call,
        block.weight_bytes(mxfp4), rounds)
    speedup(suite, "gnomon mxfp4", "torch bf16 loop", goal=2)


def test_gpt_oss_20b_t256_paired(benchmarks_enabled, gpt_oss_t256_block):
    """The T=256 goal timed back to back (conftest.paired_speedup)."""
    block = gpt_oss_t256_block
    paired_speedup("fused_moe gpt-oss-20b T=256", "gnomon mxfp4", block.gnomon(True),
                   "torch bf16 loop", block.torch_loop(), pairs=12 if benchmarks_enabled else 1,
                   goal=2)


SWEEP_SIZES = [512, 1024, 2048, 4096]  # hidden = intermediate
SWEEP = dict(E=32, k=4, style="gpt-oss")


@pytest.fixture(scope="module", params=SWEEP_SIZES, ids=lambda h: f"H=I={h}")
def sweep_experts(request, benchmarks_enabled):
    size = request.param
    layer_bytes = SWEEP["E"] * 3 * size * size * (0.5 + 1 / 32)
    layers = max(1, -(-ROTATION_BYTES // int(layer_bytes))) if benchmarks_enabled else 1
    return MoEBlock.replicated(**SWEEP, H=size, I=size, layers=layers,
                               own_memory=benchmarks_enabled)


@pytest.fixture(scope="module", params=[1, 4], ids=lambda t: f"T={t}")
def sweep_block(request, sweep_experts):
    block = sweep_experts.batch(request.param)
    check_same_block(block, [block.torch_loop()])
    return block


@pytest.mark.parametrize("implementation", ["gnomon mxfp4", "torch bf16 loop"])
def test_mxfp4_decode_sweep(benchmark, memory_bandwidth, sweep_block, implementation):
    block = sweep_block
    suite = (f"fused_moe mxfp4 decode sweep E={block.E} top-{block.k} H=I={block.H} "
             f"T={block.hidden.shape[0]}")
    mxfp4 = implementation == "gnomon mxfp4"
    call = block.gnomon(True) if mxfp4 else block.torch_loop()
    run(benchmark, memory_bandwidth, block, suite, implementation, call,
        block.weight_bytes(mxfp4), 40)
    if benchmark.stats is not None:
        benchmark.extra_info.update(layers=block.layers)
    speedup(suite, "gnomon mxfp4", "torch bf16 loop", goal=2)
