"""Power and false alarms of `gnomon dash compare` on real `gnomon bench --quick` runs.

One build is benched once with ``--runs N``: every run is a process of its own (a full pass
over the quick cases, on this machine), so its runs are what N separate benches of the build
would give. They are dealt out to made-up commits, so every comparison below is between runs
of the same code; a slowdown is planted by multiplying every sample and stat of one case of the
head's runs by a factor. Each scenario is repeated ``--repeats`` times over fresh random deals,
each into a fresh SQLite store, through the same `compare` the CLI runs:

- A/A, 3 runs a side: the keys flagged REGRESSION or IMPROVEMENT (false alarms), the keys
  left AMBIGUOUS, and how many deals `compare` would exit 0 (pass), 1 (a REGRESSION) or 3
  (AMBIGUOUS) on, which is what a CI job running it sees;
- A/A, 1 run a side with `stats.HISTORY_COMMITS` (16) earlier commits of 1 run as history: the
  same;
- 1.5x planted, 3 runs a side, and 1 run a side with history: is the key a REGRESSION;
- 1.10x planted, 7 runs a side, and 1 run a side with history: likewise.

    python bench/regression_gate.py [--runs 48] [--repeats 40] [--results FILE] [--out FILE]

``--results`` reuses a results file of ``gnomon bench --quick --runs N`` instead of benching.
Nothing else may run on the machine meanwhile: the runs are the noise under test.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile
from collections import Counter

from gnomon.dash import comparison, stats, store

HISTORY = stats.HISTORY_COMMITS


def bench(runs: int, out: str) -> dict:
    subprocess.run([sys.executable, "-m", "gnomon.cli", "bench", "--quick", "--runs", str(runs),
                    "--out", out], check=True, stdout=subprocess.DEVNULL)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def commit_doc(doc: dict, name: str, runs: list, slow_key: str | None = None,
               factor: float = 1.0) -> dict:
    """A results document of commit `name` holding `runs` (copies), the case `slow_key`
    slowed by `factor` in each."""
    out = copy.deepcopy(doc)
    out["commit"] = (name.encode().hex() + "0" * 40)[:40]
    out["runs"] = []
    for index, run in enumerate(runs):
        run = copy.deepcopy(run)
        run["index"] = index
        for case in run["cases"]:
            if case["key"] == slow_key:
                case["samples_ns"] = [round(s * factor) for s in case["samples_ns"]]
                case["stats"] = {k: (v if k == "count" else v * factor)
                                 for k, v in case["stats"].items()}
        out["runs"].append(run)
    return out


def compare(docs: list, folder: str, base: dict, head: dict) -> dict:
    """{key: verdict} of `compare` (base, head) in a fresh store holding `docs` in order."""
    paths = []
    for i, doc in enumerate(docs):
        paths.append(os.path.join(folder, f"{i}.json"))
        with open(paths[-1], "w", encoding="utf-8") as f:
            json.dump(doc, f)
    url = f"sqlite:///{os.path.join(folder, f'store{random.random()}.sqlite')}"
    engine = store.open_engine(url)
    try:
        store.ingest(engine, paths)
        result = comparison.compare(engine, base["commit"], head["commit"])
    finally:
        engine.dispose()
    return {row.key: row.verdict for row in result.rows}


def scenario(doc: dict, rng: random.Random, folder: str, *, side: int, history: bool,
             slow_key: str | None = None, factor: float = 1.0) -> dict:
    runs = list(doc["runs"])
    rng.shuffle(runs)
    past = [commit_doc(doc, f"past{i}", [runs.pop()]) for i in range(HISTORY if history else 0)]
    base = commit_doc(doc, "base", [runs.pop() for _ in range(side)])
    head = commit_doc(doc, "head", [runs.pop() for _ in range(side)], slow_key, factor)
    return compare([*past, base, head], folder, base, head)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--results", help="a results file of gnomon bench --quick --runs N")
    parser.add_argument("--out", help="write the figures here (JSON)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        doc = (json.load(open(args.results, encoding="utf-8")) if args.results
               else bench(args.runs, os.path.join(folder, "runs.json")))
        need = max(2 * 7, HISTORY + 2)
        if len(doc["runs"]) < need:
            raise SystemExit(f"--runs: these scenarios need {need} runs, got {len(doc['runs'])}")
        keys = sorted({case["key"] for case in doc["runs"][0]["cases"]})
        rng = random.Random(args.seed)
        figures = {"runs": len(doc["runs"]), "keys": len(keys), "repeats": args.repeats,
                   "history_commits": HISTORY, "alpha": stats.ALPHA,
                   "threshold": stats.DEFAULT_THRESHOLD, "scenarios": {}}
        plans = [("A/A, 3 runs a side", dict(side=3, history=False), None),
                 ("A/A, 1 run a side + history", dict(side=1, history=True), None),
                 ("1.5x, 3 runs a side", dict(side=3, history=False), 1.5),
                 ("1.5x, 1 run a side + history", dict(side=1, history=True), 1.5),
                 ("1.10x, 7 runs a side", dict(side=7, history=False), 1.10),
                 ("1.10x, 1 run a side + history", dict(side=1, history=True), 1.10)]
        for name, kw, factor in plans:
            flagged, ambiguous, caught, missed = Counter(), Counter(), 0, Counter()
            exits = Counter()
            for _ in range(args.repeats):
                key = rng.choice(keys) if factor else None
                verdicts = scenario(doc, rng, folder, slow_key=key, factor=factor or 1.0, **kw)
                exits[comparison.exit_code(verdicts.values())] += 1
                others = {k: v for k, v in verdicts.items() if k != key}
                flagged.update(f"{k}: {v}" for k, v in others.items()
                               if v in (stats.REGRESSION, stats.IMPROVEMENT))
                ambiguous.update(k for k, v in others.items() if v == stats.AMBIGUOUS)
                if key is not None:
                    if verdicts[key] == stats.REGRESSION:
                        caught += 1
                    else:
                        missed[f"{key}: {verdicts[key]}"] += 1
            row = {"false_alarm_keys": sum(flagged.values()),
                   "false_alarms_by_key": dict(flagged.most_common()),
                   "ambiguous_keys": sum(ambiguous.values()),
                   "ambiguous_by_key": dict(ambiguous.most_common()),
                   "exit_codes": {str(code): exits[code] for code in (0, 1, 3)}}
            if factor:
                row.update(planted_caught=caught, missed=dict(missed))
            figures["scenarios"][name] = row
            print(f"{name:32s} over {args.repeats} deals: {sum(flagged.values())} false alarm(s), "
                  f"{sum(ambiguous.values())} AMBIGUOUS key(s)"
                  + (f", planted slowdown a REGRESSION in {caught} of {args.repeats}"
                     if factor else "")
                  + f"; compare exits 0 / 1 / 3 in {exits[0]} / {exits[1]} / {exits[3]}",
                  flush=True)
            for what, n in (list(flagged.items()) + list(missed.items())
                            + list(ambiguous.most_common(3))):
                print(f"    {n} x {what}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
