"""Timing: timers, the adaptive sampler, cold-cache input rotation and the summary statistics.

- A CPU sample is ``time.perf_counter_ns`` around one call. A GPU sample (CUDA, or HIP, which
  torch reports as ``cuda``) is the time between two events recorded on the current stream
  around one call, read after the end event synchronises.
- ``hot`` mode reuses one set of inputs. ``cold`` mode on a CPU rotates through enough copies of
  the inputs that together they exceed twice the last-level cache, so each call finds its inputs
  evicted; on a GPU it writes a buffer of twice the L2 size before each sample, outside the
  timed region.
- The sampler takes samples until the relative spread (IQR / median) falls under a threshold,
  once it has a minimum count, or until the case's time limit or the sample cap is reached,
  and says which of these stopped it. Every raw sample is kept. `QUICK` and `FULL` let the
  time limit stop a case only once its median is known to 2% (its standard error); one whose
  calls scatter widely, a collective on a busy machine, samples on to a longer limit. Such a
  case had stopped at the time limit with 10-180 samples, and its runs' medians scattered by
  6-11% between processes, as much as those few samples' sampling error of the median: the
  samples, not the processes, were most of the noise (`bench/regression_gate.py`'s pools;
  the README gives the figures).
- A run samples each case in ``rounds`` passes over all the cases (asv's rounds), each pass
  with the stopping rule above and its share of the time limit, on inputs built for it; the
  run's samples are the passes' together. A burst of interference on a shared machine
  (another process taking a core for some milliseconds) then falls on one pass of a case
  rather than on every sample the run has of it, and one allocation's placement decides one
  pass, not the run. `QUICK` takes 16 passes, not 4: the passes are independent windows of
  the machine's state (within one run, a collective's quarter-run medians scattered twice as
  much as its whole runs' medians, as four independent windows would), so a run's value is
  as steady as the number of windows it averages. On this 2-core machine, 48 `--quick` runs
  of each, alternated run by run, scattered by 3.5 % instead of 4.9 % over the 18 kernels
  (16 of them lower; the root mean square of each key's standard deviation of the log, the
  runs' common part out) and 4.8 % instead of 5.0 % over the 4 collectives (one all-gather
  6.4 -> 3.7 %, another 5.3 -> 7.2 %); a run took about 15 s instead of 9
  (`bench/regression_gate.py`'s pools; the README gives the gate's figures). `FULL` keeps 4.
  On that machine a pass of a kernel on two threads runs either at its speed or at about
  twice its time throughout (torch's OpenMP threads, spinning after the pass's input building,
  take the vCPU gnomon's helper thread needs); the run's fastest sample comes from the passes
  at speed. Running the runs with ``OMP_WAIT_POLICY=passive`` removed the slow passes but left
  the runs' scatter as it was (48 runs of each, alternated: 3.65 % and 3.76 % over the kernels).
"""

from __future__ import annotations

import bisect
import math
import os
import re
import subprocess
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

FALLBACK_LLC_BYTES = 256 << 20  # when the cache size cannot be read: larger than any CPU's L3
                                # per socket in common use, so cold mode still evicts


@dataclass(frozen=True)
class Sampling:
    """The sampler's settings: stop when IQR / median <= `rel_spread` with at least
    `min_samples`, or after `time_limit_s` of sampling, or at `max_samples`; each of a run's
    `rounds` passes over the cases samples by that rule with ``time_limit_s / rounds``.

    With `precision_limit_s`, the time limit stops a pass only once its median is known to
    `rel_precision` (`median_error`); a pass whose median is not goes on until it is, or
    until `precision_limit_s` (split over the rounds as the time limit is). A case whose calls
    scatter widely (a collective, which ends when the later of its ranks arrives) would
    otherwise stop at the time limit with a few samples, and its run's median would scatter
    between runs by its sampling error alone."""

    min_samples: int = 20
    max_samples: int = 100_000
    rel_spread: float = 0.05
    time_limit_s: float = 1.0
    warmup_calls: int = 2
    warmup_s: float = 0.05
    rounds: int = 1
    rel_precision: float = 0.02
    precision_limit_s: Optional[float] = None

    def __post_init__(self):
        if self.min_samples < 1 or self.max_samples < self.min_samples:
            raise ValueError(f"Sampling: need 1 <= min_samples <= max_samples, got "
                             f"{self.min_samples}, {self.max_samples}")
        if not self.rel_spread > 0 or not self.time_limit_s > 0 or not self.rel_precision > 0:
            raise ValueError("Sampling: rel_spread, time_limit_s and rel_precision must be "
                             "positive")
        if self.precision_limit_s is not None and not self.precision_limit_s >= self.time_limit_s:
            raise ValueError(f"Sampling: precision_limit_s must be None or at least "
                             f"time_limit_s ({self.time_limit_s}), got {self.precision_limit_s}")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"Sampling: rounds must be an integer >= 1, got {self.rounds!r}")

    def per_round(self) -> "Sampling":
        """The rule of one of the `rounds` passes: its share of the time limits."""
        extended = self.precision_limit_s
        return replace(self, time_limit_s=self.time_limit_s / self.rounds, rounds=1,
                       precision_limit_s=None if extended is None else extended / self.rounds)


FULL = Sampling(rounds=4, precision_limit_s=10.0)
QUICK = Sampling(min_samples=10, max_samples=2000, rel_spread=0.05, time_limit_s=0.15,
                 warmup_calls=2, warmup_s=0.005, rounds=16, precision_limit_s=1.5)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of already-sorted values by linear interpolation between order statistics
    (numpy's default, Hyndman & Fan type 7): position ``q * (n - 1)``."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("quantile of no values")
    position = q * (n - 1)
    low = math.floor(position)
    high = min(low + 1, n - 1)
    fraction = position - low
    return float(sorted_values[low]) + (float(sorted_values[high]) -
                                        float(sorted_values[low])) * fraction


def summarize(samples: Sequence[int]) -> Dict[str, float]:
    """count, min, q1, median, q3 and max of the samples (type-7 quantiles)."""
    values = sorted(samples)
    if not values:
        raise ValueError("no samples to summarise")
    return {"count": len(values), "min": float(values[0]), "q1": quantile(values, 0.25),
            "median": quantile(values, 0.5), "q3": quantile(values, 0.75),
            "max": float(values[-1])}


def relative_spread(sorted_values: Sequence[float]) -> float:
    """(q3 - q1) / median of sorted values; inf for a zero median."""
    median = quantile(sorted_values, 0.5)
    if median <= 0:
        return math.inf
    return (quantile(sorted_values, 0.75) - quantile(sorted_values, 0.25)) / median


def median_error(sorted_values: Sequence[float]) -> float:
    """The standard error of the sorted values' median over the median: the large-sample
    ``sqrt(pi / 2) sigma / sqrt(n)`` of a median, with sigma estimated robustly as
    IQR / 1.349 (so 0.929 IQR / sqrt(n))."""
    return math.sqrt(math.pi / 2) / 1.349 * relative_spread(sorted_values) \
        / math.sqrt(len(sorted_values))


@dataclass
class SampleRun:
    samples_ns: List[int]
    stopped: str  # "converged", "time_limit" or "max_samples"; passes: theirs, by "+"
    rel_spread: float

    @staticmethod
    def merged(passes: Sequence["SampleRun"]) -> "SampleRun":
        """One run's samples from its `Sampling.rounds` passes, in the order taken."""
        samples = [s for p in passes for s in p.samples_ns]
        return SampleRun(samples, "+".join(p.stopped for p in passes),
                         relative_spread(sorted(samples)))


def sample(one_sample: Callable[[], int], settings: Sampling,
           clock: Callable[[], int] = time.perf_counter_ns) -> SampleRun:
    """Calls `one_sample` (which runs the op once and returns its duration in ns) until the
    stopping rule holds. `clock` (ns) measures the time limit; tests inject a fake one."""
    samples: List[int] = []
    ordered: List[int] = []
    start = clock()
    limit_ns = settings.time_limit_s * 1e9
    while True:
        duration = int(one_sample())
        samples.append(duration)
        bisect.insort(ordered, duration)
        spread = relative_spread(ordered)
        if len(samples) >= settings.min_samples and spread <= settings.rel_spread:
            return SampleRun(samples, "converged", spread)
        if len(samples) >= settings.max_samples:
            return SampleRun(samples, "max_samples", spread)
        elapsed = clock() - start
        if elapsed >= limit_ns:
            if settings.precision_limit_s is None \
                    or median_error(ordered) <= settings.rel_precision:
                return SampleRun(samples, "time_limit", spread)
            if elapsed >= settings.precision_limit_s * 1e9:
                return SampleRun(samples, "precision_limit", spread)


def warm_up(call: Callable[[], Any], settings: Sampling, sync: Callable[[], None],
            clock: Callable[[], int] = time.perf_counter_ns) -> int:
    """At least `warmup_calls` calls and at least `warmup_s` seconds (capped at 100 calls
    past the minimum); returns the number of calls."""
    start, calls = clock(), 0
    while calls < settings.warmup_calls or (clock() - start < settings.warmup_s * 1e9
                                            and calls < settings.warmup_calls + 100):
        call()
        calls += 1
    sync()
    return calls


# --- caches -----------------------------------------------------------------------------------

def _parse_size(text: str) -> Optional[int]:
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.I)
    if not match:
        return None
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2).upper()]


def last_level_cache_bytes() -> tuple:
    """``(bytes, source)`` of the CPU's last-level cache: the highest-level data or unified
    cache in /sys/devices/system/cpu/cpu0/cache, else ``lscpu -B``'s L3/L2 line, else
    FALLBACK_LLC_BYTES (256 MiB) with a source that says so."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            with open(f"{base}/{entry}/type") as f:
                kind = f.read().strip()
            with open(f"{base}/{entry}/level") as f:
                level = int(f.read())
            with open(f"{base}/{entry}/size") as f:
                size = _parse_size(f.read())
            if kind != "Instruction" and size and (best is None or level > best[0]):
                best = (level, size)
    except (OSError, ValueError):
        best = None
    if best:
        return best[1], f"{base} (L{best[0]})"
    try:
        text = subprocess.run(["lscpu", "-B"], capture_output=True, text=True, timeout=5).stdout
        for level in ("L3", "L2"):
            match = re.search(rf"^{level} cache:\s+(\d+)", text, re.M)
            if match:
                return int(match.group(1)), f"lscpu ({level}, all instances)"
    except (OSError, subprocess.SubprocessError):
        pass
    return FALLBACK_LLC_BYTES, "fallback: cache size unreadable, assumed 256 MiB"


# --- timers -----------------------------------------------------------------------------------

class CpuTimer:
    """perf_counter_ns around one call; `cold` rotates input sets (chosen by the caller)."""

    device = "cpu"

    def sync(self) -> None:
        pass

    def time_call(self, call: Callable[[], Any]) -> int:
        start = time.perf_counter_ns()
        call()
        return time.perf_counter_ns() - start


class GpuTimer:
    """CUDA/HIP events around one call on the current stream. With `flush_bytes`, writes a
    buffer that large before each sample (outside the events) to evict L2."""

    def __init__(self, device: str = "cuda", flush_bytes: int = 0):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device 'cuda': torch sees no CUDA or HIP GPU on this machine "
                             "(accepted here: cpu)")
        self.torch = torch
        self.device = device
        self.flush = (torch.empty(flush_bytes // 4, dtype=torch.float32, device="cuda")
                      if flush_bytes else None)
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def time_call(self, call: Callable[[], Any]) -> int:
        if self.flush is not None:
            self.flush.zero_()
        self.start.record()
        call()
        self.end.record()
        self.end.synchronize()
        return int(round(self.start.elapsed_time(self.end) * 1e6))  # ms -> ns


def gpu_l2_bytes() -> int:
    import torch

    return int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                       "L2_cache_size", 0)) or (256 << 20)
