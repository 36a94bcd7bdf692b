"""LLMEngine / LLM / `gnomon generate`: tiny presets with random weights, float32."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnomon import _C
from gnomon.engine.config import ModelConfig, preset_json
from gnomon.engine import llm as llm_module
from gnomon.engine.llm import LLM, LLMEngine
from gnomon.engine.runner import ModelRunner
from gnomon.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
           [5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 30]]


def make(model="tiny-llama", **kw):
    kw.setdefault("dtype", "float32")
    kw.setdefault("max_model_len", 128)
    return LLM(model, random_weights=True, **kw)


def check_invariants(llm, outs, params):
    assert llm.num_free_blocks == llm.num_kv_blocks
    for o, p in zip(outs, params):
        assert o.finished and len(o.outputs) == p.n
        for c in o.outputs:
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert len(c.token_ids) == p.max_tokens
            else:
                assert len(c.token_ids) <= p.max_tokens
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time


def token_ids(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


@pytest.fixture(scope="module")
def reference():
    llm = make()
    outs = llm.generate(PROMPTS, GREEDY)
    check_invariants(llm, outs, [GREEDY] * len(PROMPTS))
    return token_ids(outs)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-mixtral", "tiny-gpt-oss"])
def test_greedy_matches_full_recompute_decode(model):
    llm = make(model)
    outs = llm.generate(PROMPTS[:2], GREEDY)
    check_invariants(llm, outs, [GREEDY] * 2)
    for prompt, o in zip(PROMPTS[:2], outs):
        seq = list(prompt)
        for _ in range(GREEDY.max_tokens):  # each token from a fresh prefill of everything
            seq.append(int(llm.score([seq])[0].argmax()))
        assert list(o.outputs[0].token_ids) == seq[len(prompt):]
    assert token_ids(llm.generate(PROMPTS[:2], GREEDY)) == token_ids(outs)


@pytest.mark.parametrize("constraint", [
    dict(max_num_batched_tokens=8, max_num_seqs=4),   # chunked prefill (budget < prompt)
    dict(num_kv_blocks=9, block_size=4),              # preemption
    # TensorRT-LLM's capacity policy on the same cache: requests wait instead
    dict(num_kv_blocks=9, block_size=4, capacity_policy="guaranteed_no_evict"),
    dict(enable_prefix_caching=False),
    dict(max_num_seqs=1),
])
def test_constraints_give_identical_greedy_outputs(reference, constraint):
    llm = make(**constraint)
    outs = llm.generate(PROMPTS, GREEDY)
    check_invariants(llm, outs, [GREEDY] * len(PROMPTS))
    assert token_ids(outs) == reference
    if "num_kv_blocks" in constraint:
        evicts = constraint.get("capacity_policy", "max_utilization") == "max_utilization"
        assert (llm.engine.scheduler.num_preemptions > 0) == evicts


def test_prefix_sharing_prompts(reference):
    llm = make(block_size=4)
    first = llm.generate(PROMPTS, GREEDY)
    again = llm.generate(PROMPTS[::-1], GREEDY)  # now served from the prefix cache
    assert token_ids(first) == reference and token_ids(again) == reference[::-1]
    assert llm.num_free_blocks == llm.num_kv_blocks


def test_n_samples_and_seeded_sampling_independent_of_companions():
    p = SamplingParams(max_tokens=8, temperature=1.0, seed=7, n=3, logprobs=2)
    llm = make()
    alone = llm.generate([PROMPTS[1]], p)
    crowd = llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2]],
                         [SamplingParams(max_tokens=5, temperature=1.0), p,
                          SamplingParams(max_tokens=9, temperature=0.5, seed=1)])
    check_invariants(llm, crowd, [SamplingParams(max_tokens=5), p, SamplingParams(max_tokens=9)])
    assert token_ids(alone)[0] == token_ids(crowd)[1]
    samples = token_ids(alone)[0]
    assert len(samples) == 3 and len(set(samples)) > 1
    small = make(num_kv_blocks=9, block_size=4).generate([PROMPTS[0], PROMPTS[1]], [GREEDY, p])
    assert token_ids(small)[1] == samples
    for c in alone[0].outputs:
        assert len(c.logprobs) == len(c.token_ids)
        for t, lp in zip(c.token_ids, c.logprobs):
            assert lp.token_id == t and lp.logprob <= 0 and len(lp.top_token_ids) == 2


def test_token_ids_outside_the_vocabulary_are_refused_where_they_enter():
    eng = LLMEngine("tiny-llama", random_weights=True, dtype="float32", max_model_len=64)
    vocab = eng.config.vocab_size
    free = eng.num_free_blocks
    with pytest.raises(ValueError, match=rf"request 'bad': prompt_token_ids: token id {vocab} "
                                         rf"at position 2 .* vocab_size={vocab}"):
        eng.add_request("bad", [1, 2, vocab, vocab + 5], GREEDY)
    # nothing of it stayed: the id is free, nothing waits, no block is held
    assert not eng.has_unfinished_requests() and eng.num_free_blocks == free
    eng.add_request("bad", [1, 2, vocab - 1], GREEDY)
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.get_output("bad").finished


def test_fake_clock_admits_arrivals_only_after_their_time():
    now = [0.0]
    eng = LLMEngine("tiny-llama", random_weights=True, dtype="float32", max_model_len=64,
                    clock=lambda: now[0])
    eng.add_request("a", [1, 2, 3], GREEDY)
    eng.add_request("b", [4, 5, 6], GREEDY, arrival_time=10.0)
    out = eng.step()
    assert [o.request_id for o in out] == ["a"]
    while eng.get_output("a").finished is False:
        assert all(o.request_id == "a" for o in eng.step())
    assert eng.has_unfinished_requests() and eng.step() == []
    assert eng.next_arrival_time() == 10.0
    now[0] = 10.0
    out = eng.step()
    assert [o.request_id for o in out] == ["b"]
    metrics = eng.get_output("b").metrics
    assert metrics.arrival_time == 10.0 and metrics.first_scheduled_time == 10.0
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.num_free_blocks == eng.num_kv_blocks


def test_score_shape():
    llm = make()
    logits = llm.score([[1, 2, 3], [4, 5, 6, 7, 8]])
    assert logits.shape == (2, llm.engine.config.vocab_size) and logits.dtype == torch.float32
    assert llm.num_free_blocks == llm.num_kv_blocks


def test_score_is_requests_through_the_scheduler_that_end_with_their_logits():
    # scored prompts are ordinary requests flagged prompt_logits: batched in one step with a
    # generating request, chunked, and they end after their prefill without a token
    llm = make(max_num_batched_tokens=8, max_num_seqs=4)
    eng = llm.engine
    prompts = [[1, 2, 3], list(range(4, 17))]  # the second needs two chunks of 8
    alone = [llm.score([p])[0] for p in prompts]
    eng.add_request("gen", [7, 8, 9], SamplingParams(max_tokens=3, temperature=0))
    eng.add_request("s0", prompts[0], SamplingParams(prompt_logits=True))
    eng.add_request("s1", prompts[1], SamplingParams(prompt_logits=True))
    deltas = []
    while eng.has_unfinished_requests():
        deltas += eng.step()
    ends = {d.request_id: d for d in deltas if d.request_id in ("s0", "s1")}
    assert all(d.new_token_ids == () and d.finish_reason == "length" and d.finished
               for d in ends.values()) and len(ends) == 2
    for i, rid in enumerate(("s0", "s1")):
        assert eng.get_output(rid).outputs[0].token_ids == ()
        torch.testing.assert_close(eng.scheduler.get_request(rid).prompt_logits, alone[i])
    assert len(eng.get_output("gen").outputs[0].token_ids) == 3
    assert eng.num_free_blocks == eng.num_kv_blocks
    with pytest.raises(ValueError, match="prompt_logits: a request returning"):
        SamplingParams(prompt_logits=True, n=2)
    with pytest.raises(ValueError, match="prompt_logits: expected a bool"):
        SamplingParams(prompt_logits=1)


def _write_folder(tmp_path, with_tokenizer=False):
    from safetensors.torch import save_file

    from gnomon.engine.random_weights import random_weights
    cfg = preset_json("tiny-llama")
    cfg["torch_dtype"] = "float32"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    config = ModelConfig.from_model(str(tmp_path))
    w = random_weights(config, torch.float32, seed=3)
    H = config.hidden_size
    tensors = {"model.embed_tokens.weight": w["embed"], "model.norm.weight": w["norm"],
               "lm_head.weight": w["lm_head"]}
    for i in range(config.num_layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        qs, kv = config.q_size, config.kv_size
        qkv = w[p + "qkv"]
        tensors[q + "self_attn.q_proj.weight"] = qkv[:qs].clone()
        tensors[q + "self_attn.k_proj.weight"] = qkv[qs:qs + kv].clone()
        tensors[q + "self_attn.v_proj.weight"] = qkv[qs + kv:].clone()
        tensors[q + "self_attn.o_proj.weight"] = w[p + "o"]
        gate, up = w[p + "w13"].chunk(2, dim=0)
        tensors[q + "mlp.gate_proj.weight"] = gate.clone()
        tensors[q + "mlp.up_proj.weight"] = up.clone()
        tensors[q + "mlp.down_proj.weight"] = w[p + "w2"]
        tensors[q + "input_layernorm.weight"] = w[p + "attn_norm"]
        tensors[q + "post_attention_layernorm.weight"] = w[p + "mlp_norm"]
    assert tensors["model.embed_tokens.weight"].shape[1] == H
    save_file({k: v.contiguous() for k, v in tensors.items()},
              str(tmp_path / "model.safetensors"))
    if with_tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers
        vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(
            "the cat sat on a mat and dog ran".split())}}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(str(tmp_path / "tokenizer.json"))
    return w


def test_folder_loads_and_generates_like_the_same_random_weights(tmp_path):
    w = _write_folder(tmp_path)
    llm = LLM(str(tmp_path), max_model_len=64)
    assert llm.engine.dtype == torch.float32  # "auto" = the checkpoint's dtype
    outs = llm.generate(PROMPTS[:2], GREEDY)
    check_invariants(llm, outs, [GREEDY] * 2)
    config = llm.engine.config
    runner = ModelRunner(config, w, num_kv_blocks=64, block_size=16)
    eng = LLMEngine(str(tmp_path), max_model_len=64, num_kv_blocks=64, runner=runner)
    eng.add_request(0, PROMPTS[0], GREEDY)
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.get_output(0).outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_string_prompts_with_tokenizer(tmp_path):
    _write_folder(tmp_path, with_tokenizer=True)
    llm = LLM(str(tmp_path), max_model_len=64)
    outs = llm.generate(["the cat sat on a mat", "dog ran"], GREEDY)
    assert outs[0].prompt_token_ids == (1, 2, 3, 4, 5, 6)
    assert outs[1].prompt_token_ids == (8, 9)
    assert isinstance(outs[0].outputs[0].text, str)
    assert outs[0].outputs[0].token_ids == llm.generate([[1, 2, 3, 4, 5, 6]],
                                                        GREEDY)[0].outputs[0].token_ids


def test_bad_inputs():
    with pytest.raises(ValueError, match="model"):
        LLM("no-such-preset", random_weights=True)
    with pytest.raises(ValueError, match="random_weights"):
        LLM("tiny-llama")
    llm = make(num_kv_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate(["hello"])
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate([[1], [2]], [GREEDY])
    with pytest.raises(ValueError, match="can never run"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=30))
    with pytest.raises(ValueError, match="prompts"):
        llm.generate([[10**6]])
    assert llm.num_free_blocks == llm.num_kv_blocks
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="dtype"):
        make(dtype="int8")


def engine_runner_surface():
    """The runner attributes the engine's source uses (``runner.x`` / ``self.runner.x``)."""
    src = Path(llm_module.__file__).read_text()  # the engine source actually imported
    used = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Attribute):
            v = node.value
            if (isinstance(v, ast.Name) and v.id == "runner") or \
                    (isinstance(v, ast.Attribute) and v.attr == "runner"):
                used.add(node.attr)
    assert "execute" in used
    return used


def test_runner_surface_is_answered_by_the_real_runner():
    runner = make().engine.runner
    assert isinstance(runner, ModelRunner)
    missing = sorted(a for a in engine_runner_surface() if not hasattr(runner, a))
    assert not missing, f"the engine uses runner attributes the ModelRunner lacks: {missing}"


def test_cli_generate():
    env = dict(os.environ)  # the gnomon this interpreter imports, installed or on PYTHONPATH
    run = subprocess.run([sys.executable, "-m", "gnomon.cli", "generate", "--model", "tiny-llama",
                          "--random-weights", "--prompt-ids", "1,2,3", "--max-tokens", "4"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    line = [l for l in run.stdout.splitlines() if l.startswith("token_ids:")][0]
    assert len(line.split(":")[1].split(",")) == 4
    bad = subprocess.run([sys.executable, "-m", "gnomon.cli", "generate", "--model", "nope",
                          "--random-weights", "--prompt-ids", "1"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2
    err = bad.stderr.strip()
    assert err.startswith("gnomon: error:") and len(err.splitlines()) == 1


def test_cli_generate_tp():
    """--tp 2 gives --tp 1's tokens; a --tp that cannot shard the model is refused by name."""
    def generate(*flags):
        return subprocess.run([sys.executable, "-m", "gnomon.cli", "generate", "--model",
                               "tiny-llama", "--random-weights", "--prompt-ids", "1,2,3",
                               "--max-tokens", "6", *flags],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "GNOMON_DIST_TIMEOUT_S": "20"})

    one, two, three = generate("--tp", "1"), generate("--tp", "2"), generate("--tp", "3")
    assert one.returncode == two.returncode == 0, two.stderr
    tokens = [[l for l in r.stdout.splitlines() if l.startswith("token_ids:")] for r in (one, two)]
    assert tokens[0] == tokens[1] and tokens[0]
    assert three.returncode == 2 and "tensor_parallel_size: 3 does not divide" in three.stderr


def test_stop_token_finishes_with_reason_stop(reference):
    stop = reference[0][0][3]
    first = list(reference[0][0]).index(stop)
    p = SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(stop,))
    llm = make()
    out = llm.generate([PROMPTS[0]], p)
    check_invariants(llm, out, [p])
    c = out[0].outputs[0]
    assert c.finish_reason == "stop" and c.token_ids == reference[0][0][:first + 1]


def test_lazy_exports_from_gnomon():
    import gnomon
    assert gnomon.LLM is LLM and gnomon.LLMEngine is LLMEngine
    assert gnomon.SamplingParams is SamplingParams
    with pytest.raises(AttributeError):
        gnomon.NoSuchThing  # noqa: B018


@pytest.mark.parametrize("device, expected", [
    ("tpu", "device: expected 'cpu' or 'cuda[:N]'"),
    ("mps", "device: gnomon runs on 'cpu' or 'cuda[:N]'"),
])
def test_unusable_device_is_refused_naming_it(device, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        LLM("tiny-llama", random_weights=True, device=device)


@pytest.mark.skipif(torch.cuda.is_available() and bool(_C.build_info()["gpu_backends"]),
                    reason="this machine can run gnomon on a GPU")
def test_gpu_device_without_a_gpu_build_or_gpu_is_refused():
    with pytest.raises(ValueError, match=r"device: 'cuda', but (this build of gnomon has no GPU "
                                         r"kernels|torch .* sees no GPU)"):
        LLM("tiny-llama", random_weights=True, device="cuda")
