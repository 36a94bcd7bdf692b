"""The terminal side of `gnomon bench`: a rich progress bar and the results table."""

from __future__ import annotations

import contextlib
import statistics
from typing import Any, Dict, Iterator, List

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from gnomon.bench.cases import bandwidth_peak


@contextlib.contextmanager
def progress_bar(console: Console) -> Iterator:
    """Yields a callback for `run_bench(progress=...)` that drives a rich progress bar."""
    with Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.description}"), console=console,
                  transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, key: str) -> None:
            bar.update(task, completed=done, total=total, description=escape(key))

        yield update


def _time(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


ABOVE_PEAK = "(!)"
ABOVE_PEAK_NOTE = (f"{ABOVE_PEAK} above 100% of its peak: no case can beat the machine's "
                   "limit, so the peak it is taken against is suspect (measured too low, for "
                   "instance under load); that figure is not a fraction of the machine's limit")


def _fraction(value) -> str:
    """A fraction of peak as a percentage; one above 100% carries the ABOVE_PEAK mark."""
    if value is None:
        return "—"
    return f"{100 * value:.1f}% {ABOVE_PEAK}" if value > 1 else f"{100 * value:.1f}%"


def table(doc: Dict[str, Any]) -> Table:
    """One row per case. With several runs: the median of the runs' medians, and the median of
    their IQRs; rates from that median."""
    runs = doc["runs"]
    peaks = doc["peaks"]
    machine = doc["machine"]
    title = (f"gnomon bench · {machine.get('gpu_name') or machine['cpu_model']} · "
             f"{machine['device']} · mode {doc['mode']} · commit {doc['commit'][:12]}")
    tflops_peaks = ", ".join(f"{k} {v:.3g}" for k, v in peaks.get("tflops", {}).items())
    memory = peaks.get("memory_gbps")
    caption = (f"peaks: memory {memory:.3g} GB/s; TFLOP/s {tflops_peaks or 'none'} "
               f"({peaks.get('source', '')})" if memory else
               f"peaks: {peaks.get('source', 'none')}")
    units = peaks.get("vector_units")
    if units:
        rates = ", ".join(f"{k} {v:.3g}" for k, v in units["tflops"].items())
        caption += f"\nvector units ({units['kernel_isa']}, {units['source']}): TFLOP/s {rates}"
    implausible = peaks.get("implausible") or {}
    if implausible:
        caption += "\nnot used as peaks (no % peak compute against them): " + "; ".join(
            f"{dtype} {why}" for dtype, why in implausible.items())
    if len(runs) > 1:
        caption += f"\n{len(runs)} runs: median of run medians, median of run IQRs"
    out = Table(title=title, caption=caption, caption_justify="left")
    for name, justify in (("key", "left"), ("n", "right"), ("median", "right"),
                          ("IQR", "right"), ("TFLOP/s", "right"), ("GB/s", "right"),
                          ("% peak compute", "right"), ("% peak memory", "right")):
        out.add_column(name, justify=justify, overflow="fold")
    above = False
    by_key: Dict[str, List[Dict[str, Any]]] = {}
    for run in runs:
        for case in run["cases"]:
            by_key.setdefault(case["key"], []).append(case)
    for key, cases in by_key.items():
        median = statistics.median(c["stats"]["median"] for c in cases)
        iqr = statistics.median(c["stats"]["q3"] - c["stats"]["q1"] for c in cases)
        first = cases[0]
        tflops = first["flops"] / median / 1e3 if median else 0.0
        gbps = first["bytes"] / median if median else 0.0
        compute_peak = peaks.get("tflops", {}).get(first.get("compute_dtype", ""))
        compute = tflops / compute_peak if first["flops"] and compute_peak else None
        bandwidth = bandwidth_peak(first["op"], peaks)
        mem = gbps / bandwidth if first["bytes"] and bandwidth else None
        count = sum(c["stats"]["count"] for c in cases)
        above = above or any(f is not None and f > 1 for f in (compute, mem))
        out.add_row(Text(key), str(count), _time(median), _time(iqr),
                    f"{tflops:.3g}" if first["flops"] else "—", f"{gbps:.3g}",
                    _fraction(compute), _fraction(mem))
    if above:
        out.caption = f"{out.caption}\n{ABOVE_PEAK_NOTE}"
    return out


def print_table(doc: Dict[str, Any]) -> None:
    """Prints the table to stdout; to a file or pipe at a width that keeps keys whole."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=240)
    console.print(table(doc))
