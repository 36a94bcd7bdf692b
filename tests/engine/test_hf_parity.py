"""Parity with Hugging Face transformers (pinned in pyproject's ``test`` extra).

Tiny random models of each architecture are built by transformers from config objects (no
download), saved as safetensors to a temporary folder, and loaded from the same files by
gnomon. Everything runs in float32 on the CPU. Checked:

- last-position logits of a batch of prompts of different lengths (`LLM.score` vs HF
  ``model(ids).logits[:, -1]``, one unpadded prompt at a time): ``atol=RTOL=1e-4``;
- greedy generation of 32 tokens per prompt, token-identical to HF ``generate``;
- the same greedy tokens under constraints: prompts that share prefixes (prefix cache hits),
  a token budget smaller than a prompt (chunked prefill), a KV cache so small that preemption
  happens;
- gpt-oss with MXFP4 experts written in the hub layout (``*_blocks`` / ``*_scales`` from
  `gnomon.ops.mxfp4_quantize`), against transformers on the dequantised dense weights;
- after every generate: every KV block is free again, every request finished with
  ``finish_reason == "length"`` and exactly ``max_tokens`` tokens.

Weights are drawn with ``initializer_range`` 0.1 (not HF's 0.02) and every bias, sink and
norm weight is perturbed, so the logits are spread enough for greedy argmax ties not to be a
matter of rounding, and so that biases and sinks actually matter.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gnomon.engine.config import ModelConfig  # noqa: E402
from gnomon.engine.kv_cache import max_blocks_held  # noqa: E402
from gnomon.engine.llm import LLM  # noqa: E402
from gnomon.engine.sampling_params import SamplingParams  # noqa: E402
from hf_checkpoints import write_mxfp4_checkpoint  # noqa: E402

ATOL = 1e-4
RTOL = 1e-4
MAX_TOKENS = 32
BLOCK = 16
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)

_g = torch.Generator().manual_seed(1234)
PROMPTS = [torch.randint(0, 256, (n,), generator=_g).tolist() for n in (5, 37, 12, 20)]
# Prompts sharing prefixes with each other (one block, two blocks, and a whole prompt).
_base = torch.randint(0, 256, (40,), generator=_g).tolist()
SHARED = [_base[:33], _base[:18] + [7, 8, 9], _base[:40], _base[:33] + [1]]

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=512, initializer_range=0.1, tie_word_embeddings=False,
              bos_token_id=None, eos_token_id=None, pad_token_id=None,
              attn_implementation="eager")


def _llama(**kw):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, **kw))


def _llama3():
    return _llama(rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 32})


def _mixtral():
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=None))


def _gpt_oss():
    kw = dict(COMMON)
    kw["intermediate_size"] = 64  # a multiple of 32 (MXFP4 blocks along I)
    return transformers.GptOssForCausalLM(transformers.GptOssConfig(
        **kw, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_scaling={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": False, "original_max_position_embeddings": 64}))


def _qwen3():
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON))


def _qwen3_moe():
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]))


BUILDERS = {"llama": _llama, "llama3-rope": _llama3, "mixtral": _mixtral, "qwen3": _qwen3,
            "qwen3-moe": _qwen3_moe}
if hasattr(transformers, "GptOssForCausalLM"):
    BUILDERS["gpt-oss"] = _gpt_oss


def _build(name):
    torch.manual_seed(0)
    model = BUILDERS[name]().float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1 or pname.endswith(("bias", "sinks")):
                p.add_(torch.randn_like(p) * 0.1)  # norms, biases, sinks away from 1 / 0
    return model


@pytest.fixture(scope="module", params=list(BUILDERS))
def case(request, tmp_path_factory):
    """(name, HF model, folder, HF last-position logits per prompt, HF greedy tokens)."""
    name = request.param
    model = _build(name)
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder, safe_serialization=True)
    return (name, model, folder) + _hf_reference(model, PROMPTS + SHARED)


def _hf_reference(model, prompts):
    logits, tokens = [], []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            logits.append(model(ids).logits[0, -1].float())
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
            tokens.append(out[0, len(p):].tolist())
    return torch.stack(logits), tokens


def _generate(llm, prompts):
    outs = llm.generate(prompts, GREEDY)
    assert llm.num_free_blocks == llm.num_kv_blocks
    assert [list(o.prompt_token_ids) for o in outs] == [list(p) for p in prompts]
    for o in outs:
        assert o.finished and len(o.outputs) == 1
        assert o.outputs[0].finish_reason == "length"
        assert len(o.outputs[0].token_ids) == MAX_TOKENS
    return [list(o.outputs[0].token_ids) for o in outs]


def _llm(folder, **kw):
    kw.setdefault("num_kv_blocks", 64)
    kw.setdefault("block_size", BLOCK)
    return LLM(str(folder), dtype="float32", **kw)


def _one_sequence_cache(folder, max_num_batched_tokens=8192):
    """The fewest blocks that still admit the longest request alone, by the engine's own
    arithmetic (a full group's table, plus a sliding group's window and one step), plus one:
    too few to hold two requests at once."""
    windows = ModelConfig.from_pretrained(folder).kv_cache_groups().windows
    return max_blocks_held(windows, max(map(len, PROMPTS)) + MAX_TOKENS, block_size=BLOCK,
                           max_step_tokens=max_num_batched_tokens) + 1


def test_last_position_logits(case):
    name, model, folder, hf_logits, _ = case
    llm = _llm(folder)
    got = llm.score(PROMPTS)
    assert got.shape == (len(PROMPTS), 256) and got.dtype == torch.float32
    torch.testing.assert_close(got, hf_logits[:len(PROMPTS)], atol=ATOL, rtol=RTOL)
    assert llm.num_free_blocks == llm.num_kv_blocks


def test_greedy_tokens_match(case):
    name, model, folder, _, hf_tokens = case
    llm = _llm(folder)
    assert _generate(llm, PROMPTS) == hf_tokens[:len(PROMPTS)]


def test_greedy_shared_prefixes(case):
    name, model, folder, _, hf_tokens = case
    llm = _llm(folder)
    assert _generate(llm, SHARED) == hf_tokens[len(PROMPTS):]
    # a second pass hits the prefix cache left by the first
    assert _generate(llm, SHARED) == hf_tokens[len(PROMPTS):]
    assert llm.engine.kv.stats()["hits"] > 0


def test_greedy_chunked_prefill(case):
    name, model, folder, _, hf_tokens = case
    llm = _llm(folder, max_num_batched_tokens=8, max_num_seqs=4)
    assert max(map(len, PROMPTS)) > 8
    assert _generate(llm, PROMPTS) == hf_tokens[:len(PROMPTS)]


def test_greedy_preemption(case):
    name, model, folder, _, hf_tokens = case
    # the longest request needs ceil((37 + 32) / 16) = 5 blocks per group (a sliding group
    # fewer): the cache cannot hold two at once
    llm = _llm(folder, num_kv_blocks=_one_sequence_cache(folder))
    assert _generate(llm, PROMPTS) == hf_tokens[:len(PROMPTS)]
    assert llm.engine.scheduler.num_preemptions > 0, \
        "the tiny cache was expected to force a preemption"


# ---------------------------------------------------------------- gpt-oss with MXFP4 experts

@pytest.mark.skipif("gpt-oss" not in BUILDERS, reason="this transformers has no gpt-oss")
def test_gpt_oss_mxfp4(tmp_path):
    model = _build("gpt-oss")
    dense = tmp_path / "dense"
    model.save_pretrained(dense, safe_serialization=True)
    dequant = write_mxfp4_checkpoint(dense, tmp_path / "mxfp4")
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, t in dequant.items():
            assert not torch.equal(params[name], t)  # quantisation did change the weights
            params[name].copy_(t)
    hf_logits, hf_tokens = _hf_reference(model, PROMPTS)

    llm = _llm(tmp_path / "mxfp4")
    assert llm.engine.runner.weights["layers.0.w13"].dtype == torch.uint8  # really MXFP4
    torch.testing.assert_close(llm.score(PROMPTS), hf_logits, atol=ATOL, rtol=RTOL)
    assert _generate(llm, PROMPTS) == hf_tokens
    # and under a small token budget and a small cache
    small = _llm(tmp_path / "mxfp4", max_num_batched_tokens=8, max_num_seqs=4,
                 num_kv_blocks=_one_sequence_cache(tmp_path / "mxfp4", 8))
    assert _generate(small, PROMPTS) == hf_tokens


# ------------------------------------------------- gpt-oss with the hybrid KV cache (window 8)

class _Spy:
    """Wraps the engine's runner and keeps what the hybrid tests must see happen."""

    def __init__(self, runner, window):
        self.runner, self.window = runner, window
        self.chunk_past_window = self.hit_with_released_blocks = self.copies = False

    def execute(self, batch):
        for s in batch.sequences:
            if not s.is_last_prefill_chunk or len(s.token_ids) > 1:  # a prompt chunk
                self.chunk_past_window |= s.num_computed_tokens > self.window
            if s.full and s.num_computed_tokens > 0:
                self.hit_with_released_blocks |= -1 in s.block_ids[1]
        self.copies |= bool(batch.block_copies)
        return self.runner.execute(batch)

    def execute_logits(self, batch):
        return self.runner.execute_logits(batch)


def _hybrid_pair(folder, **kw):
    """The same engine with the hybrid KV cache on (spied) and off."""
    on, off = _llm(folder, **kw), _llm(folder, enable_hybrid_kv=False, **kw)
    assert on.engine.kv.windows == (None, 8) and off.engine.kv.windows == (None,)
    spy = _Spy(on.engine.runner, 8)
    on.engine.runner = spy
    return on, off, spy


HYBRID_CASES = {
    # chunks of 5 tokens: later chunks of a prompt attend across the window edge into KV that
    # earlier steps computed, some of it in blocks already released
    "chunked prefill": dict(max_num_batched_tokens=5, max_num_seqs=4),
    "prefix hits": dict(),
    "preemption": dict(max_num_batched_tokens=8, max_num_seqs=4),
}


@pytest.mark.skipif("gpt-oss" not in BUILDERS, reason="this transformers has no gpt-oss")
@pytest.mark.parametrize("scenario", HYBRID_CASES)
@pytest.mark.parametrize("block_size", [4, 16])
def test_hybrid_kv_matches_full_kv_and_transformers(scenario, block_size, tmp_path):
    model = _build("gpt-oss")
    model.save_pretrained(tmp_path, safe_serialization=True)
    prompts = SHARED if scenario == "prefix hits" else PROMPTS
    _, hf_tokens = _hf_reference(model, prompts)
    kw = dict(HYBRID_CASES[scenario], block_size=block_size)
    if scenario == "preemption":
        windows = ModelConfig.from_pretrained(tmp_path).kv_cache_groups().windows
        kw["num_kv_blocks"] = max_blocks_held(windows, max(map(len, prompts)) + MAX_TOKENS,
                                              block_size=block_size, max_step_tokens=8) + 1
    on, off, spy = _hybrid_pair(tmp_path, **kw)
    passes = 2 if scenario == "prefix hits" else 1  # the second pass hits the first's blocks
    for _ in range(passes):
        got = _generate(on, prompts)  # all blocks free after it (asserted inside)
        assert got == _generate(off, prompts) == hf_tokens
    assert on.engine.kv.group_stats()[1]["released"] > 0
    if scenario == "chunked prefill":
        assert spy.chunk_past_window
    if scenario == "prefix hits":
        assert on.engine.kv.stats()["hits"] > 0 and spy.hit_with_released_blocks
    if scenario == "preemption":
        assert on.engine.scheduler.num_preemptions > 0


@pytest.mark.skipif("gpt-oss" not in BUILDERS, reason="this transformers has no gpt-oss")
def test_hybrid_kv_parallel_samples(tmp_path):
    """n=2: the samples fork every group's table and copy-on-write their shared last blocks;
    greedy, both equal transformers' tokens, with the hybrid cache on and off."""
    model = _build("gpt-oss")
    model.save_pretrained(tmp_path, safe_serialization=True)
    _, hf_tokens = _hf_reference(model, PROMPTS)
    on, off, spy = _hybrid_pair(tmp_path, block_size=4)
    params = SamplingParams(n=2, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    for llm in (on, off):
        outs = llm.generate(PROMPTS, params)
        assert [[list(c.token_ids) for c in o.outputs] for o in outs] == \
            [[t, t] for t in hf_tokens]
        assert llm.num_free_blocks == llm.num_kv_blocks
    assert spy.copies and on.engine.kv.group_stats()[1]["released"] > 0
