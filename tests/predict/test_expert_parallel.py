"""Expert parallelism in the simulator: the experts split over ``ep`` of the ``tp`` GPUs, each
GPU's MoE work counted by hand, the same all-reduce as tensor parallelism, and the layouts an
engine would refuse refused by name."""

import pytest

from gnomon.engine.config import ModelConfig
from gnomon.engine.parallel import check_ep
from gnomon.predict.opcount import step_ops
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.simulate import simulate
from gnomon.predict.spec import SimulationSpec
from gnomon.predict.workloads import parse_length


def _ops(model, requests, tp, ep):
    spec = ModelSpec.from_model(model)
    return {op.name: op for op in step_ops(StepShape.of(spec, requests, tp=tp, ep=ep))}


def test_each_gpu_computes_its_share_of_the_token_expert_pairs_on_whole_experts():
    # tiny-mixtral: 2 layers, hidden 64, 4 experts of 128, top-2; 6 tokens at tp 2
    T, H, I, E, k, L, a = 6, 64, 128, 4, 2, 2, 4
    tp_only, ep2 = _ops("tiny-mixtral", [(T, 0)], 2, 1), _ops("tiny-mixtral", [(T, 0)], 2, 2)
    distinct = E * (1 - (1 - k / E) ** T)
    # ep 2: 2 whole experts per GPU (intermediate 128), half of the 12 token-expert pairs
    w13 = ep2["fused_moe[w13]"]
    assert w13.flops == pytest.approx(L * 2 * (T * k / 2) * 2 * I * H)
    assert w13.bytes == pytest.approx(L * (2 * (distinct / 2) * H * I * a + T * H * a
                                           + (T * k / 2) * 2 * I * a))
    # tp 2 without ep: every expert, half its width: the same FLOPs and weight bytes per GPU
    assert tp_only["fused_moe[w13]"].flops == pytest.approx(w13.flops)
    assert tp_only["fused_moe[w2]"].bytes == pytest.approx(ep2["fused_moe[w2]"].bytes)
    # the tokens are on every GPU already: the experts' outputs take the same all-reduce
    assert ep2["all_reduce"] == tp_only["all_reduce"]
    assert {n: op for n, op in ep2.items() if not n.startswith("fused_moe")} == \
        {n: op for n, op in tp_only.items() if not n.startswith("fused_moe")}


def test_a_step_with_experts_split_is_priced_and_its_limit_stated():
    kw = dict(model="qwen3-235b-a22b", hardware="H100 SXM", tp=4, weight_dtype="fp8",
              engine="trtllm", num_requests=8, concurrency=4,
              input_len=parse_length("256", "i"), output_len=parse_length("16", "o"))
    report, _ = simulate(SimulationSpec.of(ep=4, **kw))
    assert report["setup"]["ep"] == 4
    assert any("expert parallelism over 4 GPUs: each holds 32 experts" in x
               for x in report["limits"])
    assert report["metrics"]["tpot"]["mean"] > 0


@pytest.mark.parametrize("model, tp, ep, reason", [
    ("tiny-llama", 2, 2, "has no experts"),
    ("tiny-mixtral", 2, 4, "4 does not divide tp 2"),
    ("tiny-qwen3-moe", 4, 3, "3 does not divide tp 4"),
    ("tiny-mixtral", 2, 0, "expected a positive int"),
])
def test_layouts_an_engine_refuses_are_refused_by_name(model, tp, ep, reason):
    with pytest.raises(ValueError, match=f"ep: .*{reason}"):
        check_ep(ModelConfig.preset(model), tp, ep)


def test_experts_that_do_not_divide_are_refused():
    raw = ModelConfig.preset("tiny-mixtral")
    with pytest.raises(ValueError, match="ep: 8 does not divide the 4 experts"):
        check_ep(raw, 8, 8)
