"""How the engine's per-step cost scales: simulations at benchmark shapes, the work per generated
token as outputs grow, startup, the allocator in an engine-style loop, and the real engine's
host overhead per decode step.

The simulation, startup and engine-overhead cases run `step_scale_cases.py` in a fresh
interpreter (a clean peak RSS per case). With ``GNOMON_BASELINE`` set to a command that runs
Python against another install of gnomon (for example
``GNOMON_BASELINE="env PYTHONPATH=/path/to/old-site /path/to/venv/bin/python"``), each of those
cases also runs there, and the ratio baseline / this goes into extra_info and the summary.

The allocator case drives one engine-style loop (admission with prefix lookups, one token per
running sequence per step, preemption of the newest when a step does not fit, frees) over the
same request stream with gnomon's per-step ``BlockAllocator.step`` and with a plain
pure-Python block manager of the nano-vllm kind (`PyBlockManager`, written here).

Under ``--benchmark-disable`` (CI's smoke run) every case runs once at a small stand-in size.
"""

import json
import os
import shlex
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import pytest

import gnomon
from conftest import note, record
from test_allocator import _requests

CASES_SCRIPT = str(Path(__file__).with_name("step_scale_cases.py"))
LLAMA_70B_MI300X_TP8 = dict(model="llama-3.1-70b", hardware="MI300X", tp=8)
DEEPSEEK_B200_DP8_EP8 = dict(model="deepseek-v3", hardware="B200", tp=1, ep=8, dp=8,
                             engine="trtllm", weight_dtype="fp8", kv_dtype="fp8")


def _smoke(config) -> bool:
    return bool(config.getoption("benchmark_disable"))


def _run_case(python, case, args):
    run = subprocess.run([*python, CASES_SCRIPT, case, json.dumps(args)], capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _measure(benchmark, request, case, args, keys, with_baseline=True):
    """Run `case` here (timed by the benchmark) and, with GNOMON_BASELINE (and
    `with_baseline`), there too; record `keys` of the result and their baseline ratios."""
    result = benchmark.pedantic(_run_case, args=([sys.executable], case, args), rounds=1,
                                iterations=1)
    info = {k: result[k] for k in keys}
    baseline = os.environ.get("GNOMON_BASELINE")
    if baseline and with_baseline:
        old = _run_case(shlex.split(baseline), case, args)
        for k in keys:
            info[f"baseline_{k}"] = old[k]
            if isinstance(result[k], (int, float)) and result[k]:
                info[f"ratio_{k}"] = old[k] / result[k]
    benchmark.extra_info.update(case=case, args=args, **info)
    note(f"step scale {request.node.callspec.id if hasattr(request.node, 'callspec') else case}: "
         + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in info.items()))
    return result


@pytest.mark.parametrize("num_requests", [100, 1500])
def test_simulate_2k_2k_all_at_t0(benchmark, request, num_requests):
    """Llama-3.1-70B on 8 x MI300X, every request 2,048 prompt and 2,048 output tokens, all at
    t=0 (smoke: 8 requests of 128/128). The baseline runs only the 100: the previous contract
    needed more than 15 GB and 4 minutes for the 1,500."""
    if _smoke(request.config):
        args = dict(LLAMA_70B_MI300X_TP8, num_requests=8, input_len=128, output_len=128)
    else:
        args = dict(LLAMA_70B_MI300X_TP8, num_requests=num_requests, input_len=2048,
                    output_len=2048)
    result = _measure(benchmark, request, "simulate", args, ["wall_s", "peak_rss_mb"],
                      with_baseline=num_requests <= 100)
    assert result["returncode"] == 0


def test_simulate_deepseek_dp8_ep8_1k_1k(benchmark, request):
    """DeepSeek-V3 at attention DP 8 x EP 8 on 8 B200 (FP8 weights and KV, TensorRT-LLM's
    profile), 5,120 requests of 1,024 prompt and 1,024 output tokens in a closed loop of 512
    (the MLA issue's goal: 20 s; smoke: 64 requests of 128/128 at 32). No baseline: the
    previous contract had no data parallelism."""
    n, length, c = (64, 128, 32) if _smoke(request.config) else (5120, 1024, 512)
    args = dict(DEEPSEEK_B200_DP8_EP8, num_requests=n, input_len=length, output_len=length,
                concurrency=c)
    result = _measure(benchmark, request, "simulate", args, ["wall_s", "simulate_s"],
                      with_baseline=False)
    assert result["returncode"] == 0


def test_calls_per_token_as_outputs_double(benchmark, request):
    """Python function calls per generated token (cProfile's count, not a clock), 100 requests
    of 2,048 prompt tokens with 1,024 and then 2,048 output tokens (smoke: 4 requests, 64 ->
    128)."""
    n, prompt, out = (4, 64, 64) if _smoke(request.config) else (100, 2048, 1024)
    short = _run_case([sys.executable], "calls_per_token",
                      dict(LLAMA_70B_MI300X_TP8, num_requests=n, input_len=prompt,
                           output_len=out))
    long = _measure(benchmark, request, "calls_per_token",
                    dict(LLAMA_70B_MI300X_TP8, num_requests=n, input_len=prompt,
                         output_len=2 * out), ["calls_per_token"])
    growth = long["calls_per_token"] / short["calls_per_token"]
    benchmark.extra_info.update(calls_per_token_short=short["calls_per_token"], growth=growth)
    note(f"step scale: calls per generated token grow {growth - 1:+.1%} when the output "
         f"doubles ({short['calls_per_token']:.1f} -> {long['calls_per_token']:.1f})")


def test_chat_1000_through_the_cli(benchmark, request):
    """The default chat workload (gpt-oss-120b, MI355X, 8 req/s), 1,000 requests, end to end
    through the CLI entry (smoke: 50)."""
    args = dict(num_requests=50 if _smoke(request.config) else 1000)
    assert _measure(benchmark, request, "simulate", args, ["wall_s"])["returncode"] == 0


def test_startup(benchmark, request):
    """``gnomon simulate --help``, and the imports a simulation needs before its first step."""
    result = _measure(benchmark, request, "startup", {},
                      ["help_s", "simulation_imports_s"])
    assert not result["torch_imported"]


def test_engine_host_overhead_per_decode_step(benchmark, request):
    """The real engine's schedule + input prep + update + outputs per decode step (no forward)
    at batch 256 with 2,048 tokens of context, tiny model (smoke: batch 16, context 128)."""
    args = (dict(batch=16, context=128, decode_steps=8) if _smoke(request.config)
            else dict(batch=256, context=2048, decode_steps=200))
    _measure(benchmark, request, "engine_overhead", args, ["step_us_median", "step_us_p90"])


# --------------------------------------------------------------------------- allocator loop

BLOCK_SIZE = 16


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id):
        self.block_id, self.ref_count, self.hash, self.token_ids = block_id, 0, None, None


class PyBlockManager:
    """A plain pure-Python block manager of the nano-vllm kind, written here: a `Block` object
    per block (ref count, and the hash and token ids of a full block), a deque of free ids, a
    set of used ids, a dict from hash to block id, and a block-id list per sequence. Its policy
    is gnomon's, so that the same loop makes close to the same decisions on both: a prefix hit
    claims whole cached blocks (leaving a token to compute), a full block enters the cache when
    the next step begins (gnomon's commit), a duplicate stays out, and a freed block goes to the
    head of the queue, or to the tail (least recently used first) while it holds cached
    content."""

    def __init__(self, num_blocks, block_size=BLOCK_SIZE):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids = deque(range(num_blocks))
        self.used_block_ids = set()
        self.hash_to_block_id = {}
        self.tables = {}
        self.tokens = {}
        self.sealed = {}  # seq_id -> (full blocks offered to the cache, hash of the last)
        self.pending = []  # sequences whose new full blocks enter the cache next step

    def _take(self):
        block = self.blocks[self.free_block_ids.popleft()]
        if block.hash is not None:
            del self.hash_to_block_id[block.hash]
            block.hash = block.token_ids = None
        block.ref_count = 1
        self.used_block_ids.add(block.block_id)
        return block.block_id

    def _release(self, block_id):
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.used_block_ids.remove(block_id)
            if block.hash is None:
                self.free_block_ids.appendleft(block_id)
            else:
                self.free_block_ids.append(block_id)

    def _seal_full_blocks(self):
        bs = self.block_size
        for seq_id in self.pending:
            if seq_id not in self.tables:
                continue
            table, tokens = self.tables[seq_id], self.tokens[seq_id]
            done, parent = self.sealed[seq_id]
            while (done + 1) * bs <= len(tokens):
                content = tuple(tokens[done * bs:(done + 1) * bs])
                h = hash((parent, content))
                block = self.blocks[table[done]]
                if h not in self.hash_to_block_id and block.hash is None:
                    self.hash_to_block_id[h] = block.block_id
                    block.hash, block.token_ids = h, content
                parent, done = h, done + 1
            self.sealed[seq_id] = (done, parent)
        self.pending = []

    def admit(self, seq_id, tokens):
        self._seal_full_blocks()
        bs = self.block_size
        hits, parent = [], None
        for i in range((len(tokens) - 1) // bs):
            content = tuple(tokens[i * bs:(i + 1) * bs])
            h = hash((parent, content))
            block_id = self.hash_to_block_id.get(h)
            if block_id is None or self.blocks[block_id].token_ids != content:
                break
            hits.append(block_id)
            parent = h
        fresh = -(-len(tokens) // bs) - len(hits)
        if fresh > len(self.free_block_ids) - sum(
                1 for b in hits if self.blocks[b].ref_count == 0):
            return False
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self.free_block_ids.remove(block_id)
                self.used_block_ids.add(block_id)
            block.ref_count += 1
        table = hits + [self._take() for _ in range(fresh)]
        self.tables[seq_id], self.tokens[seq_id] = table, list(tokens)
        self.sealed[seq_id] = (len(hits), parent)
        self.pending.append(seq_id)
        return True

    def decode(self, seq_ids, new_tokens):
        """One token each, in order; stops at the first that does not fit."""
        self._seal_full_blocks()
        bs = self.block_size
        for i, (seq_id, token) in enumerate(zip(seq_ids, new_tokens)):
            tokens, table = self.tokens[seq_id], self.tables[seq_id]
            if len(tokens) == len(table) * bs:
                if not self.free_block_ids:
                    return i
                table.append(self._take())
            tokens.append(token)
            self.pending.append(seq_id)
        return len(seq_ids)

    def free(self, seq_id):
        for block_id in reversed(self.tables.pop(seq_id)):
            self._release(block_id)
        del self.tokens[seq_id], self.sealed[seq_id]

    finish = free


class GnomonSteps:
    """gnomon's allocator driven as an engine does: admission by one `BlockAllocator.admit`
    (lookup and allocate in one pass; the head of the queue, retried after it did not fit,
    without its unchanged prompt, as `gnomon.engine.kv_cache.KVCacheManager.admit` retries it);
    then one `BlockAllocator.step` per engine step that commits everything the previous step
    allocated, frees the finished and allocates the next tokens (one each), returning the
    block-table updates a runner applies. The sequences pass as the lists the loop holds, with
    nothing packed per step."""

    def __init__(self, num_blocks, block_size=BLOCK_SIZE):
        self.allocator = gnomon.BlockAllocator(num_blocks, block_size)
        self.commit_ids, self.finished = [], []
        self.failed = None  # the sequence whose admission last did not fit

    def admit(self, seq_id, tokens):
        retry = seq_id == self.failed
        if self.allocator.admit(seq_id, None if retry else tokens, len(tokens), len(tokens)) < 0:
            self.failed = seq_id
            return False
        self.failed = None
        self.commit_ids.append(seq_id)
        return True

    def decode(self, seq_ids, new_tokens):
        fitted, _updates = self.allocator.step(self.commit_ids, None, self.finished, seq_ids,
                                               new_tokens, 1, 1)
        self.commit_ids = seq_ids if fitted == len(seq_ids) else seq_ids[:fitted]
        self.finished = []
        return fitted

    def free(self, seq_id):  # preemption: the blocks are needed now
        self.allocator.free(seq_id)
        if seq_id in self.commit_ids:
            self.commit_ids.remove(seq_id)

    def finish(self, seq_id):  # freed with the next step's call
        self.finished.append(seq_id)


def _request_stream(num_requests):
    """test_allocator's request stream (shared system prefixes), and tokens to sample."""
    requests, rng = _requests(0, num_requests)
    return requests, rng.integers(0, 32000, 1 << 16).tolist()


def engine_loop(manager, requests, sampled, max_running=48):
    """Admission FCFS up to `max_running`, then one token for every sequence that was running
    before the admissions; when they do not all fit, the newest is preempted (freed and put
    back at the front) and the rest retried; finished sequences are freed. Returns (steps,
    tokens appended, preemptions)."""
    waiting = deque(requests)
    running = {}  # seq_id -> [prompt with outputs so far, outputs left], admission order
    steps = appended = preemptions = k = 0
    while waiting or running:
        steps += 1
        decoding = list(running)
        while waiting and len(running) < max_running:
            seq_id, tokens, outputs = waiting[0]
            if not manager.admit(seq_id, tokens):
                break
            waiting.popleft()
            running[seq_id] = [list(tokens), outputs]  # a copy: the stream is reused
        while decoding:
            tokens = sampled[k:k + len(decoding)]
            k = (k + len(decoding)) % (len(sampled) - 1024)
            fitted = manager.decode(decoding, tokens)
            for seq_id, token in zip(decoding[:fitted], tokens):
                state = running[seq_id]
                state[0].append(token)
                state[1] -= 1
                appended += 1
                if state[1] == 0:
                    manager.finish(seq_id)
                    del running[seq_id]
            if fitted == len(decoding):
                break
            victim = decoding[-1]
            manager.free(victim)
            waiting.appendleft((victim, *running.pop(victim)))
            preemptions += 1
            decoding = decoding[fitted:-1]
    return steps, appended, preemptions


class Timed:
    """Accumulates the seconds spent inside a manager's calls, so the allocator's share of the
    loop (its Python call overhead included) is reported apart from the driver's own work."""

    def __init__(self, manager):
        self.manager, self.seconds = manager, 0.0
        for name in ("admit", "decode", "free", "finish"):
            setattr(self, name, self._timed(getattr(manager, name)))

    def _timed(self, method):
        clock = time.perf_counter

        def call(*args):
            began = clock()
            try:
                return method(*args)
            finally:
                self.seconds += clock() - began
        return call


@pytest.mark.parametrize("manager", [GnomonSteps, PyBlockManager],
                         ids=["gnomon-step", "nano-vllm-kind"])
def test_allocator_engine_loop(benchmark, request, manager):
    num_requests, num_blocks = (40, 300) if _smoke(request.config) else (300, 700)
    requests, sampled = _request_stream(num_requests)
    timed = []

    def run():
        timed.append(Timed(manager(num_blocks)))
        return engine_loop(timed[-1], requests, sampled)

    steps, appended, preemptions = benchmark.pedantic(
        run, rounds=1 if _smoke(request.config) else 7, iterations=1)
    assert appended == sum(out for _, _, out in requests)
    assert preemptions > 0, "the pool must be small enough to preempt"
    inside = sorted(t.seconds for t in timed)[len(timed) // 2]
    ALLOCATOR_SECONDS[request.node.callspec.id] = inside
    record("allocator engine loop", request.node.callspec.id, benchmark)
    benchmark.extra_info.update(steps=steps, tokens=appended, preemptions=preemptions,
                                allocator_us_per_step=inside / steps * 1e6)
    if len(ALLOCATOR_SECONDS) == 2:
        ratio = ALLOCATOR_SECONDS["nano-vllm-kind"] / ALLOCATOR_SECONDS["gnomon-step"]
        benchmark.extra_info["allocator_ratio_vs_nano_vllm_kind"] = ratio
        note(f"allocator engine loop: time inside the allocator calls, nano-vllm kind / "
             f"gnomon step = {ratio:.1f}x")


ALLOCATOR_SECONDS = {}
