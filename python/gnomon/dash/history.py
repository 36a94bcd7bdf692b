"""`gnomon dash history` and `gnomon dash ack`: steps along each benchmark's commit series.

A *series* is one benchmark (key and definition hash) on one machine: its commits in commit
order (the order in which they were first ingested), each with its runs' values (each run's
fastest sample, or a collective's median: `store.run_value`, as `compare` judges them).

Detection (binary segmentation)
-------------------------------
Within a segment of the series every split ``k`` is a candidate step at commit ``k``. Its
evidence is a window of up to ``WINDOW`` (5) commits of the segment on each side: the commits
``k - 5 .. k - 1`` before and ``k .. k + 4`` after (so a bump that later reverts is found at
both of its edges). It is a candidate when

* at least one commit lies before it and the step commit plus ``PERSIST_AFTER`` (2) further
  commits lie after it (a step must persist for two commits after it);
* the step commit sits on the new side of the midpoint between the before-window level and
  the after-window level, and so does at least one of the two commits after it (a single
  outlier commit is not a step; one noisy commit inside a real step does not hide it);
* the ratio ``median(after-window runs) / median(before-window runs)`` is beyond the
  threshold (default 5 %, overridable per op), in either direction.

Among the candidates the one with the smallest one-sided Mann-Whitney p-value on the runs'
values of the two windows (a rank test: the windows hold up to 5 commits of runs a side) is
taken and its p-value multiplied by the number of candidates (Bonferroni for the choice of
split). When that is below ``alpha`` the segment is split there and both halves are searched again. Every
segment searched contributes its best p-value to one family, across all series; Benjamini-
Hochberg over that family gives each step its q, and a step is reported when ``q < alpha``
(0.01). Runs are treated as independent: a commit-to-commit jitter larger than the run noise
inflates the evidence, which the threshold and the persistence rule guard against.

Predictor accuracy series (one validation or accuracy document per commit) are judged by their
own noise floor, an accuracy document's being its stated tolerance: `accuracy_steps` finds each
commit whose figure moved beyond the noise floor from the commit before it
(`stats.judge_accuracy`, the rule `compare` uses). They are reported, not stored.

States: a step is ``open`` when found, ``acknowledged`` after `gnomon dash ack KEY --reason`,
and ``fixed`` when a later step of the same series brings the level back to within the
threshold of the level before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from gnomon.dash import stats
from gnomon.dash.store import (DashError, accuracy, benchmarks, machines, results, run_value,
                               runs, steps, with_retry)

PERSIST_AFTER = 2
WINDOW = 5


@dataclass
class Point:
    commit: str
    commit_order: int
    medians: list[float]


@dataclass
class Candidate:
    index: int  # position of the step commit in the series
    ratio: float
    p: float  # Bonferroni-adjusted for the choice of split
    before_level: float
    after_level: float


def _level(points: Sequence[Point]) -> float:
    return stats.median([m for p in points for m in p.medians])


def _best_split(points: Sequence[Point], threshold: float) -> Candidate | None:
    n = len(points)
    candidates = []
    for k in range(1, n - PERSIST_AFTER):
        before, after = points[max(0, k - WINDOW):k], points[k:k + WINDOW]
        a = [m for p in before for m in p.medians]
        b = [m for p in after for m in p.medians]
        if not a or not b:
            continue
        lo, hi = stats.median(a), stats.median(b)
        if lo <= 0:
            continue
        ratio = hi / lo
        if not (ratio >= 1 + threshold or ratio <= 1 - threshold):
            continue
        mid = (lo + hi) / 2
        beyond = [bool(p.medians) and ((stats.median(p.medians) > mid) == (hi > lo))
                  for p in after[:PERSIST_AFTER + 1]]
        if not beyond[0] or sum(beyond) < 2:  # the step commit and most of the next ones
            continue
        p = (stats.mann_whitney_greater(a, b) if ratio > 1
             else stats.mann_whitney_greater(b, a))
        candidates.append((p, -abs(math.log(ratio)), k, ratio, lo, hi, len(a), len(b)))
    if not candidates:
        return None
    p, _, k, ratio, lo, hi, _, _ = min(candidates)
    return Candidate(k, ratio, min(1.0, p * len(candidates)), lo, hi)


def segment(points: Sequence[Point], threshold: float,
            alpha: float = stats.ALPHA) -> list[Candidate]:
    """Binary segmentation of one series: the best split of every segment searched (its
    p-value is part of the BH family even when it is not significant)."""
    found: list[Candidate] = []

    def search(lo: int, hi: int) -> None:
        best = _best_split(points[lo:hi], threshold)
        if best is None:
            return
        best.index += lo
        found.append(best)
        if best.p < alpha:
            search(lo, best.index)
            search(best.index, hi)

    search(0, len(points))
    return found


@dataclass
class Step:
    benchmark_id: int
    machine_id: int
    key: str
    op: str
    machine: str
    commit: str
    commit_order: int
    ratio: float
    q: float
    state: str = "open"
    reason: str | None = None


def load_series(conn: Connection) -> dict[tuple[int, int], list[Point]]:
    """{(benchmark id, machine id): points in commit order}."""
    query = (sa.select(results.c.benchmark_id, runs.c.machine_id, runs.c.commit,
                       runs.c.commit_order, run_value())
             .join(runs, runs.c.id == results.c.run_id)
             .join(benchmarks, benchmarks.c.id == results.c.benchmark_id)
             .order_by(runs.c.commit_order, runs.c.id))
    series: dict[tuple[int, int], dict[str, Point]] = {}
    for bench_id, machine_id, commit, order, value in conn.execute(query):
        points = series.setdefault((bench_id, machine_id), {})
        point = points.setdefault(commit, Point(commit, order, []))
        point.medians.append(float(value))
    return {ident: sorted(points.values(), key=lambda p: p.commit_order)
            for ident, points in series.items()}


def find_steps(all_series: Mapping[object, Sequence[Point]], thresholds: Mapping[object, float],
               alpha: float = stats.ALPHA) -> list[tuple[object, Candidate, float, str]]:
    """The statistics of `detect` without a database: ``all_series`` = {id: points in commit
    order}, ``thresholds`` = {id: threshold}. Returns (id, candidate, q, state) for every
    reported step, the state being ``open`` or ``fixed``."""
    family: list[tuple[object, Candidate, float]] = []
    for ident, points in all_series.items():
        t = thresholds[ident]
        for candidate in segment(points, t, alpha):
            family.append((ident, candidate, t))
    q_values = stats.benjamini_hochberg([c.p for _, c, _ in family])
    by_series: dict[object, list[tuple[Candidate, float, float]]] = {}
    for (ident, candidate, t), q in zip(family, q_values):
        if q < alpha:
            by_series.setdefault(ident, []).append((candidate, q, t))
    out = []
    for ident, accepted in by_series.items():
        accepted.sort(key=lambda item: item[0].index)
        for i, (candidate, q, t) in enumerate(accepted):
            state = "open"
            if candidate.ratio > 1:
                for later, _, _ in accepted[i + 1:]:
                    if later.after_level / candidate.before_level <= 1 + t:
                        state = "fixed"
                        break
            out.append((ident, candidate, q, state))
    return out


def detect(conn: Connection, threshold: float = stats.DEFAULT_THRESHOLD,
           op_thresholds: Mapping[str, float] | None = None,
           alpha: float = stats.ALPHA) -> list[Step]:
    """Steps in every series (not written anywhere); states are all ``open`` except
    regressions a later step reversed, which are ``fixed``."""
    op_thresholds = dict(op_thresholds or {})
    info = {row.id: row for row in conn.execute(
        sa.select(benchmarks.c.id, benchmarks.c.key, benchmarks.c.op))}
    names = dict(conn.execute(sa.select(machines.c.id, machines.c.fingerprint)).all())
    unknown = set(op_thresholds) - {row.op for row in info.values()}
    if unknown:
        raise DashError(f"--threshold-op names op(s) {', '.join(sorted(unknown))} that no "
                        "stored benchmark has")
    all_series = load_series(conn)
    series_thresholds = {ident: op_thresholds.get(info[ident[0]].op, threshold)
                         for ident in all_series}
    found: list[Step] = []
    for ident, candidate, q, state in find_steps(all_series, series_thresholds, alpha):
        point = all_series[ident][candidate.index]
        found.append(Step(ident[0], ident[1], info[ident[0]].key, info[ident[0]].op,
                          names[ident[1]], point.commit, point.commit_order,
                          candidate.ratio, q, state))
    found.sort(key=lambda s: (s.key, s.machine, s.commit_order))
    return found


def merge_stored(conn: Connection, found: list[Step]) -> list[Step]:
    """Carries acknowledged states and reasons from the steps table onto ``found``."""
    stored = {(row.benchmark_id, row.machine_id, row.commit): row
              for row in conn.execute(sa.select(steps))}
    for step in found:
        row = stored.get((step.benchmark_id, step.machine_id, step.commit))
        if row is not None:
            step.reason = row.reason
            if row.state == "acknowledged" and step.state == "open":
                step.state = "acknowledged"
    return found


def update_history(engine: Engine, threshold: float = stats.DEFAULT_THRESHOLD,
                   op_thresholds: Mapping[str, float] | None = None) -> list[Step]:
    """Detects steps and stores them: new steps are open, known ones keep their
    acknowledgement and reason, reversed regressions become fixed, and open steps no longer
    detected are removed (acknowledged ones are kept with their reason)."""

    def work(conn: Connection) -> list[Step]:
        found = merge_stored(conn, detect(conn, threshold, op_thresholds))
        keep = {(s.benchmark_id, s.machine_id, s.commit) for s in found}
        for row in conn.execute(sa.select(steps)).all():
            if (row.benchmark_id, row.machine_id, row.commit) not in keep \
                    and row.state != "acknowledged":
                conn.execute(sa.delete(steps).where(steps.c.id == row.id))
        for step in found:
            values = {"commit_order": step.commit_order, "ratio": step.ratio, "q": step.q,
                      "state": step.state, "reason": step.reason}
            updated = conn.execute(sa.update(steps).where(
                steps.c.benchmark_id == step.benchmark_id,
                steps.c.machine_id == step.machine_id,
                steps.c.commit == step.commit).values(**values)).rowcount
            if not updated:
                conn.execute(sa.insert(steps).values(
                    benchmark_id=step.benchmark_id, machine_id=step.machine_id,
                    commit=step.commit, **values))
        return found

    return with_retry(engine, work)


def ack(engine: Engine, key: str, reason: str) -> int:
    """Acknowledges the open step(s) of benchmark ``key`` with ``reason``; returns how many."""
    if not reason or not reason.strip():
        raise DashError("ack needs a non-empty --reason")

    def work(conn: Connection) -> int:
        ids = [row[0] for row in conn.execute(
            sa.select(benchmarks.c.id).where(benchmarks.c.key == key))]
        if not ids:
            raise DashError(f"benchmark key {key!r} is not in the database "
                            "(keys look like suite/name[params]; see `gnomon dash history`)")
        open_ids = [row[0] for row in conn.execute(sa.select(steps.c.id).where(
            steps.c.benchmark_id.in_(ids), steps.c.state == "open"))]
        if not open_ids:
            raise DashError(f"benchmark {key!r} has no open step "
                            "(run `gnomon dash history` to detect steps)")
        conn.execute(sa.update(steps).where(steps.c.id.in_(open_ids))
                     .values(state="acknowledged", reason=reason.strip()))
        return len(open_ids)

    return with_retry(engine, work)


@dataclass
class AccuracyStep:
    series: str
    machine: str
    commit: str
    commit_order: int
    verdict: stats.AccuracyVerdict  # the commit before against this one


def accuracy_series(conn: Connection) -> dict[tuple[str, str], list[tuple[str, int, list]]]:
    """{(machine fingerprint, series): [(commit, order, [(value, noise floor)]), ...] in
    commit order}."""
    query = (sa.select(machines.c.fingerprint, accuracy.c.series, accuracy.c.commit,
                       accuracy.c.commit_order, accuracy.c.value, accuracy.c.noise_floor)
             .join(machines, machines.c.id == accuracy.c.machine_id)
             .order_by(accuracy.c.commit_order, accuracy.c.id))
    grouped: dict[tuple[str, str], dict[str, tuple[str, int, list]]] = {}
    for fingerprint, series, commit, order, value, noise in conn.execute(query):
        points = grouped.setdefault((fingerprint, series), {})
        points.setdefault(commit, (commit, order, []))[2].append((value, noise))
    return {ident: list(points.values()) for ident, points in grouped.items()}


def accuracy_steps(conn: Connection) -> list[AccuracyStep]:
    """Each commit of an accuracy series whose figure moved beyond the noise floor."""
    found = []
    for (fingerprint, series), points in sorted(accuracy_series(conn).items()):
        for (_, _, before), (commit, order, after) in zip(points, points[1:]):
            verdict = stats.judge_accuracy(series, before, after)
            if verdict.verdict in (stats.REGRESSION, stats.IMPROVEMENT):
                found.append(AccuracyStep(series, fingerprint, commit, order, verdict))
    return found


def render_accuracy_steps(found: list[AccuracyStep], console=None) -> None:  # noqa: ANN001
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    if not found:
        return
    table = Table(title="predictor accuracy moves beyond the noise floor")
    table.add_column("series", overflow="fold", ratio=2)
    for name in ("machine", "commit", "before", "after", "noise floor", "verdict"):
        table.add_column(name, no_wrap=True)
    for step in found:
        v = step.verdict
        table.add_row(escape(step.series), step.machine, step.commit[:12], f"{v.base:.1%}",
                      f"{v.head:.1%}", f"{v.noise_floor:.1%}", v.verdict)
    console.print(table)


def render_history(found: list[Step], console=None) -> None:  # noqa: ANN001
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    if not found:
        console.print("no steps found")
        return
    table = Table(title="steps along the commit order")
    table.add_column("key", overflow="fold", ratio=2)
    for name in ("machine", "commit", "ratio", "q", "state"):
        table.add_column(name, no_wrap=True)
    table.add_column("reason", overflow="fold", ratio=1)
    for step in found:
        kind = "slower" if step.ratio > 1 else "faster"
        table.add_row(escape(step.key), step.machine, step.commit[:12],
                      f"{step.ratio:.3f} ({kind})", f"{step.q:.2g}", step.state,
                      escape(step.reason or ""))
    console.print(table)


__all__ = ["AccuracyStep", "Point", "Step", "accuracy_series", "accuracy_steps", "ack",
           "detect", "load_series", "render_accuracy_steps", "render_history", "segment",
           "update_history"]
