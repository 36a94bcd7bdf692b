"""A new architecture is one new module and one registry line: this file is that module.

It defines ``GeluLlamaForCausalLM``, Llama with a tanh-approximated GELU gate instead of SiLU (as
transformers' Llama runs with ``hidden_act="gelu_pytorch_tanh"``), registers it from inside the
test, runs a transformers checkpoint of it through `gnomon.LLM` and simulates it, with no edit
to any other gnomon file. The tokens must match transformers' own generation, and the
simulation must price the module's own ops.
"""

import json

import pytest
import torch

from gnomon.engine import models
from gnomon.engine.llm import LLM
from gnomon.engine.models import llama
from gnomon.engine.sampling_params import SamplingParams
from hf_checkpoints import hf_greedy

transformers = pytest.importorskip("transformers")

# ---- the architecture module: its config.json mapping, weight names, cost and layer forward -

ARCHITECTURE = "GeluLlamaForCausalLM"
DEFAULTS = llama.DEFAULTS
ROPE_SCALING = llama.ROPE_SCALING
MXFP4_TENSOR = None
PRESETS = {}
layer_shapes = llama.layer_shapes
SHARDING = llama.SHARDING
load_layer = llama.load_layer  # the same HF names as Llama's


def config_fields(r, base):
    act = r.raw.get("hidden_act")
    if act != "gelu_pytorch_tanh":
        r.fail(f"hidden_act must be 'gelu_pytorch_tanh', got {act!r}")
    return dict(head_dim=r.head_dim(), attention_bias=False, num_experts=0, top_k=0,
                routing=None, layer_types=("full",) * base["num_layers"], sliding_window=None,
                has_sinks=False, activation="gelu_pytorch_tanh", gate_up_layout="concat")


def step_ops(ops):
    def mlp():  # a dense gated MLP whose activation is GELU, priced as its own op
        c, inter = ops.config, ops.config.intermediate_size // ops.tp
        ops.gemm("gemm", "gate_up_proj", c.hidden_size, 2 * inter)
        ops.elementwise("gelu_tanh_and_mul", 3 * ops.T * inter * ops.pricing.activation_bytes, 1)
        ops.gemm("gemm", "down_proj", inter, c.hidden_size)

    ops.decoder(mlp)


def _gelu(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def forward_layer(model, i, h, residual, step, kv, tick):
    from gnomon.engine.models.layers import decoder_layer, gated_mlp

    def mlp(model, i, x, tick):
        return gated_mlp(model, i, x, tick, activation=_gelu)

    return decoder_layer(model, i, h, residual, step, kv, tick, mlp)


# ---- the test --------------------------------------------------------------------------------

@pytest.fixture
def registered():
    models.register(ARCHITECTURE, __name__)
    yield
    models.unregister(ARCHITECTURE)


def _checkpoint(folder):
    """A transformers Llama with a GELU gate, saved as a GeluLlamaForCausalLM checkpoint."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        hidden_act="gelu_pytorch_tanh", initializer_range=0.1, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).float().eval()
    model.save_pretrained(folder, safe_serialization=True)
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    raw["architectures"] = [ARCHITECTURE]
    path.write_text(json.dumps(raw))
    return model


def test_a_registered_architecture_runs_through_llm(tmp_path, registered):
    hf = _checkpoint(tmp_path)
    prompts = [[5, 17, 99, 3, 42], list(range(10, 40))]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32)
    assert llm.engine.config.architecture == ARCHITECTURE
    got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    assert got == hf_greedy(hf, prompts, 12)


def test_a_registered_architecture_is_priced_from_its_module(tmp_path, registered):
    from gnomon.predict.opcount import step_ops as priced
    from gnomon.predict.shapes import ModelSpec, StepShape
    from gnomon.predict.simulate import simulate
    from gnomon.predict.spec import SimulationSpec
    from gnomon.predict.workloads import LengthDist

    _checkpoint(tmp_path)
    spec = ModelSpec.from_model(str(tmp_path))
    ops = {op.name: op for op in priced(StepShape.of(spec, [(5, 0), (1, 9)], tp=2))}
    # its own activation op: 3 passes over T x I/tp float32 values per layer, 2 layers
    assert ops["gelu_tanh_and_mul"].bytes == 2 * 3 * 6 * 64 * 4
    assert "silu_and_mul" not in ops
    report, _ = simulate(SimulationSpec.of(
        model=str(tmp_path), hardware="H100 SXM", workload="random", num_requests=4, rate=10.0,
        input_len=LengthDist.fixed(32), output_len=LengthDist.fixed(8)))
    assert report["setup"]["model"] == tmp_path.name
    assert report["metrics"]["requests"] == 4 and report["metrics"]["ttft"]["mean"] > 0


def test_an_unregistered_architecture_is_refused_by_name(tmp_path):
    _checkpoint(tmp_path)
    with pytest.raises(ValueError, match="GeluLlamaForCausalLM.*LlamaForCausalLM"):
        LLM(str(tmp_path), dtype="float32", num_kv_blocks=32)


def test_register_checks_the_module():
    with pytest.raises(ValueError, match="does not define"):
        models.register("Nothing", "gnomon.engine.models.layers")
    with pytest.raises(ValueError, match="declares ARCHITECTURE 'LlamaForCausalLM'"):
        models.register("Other", "gnomon.engine.models.llama")
    with pytest.raises(ValueError, match="built in"):
        models.unregister("LlamaForCausalLM")
    assert models.architectures()[:3] == ("LlamaForCausalLM", "MixtralForCausalLM",
                                          "GptOssForCausalLM")
