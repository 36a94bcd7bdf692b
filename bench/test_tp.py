"""Tensor parallelism on this CPU: what sending each batch to the workers costs, and offline
throughput at TP=2 against TP=1.

- ``test_batch_send``: a TP=2 engine decodes B sequences together (B = 32 and 256) on the
  Llama-shaped 0.3B model of ``bench/test_engine.py`` (random bf16 weights); extra_info holds the
  median time rank 0 spends broadcasting a decode step's `ScheduledBatch` (pickled, through
  ``broadcast_object_list`` over gloo) and that share of the median TP=2 decode step. The goal
  is at most 5%.
- ``test_throughput``: 16 requests (prompts 64-128 tokens, 32 output tokens, greedy) through
  `gnomon.LLM` at TP=1 and at TP=2, every rank on one thread. On 2 cores this records what
  tensor parallelism costs (two processes, two all-reduces per layer); it is not a speed-up.

Under ``--benchmark-disable`` (CI) both run once on tiny-llama with batch 8, as a smoke test.
"""

import numpy as np
import pytest
import torch

from conftest import note, record
from gnomon.engine.config import ModelConfig, preset_json
from gnomon.engine.llm import LLM
from gnomon.engine.sampling_params import SamplingParams

LLAMA_03B = dict(architectures=["LlamaForCausalLM"], hidden_size=1024, num_hidden_layers=16,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=64, vocab_size=32000,
                 intermediate_size=4096, rope_theta=500000.0, rms_norm_eps=1e-5,
                 max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=2,
                 torch_dtype="bfloat16")


def _smoke(config) -> bool:
    return bool(config.getoption("benchmark_disable"))


@pytest.fixture(autouse=True)
def one_thread():
    """Every rank on one thread (the workers take cpu_count / ranks); restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(request) -> ModelConfig:
    raw = preset_json("tiny-llama") if _smoke(request.config) else LLAMA_03B
    return ModelConfig.from_json(dict(raw))


@pytest.mark.parametrize("batch", [32, 256])
def test_batch_send(benchmark, request, batch):
    batch = 8 if _smoke(request.config) else batch
    config = _config(request)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, config.vocab_size, 8).tolist() for _ in range(batch)]
    decode = 4 if _smoke(request.config) else 6
    with LLM(config, random_weights=True, tensor_parallel_size=2, max_num_seqs=batch,
             num_kv_blocks=batch * 2 + 8, max_model_len=64) as llm:
        runner = llm.engine.runner
        steps = []
        original = runner.execute

        def timed(b):
            out = original(b)
            if b.num_decode_tokens == batch and b.num_prefill_tokens == 0:
                steps.append((runner.send_seconds[-1], out.seconds))
            return out

        runner.execute = timed
        params = SamplingParams(max_tokens=decode, temperature=0, ignore_eos=True)
        benchmark.pedantic(llm.generate, args=(prompts, params), rounds=1, iterations=1)
    assert steps, "no step decoded the whole batch"
    send = float(np.median([s for s, _ in steps]))
    step = float(np.median([t for _, t in steps]))
    benchmark.extra_info.update(batch=batch, decode_steps=len(steps), send_us=send * 1e6,
                                step_ms=step * 1e3, send_share=send / step)
    note(f"tp batch send at {batch}: {send * 1e6:.0f} µs = {send / step:.2%} of a "
         f"{step * 1e3:.1f} ms TP=2 decode step")


@pytest.mark.parametrize("tp", [1, 2])
def test_throughput(benchmark, request, tp):
    config = _config(request)
    rng = np.random.default_rng(0)
    n, out = (4, 4) if _smoke(request.config) else (16, 32)
    prompts = [rng.integers(3, config.vocab_size, int(rng.integers(64, 129))).tolist()
               for _ in range(n)]
    with LLM(config, random_weights=True, tensor_parallel_size=tp, max_model_len=256) as llm:
        params = SamplingParams(max_tokens=out, temperature=0, ignore_eos=True)
        benchmark.group = "tp throughput"
        benchmark.pedantic(llm.generate, args=(prompts, params), rounds=1, iterations=1)
    record("tp throughput", f"tp={tp}", benchmark)
    if benchmark.stats is not None:
        benchmark.extra_info.update(tokens=n * out,
                                    tokens_per_s=n * out / benchmark.stats.stats.median)
