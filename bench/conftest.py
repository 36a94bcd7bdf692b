"""Prints each suite's ratio against its named baseline, and any notes, at the end of a
benchmark run."""

RATIOS = {}  # suite -> {implementation: median seconds}
NOTES = []  # lines a benchmark asked to print in the summary
SPEEDUPS = []  # (suite, implementation, baseline, goal): summary lines asked for by `speedup`


def note(line):
    NOTES.append(line)


def speedup(suite, implementation, baseline, goal=None):
    """Asks the summary for one line: `implementation`'s speed in `suite` as a multiple of
    `baseline`'s (both `record`ed in the same run), and whether it meets `goal` (a multiple)
    where one is given. Printed only when both were timed."""
    entry = (suite, implementation, baseline, goal)
    if entry not in SPEEDUPS:
        SPEEDUPS.append(entry)


def record(suite, implementation, benchmark):
    if benchmark.stats is not None:  # None under --benchmark-disable
        RATIOS.setdefault(suite, {})[implementation] = benchmark.stats.stats.median


def pytest_terminal_summary(terminalreporter):
    for suite, medians in RATIOS.items():
        if len(medians) < 2:
            continue
        fastest = min(medians, key=medians.get)
        parts = ", ".join(f"{impl} {medians[impl] / medians[fastest]:.1f}x"
                          for impl in sorted(medians, key=medians.get))
        terminalreporter.write_line(f"{suite}: median time relative to {fastest}: {parts}")
    for suite, implementation, baseline, goal in SPEEDUPS:
        medians = RATIOS.get(suite, {})
        if implementation not in medians or baseline not in medians:
            continue
        ratio = medians[baseline] / medians[implementation]
        verdict = ""
        if goal is not None:
            verdict = f" (goal >= {goal:g}x: {'met' if ratio >= goal else 'NOT met'})"
        terminalreporter.write_line(f"{suite}: {implementation} {ratio:.2f}x the speed of "
                                    f"{baseline}{verdict}")
    for line in NOTES:
        terminalreporter.write_line(line)


import time

import pytest


SETTLE_SECONDS = 0.03


def paired_speedup(suite, implementation, call, baseline, baseline_call, pairs, goal=None):
    """Times `call` and `baseline_call` in alternation, `pairs` times (each pair in the opposite
    order to the one before), and notes the median over pairs of baseline time / call time,
    with its quartiles. This VM's speed drifts by up to ~2.5x from one few-second stretch to the
    next (a busy neighbour on the host core); two calls timed back to back see the same machine,
    so their ratio holds where the ratio of two separately timed medians does not. Each call
    starts after SETTLE_SECONDS of busy waiting: torch's OpenMP workers spin for several ms after
    a parallel region (gnomon's pool waits on a condition variable), and a gnomon call right
    after a torch one would share its cores with them; a sleep instead lets the core idle, and
    the first call after it measured slower by a varying amount."""
    ratios = []
    for i in range(pairs):
        order = [(implementation, call), (baseline, baseline_call)]
        if i % 2:
            order.reverse()
        times = {}
        for name, fn in order:
            start = time.perf_counter()
            while time.perf_counter() - start < SETTLE_SECONDS:
                pass
            start = time.perf_counter()
            fn()
            times[name] = time.perf_counter() - start
        ratios.append(times[baseline] / times[implementation])
    ratios.sort()
    median = ratios[len(ratios) // 2]
    verdict = ""
    if goal is not None:
        verdict = f" (goal >= {goal:g}x: {'met' if median >= goal else 'NOT met'})"
    note(f"{suite}: paired, {implementation} {median:.2f}x the speed of {baseline} (quartiles "
         f"{ratios[len(ratios) // 4]:.2f}-{ratios[3 * len(ratios) // 4]:.2f}x over {pairs} "
         f"back-to-back pair{'s' if pairs > 1 else ''}){verdict}")
    return median


@pytest.fixture(scope="session")
def benchmarks_enabled(request):
    """False under --benchmark-disable (each benchmark then runs once): set-up that only
    timing needs, such as weight copies that outgrow the cache, can be skipped."""
    session = getattr(request.config, "_benchmarksession", None)
    return session is None or not session.disabled


@pytest.fixture(scope="session")
def memory_bandwidth():
    """This machine's copy bandwidth in bytes/s (read + write), measured once per session with
    torch's copy of a 256 MiB buffer; the best of 5 runs. Memory-bound cases report a fraction
    of it."""
    import torch

    src = torch.ones(64 * 1024 * 1024, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best
