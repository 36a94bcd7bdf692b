"""`gnomon dash compare BASE HEAD`: two commits on one machine, key by key.

Kernel timings follow the rule in :mod:`gnomon.dash.stats` (`judge`); predictor accuracy
series, one validation per commit, the noise-floor rule (`judge_accuracy`). The series of
accuracy documents, stored under the simulation machine (`store.SIMULATION_MACHINE`), are the
same on every machine: they are compared beside those of whichever machine is compared on."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from gnomon.dash import stats
from gnomon.dash.store import (SIMULATION, DashError, accuracy, benchmarks, machines, results,
                               run_value, runs, steps)


EXIT_REGRESSION = 1
EXIT_AMBIGUOUS = 3  # no REGRESSION, but a key the evidence cannot judge


def exit_code(verdicts, allow_ambiguous: bool = False) -> int:
    """`gnomon dash compare`'s exit status for its rows' `verdicts`: 1 with a REGRESSION,
    else 3 with an AMBIGUOUS one (unless `allow_ambiguous`), else 0. NEW, GONE, SAME and
    IMPROVEMENT pass."""
    verdicts = list(verdicts)
    if stats.REGRESSION in verdicts:
        return EXIT_REGRESSION
    return EXIT_AMBIGUOUS if stats.AMBIGUOUS in verdicts and not allow_ambiguous else 0


@dataclass
class Comparison:
    base: str
    head: str
    machine: str  # fingerprint
    rows: list[stats.Verdict] = field(default_factory=list)
    ops: dict[str, str] = field(default_factory=dict)  # key -> op
    accuracy: list[stats.AccuracyVerdict] = field(default_factory=list)
    shift: float = 1.0  # the machine-wide ratio between the commits' runs, when significant

    @property
    def regressions(self) -> list:
        return [row for row in [*self.rows, *self.accuracy] if row.verdict == stats.REGRESSION]


def resolve_commit(conn: Connection, prefix: str) -> str:
    """The one stored commit that starts with ``prefix``; DashError if none or several."""
    prefix = prefix.strip().lower()
    if not prefix or any(ch not in "0123456789abcdef" for ch in prefix):
        raise DashError(f"commit {prefix!r} is not a hex commit sha or prefix")
    found = sorted({row[0] for table in (runs, accuracy) for row in conn.execute(
        sa.select(table.c.commit).where(table.c.commit.like(prefix + "%")).distinct())})
    if not found:
        raise DashError(f"commit {prefix!r}: no runs or validations of it are stored "
                        "(ingest its results file first)")
    if len(found) > 1:
        shown = ", ".join(c[:12] for c in found[:5])
        raise DashError(f"commit prefix {prefix!r} is ambiguous: it matches {shown}"
                        f"{', ...' if len(found) > 5 else ''}; give more digits")
    return found[0]


def resolve_machine(conn: Connection, machine: str | None, commits: tuple[str, ...]) -> tuple[int, str]:
    """(id, fingerprint) of the machine to compare on: ``machine`` is a fingerprint or a
    unique prefix of one; without it, the only machine that has runs of every commit, the
    simulation machine counting only where no other has."""
    with_all = None
    for commit in commits:
        ids = {row[0] for table in (runs, accuracy) for row in conn.execute(
            sa.select(table.c.machine_id).where(table.c.commit == commit).distinct())}
        with_all = ids if with_all is None else with_all & ids
    with_all = with_all or set()
    rows = conn.execute(sa.select(machines.c.id, machines.c.fingerprint)).all()
    names = {row.id: row.fingerprint for row in rows}
    short = ", ".join(f"{c[:12]}" for c in commits)
    if machine is not None:
        matches = [row for row in rows if row.fingerprint.startswith(machine.strip().lower())]
        if not matches:
            raise DashError(f"machine {machine!r}: no such machine "
                            f"(known: {', '.join(sorted(names.values())) or 'none'})")
        if len(matches) > 1:
            raise DashError(f"machine prefix {machine!r} is ambiguous: "
                            f"{', '.join(r.fingerprint for r in matches)}")
        chosen = matches[0]
        if chosen.id not in with_all:
            raise DashError(f"machine {chosen.fingerprint} has no runs of commit(s) {short} "
                            "on it")
        return chosen.id, chosen.fingerprint
    if not with_all:
        raise DashError(f"no machine has runs of both commits {short}")
    with_all = {i for i in with_all if names[i] != SIMULATION} or with_all
    if len(with_all) > 1:
        raise DashError(f"several machines have runs of both commits: "
                        f"{', '.join(sorted(names[i] for i in with_all))}; "
                        "choose one with --machine")
    only = next(iter(with_all))
    return only, names[only]


def run_values(conn: Connection, machine_id: int, commit: str) -> dict[int, dict[int, float]]:
    """{benchmark id: {run id: the run's value (`store.run_value`)}} for one commit on one
    machine."""
    out: dict[int, dict[int, float]] = {}
    query = (sa.select(results.c.benchmark_id, results.c.run_id, run_value())
             .join(runs, runs.c.id == results.c.run_id)
             .join(benchmarks, benchmarks.c.id == results.c.benchmark_id)
             .where(runs.c.machine_id == machine_id, runs.c.commit == commit)
             .order_by(runs.c.id))
    for bench_id, run_id, value in conn.execute(query):
        out.setdefault(bench_id, {})[run_id] = float(value)
    return out


def history_values(conn: Connection, machine_id: int, base: str, head: str,
                   bench_ids) -> dict[int, dict[int, float]]:
    """{benchmark id: {run id: value} of its history before commit `base`}: the runs of
    the `stats.HISTORY_COMMITS` latest commits before it in commit order (`head` excepted),
    on this machine, of that definition, at or after the last step `history` stored for it
    (`gnomon.dash.stats`)."""
    base_order = conn.execute(sa.select(sa.func.min(runs.c.commit_order)).where(
        runs.c.machine_id == machine_id, runs.c.commit == base)).scalar()
    if base_order is None or not bench_ids:
        return {}
    last_step = dict(conn.execute(
        sa.select(steps.c.benchmark_id, sa.func.max(steps.c.commit_order))
        .where(steps.c.machine_id == machine_id, steps.c.commit_order <= base_order,
               steps.c.benchmark_id.in_(bench_ids))
        .group_by(steps.c.benchmark_id)).all())
    query = (sa.select(results.c.benchmark_id, runs.c.commit, runs.c.commit_order,
                       results.c.run_id, run_value())
             .join(runs, runs.c.id == results.c.run_id)
             .join(benchmarks, benchmarks.c.id == results.c.benchmark_id)
             .where(runs.c.machine_id == machine_id, runs.c.commit_order < base_order,
                    runs.c.commit != head, results.c.benchmark_id.in_(bench_ids))
             .order_by(runs.c.commit_order.desc(), runs.c.id))
    by_key: dict[int, dict[str, dict[int, float]]] = {}
    for bench_id, commit, order, run_id, value in conn.execute(query):
        if order < last_step.get(bench_id, order):
            continue
        commits = by_key.setdefault(bench_id, {})
        if commit in commits or len(commits) < stats.HISTORY_COMMITS:
            commits.setdefault(commit, {})[run_id] = float(value)
    return {k: {r: v for values in c.values() for r, v in values.items()}
            for k, c in by_key.items()}


def compare(engine: Engine, base: str, head: str, machine: str | None = None,
            threshold: float = stats.DEFAULT_THRESHOLD,
            op_thresholds: Mapping[str, float] | None = None) -> Comparison:
    """Compares commits ``base`` and ``head`` (shas or unique prefixes) on one machine, each
    key with its history before the base (`history_values`).

    Keys present at only one commit are NEW or GONE, listed and not judged."""
    op_thresholds = dict(op_thresholds or {})
    with engine.connect() as conn:
        base_sha = resolve_commit(conn, base)
        head_sha = resolve_commit(conn, head)
        machine_id, fingerprint = resolve_machine(conn, machine, (base_sha, head_sha))
        simulation = conn.execute(sa.select(machines.c.id)
                                  .where(machines.c.fingerprint == SIMULATION)).scalar()
        figures = accuracy_figures(conn, {machine_id, simulation} - {None},
                                   (base_sha, head_sha))
        a = run_values(conn, machine_id, base_sha)
        b = run_values(conn, machine_id, head_sha)
        ids = sorted(set(a) | set(b))
        past = history_values(conn, machine_id, base_sha, head_sha, sorted(a))
        info = {row.id: row for row in conn.execute(
            sa.select(benchmarks.c.id, benchmarks.c.key, benchmarks.c.op)
            .where(benchmarks.c.id.in_(ids)))} if ids else {}
    unknown = set(op_thresholds) - {row.op for row in info.values()}
    if unknown:
        raise DashError(f"--threshold-op names op(s) {', '.join(sorted(unknown))} that no "
                        f"compared benchmark has (ops: "
                        f"{', '.join(sorted({r.op for r in info.values()})) or 'none'})")
    effects = stats.run_effects({(run, bench_id): value
                                 for table in (a, b, past)
                                 for bench_id, values in table.items()
                                 for run, value in values.items()})

    def steady(values: dict[int, float]) -> list[float]:  # the run's machine-wide part out
        return [v / math.exp(effects[run]) for run, v in values.items()]

    evidence, raw, per_key, ops, history = {}, {}, {}, {}, {}
    for bench_id in sorted(ids, key=lambda i: info[i].key):
        row = info[bench_id]
        label = row.key
        if label in evidence:  # same key, another definition: keep them apart
            label = f"{row.key} (definition {bench_id})"
        evidence[label] = (steady(a.get(bench_id, {})), steady(b.get(bench_id, {})))
        raw[label] = (list(a.get(bench_id, {}).values()), list(b.get(bench_id, {}).values()))
        history[label] = steady(past.get(bench_id, {}))
        ops[label] = row.op
        if row.op in op_thresholds:
            per_key[label] = op_thresholds[row.op]
    verdicts = stats.judge(evidence, threshold=threshold, thresholds=per_key,
                           history=history) if evidence else []
    base_runs = {r for values in (*a.values(), *past.values()) for r in values}
    head_runs = {r for values in b.values() for r in values}
    shift = stats.machine_shift([effects[r] for r in base_runs],
                                [effects[r] for r in head_runs], threshold)
    stats.mark_shifted(verdicts, raw, shift, threshold, per_key)
    judged = [stats.judge_accuracy(name, sides.get(base_sha, []), sides.get(head_sha, []))
              for name, sides in sorted(figures.items())]
    return Comparison(base_sha, head_sha, fingerprint, verdicts, ops, judged, shift)


def accuracy_figures(conn: Connection, machine_ids, commits) -> dict:
    """{series: {commit: [(value, noise floor), ...]}} for `commits` on the machines
    `machine_ids` (one real machine and the simulation machine hold different series)."""
    out: dict[str, dict[str, list]] = {}
    query = (sa.select(accuracy.c.series, accuracy.c.commit, accuracy.c.value,
                       accuracy.c.noise_floor)
             .where(accuracy.c.machine_id.in_(sorted(machine_ids)),
                    accuracy.c.commit.in_(commits))
             .order_by(accuracy.c.id))
    for series, commit, value, noise in conn.execute(query):
        out.setdefault(series, {}).setdefault(commit, []).append((value, noise))
    return out


# --------------------------------------------------------------------------- rendering

def format_ns(ns: float) -> str:
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def _ratio(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.3f}"


def _change(ratio: float) -> str:
    return "" if math.isnan(ratio) else f"{(ratio - 1) * 100:+.1f}%"


def ambiguous_notes(comparison: Comparison, limit: int = 10) -> list[str]:
    rows = [row for row in comparison.rows if row.verdict == stats.AMBIGUOUS]
    notes = [f"{row.key}: {row.note}" for row in rows[:limit]]
    if len(rows) > limit:
        notes.append(f"... and {len(rows) - limit} more AMBIGUOUS")
    return notes


def _q(q: float) -> str:
    return "-" if math.isnan(q) else f"{q:.2g}"


def summary_line(comparison: Comparison) -> str:
    counts = {v: 0 for v in stats.VERDICTS}
    for row in [*comparison.rows, *comparison.accuracy]:
        counts[row.verdict] += 1
    return ", ".join(f"{counts[v]} {v}" for v in stats.VERDICTS)


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def accuracy_rows(comparison: Comparison) -> list[tuple[str, ...]]:
    """(series, base, head, change, noise floor, verdict) per accuracy series, as text."""
    return [(row.series, _pct(row.base), _pct(row.head),
             "-" if math.isnan(row.head - row.base) else f"{row.head - row.base:+.1%}",
             _pct(row.noise_floor), row.verdict) for row in comparison.accuracy]


def render_table(comparison: Comparison, console=None) -> None:  # noqa: ANN001
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"{comparison.base[:12]} -> {comparison.head[:12]} "
                        f"on machine {comparison.machine}")
    table.add_column("key", overflow="fold", min_width=24)
    for name in ("base", "head", "ratio", "change", "q", "verdict"):
        table.add_column(name, justify="left" if name == "verdict" else "right", no_wrap=True)
    style = {stats.REGRESSION: "bold red", stats.IMPROVEMENT: "green",
             stats.AMBIGUOUS: "yellow", stats.SAME: "", stats.NEW: "cyan", stats.GONE: "cyan"}
    for row in comparison.rows:
        table.add_row(escape(row.key), format_ns(row.base_median), format_ns(row.head_median),
                      _ratio(row.ratio), _change(row.ratio), _q(row.q),
                      f"[{style[row.verdict]}]{row.verdict}[/]" if style[row.verdict]
                      else row.verdict)
    if comparison.rows:
        console.print(table)
    if comparison.accuracy:
        figures = Table(title="predictor accuracy (lower is better; a change beyond the noise "
                              "floor, or a simulation's tolerance, counts)")
        figures.add_column("series", overflow="fold", min_width=24)
        for name in ("base", "head", "change", "noise floor", "verdict"):
            figures.add_column(name, justify="left" if name == "verdict" else "right",
                               no_wrap=True)
        for cells in accuracy_rows(comparison):
            figures.add_row(*(escape(c) for c in cells[:-1]),
                            f"[{style[cells[-1]]}]{cells[-1]}[/]" if style[cells[-1]]
                            else cells[-1])
        console.print(figures)
    console.print(summary_line(comparison))
    if comparison.shift != 1.0:
        console.print(f"the head's runs took {comparison.shift:.3g}x the base's on every key at "
                      f"once: the machine, or a change to everything", highlight=False)
    for note in ambiguous_notes(comparison):
        console.print(f"  AMBIGUOUS {escape(note)}", soft_wrap=True, highlight=False)


def to_markdown(comparison: Comparison) -> str:
    lines = [f"### gnomon bench: `{comparison.base[:12]}` → `{comparison.head[:12]}` "
             f"(machine `{comparison.machine}`)", "",
             f"**{summary_line(comparison)}**", "",
             "| key | base | head | ratio | change | q | verdict |",
             "|---|---:|---:|---:|---:|---:|---|"]
    order = {v: i for i, v in enumerate((stats.REGRESSION, stats.IMPROVEMENT, stats.AMBIGUOUS,
                                         stats.NEW, stats.GONE, stats.SAME))}
    for row in sorted(comparison.rows, key=lambda r: (order[r.verdict], r.key)):
        verdict = f"**{row.verdict}**" if row.verdict == stats.REGRESSION else row.verdict
        key = row.key.replace("|", "\\|")
        lines.append(f"| `{key}` | {format_ns(row.base_median)} | "
                     f"{format_ns(row.head_median)} | {_ratio(row.ratio)} | {_change(row.ratio)} | "
                     f"{_q(row.q)} | "
                     f"{verdict} |")
    if comparison.accuracy:
        lines += ["", "| accuracy series | base | head | change | noise floor | verdict |",
                  "|---|---:|---:|---:|---:|---|"]
        for cells in accuracy_rows(comparison):
            verdict = f"**{cells[-1]}**" if cells[-1] == stats.REGRESSION else cells[-1]
            lines.append(f"| `{cells[0]}` | " + " | ".join(cells[1:-1]) + f" | {verdict} |")
    notes = ambiguous_notes(comparison)
    if notes:
        lines += [""] + [f"- AMBIGUOUS `{n.split(': ', 1)[0]}`: {n.split(': ', 1)[-1]}"
                         for n in notes]
    lines += ["", "Verdicts (`gnomon.dash.stats`): a one-sided t-test on the log of each run's "
              "fastest sample, the runs' machine-wide effect taken out, the base's history on "
              "its side and the noise moderated across keys; Benjamini–Hochberg across keys, "
              "q < 0.01 for a change beyond what one run in a slower state moves its side by, "
              "and the ratio beyond the threshold. A change the runs cannot confirm is "
              "AMBIGUOUS."]
    return "\n".join(lines) + "\n"
