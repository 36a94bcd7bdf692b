"""The statistics of `gnomon dash compare` and `history`, without a database."""

import math
import random
import re

import numpy as np
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


def test_the_u_test_of_history_attains_its_floor():
    # history's step search keeps the rank test: complete separation gives 1 / C(10, 5)
    assert stats.mann_whitney_greater([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(1 / 252)
    assert stats.mann_whitney_greater([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(1.0)


def _runs(level, n, rng, noise=0.01):
    return [level * (1 + rng.gauss(0, noise)) for _ in range(n)]


def test_one_run_each_without_history_is_ambiguous():
    out = stats.judge({"k": ([100.0], [150.0])})
    assert out[0].verdict == stats.AMBIGUOUS and "cannot measure the noise" in out[0].note
    # a change within the threshold needs no noise model to be SAME
    assert stats.judge({"k": ([100.0], [101.0])})[0].verdict == stats.SAME


def test_three_runs_judge_a_change_many_times_the_noise():
    out = stats.judge({"k": ([100, 101, 102], [150, 151, 152])})
    assert out[0].verdict == stats.REGRESSION and out[0].q < 1e-4
    assert out[0].ratio == pytest.approx(1.4951, rel=1e-3)  # the geometric-mean ratio
    out = stats.judge({"k": ([100, 101, 102], [101, 102, 100.5])})
    assert out[0].verdict == stats.SAME


def test_noise_prior_recovers_the_distribution_of_the_keys_noise():
    # 400 keys whose true variances are drawn from a scaled inverse chi-square on 8 degrees
    # of freedom about 0.01^2, each observed on 4 degrees of freedom (3 runs a side)
    rng = np.random.default_rng(0)
    true = 8 * 0.01 ** 2 / rng.chisquare(8, 400)
    observed = true * rng.chisquare(4, 400) / 4
    d0, s02 = stats.noise_prior(observed, [4] * 400)
    assert 6 < d0 < 10 and math.sqrt(s02) == pytest.approx(0.01, rel=0.1)
    # one true variance for every key: the observed scatter is all chance, d0 is large
    d0, s02 = stats.noise_prior(0.01 ** 2 * rng.chisquare(4, 400) / 4, [4] * 400)
    assert d0 > 20 and math.sqrt(s02) == pytest.approx(0.01, rel=0.05)
    # fewer than three keys with a variance: no prior
    assert stats.noise_prior([1e-4, 0.0, 2e-4], [4, 4, 0]) == (0.0, 0.0)


def test_the_other_keys_lend_a_key_the_degrees_of_freedom_three_runs_lack():
    # 22 keys of 7% run noise, 3 runs a side, one slowed 1.5x: on its own 4 degrees of freedom
    # the key cannot pass Benjamini-Hochberg over 22 keys; moderated across them it does
    for seed in (0, 1, 2, 3, 5):
        rng = random.Random(seed)
        evidence = {f"k{i:02d}": ([100 * math.exp(rng.gauss(0, 0.07)) for _ in range(3)],
                                  [100 * math.exp(rng.gauss(0, 0.07)) * (1.5 if i == 0 else 1)
                                   for _ in range(3)]) for i in range(22)}
        alone = stats.t_test(*evidence["k00"], margin=math.log1p(stats.DEFAULT_THRESHOLD))
        assert alone[1] * 22 > stats.ALPHA
        verdicts = {v.key: v.verdict for v in stats.judge(evidence)}
        assert verdicts.pop("k00") == stats.REGRESSION
        assert set(verdicts.values()) <= {stats.SAME, stats.AMBIGUOUS}


def test_history_is_the_noise_model_of_a_single_run():
    rng = random.Random(4)
    past = _runs(100, 8, rng)
    out = stats.judge({"k": (_runs(100, 1, rng), [150.0])}, history={"k": past})
    assert out[0].verdict == stats.REGRESSION and out[0].history_runs == 8
    out = stats.judge({"k": (_runs(100, 1, rng), [110.0])}, history={"k": past})
    assert out[0].verdict == stats.REGRESSION  # 10%, ten times the 1% run noise
    out = stats.judge({"k": (_runs(100, 1, rng), [100.5])}, history={"k": past})
    assert out[0].verdict == stats.SAME


def test_a_history_the_base_moved_away_from_is_left_out():
    # the base sits 20% above its history (a step nobody recorded): with it the base's level
    # would read 1.18x too low and this unchanged head a regression
    rng = random.Random(5)
    past, base, head = _runs(100, 8, rng), _runs(120, 3, rng), _runs(120, 3, rng)
    assert stats.level_history(past, base, 0.05) == ()
    out = stats.judge({"k": (base, head)}, history={"k": past})
    assert out[0].verdict == stats.SAME and out[0].history_runs == 0
    assert stats.level_history(past, _runs(100, 3, rng), 0.05) == past


def test_a_slow_base_run_does_not_hide_a_slow_head():
    # the base's one run fell into a state 1.5x slower; the head is 1.5x slower for real: the
    # history is left out (the base moved from it), and one run a side cannot say SAME
    rng = random.Random(7)
    past = _runs(100, 16, rng)
    out = stats.judge({"k": ([150.0], [150.5])}, history={"k": past})[0]
    assert out.verdict == stats.AMBIGUOUS and out.history_runs == 0
    assert "moved from its 16 runs of history" in out.note
    # with the base at its history's level, the same head is a regression
    out = stats.judge({"k": ([100.2], [150.5])}, history={"k": past})[0]
    assert out.verdict == stats.REGRESSION and out.history_runs == 16


def test_a_change_within_a_keys_noise_is_ambiguous_and_named():
    # +12% with runs scattered by 10%: beyond the threshold, not beyond the noise
    out = stats.judge({"noisy": ([100, 110, 90], [112, 124, 100])})
    assert out[0].ratio == pytest.approx(1.1194, rel=1e-3)
    assert out[0].verdict == stats.AMBIGUOUS and out[0].q > stats.ALPHA
    assert "within this key's noise" in out[0].note and "record more runs" in out[0].note


def test_an_ambiguous_note_gives_the_change_its_runs_would_confirm():
    base = [100.0, 110.0, 90.0]
    out = stats.judge({"noisy": (base, [x * 1.12 for x in base])})[0]
    assert out.verdict == stats.AMBIGUOUS
    reach = float(re.search(r"confirm a change only beyond ([0-9.]+)x", out.note).group(1))
    assert reach > 1.12
    # the same runs moved by just beyond that ratio are a regression, just short of it not
    for factor, verdict in ((reach * 1.01, stats.REGRESSION), (reach * 0.99, stats.AMBIGUOUS)):
        assert stats.judge({"noisy": (base, [x * factor for x in base])})[0].verdict == verdict


def test_run_effects_are_what_every_key_shares():
    # run 2 is 10% slower on every key; key "b" alone is 30% slower in run 3
    table = {(run, key): level * (1.1 if run == 2 else 1.0) * (1.3 if (run, key) == (3, "b")
                                                               else 1.0)
             for run in range(4) for key, level in (("a", 10.0), ("b", 20.0), ("c", 30.0))}
    effects = stats.run_effects(table)
    assert effects[2] == pytest.approx(math.log(1.1)) and effects[0] == pytest.approx(0.0)
    assert effects[3] == pytest.approx(0.0)  # one key's change is not the machine's
    assert stats.machine_shift([0.0, 0.001, -0.001], [0.08, 0.081, 0.079]) == \
        pytest.approx(math.exp(0.08), rel=1e-3)
    assert stats.machine_shift([0.0, 0.001, -0.001], [0.01, 0.011, 0.009]) == 1.0  # < 5%


def test_keys_on_one_side_only_are_new_or_gone():
    out = {v.key: v.verdict for v in stats.judge({"new": ([], [1.0, 1.1]),
                                                  "gone": ([1.0, 1.1], [])})}
    assert out == {"new": stats.NEW, "gone": stats.GONE}


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
    # a 2% change the runs confirm (beyond what one slow run of 8 explains) is not a change
    # beyond the 5% threshold
    assert verdicts["small"].verdict == stats.SAME and verdicts["small"].q < 1e-6
    # a 6% change barely past the threshold, in runs of 3% noise: beyond it, not confirmed
    near = stats.judge({"near": (_runs(100, 3, rng, 0.03), _runs(106, 3, rng, 0.03))})[0]
    assert near.ratio > 1.05 and near.verdict == stats.AMBIGUOUS
    # a per-key threshold of 15% turns the 10% regression into SAME
    out = stats.judge({"slower": evidence["slower"]}, thresholds={"slower": 0.15})
    assert out[0].verdict == stats.SAME


def test_the_margin_is_what_one_slow_run_moves_its_side_by():
    ten, five = math.log1p(0.10), math.log1p(0.05)
    assert stats.margin(0.05, 1, 16) == pytest.approx(five)  # capped at the threshold
    assert stats.margin(0.05, 16, 2) == pytest.approx(ten / 2)
    assert stats.margin(0.05, 3, 3) == pytest.approx(ten / 3)
    assert stats.margin(0.05, 7, 23) == pytest.approx(ten / 7)
    assert stats.margin(0.20, 4, 4) == pytest.approx(math.log1p(0.40) / 4)


def _keys(rng, runs, noise, n=22):
    return {f"k{i:02d}": (_runs(100, runs, rng, noise), _runs(100, runs, rng, noise))
            for i in range(n)}


def _p_slower(evidence, key, margin):
    """`judge`'s p-value of "`key` slower by more than `margin`", its noise moderated."""
    prior = stats.noise_prior(*zip(*[(ss / df, df) for _, ss, df, _, _ in
                                     (stats._log_sides(*e) for e in evidence.values())]))
    return stats.t_test(*evidence[key], prior, margin)[1]


def test_seven_runs_confirm_a_ten_percent_slowdown_against_a_slow_runs_margin():
    # 22 keys of 3% run noise, one slowed 1.10x, 7 runs a side: against the 5% threshold the
    # change stands 4.7% out of 1.6% noise, short of BH's 0.01 over 22 keys; against one slow
    # run's seventh of 10% it stands 8.2% out
    for seed in range(5):
        rng = random.Random(seed)
        evidence = _keys(rng, 7, 0.03)
        evidence["k00"] = (evidence["k00"][0], [x * 1.10 for x in evidence["k00"][1]])
        verdicts = {v.key: v for v in stats.judge(evidence)}
        assert verdicts["k00"].verdict == stats.REGRESSION, seed
        assert _p_slower(evidence, "k00", math.log1p(0.05)) * 22 > stats.ALPHA, seed


def test_one_run_in_a_slower_state_is_not_a_regression():
    # 22 keys of 1% noise; one head run of one key in a slower state moves that key's mean
    # past the threshold: 18% in one of 3 runs, 50% in one of 7
    for runs, slow in ((3, 1.18), (7, 1.50)):
        level = [100, 101, 99, 100.5, 99.5, 100, 100][:runs]
        for seed in range(5):
            evidence = _keys(random.Random(seed), runs, 0.01)
            evidence["k00"] = (level, [level[0] * slow, *level[1:][::-1]])
            verdicts = {v.key: v for v in stats.judge(evidence)}
            assert verdicts["k00"].ratio > 1.05, (runs, seed)
            assert verdicts["k00"].verdict == stats.AMBIGUOUS, (runs, seed)
            assert not {v.verdict for k, v in verdicts.items() if k != "k00"} - {stats.SAME}


def test_bh_keeps_a_clear_change_among_many_null_keys():
    rng = random.Random(3)
    evidence = {"k": ([100, 101, 102, 103, 104], [150, 151, 152, 153, 154])}
    for i in range(40):
        evidence[f"null{i}"] = (_runs(100, 5, rng), _runs(100, 5, rng))
    out = {v.key: v for v in stats.judge(evidence)}
    assert out["k"].verdict == stats.REGRESSION
    assert not any(v.verdict in (stats.REGRESSION, stats.IMPROVEMENT)
                   for k, v in out.items() if k != "k")


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
