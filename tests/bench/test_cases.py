"""Cases: FLOPs and bytes from hand-computed shapes, and key / definition-hash stability."""

import dataclasses
import subprocess
import sys

import pytest

from gnomon.bench import cases as cases_mod
from gnomon.bench.cases import Case, touched_experts

BF16 = {"act": "bfloat16"}


def attention(**overrides):
    params = dict(batch=2, context=3, q_len=2, heads=4, kv_heads=2, head_dim=8, block_size=4,
                  window=0, sinks=0)
    params.update(overrides)
    return Case.make("attention", "paged_attention", "", params, BF16)


def test_paged_attention_counts():
    case = attention()
    # Per sequence and head: query 0 sees 4 keys, query 1 sees 5: 9 pairs, each 4 * D + 3.
    assert case.flops == 2 * 4 * 9 * (4 * 8 + 3)
    kv = 2 * 5 * (2 * 2 * 8) * 2  # 2 sequences x 5 keys x (K and V, 2 heads, D 8) x bf16
    q_and_out = 2 * (4 * 4 * 8) * 2
    metadata = 4 * (2 * 2 + 2 + 3)  # block tables (2 blocks a sequence), seq_lens, starts
    assert case.bytes == kv + q_and_out + metadata


def test_paged_attention_window_limits_pairs_and_reads():
    case = attention(batch=1, context=10, q_len=3, window=4, sinks=1)
    assert case.flops == 1 * 4 * (4 + 4 + 4) * (4 * 8 + 3)
    kv = 1 * 6 * (2 * 2 * 8) * 2  # a 4-key window slid over 3 queries reads 6 keys
    assert case.bytes == kv + 2 * (3 * 4 * 8) * 2 + 4 * (4 + 1 + 2) + 4 * 4


def test_mxfp4_weights_count_4_25_bits():
    gemm = Case.make("mxfp4", "mxfp4_gemm", "", dict(m=2, n=64, k=64, bias=0), BF16)
    assert gemm.flops == 2 * 2 * 64 * 64
    assert gemm.bytes == 2 * 64 * 2 + 64 * 64 * 17 // 32 + 2 * 64 * 2
    assert 64 * 64 * 17 // 32 == 64 * 64 * cases_mod.MXFP4_BITS_PER_WEIGHT / 8
    # The count matches what the layout really holds: codes plus E8M0 scales.
    _, (a, w, scales, bias) = gemm.build("cpu")
    assert w.numel() + scales.numel() == 64 * 64 * 17 // 32
    dequantize = Case.make("mxfp4", "mxfp4_dequantize", "", dict(rows=2, cols=64), BF16)
    assert dequantize.bytes == 2 * 64 * 2 + 2 * 64 * 17 // 32
    assert dequantize.flops == 2 * 64


def moe(weights, tokens=1, experts=8, top_k=2, bias=0):
    return Case.make("moe", "fused_moe", weights, dict(
        tokens=tokens, experts=experts, top_k=top_k, hidden=32, intermediate=64,
        activation="silu", layout="concat", routing="softmax_topk", bias=bias,
        routing_seed=0), {"act": "bfloat16", "weights": weights})


def test_moe_counts_only_the_touched_experts():
    # One token with top 2 of 8 experts touches exactly 2 of them.
    dense, mxfp4 = moe("bfloat16"), moe("mxfp4")
    assert touched_experts(dense.p) == 2
    assert dense.flops == mxfp4.flops == 6 * 1 * 2 * 32 * 64
    activations = 2 * 1 * 32 * 2 + 1 * 2 * (4 + 4)
    assert dense.bytes == 2 * (3 * 32 * 64 * 2) + activations
    assert mxfp4.bytes == 2 * (3 * 32 * 64 * 17 // 32) + activations
    with_bias = moe("mxfp4", bias=1)
    assert with_bias.bytes == mxfp4.bytes + 2 * (2 * 64 + 32) * 2


def test_moe_touched_experts_follow_the_built_routing():
    case = moe("mxfp4", tokens=3, experts=16, top_k=2)
    _, args = case.build("cpu")
    ids = args[4]
    assert touched_experts(case.p) == ids.unique().numel() <= 6
    assert case.bytes < moe("mxfp4", tokens=64, experts=16, top_k=2).bytes


def test_norm_and_rotary_counts():
    norm = Case.make("norm", "rms_norm", "", dict(tokens=3, hidden=8, residual=1, eps=1e-6),
                     BF16)
    assert norm.flops == 3 * 8 * 5 + 3
    assert norm.bytes == (2 * 3 * 8 + 8 + 2 * 3 * 8) * 2
    rotary = Case.make("norm", "rotary_embedding", "", dict(
        tokens=2, heads=4, kv_heads=2, head_dim=16, rotary_dim=8, max_position=32,
        theta=10000, is_neox=1), BF16)
    assert rotary.flops == 2 * 6 * 4 * 6  # tokens x heads x pairs x 6
    assert rotary.bytes == 2 * 2 * 6 * 8 * 2 + 8 * 2 + 4 * 2 * 8


def test_reshape_and_cache_moves_bytes_only():
    case = Case.make("attention", "reshape_and_cache", "", dict(
        tokens=5, kv_heads=2, head_dim=8, block_size=4, cache_blocks=2), BF16)
    assert case.flops == 0
    assert case.bytes == 2 * 2 * (5 * 2 * 8 * 2) + 8 * 5


def test_same_definition_same_key_and_hash_in_any_param_order():
    a = Case.make("s", "rms_norm", "", dict(tokens=4, hidden=8, residual=0, eps=1e-6), BF16)
    b = Case.make("s", "rms_norm", "", dict(eps=1e-6, residual=0, hidden=8, tokens=4), BF16)
    assert a == b and a.key == b.key and a.definition_hash == b.definition_hash
    assert a.key == "s/rms_norm[eps=1e-06,hidden=8,residual=0,tokens=4,act:bfloat16]"
    assert len(a.definition_hash) == 16 and int(a.definition_hash, 16) >= 0


def test_hash_is_stable_across_processes():
    code = ("from gnomon.bench.cases import Case; print(Case.make('s', 'rms_norm', '', "
            "dict(tokens=4, hidden=8, residual=0, eps=1e-6), {'act': 'bfloat16'})"
            ".definition_hash)")
    here = Case.make("s", "rms_norm", "", dict(tokens=4, hidden=8, residual=0, eps=1e-6), BF16)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == here.definition_hash


def test_changed_shape_dtype_or_version_changes_the_hash(monkeypatch):
    base = attention()
    assert attention(context=4).definition_hash != base.definition_hash
    assert attention(context=4).key != base.key
    other_dtype = Case.make("attention", "paged_attention", "", base.p, {"act": "float32"})
    assert other_dtype.definition_hash != base.definition_hash
    spec = cases_mod.OPS["paged_attention"]
    before = base.definition_hash
    monkeypatch.setitem(cases_mod.OPS, "paged_attention",
                        dataclasses.replace(spec, version=spec.version + 1))
    assert base.definition_hash != before
    assert base.key == attention().key  # the key names the shape; the hash the definition


def test_bad_definitions_are_refused():
    with pytest.raises(ValueError, match="unknown op 'matmul'"):
        Case.make("s", "matmul", "", {}, BF16)
    with pytest.raises(TypeError, match="param 'sinks'"):
        attention(sinks=True)
