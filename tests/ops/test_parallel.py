"""The kernels' thread pool: its workers poll for a while after a job before they block, so a
job that follows at once must find them, whatever thread count each call asks for."""

import torch

import gnomon.ops as ops


def test_back_to_back_calls_as_the_thread_count_changes():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 64, generator=g)
    w13, w2 = torch.randn(4, 128, 64, generator=g), torch.randn(4, 64, 64, generator=g)
    weights, ids = ops.topk_routing(torch.randn(3, 4, generator=g), 2)
    try:
        ops.set_num_threads(1)
        expected = ops.fused_moe(hidden, w13, w2, weights, ids)
        for call in range(400):  # a job handed out while helpers poll, block, or sit one out
            ops.set_num_threads(call % 4 + 1)
            torch.testing.assert_close(ops.fused_moe(hidden, w13, w2, weights, ids), expected,
                                       rtol=1e-5, atol=1e-5, msg=lambda m: f"call {call}: {m}")
    finally:
        ops.set_num_threads(None)
