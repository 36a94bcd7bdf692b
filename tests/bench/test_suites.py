"""Suites cover every op in gnomon.ops at model shapes, with the CPU scaling stated."""

import pytest
import torch

import gnomon.ops
from gnomon.bench import suites

NOT_OPS = {"num_threads", "set_num_threads"}
COLLECTIVES = {"all_reduce", "all_gather"}  # the engine's, over torch.distributed


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("quick", [False, True])
def test_every_op_is_covered(target, quick):
    ops = {case.op for case in suites.cases(suites.SUITES, target, quick=quick)}
    assert ops == set(gnomon.ops.__all__) - NOT_OPS | COLLECTIVES


def test_suites_hold_the_ops_the_issue_names():
    by_suite = {name: {c.op for c in suites.cases([name], "cpu")} for name in suites.SUITES}
    assert by_suite == {
        "attention": {"paged_attention", "reshape_and_cache"},
        "moe": {"topk_routing", "fused_moe"},
        "mxfp4": {"mxfp4_quantize", "mxfp4_dequantize", "mxfp4_gemm"},
        "norm": {"rms_norm", "rotary_embedding"},
        "comm": COLLECTIVES,
    }
    variants = {c.name for c in suites.cases(["attention", "moe"], "cpu")}
    assert {"paged_attention.decode", "paged_attention.prefill", "fused_moe.dense",
            "fused_moe.mxfp4"} <= variants


def test_gpu_shapes_are_the_models_and_scaling_is_stated_elsewhere():
    gpu = suites.cases(suites.SUITES, "cuda")
    assert all("scaling" not in c.p for c in gpu)
    decode = next(c for c in gpu if c.name == "paged_attention.decode")
    assert (decode.p["heads"], decode.p["kv_heads"], decode.p["head_dim"]) == (32, 8, 128)
    gpt_oss = [c for c in gpu if c.p.get("model") == "gpt-oss-120b" and c.op == "fused_moe"]
    assert [(c.p["experts"], c.p["top_k"], c.p["hidden"], c.p["intermediate"])
            for c in gpt_oss] == [(128, 4, 2880, 2880)]
    cpu = {c.key: c for c in suites.cases(suites.SUITES, "cpu")}
    scaled = [c for c in cpu.values() if "scaling" in c.p]
    assert scaled and all(c.p["scaling"].startswith("cpu: ") for c in scaled)
    dense = next(c for c in cpu.values() if c.name == "fused_moe.dense")
    assert dense.p["scaling"] == "cpu: hidden 4096->2048, intermediate 14336->1792, tokens 16->4"
    quick = suites.cases(suites.SUITES, "cpu", quick=True)
    # the comm suite runs fewer of the models' own message sizes, never scaled ones
    assert all(c.p["scaling"].startswith("quick: ") for c in quick if c.suite != "comm")
    assert all("scaling" not in c.p for c in quick if c.suite == "comm")


def test_keys_are_unique_and_stable_between_calls():
    first = [(c.key, c.definition_hash) for c in suites.cases(suites.SUITES, "cpu", True)]
    again = [(c.key, c.definition_hash) for c in suites.cases(suites.SUITES, "cpu", True)]
    assert first == again
    assert len({k for k, _ in first}) == len(first)


def test_parse_suites():
    assert suites.parse_suites(None) == list(suites.SUITES)
    assert suites.parse_suites("norm, moe,norm") == ["norm", "moe"]
    with pytest.raises(ValueError, match=r"unknown suite 'gemm'; known: attention, moe, mxfp4"):
        suites.parse_suites("norm,gemm")
    with pytest.raises(ValueError, match="unknown suite"):
        suites.parse_suites(",")


def test_every_quick_case_builds_and_runs_on_the_cpu():
    # a collective needs its peers: tests/bench/test_comm.py runs those in a group
    local = [name for name in suites.SUITES if name != "comm"]
    for case in suites.cases(local, "cpu", quick=True):
        fn, args = case.build("cpu")
        with torch.inference_mode():
            out = fn(*args)
        first = out[0] if isinstance(out, tuple) else out
        if first is not None:
            assert torch.isfinite(first.float()).all() or case.op == "mxfp4_dequantize", case.key
