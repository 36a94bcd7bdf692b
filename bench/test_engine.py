"""Offline engine throughput against Hugging Face ``generate``, and the engine's per-step overhead.

Models (random bf16 weights, built by transformers and saved as safetensors, so both sides run
the same weights):
  - ``llama-0.3b``: Llama-shaped, hidden 1024, 16 layers, 16 query / 4 KV heads of 64,
    intermediate 4096, vocab 32000 (0.31B parameters);
  - ``gpt-oss-0.3b``: gpt-oss-shaped with the same attention, sinks, biases, alternating
    128-token window and YaRN, and 16 experts of intermediate 256, top 4 (0.31B parameters).
    gnomon runs its experts as MXFP4 (the hub's ``*_blocks`` / ``*_scales``); transformers runs
    the same experts dequantised (exact in bf16);
  - ``llama-small-fp32``: Llama-shaped in float32, hidden 512, 8 layers, 8 query / 2 KV heads
    of 64, intermediate 1536, vocab 8000 (25M parameters): a model so small that the engine's
    per-step host work weighs most, which its "varied-32" case and its per-step overhead show.

Workloads (drawn with seed 0, greedy, ``ignore_eos``): "mixed", 64 requests with prompts of
32-512 tokens and outputs of 16-256; "prefill-heavy", 32 requests with prompts of 512-1024
tokens and outputs of 4-16, where chunked-prefill attention and the GEMMs dominate; "varied-32",
32 requests with prompts of 16-512 tokens and outputs of 16-256. gnomon gets them all at once
through `gnomon.LLM.generate` (continuous batching, chunked prefill, paged KV with room for every
request). The baseline is
transformers' usual static batching: batches of 16 in request order, left-padded to the
batch's longest prompt, each generating until the batch's longest output. Both are timed once
(a pass takes minutes on a small CPU); throughput counts the requested output tokens only, so
the ratio of the two times is the throughput ratio, printed at the end of the run.

Per-step overhead (``test_step_overhead``): 32 requests decoding together on the same model.
Each step's wall time is split into schedule, input prep (the runner's ``overhead``), forward
(its attention, gemm, moe and elementwise time: the model through ``lm_head``), sample, and
update (the scheduler's bookkeeping and the request outputs); the overhead is everything but the
forward. extra_info holds the medians over the steps that
decode all 32 sequences, in µs and as a share of the step.

Under ``--benchmark-disable`` (CI) everything runs once on the tiny test configs with a
smaller workload, as a smoke test of the same code.
"""

import time

import numpy as np
import pytest
import torch

from conftest import note, record
from gnomon.engine.config import ModelConfig, preset_json
from gnomon.engine.kv_cache import max_blocks_held
from gnomon.engine.llm import LLM
from gnomon.engine.sampling_params import SamplingParams

transformers = pytest.importorskip("transformers")

from hf_checkpoints import write_mxfp4_checkpoint  # noqa: E402

HF_BATCH = 16
OVERHEAD_BATCH = 32
FORWARD_FAMILIES = ("attention", "gemm", "moe", "elementwise")

_ATTENTION = dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                  num_key_value_heads=4, head_dim=64, vocab_size=32000, rms_norm_eps=1e-5,
                  max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
                  eos_token_id=2, torch_dtype="bfloat16")
FULL = {
    "llama-0.3b": dict(_ATTENTION, architectures=["LlamaForCausalLM"], intermediate_size=4096,
                       rope_theta=500000.0, hidden_act="silu"),
    "gpt-oss-0.3b": dict(
        _ATTENTION, architectures=["GptOssForCausalLM"], intermediate_size=256,
        num_local_experts=16, num_experts_per_tok=4, experts_per_token=4, sliding_window=128,
        swiglu_limit=7.0, attention_bias=True, rope_theta=150000.0,
        layer_types=["sliding_attention", "full_attention"] * 8,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "original_max_position_embeddings": 128, "truncate": False}),
}
FULL["llama-small-fp32"] = dict(
    _ATTENTION, architectures=["LlamaForCausalLM"], hidden_size=512, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, vocab_size=8000, intermediate_size=1536,
    rope_theta=500000.0, hidden_act="silu", torch_dtype="float32")
SMOKE = {"llama-0.3b": dict(preset_json("tiny-llama"), torch_dtype="bfloat16"),
         "gpt-oss-0.3b": dict(preset_json("tiny-gpt-oss"), torch_dtype="bfloat16"),
         "llama-small-fp32": dict(preset_json("tiny-llama"), torch_dtype="float32")}

# name -> (requests, prompt length range, output length range), ranges inclusive
FULL_WORKLOADS = {"mixed": (64, (32, 512), (16, 256)),
                  "prefill-heavy": (32, (512, 1024), (4, 16)),
                  "varied-32": (32, (16, 512), (16, 256))}
SMOKE_WORKLOADS = {"mixed": (8, (4, 48), (2, 12)), "prefill-heavy": (4, (32, 64), (1, 3)),
                   "varied-32": (4, (4, 32), (2, 8))}


def _smoke(config) -> bool:
    return bool(config.getoption("benchmark_disable"))


def _hf_model(cfg):
    arch = cfg["architectures"][0]
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    kw = {k: v for k, v in cfg.items()
          if k not in ("architectures", "torch_dtype", "quantization_config")}
    torch.manual_seed(0)
    return getattr(transformers, arch)(config_cls(**kw)).to(
        getattr(torch, cfg["torch_dtype"])).eval()


@pytest.fixture(scope="module", params=list(FULL))
def model(request, tmp_path_factory):
    """(name, transformers model, folder gnomon loads) over the same bf16 weights."""
    name = request.param
    cfg = (SMOKE if _smoke(request.config) else FULL)[name]
    hf = _hf_model(cfg)
    folder = tmp_path_factory.mktemp(name)
    hf.save_pretrained(folder / "dense", safe_serialization=True)
    if cfg["architectures"] == ["GptOssForCausalLM"]:
        dequantised = write_mxfp4_checkpoint(folder / "dense", folder / "mxfp4")
        params = dict(hf.named_parameters())
        with torch.no_grad():
            for pname, t in dequantised.items():
                params[pname].copy_(t)
        return name, hf, folder / "mxfp4"
    return name, hf, folder / "dense"


def _workload(config, vocab_size, kind="mixed"):
    n, (p_lo, p_hi), (o_lo, o_hi) = (SMOKE_WORKLOADS if _smoke(config) else FULL_WORKLOADS)[kind]
    rng = np.random.default_rng(0)
    prompt_lens = rng.integers(p_lo, p_hi + 1, n)
    output_lens = rng.integers(o_lo, o_hi + 1, n).tolist()
    prompts = [rng.integers(3, vocab_size, p).tolist() for p in prompt_lens]
    return prompts, output_lens


def _llm(folder, prompts, output_lens, **kw):
    """A gnomon LLM with KV room for every request at once (no preemption), by the engine's
    own arithmetic over its KV-cache groups."""
    config = ModelConfig.from_pretrained(folder)
    windows = config.kv_cache_groups().windows
    blocks = sum(max_blocks_held(windows, len(p) + o, block_size=16,
                                 max_step_tokens=kw.get("max_num_batched_tokens", 8192))
                 for p, o in zip(prompts, output_lens))
    return LLM(str(folder), dtype=config.torch_dtype, block_size=16, num_kv_blocks=blocks + 16,
               max_model_len=max(len(p) + o for p, o in zip(prompts, output_lens)), **kw)


def _greedy(n):
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def _hf_generate(hf, prompts, output_lens):
    """Static batching: left-padded batches of HF_BATCH, each to its longest output."""
    generated = 0
    for i in range(0, len(prompts), HF_BATCH):
        batch = prompts[i:i + HF_BATCH]
        width = max(map(len, batch))
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, p in enumerate(batch):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        new = max(output_lens[i:i + HF_BATCH])
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out.shape == (len(batch), width + new)
        generated += out.shape[0] * new
    return generated


def _record_throughput(benchmark, name, implementation, useful_tokens, computed_tokens=None):
    seconds = benchmark.stats.stats.median if benchmark.stats is not None else None
    benchmark.extra_info["output_tokens"] = useful_tokens
    if computed_tokens is not None:
        benchmark.extra_info["output_tokens_computed"] = computed_tokens
    if seconds:
        benchmark.extra_info["output_tokens_per_s"] = useful_tokens / seconds
        note(f"engine {name}: {implementation} {useful_tokens / seconds:.1f} output tokens/s "
             f"({useful_tokens} tokens in {seconds:.1f} s)")
    record(f"engine throughput {name}", implementation, benchmark)


@pytest.mark.parametrize("workload", list(FULL_WORKLOADS))
def test_throughput_gnomon(benchmark, model, workload, request):
    name, hf, folder = model
    prompts, output_lens = _workload(request.config, hf.config.vocab_size, workload)
    name = f"{name} {workload}"
    llm = _llm(folder, prompts, output_lens)
    params = [_greedy(n) for n in output_lens]
    outs = benchmark.pedantic(llm.generate, args=(prompts, params), rounds=1, iterations=1)
    assert [len(o.outputs[0].token_ids) for o in outs] == output_lens
    assert llm.num_free_blocks == llm.num_kv_blocks
    _record_throughput(benchmark, name, "gnomon", sum(output_lens))


@pytest.mark.parametrize("workload", list(FULL_WORKLOADS))
def test_throughput_hf_generate(benchmark, model, workload, request):
    name, hf, _ = model
    prompts, output_lens = _workload(request.config, hf.config.vocab_size, workload)
    name = f"{name} {workload}"
    computed = benchmark.pedantic(_hf_generate, args=(hf, prompts, output_lens), rounds=1,
                                  iterations=1)
    _record_throughput(benchmark, name, "hf-generate", sum(output_lens), computed)


class StepTimer:
    """Splits each `LLMEngine.step` into schedule, runner phases and update, by putting timing
    proxies in front of this one engine's scheduler and runner (the compiled scheduler's
    methods cannot be replaced on the instance)."""

    def __init__(self, engine):
        self.steps = []
        self._current = None
        timer = self

        def timed(fn, key):
            def wrapper(*args, **kw):
                start = time.perf_counter()
                result = fn(*args, **kw)
                timer._current[key] = time.perf_counter() - start
                if key == "schedule":
                    timer._current["batch"] = result
                elif key == "execute":
                    b = result.breakdown
                    timer._current.update(
                        prepare=b["overhead"], sample=b["sampling"],
                        forward=sum(b[f] for f in FORWARD_FAMILIES))
                return result
            return wrapper

        class Proxy:
            def __init__(self, target, **timed_methods):
                self._target, self._timed = target, timed_methods

            def __getattr__(self, name):
                if name in self._timed:
                    return timed(getattr(self._target, name), self._timed[name])
                return getattr(self._target, name)

        engine.scheduler = Proxy(engine.scheduler, schedule="schedule", update="update")
        engine.runner = Proxy(engine.runner, execute="execute")
        step = engine.step

        def timed_step():
            self._current = {}
            start = time.perf_counter()
            result = step()
            self._current["step"] = time.perf_counter() - start
            self.steps.append(self._current)
            return result

        engine.step = timed_step

    def decode_steps(self, num_seqs):
        return [s for s in self.steps if "batch" in s and s["batch"].num_prefill_tokens == 0
                and s["batch"].num_decode_tokens == num_seqs]


def test_step_overhead(benchmark, model, request):
    """Engine overhead per step with OVERHEAD_BATCH sequences decoding (see the module doc)."""
    name, hf, folder = model
    prompt_len, max_tokens = (8, 8) if _smoke(request.config) else (32, 16)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, hf.config.vocab_size, prompt_len).tolist()
               for _ in range(OVERHEAD_BATCH)]
    llm = _llm(folder, prompts, [max_tokens] * OVERHEAD_BATCH, max_num_seqs=OVERHEAD_BATCH)
    timer = StepTimer(llm.engine)
    benchmark.pedantic(llm.generate, args=(prompts, _greedy(max_tokens)), rounds=1,
                       iterations=1)
    steps = timer.decode_steps(OVERHEAD_BATCH)
    assert len(steps) == max_tokens - 1  # the first token comes with the prefill
    med = {k: float(np.median([s[k] for s in steps]))
           for k in ("step", "schedule", "prepare", "forward", "sample", "update")}
    overhead = float(np.median([s["step"] - s["forward"] for s in steps]))
    info = {f"{k}_us": v * 1e6 for k, v in med.items()}
    info.update(overhead_us=overhead * 1e6, overhead_share=overhead / med["step"],
                decode_steps=len(steps), batch=OVERHEAD_BATCH)
    benchmark.extra_info.update(info)
    note(f"engine {name}: per-step overhead at batch {OVERHEAD_BATCH}: {overhead * 1e6:.0f} µs "
         f"= {100 * overhead / med['step']:.2f}% of a {med['step'] * 1e3:.1f} ms step "
         f"(schedule {info['schedule_us']:.0f}, prepare {info['prepare_us']:.0f}, "
         f"sample {info['sample_us']:.0f}, update {info['update_us']:.0f} µs)")
