"""The statistics of `gnomon dash compare` and `history`, without a database."""

import math
import random

import pytest

from gnomon.dash import stats
from gnomon.dash.history import Point, find_steps


def test_benjamini_hochberg_hand_case():
    # sorted: 0.005 (rank 1), 0.01 (2), 0.03 (3), 0.04 (4); m = 4
    # p*m/rank: 0.02, 0.02, 0.04, 0.04 -> already monotone
    q = stats.benjamini_hochberg([0.01, 0.04, 0.03, 0.005])
    assert q == pytest.approx([0.02, 0.04, 0.04, 0.02])
    # the step-up: a large rank's small ratio pulls the smaller ones down to it
    q = stats.benjamini_hochberg([0.01, 0.02, 0.03, 0.04, 0.05])
    assert q == pytest.approx([0.05] * 5)
    q = stats.benjamini_hochberg([0.001, 0.8, 0.049, 0.3])
    assert q == pytest.approx([0.004, 0.8, 0.098, 0.4])
    assert stats.benjamini_hochberg([]) == []
    assert stats.benjamini_hochberg([0.9, 0.9]) == pytest.approx([0.9, 0.9])


def test_smallest_p_value_of_the_u_test():
    assert stats.min_p_value(3, 3) == pytest.approx(1 / 20)
    assert stats.min_p_value(5, 5) == pytest.approx(1 / 252)
    # the test itself attains it with complete separation
    assert stats.mann_whitney_greater([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(1 / 252)
    assert stats.mann_whitney_greater([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(1.0)


def _runs(level, n, rng, noise=0.01):
    return [level * (1 + rng.gauss(0, noise)) for _ in range(n)]


def test_fewer_than_three_runs_is_ambiguous():
    rng = random.Random(1)
    out = stats.judge({"k": (_runs(100, 2, rng), _runs(150, 8, rng))})
    assert out[0].verdict == stats.AMBIGUOUS and "at least 3 runs" in out[0].note
    out = stats.judge({"k": (_runs(100, 8, rng), _runs(150, 1, rng))})
    assert out[0].verdict == stats.AMBIGUOUS


def test_three_runs_cannot_reach_q_below_001_so_a_big_change_is_ambiguous():
    out = stats.judge({"k": ([100, 101, 102], [150, 151, 152])})
    assert out[0].verdict == stats.AMBIGUOUS and "cannot reach" in out[0].note
    # but a change below the threshold is judged SAME with three runs
    out = stats.judge({"k": ([100, 101, 102], [101, 102, 100.5])})
    assert out[0].verdict == stats.SAME


def test_regression_improvement_and_same():
    rng = random.Random(2)
    evidence = {"slower": (_runs(100, 8, rng), _runs(110, 8, rng)),
                "faster": (_runs(100, 8, rng), _runs(90, 8, rng)),
                "same": (_runs(100, 8, rng), _runs(100, 8, rng)),
                "small": (_runs(100, 8, rng, 0.001), _runs(102, 8, rng, 0.001))}
    verdicts = {v.key: v for v in stats.judge(evidence)}
    assert verdicts["slower"].verdict == stats.REGRESSION
    assert verdicts["slower"].ratio == pytest.approx(1.1, rel=0.02)
    assert verdicts["slower"].q < 0.01
    assert verdicts["faster"].verdict == stats.IMPROVEMENT
    assert verdicts["same"].verdict == stats.SAME
    # significant, but under the 5% threshold
    assert verdicts["small"].verdict == stats.SAME and verdicts["small"].q < 0.01
    # a per-key threshold of 15% turns the 10% regression into SAME
    out = stats.judge({"slower": evidence["slower"]}, thresholds={"slower": 0.15})
    assert out[0].verdict == stats.SAME


def test_bh_bar_makes_few_runs_ambiguous_among_many_keys():
    # 5 runs each: min p = 1/252 = 0.004 < 0.01 alone, but not with 40 null keys beside it
    rng = random.Random(3)
    evidence = {"k": ([100, 101, 102, 103, 104], [150, 151, 152, 153, 154])}
    assert stats.judge(evidence)[0].verdict == stats.REGRESSION
    for i in range(40):
        evidence[f"null{i}"] = (_runs(100, 5, rng), _runs(100, 5, rng))
    out = {v.key: v for v in stats.judge(evidence)}
    assert out["k"].verdict == stats.AMBIGUOUS


def test_compare_false_positive_rate_is_bounded():
    # 200 seeds x 20 keys, no change: BH at 0.01 bounds the chance of any false REGRESSION
    # per comparison by 0.01 (2 of 200 expected at most); the threshold is set to 0 so that
    # only the test guards. Without BH about 18% of comparisons would flag one.
    flagged = 0
    for seed in range(200):
        rng = random.Random(seed)
        evidence = {f"k{i}": (_runs(100, 8, rng, 0.03), _runs(100, 8, rng, 0.03))
                    for i in range(20)}
        if any(v.verdict == stats.REGRESSION for v in stats.judge(evidence, threshold=0.0)):
            flagged += 1
    assert flagged <= 6, flagged


def _series(rng, step_at=None, step=1.10, commits=12, runs=3, commit_noise=0.015,
            run_noise=0.015):
    points = []
    for i in range(commits):
        level = 10_000 * (step if step_at is not None and i >= step_at else 1.0)
        level *= 1 + rng.gauss(0, commit_noise)
        points.append(Point(f"c{i}", i, [level * (1 + rng.gauss(0, run_noise))
                                         for _ in range(runs)]))
    return points


def test_planted_ten_percent_step_is_flagged():
    hits = 0
    for seed in range(200):
        rng = random.Random(seed)
        found = find_steps({"s": _series(rng, step_at=6)}, {"s": 0.05})
        at_six = [c for _, c, _, _ in found if c.index == 6]
        if at_six:
            hits += 1
            assert at_six[0].ratio == pytest.approx(1.10, rel=0.04)
    assert hits >= 196, hits  # power at least 98%


def test_no_step_series_has_a_bounded_false_positive_rate():
    # the noise of the planted-step test, no step: at most 2% of 200 series flag anything
    flagged = 0
    for seed in range(200):
        rng = random.Random(10_000 + seed)
        if find_steps({"s": _series(rng)}, {"s": 0.05}):
            flagged += 1
    assert flagged <= 4, flagged


def test_the_test_alone_bounds_false_steps():
    # threshold 0: only Mann-Whitney, the Bonferroni over splits and BH guard (runs are
    # independent here, as the test assumes); the family-wise rate is at most about 1%
    flagged = 0
    for seed in range(200):
        rng = random.Random(20_000 + seed)
        if find_steps({"s": _series(rng, commit_noise=0.0, run_noise=0.03)}, {"s": 0.0}):
            flagged += 1
    assert flagged <= 4, flagged


def test_a_single_outlier_commit_is_not_a_step():
    rng = random.Random(5)
    points = _series(rng, commit_noise=0.005, run_noise=0.005)
    points[5].medians = [m * 1.3 for m in points[5].medians]  # one slow commit, then back
    assert find_steps({"s": points}, {"s": 0.05}) == []


def test_a_step_at_the_last_two_commits_is_not_yet_reported():
    rng = random.Random(6)
    points = _series(rng, step_at=10, commit_noise=0.005, run_noise=0.005)
    assert find_steps({"s": points}, {"s": 0.05}) == []
    points = _series(rng, step_at=9, commit_noise=0.005, run_noise=0.005)
    assert [c.index for _, c, _, _ in find_steps({"s": points}, {"s": 0.05})] == [9]


def test_a_reverted_regression_is_fixed():
    rng = random.Random(7)
    points = _series(rng, step_at=4, commit_noise=0.005, run_noise=0.005, commits=14)
    for p in points[9:]:
        p.medians = [m / 1.10 for m in p.medians]
    found = find_steps({"s": points}, {"s": 0.05})
    states = {c.index: (state, c.ratio) for _, c, _, state in found}
    assert set(states) == {4, 9}
    assert states[4][0] == "fixed" and states[4][1] > 1
    assert states[9][1] < 1
    assert all(not math.isnan(q) for _, _, q, _ in found)
