"""Every `gnomon bench` case but the collectives under pytest-benchmark: the same definitions
as the harness. The ``comm`` suite's cases need their peer ranks in lockstep, which only the
harness drives (`gnomon bench --suite comm`; CI runs it in ``gnomon bench --quick``).

The cases, their inputs and their FLOP and byte counts come from `gnomon.bench` (suites.py and
cases.py), so a figure here and a `gnomon bench` figure for the same key measure the same call
on the same inputs. Shapes are the CPU-scaled ones (the ``--quick`` sizes with
``GNOMON_BENCH_QUICK=1``); each case's ``scaling`` param names what was scaled from the model's
config.

extra_info: the case key and definition hash, FLOPs and bytes per call, the achieved GFLOP/s
and GB/s, and GB/s as a fraction of `memory_bandwidth` (this machine's copy bandwidth, measured
in the same session).
"""

import os

import pytest
import torch

from gnomon.bench import suites

QUICK = os.environ.get("GNOMON_BENCH_QUICK") == "1"
CASES = suites.cases([name for name in suites.SUITES if name != "comm"], "cpu", quick=QUICK)


@pytest.mark.parametrize("case", CASES, ids=[case.key for case in CASES])
def test_case(benchmark, case, memory_bandwidth):
    fn, args = case.build("cpu")
    benchmark.group = case.suite
    with torch.inference_mode():
        benchmark.pedantic(fn, args=args, rounds=20, warmup_rounds=2)
    if benchmark.stats is not None:  # None under --benchmark-disable
        seconds = benchmark.stats.stats.median
        benchmark.extra_info.update(
            key=case.key, definition_hash=case.definition_hash, flops=case.flops,
            bytes=case.bytes, gflop_per_s=case.flops / seconds / 1e9,
            gb_per_s=case.bytes / seconds / 1e9,
            fraction_of_memory_bandwidth=case.bytes / seconds / memory_bandwidth)
