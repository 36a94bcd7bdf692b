"""Speculative decoding in a simulation: what a step with drafts costs (the target's verify
pass and the drafter's passes, counted by hand), how many tokens a decode yields (the
acceptance length), MLA's verify pass in its absorbed decode form, and drafting under attention
data parallelism."""

import math

import pytest

from gnomon.engine.config import ModelConfig
from gnomon.engine.engine_config import EngineConfig
from gnomon.engine.models import mla
from gnomon.predict.cost import StepCost
from gnomon.predict.opcount import attention_ops
from gnomon.predict.roofline import RooflinePredictor
from gnomon.predict.serve import run_workload, simulated_engine
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.workloads import LengthDist, SyntheticSpec, synthetic

TINY = ModelSpec.from_config(ModelConfig.preset("tiny-llama"), name="tiny-llama")
DEEPSEEK = ModelSpec.from_config(ModelConfig.preset("deepseek-v3"), name="deepseek-v3")


class PerToken:
    """1 µs per token per layer, 1 ms of engine overhead per step, 10 µs per sampled row."""

    name = "per-token"

    def __init__(self):
        self.shapes = []

    def predict(self, shape):
        self.shapes.append(shape)
        layers = shape.model.config.num_layers
        return StepCost.from_parts({"gemm": shape.num_tokens * layers * 1e-6,
                                    "sampling": shape.num_sampled * 1e-5,
                                    "overhead": 1e-3}, {})


def _closed_loop(model, config, predictor, n=16, prompt=32, output=40, concurrency=4):
    engine = simulated_engine(model, "H100", predictor, config)
    work = synthetic(SyntheticSpec(num_requests=n, rate=math.inf,
                                   prompt_len=LengthDist.fixed(prompt),
                                   output_len=LengthDist.fixed(output), vocab_size=256, seed=1))
    return run_workload(engine, work, concurrency=concurrency)


def test_a_step_with_drafts_costs_the_verify_pass_and_the_drafters_passes():
    # tiny-llama: L layers; 3 drafts. A decode step of B sequences: the target verifies
    # B x 4 tokens (4 logits rows each) with its overhead once; the drafter (1 layer) runs
    # over those B x 4 tokens, then 2 more times over B tokens, with no overhead of its own
    L, k = TINY.config.num_layers, 3
    config = EngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                          max_model_len=256, num_kv_blocks=400, num_speculative_tokens=k,
                          draft_acceptance_rate=0.5)
    predictor = PerToken()
    trace = _closed_loop(TINY, config, predictor)
    decodes = [s for s in trace.steps if s.num_prefill_tokens == 0]
    assert decodes
    for step in decodes:
        B = step.num_seqs
        assert step.num_decode_tokens == B * (k + 1)
        target = B * (k + 1) * L * 1e-6 + B * (k + 1) * 1e-5 + 1e-3
        drafter = B * (k + 1) * 1e-6 + B * (k + 1) * 1e-5 + (k - 1) * (B * 1e-6 + B * 1e-5)
        assert step.seconds == pytest.approx(target + drafter, rel=1e-12)
        assert step.breakdown["overhead"] == pytest.approx(1e-3)
    drafter_shapes = [s for s in predictor.shapes if s.model.config.num_layers == 1]
    assert drafter_shapes and all(s.model.config.layer_types == TINY.config.layer_types[-1:]
                                  for s in drafter_shapes)


@pytest.mark.parametrize("k, rate", [(1, 0.8), (3, 0.69), (2, 0.0)])
def test_a_decode_yields_the_acceptance_length_on_average(k, rate):
    config = EngineConfig(block_size=16, max_num_seqs=4, max_num_batched_tokens=256,
                          max_model_len=512, num_kv_blocks=400, num_speculative_tokens=k,
                          draft_acceptance_rate=rate)
    output, n = 400, 8
    trace = _closed_loop(TINY, config, PerToken(), n=n, output=output)
    length = sum(rate ** i for i in range(k + 1))  # 1 + a + ... + a^k
    decoded = sum(s.num_decode_tokens // (k + 1) for s in trace.steps)  # decodes run
    # every request's first token comes from its prompt, the rest from decodes
    assert n * (output - 1) / decoded == pytest.approx(length, rel=0.01)
    assert all(len(o.outputs[0].token_ids) == output for o in trace.outputs)


def test_drafts_cut_the_time_per_output_token_where_decoding_is_memory_bound():
    plain = EngineConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=4096)
    drafting = plain.replace(num_speculative_tokens=3, draft_acceptance_rate=0.69)
    spec = ModelSpec.from_config(ModelConfig.preset("llama-3.1-8b"), name="llama-3.1-8b")
    predictor = RooflinePredictor("H100")

    def tpot(config):
        trace = _closed_loop(spec, config, predictor, n=8, prompt=256, output=128,
                             concurrency=2)
        return sum((t[-1] - t[0]) / (len(t) - 1) for t in trace.token_times.values()) / 8

    # 2.49 tokens per decode for a verify pass barely dearer than one token's and 3 passes
    # of one layer (of 32): well under the plain TPOT, above plain / 2.49
    assert tpot(plain) / 2.49 < tpot(drafting) < tpot(plain) / 1.8


def test_mla_verifies_drafts_in_its_absorbed_decode_form():
    # 2 decodes verifying 3 drafts each after 100 and 200 cached tokens: 8 query tokens over
    # the latent cache, no per-head K/V up-projection of the context
    c, tp = DEEPSEEK.config, 8
    shape = StepShape(DEEPSEEK, ((4, 100), (4, 200)), 8, 0, 8, tp, 1, draft_tokens=3)
    ops = {op.name: op for op in attention_ops(shape)}
    assert "kv_b_proj" not in ops and "mla_prefill" not in ops
    m, L, hq = c.mla, c.num_layers, c.num_heads // tp
    assert ops["mla_absorb_q"].flops == L * 2.0 * 8 * hq * m.qk_nope_head_dim * m.kv_lora_rank
    keys = sum(n * cached + n * (n + 1) // 2 for n, cached in ((4, 100), (4, 200)))
    assert ops["mla_decode"].flops == L * 2.0 * hq * (m.latent + m.kv_lora_rank) * keys
    # beside a prompt chunk, the 4-token decodes are still told apart from it
    mixed = StepShape(DEEPSEEK, ((4, 100), (64, 0)), 2, 64, 4, tp, 1, draft_tokens=3)
    mixed_ops = {op.name: op for op in attention_ops(mixed)}
    assert mixed_ops["mla_absorb_q"].flops == \
        L * 2.0 * 4 * hq * m.qk_nope_head_dim * m.kv_lora_rank
    assert mixed_ops["kv_b_proj"].rows == 64  # the prompt's own keys only
    assert mla.attention_ops  # the ops come from the model's own MLA module


def test_under_attention_data_parallelism_each_group_drafts_and_the_slowest_step_counts():
    # 2 groups of tiny-deepseek-v3 (a dense layer, then a MoE one), one draft accepted with
    # 0.8: every group's step adds its drafter's pass over its own tokens (PerToken prices a
    # group by its own tokens); the step lasts as long as the slowest group's; each decode
    # yields 1.8 tokens on average
    model = ModelSpec.from_config(ModelConfig.preset("tiny-deepseek-v3"), name="tiny-dsv3")
    L, k, n, output = model.config.num_layers, 1, 16, 200
    config = EngineConfig(block_size=16, max_num_seqs=4, max_num_batched_tokens=64,
                          max_model_len=512, num_kv_blocks=200, num_speculative_tokens=k,
                          draft_acceptance_rate=0.8, data_parallel_size=2)
    trace = _closed_loop(model, config, PerToken(), n=n, output=output, concurrency=8)
    decodes = [s for s in trace.steps if s.num_prefill_tokens == 0]
    assert decodes
    for step in decodes:  # both groups decode 4 sequences: either one is the slowest
        B = step.num_seqs // 2
        target = B * (k + 1) * L * 1e-6 + B * (k + 1) * 1e-5 + 1e-3
        drafter = B * (k + 1) * 1e-6 + B * (k + 1) * 1e-5
        assert step.seconds == pytest.approx(target + drafter, rel=1e-12)
    decoded = sum(s.num_decode_tokens // (k + 1) for s in trace.steps)
    assert n * (output - 1) / decoded == pytest.approx(1.8, rel=0.01)
    assert all(len(o.outputs[0].token_ids) == output for o in trace.outputs)
