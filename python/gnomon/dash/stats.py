"""The statistics behind `gnomon dash compare` and `gnomon dash history`.

The rule of `compare`
---------------------
The unit of evidence is a *run*, and a run is a process of its own (``gnomon bench --runs N``
starts one per run, `gnomon.bench.runner.run_isolated`): a process's state, where its buffers
landed and how its threads were placed, holds for all the runs it times, so runs sharing one
are not independent replicates. Each run contributes one number, its fastest sample
(``RUN_VALUE``), taken on a log scale (a slowdown is a ratio): interference only ever adds
time, so the fastest call is the one the machine disturbed least (Chen and Revels,
"Robust benchmarking in noisy environments", 2016); on the 2-core machine of
`bench/regression_gate.py` it scattered between processes as little as the median or less for
every kernel. The collectives are the exception (``RUN_VALUE_BY_SUITE``): a call ends when
the later of its ranks, each a process of its own, arrives, so its fastest call is a rare
alignment of two processes' scheduling, and it scattered about twice as much between processes
as the run's median sample (a standard deviation of the log of 15 % against 8 %, over 48
processes of each of two pools), which is what they are judged on. For one
benchmark key the evidence is the runs' values at the base (``a``), at the head (``b``), and the
key's *history* on the same machine: the runs of the ``HISTORY_COMMITS`` (16) latest commits
before the base in the store's commit order, of the same benchmark definition, after the last
step `history` recorded for that key (so at the base's level; a history the base's own runs
moved away from, beyond the threshold with ``p < alpha``, is left out as a step not yet
recorded). The history joins the base's side: it is what the base's level and the noise are
estimated from, as conbench judges a new result against its baseline's distribution.

* **Run effects.** A run that was slower for every key at once (the machine's state:
  clocks, neighbours, a warm-up) says nothing about any one key. Each run's effect, the median
  over the keys it timed of its log deviation from that key's median over all the runs at hand
  (`run_effects`), is taken out of its values before the test. When the head's runs and the
  base's differ by such a common part beyond the threshold with ``p < alpha``
  (`machine_shift`), a key that is SAME once it is out but whose own runs moved that way beyond
  its threshold is AMBIGUOUS (`mark_shifted`): a machine slower for one commit's runs and a
  change that slowed everything look alike.
* **Change.** ``ratio = exp(mean log b - mean log (a + history))``, the geometric-mean ratio
  (> 1 is slower), on the runs' values with the run effects out.
* **Noise.** Each key's pooled variance ``s^2`` of the log values about their own side's
  mean, on ``df = (runs on the base's side - 1) + (runs on the head's side - 1)`` degrees of
  freedom, moderated across the keys compared (Smyth 2004, limma's moderated t; `noise_prior`):
  the keys' variances estimate the distribution they are drawn from, ``d0`` degrees of freedom
  about ``s0^2``, and each key's variance becomes ``(d0 s0^2 + df s^2) / (d0 + df)`` on
  ``d0 + df`` degrees of freedom. Three runs a side give a key 4 of its own; the other keys
  lend it the rest, so a key is neither trusted on 4 degrees of freedom nor judged by the
  others' noise where its own differs (``d0`` is small when the keys' noise differs). With
  history one run of each commit is enough; without it each side needs two.
* **Test.** A one-sided two-sample t-test of "the head is slower by more than the margin":
  ``t = (log ratio - margin) / (s sqrt(1/n_a + 1/n_b))``, its p-value from Student's t with
  the moderated degrees of freedom; mirrored, "faster by more than the margin". The margin
  (`margin`) is what one run in a slower state of the machine can move its side's mean by:
  such a run is up to ``SLOW_RUN`` (2) thresholds slower on a key (in four pools of 48
  ``--quick`` runs, one run in three was more than 10 % slower than usual on some key, 2-3 %
  of all run values; beyond 15 %, 0.4-1.1 %), which moves the mean of ``n`` runs by a
  ``n``-th of that; the side with fewer runs decides, and the margin is never more than the
  threshold itself. A test against no change would call such a run significant, since the
  t-test's noise model has no tails that heavy; a test against the threshold alone leaves a
  1.10x change with seven runs a side 4.7 % to stand out of the noise by, where this margin
  leaves it 8.2 %. Unlike a rank test it has no floor on the p-value three runs can reach.
* **Multiple keys.** Benjamini-Hochberg across all keys compared, separately for the
  regression family and the improvement family, gives each key a q-value.

Verdicts, with ``alpha = 0.01`` and ``threshold`` (default 5 %, overridable per op):

* ``REGRESSION``: the change is beyond the threshold and ``q < alpha`` for "head slower by
  more than the margin".
* ``IMPROVEMENT``: likewise, faster.
* ``SAME``: the change is within the threshold.
* ``AMBIGUOUS``: the change crosses the threshold but is not confirmed beyond the margin (the
  key is too noisy for that change at these runs: the note names it, with the smallest change
  its runs would confirm, `confirmable`), the base's runs moved from its
  history and are too few to measure the noise alone (one slow base run would otherwise
  hide a slowdown of the head as large as its own), the noise cannot be estimated
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
from scipy import optimize as _optimize, special as _special, stats as _scipy_stats

ALPHA = 0.01
DEFAULT_THRESHOLD = 0.05
MIN_RUNS = 3  # history's per-window rule (`gnomon.dash.history`)
MIN_DF = 2  # compare: the fewest degrees of freedom the noise is estimated with
SLOW_RUN = 2.0  # compare: a run in a slower state is up to this many thresholds slower
HISTORY_COMMITS = 16  # compare: the latest commits before the base whose runs join its side
RUN_VALUE = "min"  # the result column compare and history judge: the run's fastest sample
RUN_VALUE_BY_SUITE = {"comm": "median"}  # ... except these suites': the collectives' median

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
    base_median: float  # the median of the base's runs' values (each run's fastest sample)
    head_median: float
    ratio: float
    q: float  # the q-value in the direction of the change (regression if ratio >= 1)
    verdict: str
    base_runs: int
    head_runs: int
    threshold: float
    note: str = ""
    history_runs: int = 0


def _log_sides(base: Sequence[float], head: Sequence[float]):
    """``(log ratio, sum of squares about each side's mean, df, n base, n head)`` on logs."""
    la, lb = np.log(np.asarray(base, dtype=float)), np.log(np.asarray(head, dtype=float))
    d = float(lb.mean() - la.mean()) if len(la) and len(lb) else math.nan
    ss = float(((la - la.mean()) ** 2).sum() + ((lb - lb.mean()) ** 2).sum()) if len(la) \
        and len(lb) else 0.0
    return d, ss, max(len(la) + len(lb) - 2, 0), len(la), len(lb)


def noise_prior(variances: Sequence[float], dfs: Sequence[int]) -> tuple[float, float]:
    """``(d0, s0^2)``: the distribution the keys' noise variances are drawn from, a scaled
    inverse chi-square with ``d0`` degrees of freedom about ``s0^2``, estimated from the keys'
    variances ``s^2`` on ``df`` degrees of freedom by Smyth's (2004) moments of ``log s^2``
    (limma's moderated t). ``(0, 0)`` (no prior) from fewer than 3 keys with a positive
    variance; ``d0`` infinite when the keys' variances scatter no more than their degrees of
    freedom explain."""
    pairs = [(v, d) for v, d in zip(variances, dfs) if d > 0 and v > 0]
    if len(pairs) < 3:
        return 0.0, 0.0
    s2, df = np.array(pairs, dtype=float).T
    e = np.log(s2) - _special.digamma(df / 2) + np.log(df / 2)
    excess = float(e.var(ddof=1) - _special.polygamma(1, df / 2).mean())
    if excess <= 1e-12:
        return math.inf, float(math.exp(e.mean()))
    # trigamma(d0 / 2) = excess: trigamma falls from infinity at 0 to 0 at infinity
    half = _optimize.brentq(lambda x: float(_special.polygamma(1, x)) - excess, 1e-12, 1e12)
    d0 = 2 * half
    return d0, float(math.exp(e.mean() + _special.digamma(half) - math.log(half)))


def t_test(base: Sequence[float], head: Sequence[float],
           prior: tuple[float, float] = (0.0, 0.0),
           margin: float = 0.0) -> tuple[float, float, float, float, float]:
    """``(log ratio, p slower, p faster, df, s)``: the two-sample t-test on log values of the
    module docstring, its variance moderated by `prior` (`noise_prior`; none by default), of
    "head slower by more than `margin`" (a log ratio) and, mirrored, "faster by more than it";
    ``df < MIN_DF`` gives p 1 both ways (nothing can be said)."""
    return _test(_log_sides(base, head), prior, margin)


def _test(sides, prior: tuple[float, float], margin: float):
    """`t_test` on `_log_sides`'s summary of the two sides."""
    d, ss, df, na, nb = sides
    d0, s02 = prior
    total = d0 + df
    if total < MIN_DF or math.isnan(d):
        return d, 1.0, 1.0, total, math.nan
    s = math.sqrt(s02 if math.isinf(d0) else (d0 * s02 + ss) / total)
    if s == 0:  # identical runs on each side: any change is certain, none is nothing
        return d, float(not d > margin), float(not d < -margin), total, s
    se = s * math.sqrt(1 / na + 1 / nb)
    law = _scipy_stats.norm if math.isinf(total) else _scipy_stats.t(total)
    return d, float(law.sf((d - margin) / se)), float(law.cdf((d + margin) / se)), total, s


def margin(threshold: float, na: int, nb: int) -> float:
    """The log change `judge` confirms a change beyond, with `na` and `nb` runs a side: what
    one run in a slower state (``SLOW_RUN`` thresholds) moves the mean of the side with fewer
    runs by, at most the threshold's own (module docstring)."""
    return min(math.log1p(threshold), math.log1p(SLOW_RUN * threshold) / max(1, min(na, nb)))


def confirmable(s: float, df: float, na: int, nb: int, margin: float, p: float) -> float:
    """The smallest slowdown (a ratio) that runs of noise `s` (log, per run) on `df` degrees
    of freedom, `na` and `nb` a side, confirm beyond `margin` (a log ratio) at p-value `p`:
    `judge` takes ``p = alpha / keys``, what one change alone among that many keys must reach
    for Benjamini-Hochberg's ``q < alpha``. Mirrored, its inverse is the smallest speed-up."""
    law = _scipy_stats.norm if math.isinf(df) else _scipy_stats.t(df)
    return math.exp(margin + float(law.isf(p)) * s * math.sqrt(1 / na + 1 / nb))


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
    """Verdicts for every key of ``evidence`` = {key: (base runs' values, head runs'
    values)}; ``history`` = {key: runs' values of the commits before the base}, which join
    the base's side; ``thresholds`` = {key: threshold} overrides ``threshold`` per key."""
    thresholds = thresholds or {}
    keys = list(evidence)
    given = {key: (history or {}).get(key, ()) for key in keys}
    history = {key: level_history(given[key], evidence[key][0], thresholds.get(key, threshold),
                                  alpha) for key in keys}
    sides = {key: ([*evidence[key][0], *history[key]] if len(evidence[key][0]) else [],
                   evidence[key][1]) for key in keys}
    logs = {key: _log_sides(*sides[key]) for key in keys}
    prior = noise_prior([ss / df if df else 0.0 for _, ss, df, _, _ in logs.values()],
                        [df for _, _, df, _, _ in logs.values()])
    tests = {key: _test(logs[key], prior, margin(thresholds.get(key, threshold), *logs[key][3:]))
             for key in keys}
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
        left_out = len(given[key]) > 0 and not past  # the base's runs moved from its history
        if not crosses and not (left_out and df < MIN_DF):
            verdict = SAME
        elif df < MIN_DF:
            verdict = AMBIGUOUS
            note = (f"{len(a)} + {len(b)} runs and {past} from history cannot measure the "
                    f"noise; record more runs, or history before the base")
            if left_out:
                note = (f"the base's {len(a)} run(s) moved from its {len(given[key])} runs of "
                        f"history (a step history has not recorded, or a base run in a slower "
                        f"state), and {len(a)} + {len(b)} runs cannot measure the noise; bench "
                        f"the base again")
        elif q < alpha:
            verdict = REGRESSION if slower else IMPROVEMENT
        else:
            verdict = AMBIGUOUS
            _, _, _, na, nb = logs[key]
            reach = confirmable(s, df, na, nb, margin(t, na, nb), alpha / len(judged))
            reach = max(reach, 1 + t) if slower else min(1 / reach, 1 - t)
            note = (f"a {ratio:.3g}x change within this key's noise ({s:.1%} per run, "
                    f"q {q:.2g}): {len(a)} + {len(b)} runs"
                    f"{f' and {past} from history' if past else ''} confirm a change only "
                    f"beyond {reach:.3g}x; record more runs")
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
