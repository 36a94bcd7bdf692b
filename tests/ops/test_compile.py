"""A module that calls every op traces under torch.compile(fullgraph=True) and matches eager."""

import pytest
import torch

import gnomon.ops as ops

T, HQ, HKV, D, BLOCK, H, I, E = 5, 4, 2, 32, 4, 64, 64, 4


class TinyBlock(torch.nn.Module):
    """Attention (norm, rope, cache write, paged attention) then an MoE and an MXFP4 projection."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        rand = lambda *s: torch.randn(*s, generator=g) * 0.1  # noqa: E731
        self.norm1, self.norm2 = torch.ones(H), torch.ones(H)
        self.wqkv, self.wo = rand((HQ + 2 * HKV) * D, H), rand(H, HQ * D)
        angles = torch.arange(64)[:, None] * (1e-2 * torch.arange(1, D // 2 + 1))[None, :]
        self.cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).float()
        self.router = rand(E, H)
        self.w13, self.w2 = rand(E, 2 * I, H), rand(E, H, I)
        self.w_packed, self.w_scales = ops.mxfp4_quantize(rand(H, H))

    def forward(self, hidden, positions, key_cache, value_cache, slot_mapping, block_tables,
                seq_lens, query_start_loc):
        residual = hidden.clone()
        x = ops.rms_norm(hidden, self.norm1, 1e-6)
        q, k, v = (x @ self.wqkv.T).split([HQ * D, HKV * D, HKV * D], dim=-1)
        q, k, v = (t.reshape(T, -1, D).contiguous() for t in (q, k, v))
        ops.rotary_embedding(positions, q, k, self.cos_sin)
        ops.reshape_and_cache(k, v, key_cache, value_cache, slot_mapping)
        attn = ops.paged_attention(q, key_cache, value_cache, block_tables, seq_lens,
                                   query_start_loc)
        h = ops.rms_norm(attn.reshape(T, HQ * D) @ self.wo.T, self.norm2, 1e-6, residual=residual)
        weights, ids = ops.topk_routing(h @ self.router.T, 2)
        h = ops.fused_moe(h, self.w13, self.w2, weights, ids)
        return ops.mxfp4_gemm(h, self.w_packed, self.w_scales), residual


def inputs():
    # Two sequences: one with 3 cached tokens and 2 new, one fresh prompt of 3 tokens.
    key_cache = torch.zeros(6, BLOCK, HKV, D)
    value_cache = torch.zeros(6, BLOCK, HKV, D)
    key_cache[0, :3], value_cache[0, :3] = torch.randn(3, HKV, D), torch.randn(3, HKV, D)
    return dict(hidden=torch.randn(T, H), positions=torch.tensor([3, 4, 0, 1, 2]),
                key_cache=key_cache, value_cache=value_cache,
                slot_mapping=torch.tensor([3, 4, 8, 9, 10]),
                block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                seq_lens=torch.tensor([5, 3], dtype=torch.int32),
                query_start_loc=torch.tensor([0, 2, 5], dtype=torch.int32))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_module_calling_every_op_compiles_fullgraph(backend):
    torch._dynamo.reset()
    block = TinyBlock()
    eager_inputs, compiled_inputs = inputs(), inputs()
    for name in ("key_cache", "value_cache", "hidden"):
        compiled_inputs[name] = eager_inputs[name].clone()
    expected = block(**eager_inputs)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    actual = compiled(**compiled_inputs)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    # The in-place cache writes happened in the compiled run too.
    torch.testing.assert_close(compiled_inputs["key_cache"], eager_inputs["key_cache"])
