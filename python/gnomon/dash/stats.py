"""The statistics behind `gnomon dash compare` and `gnomon dash history`.

The rule
--------
The unit of evidence is a *run*: samples within one run share that run's conditions (clock,
thermal state, neighbours), so each run contributes one number, its median time. For one
benchmark key the evidence is the per-run medians of the base (``a``) and of the head (``b``).

* **Ratio.** ``ratio = median(b) / median(a)`` (medians of the per-run medians; > 1 is slower).
* **Test.** A one-sided Mann-Whitney U test on the per-run medians: for a regression the
  alternative is "head runs are slower" (``b`` stochastically greater), for an improvement the
  mirror. Exact p-values are used when there are no ties (scipy's ``method="auto"``).
* **Multiple keys.** Benjamini-Hochberg across all keys compared, separately for the
  regression family and the improvement family, gives each key a q-value.
* **Power.** With ``n`` and ``m`` runs on the two sides the smallest one-sided p-value the U
  test can give is ``1 / C(n + m, n)`` (``1 / C(2n, n)`` for equal counts: 3 runs each give
  0.05, 5 give 0.004). A key whose BH q-value could not fall below ``alpha`` even with that
  smallest p (the other keys' p-values held fixed) cannot be judged.

Verdicts, with ``alpha = 0.01`` and ``threshold`` (default 5 %, overridable per op):

* ``AMBIGUOUS``: either side has fewer than 3 runs; or the ratio crosses the threshold but
  the run counts are too small for the test to reach ``q < alpha`` (see Power).
* ``REGRESSION``: ``q < alpha`` for "head slower" and ``ratio >= 1 + threshold``.
* ``IMPROVEMENT``: ``q < alpha`` for "head faster" and ``ratio <= 1 - threshold``.
* ``SAME``: everything else: the change is smaller than the threshold, or the test finds no
  evidence for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy import stats as _scipy_stats

ALPHA = 0.01
DEFAULT_THRESHOLD = 0.05
MIN_RUNS = 3

REGRESSION = "REGRESSION"
IMPROVEMENT = "IMPROVEMENT"
SAME = "SAME"
AMBIGUOUS = "AMBIGUOUS"
VERDICTS = (REGRESSION, IMPROVEMENT, SAME, AMBIGUOUS)


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def min_p_value(n: int, m: int) -> float:
    """The smallest one-sided p-value a Mann-Whitney U test can give with n and m
    observations: 1 / C(n + m, n)."""
    if n < 1 or m < 1:
        return 1.0
    return 1.0 / math.comb(n + m, n)


def mann_whitney_greater(a: Sequence[float], b: Sequence[float]) -> float:
    """One-sided p-value for "b is stochastically greater than a" (head slower than base)."""
    if len(a) < 1 or len(b) < 1:
        return 1.0
    a_arr = np.asarray(a, dtype=float)
    b_arr = np.asarray(b, dtype=float)
    if np.all(a_arr == a_arr[0]) and np.all(b_arr == a_arr[0]):
        return 1.0  # identical constant samples: no evidence either way
    result = _scipy_stats.mannwhitneyu(b_arr, a_arr, alternative="greater", method="auto")
    p = float(result.pvalue)
    return 1.0 if math.isnan(p) else min(1.0, p)


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """BH-adjusted q-values, in the order given: q_(i) = min_{j >= i} p_(j) * m / j."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    if m == 0:
        return []
    order = np.argsort(p, kind="mergesort")
    ranked = p[order] * m / np.arange(1, m + 1)
    ranked = np.minimum.accumulate(ranked[::-1])[::-1]
    q = np.empty(m)
    q[order] = np.minimum(ranked, 1.0)
    return [float(x) for x in q]


def best_attainable_q(p_values: Sequence[float], index: int, p_min: float) -> float:
    """The q-value key ``index`` would get if its p-value were ``p_min``, the others fixed."""
    p = list(p_values)
    p[index] = p_min
    return benjamini_hochberg(p)[index]


@dataclass
class Verdict:
    key: str
    base_median: float
    head_median: float
    ratio: float
    q: float  # the q-value in the direction of the change (regression if ratio >= 1)
    verdict: str
    base_runs: int
    head_runs: int
    threshold: float
    note: str = ""


def judge(evidence: Mapping[str, tuple[Sequence[float], Sequence[float]]],
          threshold: float = DEFAULT_THRESHOLD,
          thresholds: Mapping[str, float] | None = None,
          alpha: float = ALPHA) -> list[Verdict]:
    """Verdicts for every key of ``evidence`` = {key: (base per-run medians, head per-run
    medians)}; ``thresholds`` = {key: threshold} overrides ``threshold`` per key."""
    thresholds = thresholds or {}
    keys = list(evidence)
    p_reg, p_imp = [], []
    for key in keys:
        a, b = evidence[key]
        p_reg.append(mann_whitney_greater(a, b))
        p_imp.append(mann_whitney_greater(b, a))
    q_reg = benjamini_hochberg(p_reg)
    q_imp = benjamini_hochberg(p_imp)
    verdicts = []
    for i, key in enumerate(keys):
        a, b = evidence[key]
        t = thresholds.get(key, threshold)
        base = median(a) if len(a) else math.nan
        head = median(b) if len(b) else math.nan
        ratio = head / base if len(a) and len(b) and base > 0 else math.nan
        slower = not (ratio < 1)
        q = q_reg[i] if slower else q_imp[i]
        crosses = (ratio >= 1 + t) if slower else (ratio <= 1 - t)
        note = ""
        if len(a) < MIN_RUNS or len(b) < MIN_RUNS:
            verdict = AMBIGUOUS
            note = (f"needs at least {MIN_RUNS} runs per commit "
                    f"(base {len(a)}, head {len(b)})")
        elif not crosses:
            verdict = SAME
        else:
            reachable = best_attainable_q(p_reg if slower else p_imp, i,
                                          min_p_value(len(a), len(b)))
            if q < alpha:
                verdict = REGRESSION if slower else IMPROVEMENT
            elif reachable >= alpha:
                verdict = AMBIGUOUS
                note = (f"{len(a)} and {len(b)} runs cannot reach q < {alpha:g} "
                        f"(best attainable q {reachable:.3g}); record more runs")
            else:
                verdict = SAME
                note = "change not significant"
        verdicts.append(Verdict(key, base, head, ratio, q, verdict, len(a), len(b), t, note))
    return verdicts


# --------------------------------------------------------------------------- accuracy

@dataclass
class AccuracyVerdict:
    """One accuracy series (lower is better) between two commits: the median of each
    commit's values, and the noise floor the change is judged against (the larger of the two
    commits' median noise floors)."""

    series: str
    base: float
    head: float
    noise_floor: float
    verdict: str


def judge_accuracy(series: str, base: Sequence[tuple[float, float]],
                   head: Sequence[tuple[float, float]]) -> AccuracyVerdict:
    """`base` and `head` are (value, noise floor) pairs, one per validation of that commit. A
    validation is one run, so no rank test applies: a change beyond the noise floor that the
    same validation measured is a REGRESSION (worse) or an IMPROVEMENT; a side with no
    validation is AMBIGUOUS. An accuracy document (`gnomon accuracy`) is a deterministic
    simulation with no noise to measure: its noise floor is the stated tolerance
    (`gnomon.predict.accuracy.MAPE_TOLERANCE`, `REFUSED_TOLERANCE`), so the same rule applies."""
    if not base or not head:
        value = median([v for v, _ in base or head])
        return AccuracyVerdict(series, value if base else math.nan,
                               value if head else math.nan, math.nan, AMBIGUOUS)
    b, h = median([v for v, _ in base]), median([v for v, _ in head])
    floor = max(median([n for _, n in base]), median([n for _, n in head]))
    verdict = REGRESSION if h - b > floor else IMPROVEMENT if b - h > floor else SAME
    return AccuracyVerdict(series, b, h, floor, verdict)
