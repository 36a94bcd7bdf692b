"""The comm suite: the engine's collectives timed over a real two-rank gloo group, in lockstep."""

import multiprocessing
import time

import pytest
from rich.console import Console

from gnomon.bench import report, results, runner, suites, timing
from gnomon.bench.comm import CommGroup
from gnomon.costing import ring_bytes

SHA = "0123456789abcdef0123456789abcdef01234567"
FAST = timing.Sampling(min_samples=3, max_samples=30, time_limit_s=0.05, warmup_calls=1,
                       warmup_s=0)


def _no_children():
    deadline = time.time() + 10
    while multiprocessing.active_children() and time.time() < deadline:
        time.sleep(0.1)
    return not multiprocessing.active_children()


def _case(op, **params):
    return next(c for c in suites.cases(["comm"], "cpu") if c.op == op
                and all(c.p[k] == v for k, v in params.items()))


def test_comm_cases_are_the_engines_messages_and_count_ring_bytes():
    cpu = suites.cases(["comm"], "cpu")
    assert {c.op for c in cpu} == {"all_reduce", "all_gather"}
    assert all(c.p["world"] == 2 for c in cpu)
    reduce = _case("all_reduce", model="llama-3.1-8b", tokens=256)
    assert reduce.bytes == 2 * (1 / 2) * 256 * 4096 * 4  # float32 hidden states
    gather = _case("all_gather", model="llama-3.1-8b", rows=32)
    assert gather.bytes == (1 / 2) * 32 * 128256 * 4  # float32 logits, gathered
    assert reduce.flops == gather.flops == 0
    gpu = suites.cases(["comm"], "cuda")
    assert {c.d.get("act") for c in gpu if c.op == "all_reduce"} == {"bfloat16"}
    assert max(c.p["tokens"] for c in gpu if c.op == "all_reduce") == 8192
    assert ring_bytes("all_gather", 100, 4) == 75 and ring_bytes("all_reduce", 100, 4) == 150


def test_a_sweep_times_every_case_over_two_ranks_and_leaves_no_children():
    doc = runner.run_bench(["comm"], quick=True, commit=SHA, settings=FAST)
    results.validate(doc)
    cases = doc["runs"][0]["cases"]
    assert [c["key"] for c in cases] == [c.key for c in suites.cases(["comm"], "cpu", True)]
    for case in cases:
        # the sampler's rule, unchanged: min_samples, unless the time limit came first
        assert case["stats"]["count"] >= FAST.min_samples or \
            case["sampling"]["stopped"] == "time_limit"
        assert case["stats"]["count"] == len(case["samples_ns"]) and case["stats"]["min"] > 0
        assert case["gbps"] == pytest.approx(case["bytes"] / case["stats"]["median"])
        assert case["fraction_of_peak"] == {"compute": None, "memory": None}  # no link peak
    console = Console(width=400, record=True)
    console.print(report.table(doc))
    rows = [line for line in console.export_text().splitlines() if "comm/" in line]
    assert len(rows) == len(cases) and not any("%" in row for row in rows)  # not HBM's peak
    assert _no_children()


def test_every_rank_takes_part_in_the_timed_collective():
    gather = _case("all_gather", model="llama-3.1-8b", rows=1)
    group = CommGroup([gather], "cpu")
    try:
        fn, args = gather.build("cpu")
        with group.session(gather):
            for _ in range(3):
                group.before_sample()
                out = fn(*args)
        half = gather.p["vocab"] // 2
        assert out.shape == (1, gather.p["vocab"])
        assert (out[:, :half] == 1).all() and (out[:, half:] == 2).all()  # rank r sends r + 1
    finally:
        group.close()
    assert _no_children()


@pytest.mark.timing
def test_a_dead_worker_is_named_not_waited_for():
    reduce = _case("all_reduce", model="llama-3.1-8b", tokens=1)
    group = CommGroup([reduce], "cpu")
    worker = group.group.processes[0]
    worker.kill()
    worker.join(timeout=10)
    start = time.time()
    with pytest.raises(RuntimeError, match="rank 1 exited with status -9"):
        with group.session(reduce):
            pass
    assert time.time() - start < 10
    group.close()
    assert _no_children()


def test_refused_under_torchrun(monkeypatch):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="outside torchrun"):
        CommGroup([_case("all_reduce", tokens=1, model="llama-3.1-8b")], "cpu")


def test_a_case_outside_a_group_says_what_it_needs():
    with pytest.raises(RuntimeError, match="process group of 2 ranks"):
        _case("all_reduce", tokens=1, model="llama-3.1-8b").build("cpu")
