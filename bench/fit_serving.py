"""Fit each engine profile's serving path (`gnomon.predict.engines.ServingPath`) on the fit split.

The serving path is what a request crosses outside the engine's steps: the API server and
tokenisation on the way in, output processing and streaming on the way out. A simulation with no
serving path leaves exactly that in the measured TTFT at light load, where a request barely
queues. So, per engine, on the fit-split rows at concurrency <= `LIGHT` of the sources whose
benchmark client is known (silicon.json's ``workload.client_sources``: a serving path is the
way through that client and the server; other sources, whose client is not stated, stay out):

1. simulate each row with the profile's serving path set to zero (its scheduling ahead kept:
   that is a mechanism read from the engine's source, not a fitted number);
2. take the TTFT left over, ``measured - predicted`` (ms), per row;
3. fit ``left = request_s + per_prompt_token_s * mean prompt tokens`` by the Theil-Sen
   estimator (the median of the pairwise slopes, then the median intercept), both clipped at 0
   (a negative cost does not exist). A median, not least squares: a few rows of a source run
   far from the rest, and a mean would follow them.

The split between the way in and the way out cannot be told apart from mean TTFTs, so the whole
fixed part goes to ``request_s`` and ``response_s`` stays 0. Nor can a light-load TTFT tell the
serving path from prompt time the roofline misses on the fitted rows' models, so the figures hold
both, fitted over every model whose rows an engine has (an engine whose rows are all one model's,
SGLang's DeepSeek-V3, carries that model's in full). Held-out rows (h200_sxm) are never
read. ``--write`` stores the figures in ``gnomon/predict/data/engines.json`` with the rows they
were fitted on (the groups and the count).

    python bench/fit_serving.py [--points PATH/silicon_sample.csv] [--model M,...]
        [--engine E,...] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import replace

from gnomon.predict import engines, measured, scorecard

LIGHT = 8  # the highest concurrency a row may run at to enter the fit


def profile_with(name: str, folder: str, edit) -> str:
    """A profile file of the shipped profile `name` after ``edit(raw entry)`` (it returns the
    entry to write), for points to name as their engine."""
    with open(engines.DATA_FILE, encoding="utf-8") as f:
        raw = json.load(f)["engines"][name]
    path = os.path.join(folder, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(dict(edit(raw), name=name), f)
    return path


def _zeroed_serving(raw: dict) -> dict:
    """The entry with no serving path but its scheduling ahead."""
    ahead = raw.get("serving", {}).get("schedule_ahead_steps", 0)
    return dict(raw, serving={"request_s": 0.0, "per_prompt_token_s": 0.0, "response_s": 0.0,
                              "schedule_ahead_steps": ahead})


def _prompt_mean(point: measured.MeasuredPoint) -> float:
    lo, _, hi = point.input_len.partition(":")
    return (int(lo) + int(hi or lo)) / 2


def median(values):
    s = sorted(values)
    n = len(s)
    return (s[(n - 1) // 2] + s[n // 2]) / 2


def _theil_sen(xs, ys):
    """``(a, b)`` of ``y = a + b x``: b the median slope over pairs of distinct x, a the median
    of ``y - b x``; each clipped at 0 (then the other refitted alone)."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs))
              for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    b = max(median(slopes), 0.0) if slopes else 0.0
    a = median([y - b * x for x, y in zip(xs, ys)])
    if a < 0:
        a, b = 0.0, max(median([y / x for x, y in zip(xs, ys) if x]), 0.0)
    return a, b


def answered_by_engine(points, jobs: int, keep, edit, models=None, engine_names=None):
    """Per engine profile, in name order: ``(name, pairs)``, the ``(point, record)`` of each
    fit-split row of a client-known source that ``keep(point)`` takes (and `models` /
    `engine_names`, sets, where given), simulated under the shipped profile after ``edit(raw
    entry)`` (`profile_with`), that the simulation answered. Rows launched with speculative
    decoding stay out: their times rest on an assumed draft acceptance (silicon.json's launch
    rule), not only on what the steps and the serving path cost."""
    known = set(measured.silicon_table()["workload"]["client_sources"])
    by_engine = defaultdict(list)
    for p in points:
        if (p.split == "fit" and p.concurrency is not None and p.source in known and keep(p)
                and "num_speculative_tokens" not in p.engine_settings
                and (models is None or p.model in models)
                and (engine_names is None or p.engine in engine_names)):
            by_engine[p.engine].append(p)
    with tempfile.TemporaryDirectory() as folder:
        for name, group in sorted(by_engine.items()):
            edited = profile_with(name, folder, edit)
            doc = scorecard.run([replace(p, engine=edited) for p in group], jobs=jobs)
            by_id = {p.id: p for p in group}
            yield name, [(by_id[r["id"]], r) for r in doc["rows"]
                         if r["status"] == scorecard.ANSWERED]


def group_name(point) -> str:
    """The rows' group a fit reports: model, hardware and source."""
    return f"{point.model} on {point.hardware} ({point.source})"


def fit(points, jobs: int, models=None, engine_names=None):
    """The fit per engine profile; `models` / `engine_names` (sets) keep only those rows."""
    def light(p):
        return p.concurrency <= LIGHT and p.ep == 1 and p.dp == 1

    out = {}
    for name, pairs in answered_by_engine(points, jobs, light, _zeroed_serving, models,
                                          engine_names):
        xs = [_prompt_mean(p) for p, _ in pairs]
        ys = [r["measured"]["ttft_ms"] - r["predicted"]["ttft_ms"] for _, r in pairs]
        used = Counter(group_name(p) for p, _ in pairs)
        if len(xs) < 3:
            print(f"{name}: {len(xs)} light fit rows answered; not fitted")
            continue
        a, b = _theil_sen(xs, ys)
        left = [y - a - b * x for x, y in zip(xs, ys)]
        out[name] = {"request_s": a / 1e3, "per_prompt_token_s": b / 1e3, "rows": len(xs),
                     "groups": dict(used),
                     "residual_ms": {"median_abs_before": median(map(abs, ys)),
                                     "median_abs_after": median(map(abs, left))}}
        print(f"{name}: request_s {a:.2f} ms + {b * 1e3:.3f} us per prompt token, on "
              f"{len(xs)} rows; median |TTFT left| "
              f"{out[name]['residual_ms']['median_abs_before']:.1f} -> "
              f"{out[name]['residual_ms']['median_abs_after']:.1f} ms")
        for group, n in used.items():
            print(f"    {n:3d} {group}")
    return out


def write_entries(fitted, store) -> None:
    """Each fitted engine's figures into engines.json: ``store(entry, figures, groups)`` edits
    the engine's entry, ``groups`` the rows' groups as one line of text."""
    with open(engines.DATA_FILE, encoding="utf-8") as f:
        raw = json.load(f)
    for name, fig in fitted.items():
        groups = "; ".join(f"{n} {g}" for g, n in sorted(fig["groups"].items()))
        store(raw["engines"][name], fig, groups)
    with open(engines.DATA_FILE, "w", encoding="utf-8") as f:
        json.dump(raw, f, indent=1)
        f.write("\n")
    print(f"wrote {engines.DATA_FILE}")


def _store(entry: dict, fig: dict, groups: str) -> None:
    ahead = entry.get("serving", {}).get("schedule_ahead_steps", 0)
    entry["serving"] = {"request_s": round(fig["request_s"], 6),
                        "per_prompt_token_s": round(fig["per_prompt_token_s"], 10),
                        "response_s": 0.0, "schedule_ahead_steps": ahead}
    entry["sources"]["serving"] = (
        f"fitted by bench/fit_serving.py on {fig['rows']} fit-split rows of "
        f"aiconfigurator-core 0.12.0's silicon_sample.csv at concurrency <= {LIGHT} "
        f"({groups}): "
        f"the TTFT a simulation without a serving path leaves, Theil-Sen against the "
        f"prompt tokens; median |TTFT left| {fig['residual_ms']['median_abs_before']:.1f} "
        f"-> {fig['residual_ms']['median_abs_after']:.1f} ms. The fixed part is all request_s: "
        f"mean TTFTs cannot tell the way in from the way out. What the rows leave holds the "
        f"API server and tokenisation and any prompt time the roofline misses on these rows' "
        f"models; light-load TTFTs cannot tell those apart either")


def write(fitted) -> None:
    write_entries(fitted, _store)


def run_cli(argv, doc: str, fit_rows, write_fit) -> int:
    """The command line of a fit script: load the points, ``fit_rows(points, jobs, models,
    engines)``, print it, and ``write_fit(fitted)`` under ``--write``."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--points", default=None,
                        help="a silicon_sample.csv (default: the installed aiconfigurator-core's)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default=None,
                        help="fit on these gnomon models' rows only (comma-separated)")
    parser.add_argument("--engine", default=None,
                        help="fit (and write) these engine profiles only (comma-separated)")
    parser.add_argument("--write", action="store_true", help="store the fit in engines.json")
    args = parser.parse_args(argv)
    points, _ = measured.load_silicon(args.points)
    fitted = fit_rows(points, args.jobs, *(None if a is None else set(a.split(","))
                                           for a in (args.model, args.engine)))
    print(json.dumps(fitted, indent=1))
    if args.write:
        write_fit(fitted)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(None, __doc__, fit, write))
