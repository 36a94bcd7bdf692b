"""The statistics behind `gnomon dash compare` and `gnomon dash history`.

The rule of `compare`
---------------------
The unit of evidence is a *run*: samples within one run share that run's conditions (clock,
thermal state, neighbours), so each run contributes one number, its median time, taken on a log
scale (a slowdown is a ratio). For one benchmark key the evidence is the per-run medians of the
base (``a``), of the head (``b``), and the key's *history* on the same machine: the runs of the
``HISTORY_COMMITS`` (8) latest commits before the base in the store's commit order, of the same
benchmark definition, after the last step `history` recorded for that key (so at the base's
level; a history the base's own runs moved away from, beyond the threshold with ``p < alpha``,
is left out as a step not yet recorded). The history joins the base's side: it is what the base's level and the noise are
estimated from, as conbench judges a new result against its baseline's distribution.

* **Run effects.** A run that was slower for every key at once (the machine's state:
  clocks, neighbours, a warm-up) says nothing about any one key. Each run's effect, the median
  over the keys it timed of its log deviation from that key's median over all the runs at hand
  (`run_effects`), is taken out of its medians before the test. When the head's runs and the
  base's differ by such a common part beyond the threshold with ``p < alpha``
  (`machine_shift`), a key that is SAME once it is out but whose own runs moved that way beyond
  its threshold is AMBIGUOUS (`mark_shifted`): a machine slower for one commit's runs and a
  change that slowed everything look alike.
* **Change.** ``ratio = exp(mean log b - mean log (a + history))``, the geometric-mean ratio
  (> 1 is slower), on the medians with the run effects out.
* **Noise.** The pooled standard deviation ``s`` of the log medians about their own side's
  mean, with ``df = (runs on the base's side - 1) + (runs on the head's side - 1)`` degrees of
  freedom. With history one run of each commit is enough; without it each side needs two.
* **Test.** A one-sided two-sample t-test: ``t = log ratio / (s sqrt(1/n_a + 1/n_b))``, its
  p-value from Student's t with ``df``, for "head slower" and, mirrored, "head faster". Unlike
  a rank test it has no floor on the p-value three runs can reach: a change many times the
  noise is significant with three runs a side, or with one and a history.
* **Multiple keys.** Benjamini-Hochberg across all keys compared, separately for the
  regression family and the improvement family, gives each key a q-value.

Verdicts, with ``alpha = 0.01`` and ``threshold`` (default 5 %, overridable per op):

* ``REGRESSION``: ``q < alpha`` for "head slower" and ``ratio >= 1 + threshold``.
* ``IMPROVEMENT``: ``q < alpha`` for "head faster" and ``ratio <= 1 - threshold``.
* ``SAME``: the change is within the threshold.
* ``AMBIGUOUS``: the change crosses the threshold but is not significant (the key is too
  noisy for that change at these runs: the note names it), the noise cannot be estimated
  (``df < MIN_DF``: one run on each side and no history), or the key moved with every key.
* ``NEW`` / ``GONE``: runs at only the head / only the base. Listed, never judged.

The error rates this gives on `gnomon bench --quick` results are measured by
``bench/regression_gate.py`` and stated in the README.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy import stats as _scipy_stats

ALPHA = 0.01
DEFAULT_THRESHOLD = 0.05
MIN_RUNS = 3  # history's per-window rule (`gnomon.dash.history`)
MIN_DF = 2  # compare: the fewest degrees of freedom the noise is estimated with
HISTORY_COMMITS = 8  # compare: the latest commits before the base whose runs join its side

REGRESSION = "REGRESSION"
IMPROVEMENT = "IMPROVEMENT"
SAME = "SAME"
AMBIGUOUS = "AMBIGUOUS"
NEW = "NEW"
GONE = "GONE"
VERDICTS = (REGRESSION, IMPROVEMENT, SAME, AMBIGUOUS, NEW, GONE)


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


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
    history_runs: int = 0


def t_test(base: Sequence[float], head: Sequence[float]) -> tuple[float, float, float, int, float]:
    """``(log ratio, p slower, p faster, df, s)``: the pooled two-sample t-test on log values
    of the module docstring; ``df < MIN_DF`` gives p 1 both ways (nothing can be said)."""
    la, lb = np.log(np.asarray(base, dtype=float)), np.log(np.asarray(head, dtype=float))
    df = max(len(la) + len(lb) - 2, 0)
    d = float(lb.mean() - la.mean()) if len(la) and len(lb) else math.nan
    if df < MIN_DF or math.isnan(d):
        return d, 1.0, 1.0, df, math.nan
    s = math.sqrt((float(((la - la.mean()) ** 2).sum()) + float(((lb - lb.mean()) ** 2).sum()))
                  / df)
    if s == 0:  # identical runs on each side: any change is certain, none is nothing
        return d, float(not d > 0), float(not d < 0), df, s
    t = d / (s * math.sqrt(1 / len(la) + 1 / len(lb)))
    return d, float(_scipy_stats.t.sf(t, df)), float(_scipy_stats.t.cdf(t, df)), df, s


def run_effects(medians: Mapping[tuple[int, str], float]) -> dict[int, float]:
    """{run: its log effect}: how much slower than usual a run was for every key at once,
    the median over the keys it timed of ``log median - the key's median log median`` over
    all runs (module docstring: runs share the machine's state across keys)."""
    by_key: dict[str, list[float]] = {}
    for (_, key), value in medians.items():
        by_key.setdefault(key, []).append(math.log(value))
    centre = {key: float(np.median(values)) for key, values in by_key.items()}
    deviations: dict[int, list[float]] = {}
    for (run, key), value in medians.items():
        deviations.setdefault(run, []).append(math.log(value) - centre[key])
    return {run: float(np.median(d)) for run, d in deviations.items()}


def moved(base: Sequence[float], head: Sequence[float], threshold: float,
          alpha: float = ALPHA) -> float:
    """The ratio from `base` to `head` (`t_test`'s, of the geometric means) when it is beyond
    the threshold with ``p < alpha``; else 1."""
    d, p_slower, p_faster, df, _ = t_test(base, head)
    if df < MIN_DF or math.isnan(d) or min(p_slower, p_faster) >= alpha \
            or abs(math.exp(d) - 1) < threshold:
        return 1.0
    return math.exp(d)


def machine_shift(base_effects: Sequence[float], head_effects: Sequence[float],
                  threshold: float = DEFAULT_THRESHOLD, alpha: float = ALPHA) -> float:
    """The ratio by which every key moved together between the base's runs (history
    included) and the head's, when it is beyond the threshold with ``p < alpha``; else 1."""
    return moved(np.exp(base_effects), np.exp(head_effects), threshold, alpha)


def mark_shifted(verdicts: list[Verdict], raw: Mapping[str, tuple], shift: float,
                 threshold: float, thresholds: Mapping[str, float] | None = None) -> None:
    """Where every key moved together (`machine_shift`), a key judged SAME once that common
    part is taken out, but whose own runs moved beyond its threshold the same way, is
    AMBIGUOUS: a machine that was slower for one commit's runs, or a change to everything."""
    if shift == 1.0:
        return
    thresholds = thresholds or {}
    for v in verdicts:
        a, b = raw.get(v.key, ((), ()))
        if v.verdict != SAME or not len(a) or not len(b):
            continue
        t = thresholds.get(v.key, threshold)
        moved = median(b) / median(a)
        if (moved >= 1 + t) if shift > 1 else (moved <= 1 - t):
            v.verdict = AMBIGUOUS
            v.note = (f"moved {moved:.3g}x with every key: the commits' runs differ by "
                      f"{shift:.3g}x on all keys at once (the machine, or a change to "
                      f"everything); bench both again")


def level_history(history: Sequence[float], base: Sequence[float], threshold: float,
                  alpha: float = ALPHA) -> Sequence[float]:
    """`history` when the base runs are at its level; none of it when they moved from it
    beyond the threshold with ``p < alpha`` (a step `history` has not recorded: the runs
    before it would bias the base's level and inflate the noise)."""
    if not len(history) or not len(base):
        return history
    return () if moved(history, base, threshold, alpha) != 1.0 else history


def judge(evidence: Mapping[str, tuple[Sequence[float], Sequence[float]]],
          threshold: float = DEFAULT_THRESHOLD,
          thresholds: Mapping[str, float] | None = None,
          alpha: float = ALPHA,
          history: Mapping[str, Sequence[float]] | None = None) -> list[Verdict]:
    """Verdicts for every key of ``evidence`` = {key: (base per-run medians, head per-run
    medians)}; ``history`` = {key: per-run medians of the commits before the base}, which join
    the base's side; ``thresholds`` = {key: threshold} overrides ``threshold`` per key."""
    thresholds = thresholds or {}
    keys = list(evidence)
    history = {key: level_history((history or {}).get(key, ()), evidence[key][0],
                                  thresholds.get(key, threshold), alpha) for key in keys}
    tests = {}
    for key in keys:
        a, b = evidence[key]
        tests[key] = t_test([*a, *history[key]] if len(a) else [], b)
    judged = [k for k in keys if len(evidence[k][0]) and len(evidence[k][1])]
    q_reg = dict(zip(judged, benjamini_hochberg([tests[k][1] for k in judged])))
    q_imp = dict(zip(judged, benjamini_hochberg([tests[k][2] for k in judged])))
    verdicts = []
    for key in keys:
        a, b = evidence[key]
        past = len(history[key]) if len(a) else 0
        t = thresholds.get(key, threshold)
        base = median(a) if len(a) else math.nan
        head = median(b) if len(b) else math.nan
        if not len(a) or not len(b):
            verdicts.append(Verdict(key, base, head, math.nan, math.nan,
                                    GONE if len(a) else NEW, len(a), len(b), t,
                                    "runs at the base only" if len(a) else
                                    "runs at the head only", past))
            continue
        d, _, _, df, s = tests[key]
        ratio = math.exp(d)
        slower = not (ratio < 1)
        q = q_reg[key] if slower else q_imp[key]
        crosses = (ratio >= 1 + t) if slower else (ratio <= 1 - t)
        note = ""
        if not crosses:
            verdict = SAME
        elif df < MIN_DF:
            verdict = AMBIGUOUS
            note = (f"{len(a)} + {len(b)} runs and {past} from history cannot measure the "
                    f"noise; record more runs, or history before the base")
        elif q < alpha:
            verdict = REGRESSION if slower else IMPROVEMENT
        else:
            verdict = AMBIGUOUS
            note = (f"a {ratio:.3g}x change within this key's noise ({s:.1%} per run, "
                    f"q {q:.2g}); record more runs")
        verdicts.append(Verdict(key, base, head, ratio, q, verdict, len(a), len(b), t, note,
                                past))
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
