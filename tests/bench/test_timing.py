"""The sampler's stopping rule on a fake timer and clock, and exact quantile statistics."""

import itertools
import math
from dataclasses import replace

import pytest

from gnomon.bench import timing
from gnomon.bench.timing import Sampling, quantile, relative_spread, sample, summarize


class FakeClock:
    """Advances by each sample's duration, as a real clock would."""

    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def fake_op(clock, durations):
    source = iter(durations)

    def one_sample():
        value = next(source)
        clock.now += value
        return value

    return one_sample


def test_steady_samples_stop_at_the_minimum_count():
    clock = FakeClock()
    settings = Sampling(min_samples=7, rel_spread=0.05, time_limit_s=10)
    run = sample(fake_op(clock, itertools.repeat(1000)), settings, clock=clock)
    assert run.stopped == "converged" and len(run.samples_ns) == 7
    assert run.rel_spread == 0


def test_noisy_samples_run_until_the_time_limit():
    clock = FakeClock()
    settings = Sampling(min_samples=3, rel_spread=0.05, time_limit_s=1e-5)  # 10 000 ns
    # Alternating 1000 / 2000 ns: IQR / median stays near 0.67, far above 5%.
    run = sample(fake_op(clock, itertools.cycle([1000, 2000])), settings, clock=clock)
    assert run.stopped == "time_limit"
    assert sum(run.samples_ns) >= 10_000 > sum(run.samples_ns[:-1])
    assert run.samples_ns == [1000, 2000] * 3 + [1000]
    assert run.rel_spread > 0.05


def test_spread_that_settles_converges_once_under_the_threshold():
    clock = FakeClock()
    settings = Sampling(min_samples=3, rel_spread=0.2, time_limit_s=10)
    durations = [100, 300, 100] + [100] * 100
    run = sample(fake_op(clock, durations), settings, clock=clock)
    # After n samples (n >= 3) the sorted values are [100]*(n-1) + [300] until the IQR vanishes.
    assert run.stopped == "converged"
    ordered = sorted(run.samples_ns)
    assert relative_spread(ordered) <= 0.2
    assert relative_spread(sorted(run.samples_ns[:-1])) > 0.2 or len(run.samples_ns) == 3


def test_a_wide_case_samples_past_the_time_limit_until_its_median_is_known():
    """With a precision limit the time limit stops a pass only once its median's standard
    error is within rel_precision; else it samples on, to the precision limit at most."""
    durations = [1000, 2000]  # IQR / median stays near 0.67: never converged
    clock = FakeClock()
    settings = Sampling(min_samples=3, rel_spread=0.05, time_limit_s=1e-5, rel_precision=0.05,
                        precision_limit_s=1.0)
    run = sample(fake_op(clock, itertools.cycle(durations)), settings, clock=clock)
    assert run.stopped == "time_limit" and sum(run.samples_ns) > 10_000
    # it stopped at the first sample that made the median precise, past the time limit
    assert timing.median_error(sorted(run.samples_ns)) <= 0.05
    assert timing.median_error(sorted(run.samples_ns[:-1])) > 0.05
    assert len(run.samples_ns) > 100
    # the precision limit ends a pass that never gets there
    clock = FakeClock()
    capped = replace(settings, rel_precision=1e-6, precision_limit_s=1e-4)  # 100 000 ns
    run = sample(fake_op(clock, itertools.cycle(durations)), capped, clock=clock)
    assert run.stopped == "precision_limit"
    assert sum(run.samples_ns) >= 100_000 > sum(run.samples_ns[:-1])
    # without one, the time limit stops it as before
    clock = FakeClock()
    run = sample(fake_op(clock, itertools.cycle(durations)),
                 replace(settings, precision_limit_s=None), clock=clock)
    assert run.stopped == "time_limit" and sum(run.samples_ns[:-1]) < 10_000


def test_the_median_error_is_the_robust_standard_error_of_a_median():
    values = sorted([90.0, 100.0, 100.0, 110.0, 100.0, 95.0, 105.0, 100.0, 100.0])
    iqr = quantile(values, 0.75) - quantile(values, 0.25)
    assert timing.median_error(values) == pytest.approx(
        math.sqrt(math.pi / 2) * iqr / 1.349 / math.sqrt(9) / 100.0)
    assert Sampling(time_limit_s=0.4, precision_limit_s=2.0, rounds=4).per_round() == \
        Sampling(time_limit_s=0.1, precision_limit_s=0.5, rounds=1)
    assert timing.QUICK.precision_limit_s and timing.FULL.precision_limit_s
    with pytest.raises(ValueError, match="precision_limit_s must be None or at least"):
        Sampling(time_limit_s=1.0, precision_limit_s=0.5)
    with pytest.raises(ValueError, match="rel_precision must be positive"):
        Sampling(rel_precision=0)


def test_sample_cap_stops_and_minimum_is_respected():
    clock = FakeClock()
    settings = Sampling(min_samples=2, max_samples=4, rel_spread=1e-9, time_limit_s=10)
    run = sample(fake_op(clock, itertools.cycle([5, 9])), settings, clock=clock)
    assert run.stopped == "max_samples" and len(run.samples_ns) == 4
    with pytest.raises(ValueError, match="min_samples"):
        Sampling(min_samples=0)


def test_a_run_of_rounds_keeps_every_pass_and_splits_the_time_limit():
    settings = Sampling(min_samples=3, time_limit_s=0.4, rounds=4)
    assert settings.per_round() == Sampling(min_samples=3, time_limit_s=0.1, rounds=1)
    clock = FakeClock()
    passes = [sample(fake_op(clock, itertools.repeat(1000 * (i + 1))), settings.per_round(),
                     clock=clock) for i in range(2)]
    run = timing.SampleRun.merged(passes)
    assert run.samples_ns == [1000] * 3 + [2000] * 3
    assert run.stopped == "converged+converged"
    assert run.rel_spread == relative_spread(sorted(run.samples_ns)) == 1000 / 1500
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
            Sampling(rounds=bad)


def test_warm_up_runs_the_minimum_calls_and_syncs():
    calls, syncs = [], []
    clock = FakeClock()

    def call():
        calls.append(1)
        clock.now += 10

    settings = Sampling(warmup_calls=3, warmup_s=1e-7)  # 100 ns: 10 calls of 10 ns
    assert timing.warm_up(call, settings, lambda: syncs.append(1), clock=clock) == 10
    assert len(calls) == 10 and syncs == [1]


def test_quantiles_are_type_7_exact():
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # position q * (n - 1): q1 at 2.25 -> 3.25, median at 4.5 -> 5.5, q3 at 6.75 -> 7.75
    assert summarize(list(reversed(values))) == {
        "count": 10, "min": 1.0, "q1": 3.25, "median": 5.5, "q3": 7.75, "max": 10.0}
    assert summarize([7]) == {"count": 1, "min": 7.0, "q1": 7.0, "median": 7.0, "q3": 7.0,
                              "max": 7.0}
    assert quantile([10, 20], 0.5) == 15.0
    assert relative_spread([1, 2, 3, 4, 5]) == pytest.approx((4 - 2) / 3)
    with pytest.raises(ValueError):
        summarize([])


def test_quantiles_agree_with_numpy():
    numpy = pytest.importorskip("numpy")
    values = [13, 2, 99, 41, 7, 7, 58, 3, 21]
    stats = summarize(values)
    for name, q in (("q1", 25), ("median", 50), ("q3", 75)):
        assert stats[name] == pytest.approx(float(numpy.percentile(values, q)), abs=0)


def test_last_level_cache_size_is_read():
    size, source = timing.last_level_cache_bytes()
    assert size >= 256 << 10
    assert source
    assert timing._parse_size("32768K") == 32 << 20
    assert timing._parse_size("2 MiB") == 2 << 20
    assert timing._parse_size("lots") is None


def test_last_level_cache_fallback_is_stated(monkeypatch):
    monkeypatch.setattr(timing.os, "listdir", lambda path: (_ for _ in ()).throw(OSError()))
    monkeypatch.setattr(timing.subprocess, "run",
                        lambda *a, **k: (_ for _ in ()).throw(OSError()))
    assert timing.last_level_cache_bytes() == (
        timing.FALLBACK_LLC_BYTES, "fallback: cache size unreadable, assumed 256 MiB")
