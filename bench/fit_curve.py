"""Fit one flat efficiency curve of ``gnomon/predict/data/efficiency.json`` on the fit split.

For a curve with no public figure for the kernels the engines run, the measured serving runs of
the fit split say what those kernels reach. For each candidate value the curve is set flat at
it, the chosen fit-split rows are simulated (`gnomon.predict.scorecard`), and the value with the
lowest MAPE of the chosen metric wins. Held-out rows are never read. ``--write`` stores the
winner with its provenance: the grid, each value's MAPE, and the rows (groups and count).

    python bench/fit_curve.py --points PATH/silicon_sample.csv \
        --curve blackwell.grouped_gemm_memory --values 0.52,0.65,0.8 --metric tpot \
        --model gpt-oss-120b --hardware B200 [--weight-dtype nvfp4] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections import Counter

from gnomon.predict import efficiency, measured, scorecard


def _set(raw: dict, generation: str, curve: str, value: float, source: str) -> None:
    entry = raw["generations"][generation][curve]
    entry.update(points=[[1, value]], source=source)
    entry.pop("default", None)


def evaluate(points, generation, curve, value, metric, jobs):
    """The MAPE of `metric` over `points` with the curve flat at `value` (the data file is
    rewritten for the run and restored after it: spawned workers read it afresh)."""
    with open(efficiency.DATA_FILE, encoding="utf-8") as f:
        raw = json.load(f)
    backup = tempfile.NamedTemporaryFile(delete=False, suffix=".json").name
    shutil.copyfile(efficiency.DATA_FILE, backup)
    try:
        _set(raw, generation, curve, value, "candidate of bench/fit_curve.py")
        with open(efficiency.DATA_FILE, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1)
        doc = scorecard.run(points, jobs=jobs)
    finally:
        shutil.copyfile(backup, efficiency.DATA_FILE)
        os.unlink(backup)
    return doc["overall"][metric]["mape"], doc["overall"][metric]["rows"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", default=None)
    parser.add_argument("--curve", required=True, help="GENERATION.CURVE")
    parser.add_argument("--values", required=True, help="comma-separated candidates")
    parser.add_argument("--metric", choices=scorecard.METRICS, required=True)
    parser.add_argument("--model", default="")
    parser.add_argument("--hardware", default="")
    parser.add_argument("--weight-dtype", default="",
                        help="keep only the rows of these dense weight dtypes (comma-separated)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    generation, _, curve = args.curve.partition(".")
    if curve not in efficiency.CURVES:
        parser.error(f"--curve: expected GENERATION.CURVE with CURVE one of "
                     f"{', '.join(efficiency.CURVES)}")
    points, _ = measured.load_silicon(args.points)
    points = scorecard.filter_points(
        points, split="fit", models=[m for m in args.model.split(",") if m],
        hardware=[h for h in args.hardware.split(",") if h])
    dtypes = [d for d in args.weight_dtype.split(",") if d]
    points = [p for p in points if p.ep == 1 and p.dp == 1
              and (not dtypes or p.weight_dtype in dtypes)]
    excluded = scorecard.under_specified(points)
    points = [p for p in points if p.id not in excluded]
    groups = Counter(f"{p.model} on {p.hardware} with {p.engine} ({p.source})" for p in points)
    grid = []
    for value in (float(v) for v in args.values.split(",")):
        mape, rows = evaluate(points, generation, curve, value, args.metric, args.jobs)
        grid.append((value, mape))
        print(f"{args.curve} = {value:g}: {args.metric} MAPE {mape:.1%} over {rows} rows")
    best, mape = min(grid, key=lambda vm: vm[1])
    print(f"best: {best:g} ({mape:.1%})")
    if args.write:
        with open(efficiency.DATA_FILE, encoding="utf-8") as f:
            raw = json.load(f)
        old = raw["generations"][generation][curve]
        source = (f"fitted by bench/fit_curve.py on {len(points)} fit-split rows of "
                  f"aiconfigurator-core 0.12.0's silicon_sample.csv ("
                  + "; ".join(f"{n} {g}" for g, n in sorted(groups.items()))
                  + f"): the flat value of the grid "
                  + ", ".join(f"{v:g} ({m:.1%})" for v, m in grid)
                  + f" with the lowest {args.metric.upper()} MAPE. It replaced "
                  f"{old['points']} from {old['source']}")
        _set(raw, generation, curve, best, source)
        with open(efficiency.DATA_FILE, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1)
            f.write("\n")
        print(f"wrote {efficiency.DATA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
