"""Prints each suite's ratio against its named baseline at the end of a benchmark run."""

RATIOS = {}  # suite -> {implementation: median seconds}


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
