"""Tensor parallelism over torch.distributed: two real gloo ranks on this CPU (a spawned worker,
or torchrun), in float32, against one rank.

The shard arithmetic is checked against the TP=1 weights row by row; generation at TP=2 must be
token-identical to TP=1 through chunked prefill, prefix-cache hits, preemption and seeded n=2
sampling (each asserted to happen), and the logits equal within 1e-5. A worker that raises, or
dies, fails rank 0's step with a RuntimeError naming it, within the group's timeout (20 s
here), and a closed engine leaves no child process.

This module is also an architecture module (``FailingLlamaForCausalLM``: Llama whose rank 1
raises on token 255), registered by path so that the spawned worker imports it too.
"""

import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest
import torch

from gnomon.engine import models
from gnomon.engine.config import ModelConfig, preset_json
from gnomon.engine.kv_cache import max_blocks_held
from gnomon.engine.llm import LLM
from gnomon.engine.models import llama
from gnomon.engine.parallel import Shard, check_tp
from gnomon.engine.sampling_params import SamplingParams
from gnomon.engine.random_weights import random_weights
from gnomon.engine.weight_shards import shard_weights
from gnomon.engine.weights import load_weights
from hf_checkpoints import hf_greedy

# ---- FailingLlamaForCausalLM ------------------------------------------------------------------

ARCHITECTURE = "FailingLlamaForCausalLM"
DEFAULTS, ROPE_SCALING, MXFP4_TENSOR = llama.DEFAULTS, llama.ROPE_SCALING, None
config_fields, layer_shapes, SHARDING, load_layer = (llama.config_fields, llama.layer_shapes,
                                                     llama.SHARDING, llama.load_layer)
PRESETS, step_ops = {}, llama.step_ops
POISON = 255


def forward_layer(model, i, h, residual, step, kv, tick):
    if model.shard.rank == 1 and bool((step.tokens == POISON).any()):
        raise ValueError("injected failure: rank 1 met the poison token")
    return llama.forward_layer(model, i, h, residual, step, kv, tick)


# ---- helpers ----------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def group_timeout(monkeypatch):
    monkeypatch.setenv("GNOMON_DIST_TIMEOUT_S", "20")


def _mxfp4_oss(intermediate=64):
    raw = preset_json("tiny-gpt-oss")
    raw.update(intermediate_size=intermediate,
               quantization_config={"quant_method": "mxfp4"})
    return ModelConfig.from_json(raw)


def _one_kv_head():
    raw = preset_json("tiny-llama")
    raw["num_key_value_heads"] = 1
    return ModelConfig.from_json(raw)


MODELS = {"tiny-llama": lambda: ModelConfig.preset("tiny-llama"),
          "tiny-llama-1kv": _one_kv_head,  # fewer KV heads than ranks: each rank holds it
          "tiny-mixtral": lambda: ModelConfig.preset("tiny-mixtral"),
          "tiny-gpt-oss": lambda: ModelConfig.preset("tiny-gpt-oss"),
          "tiny-gpt-oss-mxfp4": _mxfp4_oss,
          # I = 96: 1.5 scale blocks a rank, padded with zero codes
          "tiny-gpt-oss-mxfp4-padded": lambda: _mxfp4_oss(96),
          "tiny-qwen3": lambda: ModelConfig.preset("tiny-qwen3"),
          "tiny-qwen3-moe": lambda: ModelConfig.preset("tiny-qwen3-moe")}
_g = torch.Generator().manual_seed(7)
_base = torch.randint(3, 250, (30,), generator=_g).tolist()
PROMPTS = [_base[:22], _base[:12] + [5, 6, 7], _base, [9, 8, 7, 6, 5]]


def _no_children():
    deadline = time.time() + 10
    while multiprocessing.active_children() and time.time() < deadline:
        time.sleep(0.1)
    return not multiprocessing.active_children()


# ---- the arithmetic ----------------------------------------------------------------------------

def test_check_tp_names_the_dimension():
    raw = preset_json("tiny-llama")
    raw.update(num_attention_heads=24, num_key_value_heads=8, head_dim=8, intermediate_size=96)
    config = ModelConfig.from_json(raw)
    assert check_tp(config, 8) == 8 and check_tp(config, 24) == 24  # 24: KV heads replicated
    with pytest.raises(ValueError, match="tensor_parallel_size: 5 does not divide the 24 "
                                         "attention heads"):
        check_tp(config, 5)
    with pytest.raises(ValueError, match="3 neither divides nor is a multiple of the 8 KV"):
        check_tp(config, 3)
    with pytest.raises(ValueError, match="does not divide the 96 intermediate size"):
        check_tp(ModelConfig.from_json({**raw, "num_attention_heads": 64,
                                        "num_key_value_heads": 64}), 64)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM("tiny-llama", random_weights=True, tensor_parallel_size=3)  # before any process
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mixtral", "tiny-gpt-oss", "tiny-qwen3",
                                  "tiny-qwen3-moe"])
def test_shards_are_the_rows_of_the_tp1_weights(name):
    """Every rank's shard against the rows of the TP=1 weights it must hold, computed here from
    the layouts: Q, K and V heads of qkv; gate and up rows of w13; columns of o and w2."""
    c = MODELS[name]()
    full = random_weights(c, torch.float32)
    D, H, I, V = c.head_dim, c.hidden_size, c.intermediate_size, c.vocab_size
    q, kv = c.num_heads * D, c.num_kv_heads * D
    for r in range(2):
        s = shard_weights(full, c, Shard(r, 2))
        hq, hk = c.num_heads // 2, c.num_kv_heads // 2
        for layer in range(c.num_layers):
            p = f"layers.{layer}."
            qkv = full[p + "qkv"]
            want = torch.cat([qkv[r * hq * D:(r + 1) * hq * D],
                              qkv[q + r * hk * D:q + (r + 1) * hk * D],
                              qkv[q + kv + r * hk * D:q + kv + (r + 1) * hk * D]])
            assert torch.equal(s[p + "qkv"], want)
            assert torch.equal(s[p + "o"], full[p + "o"][:, r * hq * D:(r + 1) * hq * D])
            w13, w2 = full[p + "w13"], full[p + "w2"]
            half = I // 2
            if c.gate_up_layout == "concat":  # gate rows, then up rows
                rows = list(range(r * half, (r + 1) * half)) + \
                    list(range(I + r * half, I + (r + 1) * half))
            else:  # interleaved gate/up pairs: a contiguous run of pairs
                rows = list(range(2 * r * half, 2 * (r + 1) * half))
            assert torch.equal(s[p + "w13"], w13[..., rows, :])
            assert torch.equal(s[p + "w2"], w2[..., r * half:(r + 1) * half])
            if c.has_sinks:
                assert torch.equal(s[p + "sinks"], full[p + "sinks"][r * hq:(r + 1) * hq])
            if c.attention_bias:  # a row-parallel bias is added once, by rank 0
                assert torch.equal(s[p + "o_bias"], full[p + "o_bias"] if r == 0
                                   else torch.zeros(H))
            if c.is_moe:
                assert torch.equal(s[p + "router"], full[p + "router"])
            for norm in ("attn_norm", "mlp_norm", "q_norm", "k_norm"):  # replicated
                if p + norm in full:
                    assert torch.equal(s[p + norm], full[p + norm])
        assert torch.equal(s["embed"], full["embed"][r * V // 2:(r + 1) * V // 2])
        assert torch.equal(s["norm"], full["norm"])


def _hf_checkpoint(kind, folder, *, spread=False, sliding_window=8):
    """A small transformers checkpoint of `kind` in `folder` (gpt-oss MXFP4 kinds in the hub's
    *_blocks / *_scales layout); returns the folder gnomon loads. `spread`: weights drawn with
    ``initializer_range`` 0.1 and every norm, bias and sink perturbed (as in test_hf_parity), so
    that greedy argmax is not a matter of rounding and the biases and sinks matter."""
    transformers = pytest.importorskip("transformers")
    from hf_checkpoints import write_mxfp4_checkpoint

    common = dict(vocab_size=250, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  tie_word_embeddings=False)
    if spread:
        common.update(initializer_range=0.1, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif kind == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            **common, num_local_experts=4, num_experts_per_tok=2))
    elif kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    elif kind == "qwen3-moe":
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            norm_topk_prob=True))
    else:
        if not hasattr(transformers, "GptOssForCausalLM"):
            pytest.skip("this transformers has no gpt-oss")
        inter = 96 if kind.endswith("padded") else 64
        model = transformers.GptOssForCausalLM(transformers.GptOssConfig(
            **{**common, "intermediate_size": inter}, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=sliding_window,
            layer_types=["sliding_attention", "full_attention"]))
    if spread:
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if p.dim() == 1 or pname.endswith(("bias", "sinks")):
                    p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder / "dense", safe_serialization=True)
    if "mxfp4" in kind:
        write_mxfp4_checkpoint(folder / "dense", folder / "mxfp4")
        return folder / "mxfp4"
    return folder / "dense"


@pytest.mark.parametrize("kind", ["llama", "mixtral", "gpt-oss", "gpt-oss-mxfp4",
                                  "gpt-oss-mxfp4-padded", "qwen3", "qwen3-moe"])
def test_a_rank_loads_only_its_rows_of_a_checkpoint(kind, tmp_path):
    """load_weights with a shard (reading its rows through get_slice) gives what shard_weights
    cuts from the whole load, every tensor contiguous."""
    folder = _hf_checkpoint(kind, tmp_path)
    c = ModelConfig.from_pretrained(folder)
    whole = load_weights(folder, c, dtype=torch.float32)
    for r in range(2):
        part = load_weights(folder, c, dtype=torch.float32, shard=Shard(r, 2))
        cut = shard_weights(whole, c, Shard(r, 2))
        assert part.keys() == cut.keys()
        for name in part:
            assert torch.equal(part[name], cut[name]), name
            assert part[name].is_contiguous(), name  # get_slice of a non-leading dim: strided
        assert part["embed"].shape == (125, 64)  # 250 rows: no padding needed at 2


def test_a_rank_reads_slices_not_whole_tensors(tmp_path, monkeypatch):
    """Every split tensor of a Llama checkpoint is read with an index (get_slice), never whole;
    only the replicated norms are."""
    import gnomon.engine.weights as weights

    folder = _hf_checkpoint("llama", tmp_path)
    whole_reads = []
    get = weights._Checkpoint.get

    def spy(self, name, shape, *, uint8=False, index=None):
        if index is None:
            whole_reads.append(name)
        return get(self, name, shape, uint8=uint8, index=index)

    monkeypatch.setattr(weights._Checkpoint, "get", spy)
    load_weights(folder, dtype=torch.float32, shard=Shard(1, 2))
    assert whole_reads and all(n.endswith("norm.weight") for n in whole_reads), whole_reads


def test_mxfp4_intermediate_is_padded_to_whole_scale_blocks():
    """I = 96 is 1.5 scale blocks per rank at TP=2: padded with zero codes to 128, 64 a rank."""
    c = _mxfp4_oss(96)
    assert Shard(0, 2).intermediate(c, mxfp4=True) == 128
    full = random_weights(c, torch.float32)
    E, H = c.num_experts, c.hidden_size
    for r in range(2):
        s = shard_weights(full, c, Shard(r, 2))
        assert s["layers.0.w2"].shape == (E, H, 32) and s["layers.0.w2_scales"].shape == (E, H, 2)
        assert s["layers.0.w13"].shape == (E, 128, H // 2)
    tail = shard_weights(full, c, Shard(1, 2))
    assert not tail["layers.0.w2"][..., 16:].any()  # K 96..127 of rank 1: padding, zero codes
    assert not tail["layers.0.w13"][:, 64:].any()  # interleaved rows of I 96..127: zero codes
    assert not tail["layers.0.w13_bias"][:, 64:].any()


# ---- real ranks --------------------------------------------------------------------------------

def _run(llm):
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=10, temperature=1.0, seed=11, n=2, ignore_eos=True)
    first = [[list(c.token_ids) for c in o.outputs] for o in llm.generate(PROMPTS, greedy)]
    again = [[list(c.token_ids) for c in o.outputs] for o in llm.generate(PROMPTS, greedy)]
    two = [[list(c.token_ids) for c in o.outputs] for o in llm.generate(PROMPTS[:2], sampled)]
    assert llm.num_free_blocks == llm.num_kv_blocks
    return first, again, two, llm.score(PROMPTS)


@pytest.mark.parametrize("name", list(MODELS))
def test_tp2_generates_what_tp1_does(name):
    config = MODELS[name]()
    # a 12-token budget chunks the prompts; room for the longest request and two blocks more
    # cannot hold them all at once: preemption
    longest = max(map(len, PROMPTS)) + 10
    blocks = max_blocks_held(config.kv_cache_groups().windows, longest, block_size=4,
                             max_step_tokens=12) + 2
    kw = dict(random_weights=True, dtype="float32", block_size=4, num_kv_blocks=blocks,
              max_num_batched_tokens=12, max_num_seqs=4)
    assert max(map(len, PROMPTS)) > 12
    one = _run(LLM(config, **kw))
    with LLM(config, tensor_parallel_size=2, **kw) as llm:
        two = _run(llm)
        engine = llm.engine
        assert engine.scheduler.num_preemptions > 0
        assert engine.kv.stats()["hits"] > 0
    assert two[:3] == one[:3]
    assert one[2][0][0] != one[2][0][1]  # the two samples differ: seeded sampling was at work
    torch.testing.assert_close(two[3], one[3], atol=1e-5, rtol=1e-5)
    assert _no_children()


@pytest.mark.parametrize("kind", ["llama", "mixtral", "gpt-oss", "qwen3", "qwen3-moe"])
def test_tp2_matches_transformers(kind, tmp_path):
    """A checkpoint transformers saved, loaded at TP=2, greedy-decodes what transformers does:
    plain, and with chunked prefill and preemption (asserted to happen). Every architecture's
    shards split non-leading dimensions of the file (``o``'s columns; Mixtral's ``w2``;
    gpt-oss's ``gate_up_proj`` / ``down_proj`` and ``gate_up_proj_bias``): strided slices that
    the load must make contiguous."""
    transformers = pytest.importorskip("transformers")
    folder = _hf_checkpoint(kind, tmp_path, spread=True, sliding_window=10)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    want = hf_greedy(hf, PROMPTS, 10)
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)

    def tokens(llm):
        out = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy)]
        assert llm.num_free_blocks == llm.num_kv_blocks
        return out

    with LLM(str(folder), dtype="float32", num_kv_blocks=64, tensor_parallel_size=2) as llm:
        assert tokens(llm) == want
    # a 12-token budget chunks the prompts; room for the longest request and two blocks more
    # cannot hold them all at once: preemption
    config = ModelConfig.from_pretrained(folder)
    blocks = max_blocks_held(config.kv_cache_groups().windows, max(map(len, PROMPTS)) + 10,
                             block_size=4, max_step_tokens=12) + 2
    assert max(map(len, PROMPTS)) > 12
    with LLM(str(folder), dtype="float32", block_size=4, num_kv_blocks=blocks,
             max_num_batched_tokens=12, max_num_seqs=4, tensor_parallel_size=2) as llm:
        assert tokens(llm) == want
        assert llm.engine.scheduler.num_preemptions > 0
    assert _no_children()


@pytest.mark.timing
def test_a_worker_that_raises_is_named(tmp_path):
    raw = preset_json("tiny-llama")
    raw["architectures"] = [ARCHITECTURE]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    models.register(ARCHITECTURE, __name__)
    try:
        llm = LLM(str(tmp_path), random_weights=True, dtype="float32", num_kv_blocks=32,
                  tensor_parallel_size=2)
        greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        assert llm.generate([[1, 2, 3]], greedy)[0].finished  # a healthy step first
        start = time.time()
        with pytest.raises(RuntimeError, match=r"rank 1 failed:(.|\n)*injected failure"):
            llm.generate([[1, POISON, 3]], greedy)
        assert time.time() - start < 30
        llm.close()
    finally:
        models.unregister(ARCHITECTURE)
    assert _no_children()


@pytest.mark.timing
def test_a_dead_worker_is_noticed_before_the_next_step():
    llm = LLM("tiny-llama", random_weights=True, dtype="float32", tensor_parallel_size=2)
    worker = llm.engine.runner.group.processes[0]
    worker.kill()
    worker.join(timeout=10)
    start = time.time()
    with pytest.raises(RuntimeError, match="rank 1 exited with status"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert time.time() - start < 10
    llm.close()
    assert _no_children()


UNGUARDED_SCRIPT = """
from gnomon.engine.llm import LLM

llm = LLM("tiny-llama", random_weights=True, dtype="float32", tensor_parallel_size=2)
"""


@pytest.mark.timing
def test_a_script_without_the_main_guard_fails_at_once_with_a_hint(tmp_path):
    # The spawned worker re-imports the script, which builds an engine of its own: the
    # worker dies before gnomon's code runs. Rank 0 used to wait in the rendezvous for the
    # whole GNOMON_DIST_TIMEOUT_S (300 s); now it names the cause.
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT)
    start = time.time()
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})
    took = time.time() - start
    assert run.returncode != 0
    assert "rank 1 exited with status 1 and sent no error" in run.stderr
    assert 'if __name__ == "__main__":' in run.stderr and str(script) in run.stderr
    assert took < 15, took
    leftover = [pid for pid in os.listdir("/proc") if pid.isdigit()
                and str(script).encode() in _cmdline(pid)]
    assert not leftover


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.mark.timing
def test_a_worker_killed_while_the_group_forms_is_named_at_once(monkeypatch):
    # killed before it reached the store (out of memory, say): rank 0 stops waiting at once
    from gnomon.engine.distributed import WorkerGroup

    wait = WorkerGroup._await_workers

    def kill_then_wait(self, store):
        self.processes[0].kill()
        wait(self, store)

    monkeypatch.setattr(WorkerGroup, "_await_workers", kill_then_wait)
    start = time.time()
    with pytest.raises(RuntimeError, match=r"rank 1 exited with status -9 and sent no error$"):
        LLM("tiny-llama", random_weights=True, dtype="float32", tensor_parallel_size=2)
    assert time.time() - start < 10
    assert _no_children()


def test_torchrun_world_size_must_match(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(ValueError, match="tensor_parallel_size: 2, but torchrun started "
                                         "WORLD_SIZE=3"):
        LLM("tiny-llama", random_weights=True, tensor_parallel_size=2)


TORCHRUN_SCRIPT = """
import json, sys
from gnomon.engine.llm import LLM
from gnomon.engine.sampling_params import SamplingParams

if __name__ == "__main__":
    prompts = json.loads(sys.argv[1])
    with LLM("tiny-llama", random_weights=True, dtype="float32", tensor_parallel_size=2) as llm:
        if llm.is_driver:
            outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0,
                                                        ignore_eos=True))
            print("TOKENS", json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""


def test_torchrun_two_ranks_join_the_group(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(TORCHRUN_SCRIPT)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script), json.dumps(PROMPTS)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [l for l in run.stdout.splitlines() if l.startswith("TOKENS ")]
    assert len(lines) == 1  # rank 0 alone generates
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    want = [list(o.outputs[0].token_ids) for o in
            LLM("tiny-llama", random_weights=True, dtype="float32").generate(PROMPTS, greedy)]
    assert json.loads(lines[0][len("TOKENS "):]) == want


def test_leaving_a_group_puts_back_the_excepthook_so_rank_prefixes_do_not_pile_up(capsys):
    """torch wraps sys.excepthook on joining a group, to prefix each line of a traceback with
    "[rank0]: ", and does not unwrap it on leaving: a process that ran several engines printed
    one prefix per engine."""
    from gnomon.engine.distributed import host_store, init_group, leave_group

    hook = sys.excepthook
    for _ in range(2):
        init_group(0, 1, "cpu", host_store(1))
        try:
            raise ValueError("boom")
        except ValueError:
            sys.excepthook(*sys.exc_info())
        finally:
            leave_group()
        assert sys.excepthook is hook
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert lines and all(line.startswith("[rank0]: ") for line in lines)
    assert not any(line.startswith("[rank0]: [rank0]:") for line in lines)
    assert sum("ValueError: boom" in line for line in lines) == 2
