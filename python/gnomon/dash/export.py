"""`site_data(engine)`: everything the static site draws, as one JSON-serialisable dict.

Shape::

    {"machines": [{"fingerprint", "device", "cpu_model", "cores", "ram_gb", "gpu_name"}],
     "benchmarks": [{"key", "suite", "op", "params", "definition_hash",
                     "machine": fingerprint,
                     "series": [{"commit", "commit_order", "median_ns", "q1_ns", "q3_ns",
                                 "runs", "flops", "bytes", "tflops", "gbps"}],
                     "steps": [{"commit", "ratio", "q", "state", "reason"}]}],
     "compare": {"base", "head", "machine",
                 "rows": [{"key", "base_median_ns", "head_median_ns", "ratio", "q",
                           "verdict"}]} | None,
     "peaks": {fingerprint: {"memory_gbps", "tflops"}},
     "accuracy": [{"series", "machine": fingerprint,
                   "points": [{"commit", "commit_order", "value", "noise_floor",
                               "validations"}],
                   "steps": [commit, ...]}]}

A series point is one commit: the median of its per-run medians, the medians of its per-run
q1 and q3, the number of runs, and throughput computed from that median. Steps are detected
afresh (nothing is written) and carry the states and reasons stored by `history` and `ack`.
`compare` holds the latest two commits of the first machine with runs (the simulation machine of
accuracy documents has none) when both have runs there.
"""

from __future__ import annotations

import math

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gnomon.dash import comparison as compare_mod
from gnomon.dash import history, stats
from gnomon.dash.store import benchmarks, machines, results, runs


def _finite(value: float) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else float(value)


def site_data(engine: Engine) -> dict:
    with engine.connect() as conn:
        machine_rows = conn.execute(sa.select(machines).order_by(machines.c.id)).all()
        names = {row.id: row.fingerprint for row in machine_rows}
        bench_rows = {row.id: row for row in conn.execute(sa.select(benchmarks))}
        query = (sa.select(results.c.benchmark_id, runs.c.machine_id, runs.c.commit,
                           runs.c.commit_order, results.c.median, results.c.q1,
                           results.c.q3, results.c.flops, results.c.bytes)
                 .join(runs, runs.c.id == results.c.run_id)
                 .order_by(runs.c.commit_order, runs.c.id))
        grouped: dict[tuple[int, int], dict[str, dict]] = {}
        for row in conn.execute(query):
            point = grouped.setdefault((row.benchmark_id, row.machine_id), {}).setdefault(
                row.commit, {"commit": row.commit, "commit_order": row.commit_order,
                             "medians": [], "q1": [], "q3": [], "flops": row.flops,
                             "bytes": row.bytes})
            point["medians"].append(row.median)
            point["q1"].append(row.q1)
            point["q3"].append(row.q3)
        found = history.merge_stored(conn, history.detect(conn))
        accuracy = _accuracy(conn)
        peaks = {}
        for machine_id, fingerprint in names.items():
            latest = conn.execute(sa.select(runs.c.peaks).where(runs.c.machine_id == machine_id)
                                  .order_by(runs.c.commit_order.desc(), runs.c.id.desc())
                                  .limit(1)).first()
            value = latest[0] if latest else {}
            peaks[fingerprint] = {"memory_gbps": value.get("memory_gbps"),
                                  "tflops": dict(value.get("tflops") or {})}
        first_machine = conn.execute(sa.select(sa.func.min(runs.c.machine_id))).scalar()
        first_machine_commits = []
        if first_machine is not None:
            first_machine_commits = [row[0] for row in conn.execute(
                sa.select(runs.c.commit).where(runs.c.machine_id == first_machine)
                .group_by(runs.c.commit).order_by(sa.func.min(runs.c.commit_order).desc())
                .limit(2))]

    steps_by_series: dict[tuple[int, int], list[dict]] = {}
    for step in found:
        steps_by_series.setdefault((step.benchmark_id, step.machine_id), []).append(
            {"commit": step.commit, "ratio": step.ratio, "q": step.q, "state": step.state,
             "reason": step.reason})

    out_benchmarks = []
    for (bench_id, machine_id), points in sorted(
            grouped.items(), key=lambda item: (bench_rows[item[0][0]].key, item[0][1])):
        bench = bench_rows[bench_id]
        series = []
        for point in sorted(points.values(), key=lambda p: p["commit_order"]):
            med = stats.median(point["medians"])
            series.append({
                "commit": point["commit"], "commit_order": point["commit_order"],
                "median_ns": med, "q1_ns": stats.median(point["q1"]),
                "q3_ns": stats.median(point["q3"]), "runs": len(point["medians"]),
                "flops": int(point["flops"]), "bytes": int(point["bytes"]),
                "tflops": point["flops"] / med / 1e3 if med > 0 else 0.0,
                "gbps": point["bytes"] / med if med > 0 else 0.0})
        out_benchmarks.append({
            "key": bench.key, "suite": bench.suite, "op": bench.op,
            "params": dict(bench.params), "definition_hash": bench.definition_hash,
            "machine": names[machine_id], "series": series,
            "steps": steps_by_series.get((bench_id, machine_id), [])})

    comparison = None
    if len(first_machine_commits) == 2:
        head, base = first_machine_commits
        result = compare_mod.compare(engine, base, head, machine=names[first_machine])
        comparison = {
            "base": result.base, "head": result.head, "machine": result.machine,
            "rows": [{"key": row.key, "base_median_ns": _finite(row.base_median),
                      "head_median_ns": _finite(row.head_median), "ratio": _finite(row.ratio),
                      "q": _finite(row.q), "verdict": row.verdict} for row in result.rows]}

    return {
        "machines": [{"fingerprint": row.fingerprint, "device": row.device,
                      "cpu_model": row.cpu_model, "cores": row.cores, "ram_gb": row.ram_gb,
                      "gpu_name": row.gpu_name} for row in machine_rows],
        "benchmarks": out_benchmarks,
        "compare": comparison,
        "peaks": peaks,
        "accuracy": accuracy,
    }


def _accuracy(conn) -> list[dict]:
    """Each accuracy series: per commit the median value and noise floor of its validations,
    and the commits where it moved beyond the noise floor (`history.accuracy_steps`)."""
    moved: dict[tuple[str, str], list[str]] = {}
    for step in history.accuracy_steps(conn):
        moved.setdefault((step.machine, step.series), []).append(step.commit)
    out = []
    for (fingerprint, series), points in sorted(history.accuracy_series(conn).items()):
        out.append({"series": series, "machine": fingerprint, "points": [
            {"commit": commit, "commit_order": order,
             "value": stats.median([v for v, _ in pairs]),
             "noise_floor": stats.median([n for _, n in pairs]), "validations": len(pairs)}
            for commit, order, pairs in points],
            "steps": moved.get((fingerprint, series), [])})
    return out
