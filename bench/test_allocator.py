"""The block allocator on an engine-like trace, against the pure-Python model in the same run.

The trace is recorded once by driving the C++ allocator the way an engine does: requests arrive
sharing system-prompt prefixes, are admitted through lookup + allocate + commit, decode one
token per step through allocate_batch + commit_batch, are preempted (freed and requeued) when
a batch does not fit, and are freed when done. The pool is small enough to force evictions.
Both implementations then replay the identical calls; a replay that diverges fails.

It runs with one KV-cache group (full attention) and with two (full and a 128-token sliding
window, gpt-oss's layout), each its own trace. Reported per implementation and layout
(extra_info): block operations per second, µs per block operation and per engine step. A block
operation is one block allocated, claimed, cached, released by a window or freed.
"""

from collections import deque

import numpy as np
import pytest

import gnomon
from allocator.model import PyBlockAllocator
from conftest import record

BLOCK_SIZE = 16
NUM_BLOCKS = 1024
MAX_RUNNING = 48
NUM_REQUESTS = 300
LAYOUTS = {"one group": (None,), "two groups": (None, 128)}


def _requests(seed=0, num_requests=NUM_REQUESTS):
    """(seq_id, prompt, outputs) per request, prompts sharing six system prefixes; and the
    generator, to draw sampled tokens from."""
    rng = np.random.default_rng(seed)
    system_prompts = [rng.integers(0, 32000, int(rng.integers(200, 800))).tolist() for _ in range(6)]
    requests = []
    for seq_id in range(num_requests):
        prompt = system_prompts[int(rng.integers(0, 6))] + rng.integers(
            0, 32000, int(rng.integers(20, 200))).tolist()
        requests.append((seq_id, prompt, int(rng.integers(32, 160))))
    return requests, rng


def record_trace(groups):
    """(calls, engine steps): calls are (method, args, expected result) in engine order."""
    requests, rng = _requests()
    allocator = gnomon.BlockAllocator(NUM_BLOCKS, BLOCK_SIZE, groups=groups)
    calls = []

    def call(method, *args):
        result = getattr(allocator, method)(*args)
        calls.append((method, args, result))
        return result

    waiting = deque(requests)  # (seq_id, tokens to prefill, outputs left)
    running = {}  # seq_id -> [tokens, outputs left]
    steps = 0
    while waiting or running:
        steps += 1
        decoding = list(running)  # admitted this step sample from their prefill instead
        while waiting and len(running) < MAX_RUNNING:
            seq_id, tokens, outputs = waiting[0]
            cached = call("lookup", tokens)
            if not call("allocate", seq_id, tokens, len(tokens) - cached):
                break
            call("commit", seq_id, len(tokens))
            waiting.popleft()
            running[seq_id] = [tokens, outputs]

        decoded = []
        while decoding:
            sampled = rng.integers(0, 32000, len(decoding))
            ones = np.ones(len(decoding), np.int64)
            fitted = call("allocate_batch", np.array(decoding, np.int64), sampled, ones, ones)
            for seq_id, token in zip(decoding[:fitted], sampled[:fitted].tolist()):
                running[seq_id][0] = running[seq_id][0] + [token]
            decoded += decoding[:fitted]
            if fitted == len(decoding):
                break
            victim = decoding[-1]  # preempt the newest; it is recomputed when readmitted
            call("free", victim)
            waiting.appendleft((victim, *running.pop(victim)))
            decoding = decoding[fitted:-1]
        if decoded:
            call("commit_batch", np.array(decoded, np.int64),
                 np.array([len(running[s][0]) for s in decoded], np.int64))

        for seq_id in decoded:
            running[seq_id][1] -= 1
            if running[seq_id][1] == 0:
                call("free", seq_id)
                del running[seq_id]
    return calls, steps


def replay(allocator, calls):
    for method, args, _ in calls:
        getattr(allocator, method)(*args)


def count_block_ops(calls, groups):
    """Blocks allocated, claimed, cached, released or freed over the trace, read off a counting
    replay."""
    allocator = gnomon.BlockAllocator(NUM_BLOCKS, BLOCK_SIZE, groups=groups)

    def held(seq_ids):
        return sum(int((allocator.block_table(s, g) >= 0).sum())
                   for s in seq_ids if s in allocator for g in range(len(groups)))

    def released():
        return sum(g["released"] for g in allocator.group_stats())

    ops = 0
    for method, args, _ in calls:
        if method == "lookup":
            continue
        seq_ids = args[0].tolist() if method.endswith("_batch") else [args[0]]
        blocks, cached, gone = held(seq_ids), allocator.num_cached_blocks, released()
        getattr(allocator, method)(*args)
        if method.startswith("allocate"):  # fresh blocks taken, and prefix blocks claimed
            ops += held(seq_ids) - blocks
        elif method.startswith("commit"):  # blocks entering the cache, and those released
            ops += allocator.num_cached_blocks - cached + released() - gone
        else:  # free
            ops += blocks
    return ops


@pytest.fixture(scope="module", params=list(LAYOUTS))
def trace(request):
    groups = LAYOUTS[request.param]
    calls, steps = record_trace(groups)
    for implementation in (gnomon.BlockAllocator, PyBlockAllocator):  # both replay it exactly
        allocator = implementation(NUM_BLOCKS, BLOCK_SIZE, groups=groups)
        for method, args, expected in calls:
            assert getattr(allocator, method)(*args) == expected, (implementation, method, args)
        assert allocator.stats()["evictions"] > 0, "the pool must be small enough to evict"
    return request.param, calls, steps, count_block_ops(calls, groups)


@pytest.mark.parametrize("implementation", [gnomon.BlockAllocator, PyBlockAllocator],
                         ids=["gnomon", "python-model"])
def test_allocator_trace(benchmark, trace, implementation):
    layout, calls, steps, block_ops = trace
    groups = LAYOUTS[layout]
    benchmark.group = f"allocator engine trace, {layout}"
    benchmark.pedantic(replay, setup=lambda: ((implementation(NUM_BLOCKS, BLOCK_SIZE,
                                                              groups=groups), calls), {}),
                       rounds=5 if implementation is PyBlockAllocator else 30)
    record(benchmark.group, benchmark.name, benchmark)
    if benchmark.stats is not None:
        seconds = benchmark.stats.stats.median
        benchmark.extra_info.update(
            block_ops=block_ops, engine_steps=steps, calls=len(calls),
            block_ops_per_s=block_ops / seconds, us_per_block_op=seconds / block_ops * 1e6,
            us_per_engine_step=seconds / steps * 1e6)
