"""Prints each suite's ratio against its named baseline, and any notes, at the end of a
benchmark run."""

RATIOS = {}  # suite -> {implementation: median seconds}
NOTES = []  # lines a benchmark asked to print in the summary


def note(line):
    NOTES.append(line)


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
    for line in NOTES:
        terminalreporter.write_line(line)


import time

import pytest


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
