"""gnomon's accuracy against NVIDIA AIConfigurator's on the same measured rows, group by group.

Inputs: a `gnomon accuracy --out` document over aiconfigurator-core's ``silicon_sample.csv``, and
the peer's answers on the same rows (``bench/peer_aiconfigurator.py``, run in its own virtual
environment; its output on aiconfigurator 0.12.0, over every row that script selects, is
``bench/data/aiconfigurator_0.12.0_rows.jsonl``).
Rows join by the CSV's ``id``. Per group (gnomon's: model x hardware x engine x dtype x source)
it prints the rows each answers and, on the rows both answer, each one's TTFT and TPOT MAPE and
that of the closed-loop throughput each one's means give (`scorecard.loop_throughput`, Little's
law); then the same over the fit split, the held-out split and all rows, and the goal check: in
every group where the peer answers at least 5 rows, gnomon's TTFT and TPOT MAPE below the peer's.

    python bench/accuracy_vs_aiconfigurator.py ACCURACY.json [--peer FILE] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

from gnomon.predict import scorecard

PEER = os.path.join(os.path.dirname(__file__), "data", "aiconfigurator_0.12.0_rows.jsonl")
MIN_PEER_ROWS = 5


def _mape(pairs):
    return sum(abs(p / m - 1) for p, m in pairs) / len(pairs) if pairs else None


def _loop(row, means):
    """The closed-loop throughput of `means` (a side's TTFT and TPOT) for `row`'s point."""
    point = row["point"]
    return scorecard.loop_throughput(means["ttft_ms"], means["tpot_ms"], point["concurrency"],
                                     scorecard.mean_length(point["output_len"]))


def _load_peer(path):
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                out[row["id"]] = row
    return out


def compare(doc, peer):
    """Per group and per split: rows, answered by each, and both MAPEs on the shared rows."""
    buckets = defaultdict(list)
    for r in doc["rows"]:
        if r["status"] == scorecard.EXCLUDED:
            continue
        key = " | ".join(r["group"][k] for k in ("model", "hardware", "engine", "dtype",
                                                  "source"))
        for bucket in (key, f"split {r['split'] or 'none'}", "all rows"):
            buckets[bucket].append(r)
    table = []
    for key, rows in buckets.items():
        ours = [r for r in rows if r["status"] == scorecard.ANSWERED]
        theirs = [r for r in rows if "ttft_ms" in peer.get(r["id"], {})]
        both = [r for r in ours if "ttft_ms" in peer.get(r["id"], {})]
        line = {"group": key, "rows": len(rows), "gnomon_answers": len(ours),
                "peer_answers": len(theirs), "both": len(both),
                "split": sorted({r["split"] for r in rows})}
        for metric in ("ttft", "tpot"):
            line[f"gnomon_{metric}"] = _mape([(r["predicted"][f"{metric}_ms"],
                                              r["measured"][f"{metric}_ms"]) for r in both])
            line[f"peer_{metric}"] = _mape([(peer[r["id"]][f"{metric}_ms"],
                                            r["measured"][f"{metric}_ms"]) for r in both])
            line[f"gnomon_{metric}_all"] = _mape([(r["predicted"][f"{metric}_ms"],
                                                  r["measured"][f"{metric}_ms"]) for r in ours])
        loops = [(_loop(r, r["predicted"]), _loop(r, peer[r["id"]]), _loop(r, r["measured"]))
                 for r in both if r["point"]["concurrency"] and r["point"]["output_len"]]
        loops = [x for x in loops if None not in x]
        line["gnomon_loop"] = _mape([(ours, measured) for ours, _, measured in loops])
        line["peer_loop"] = _mape([(theirs, measured) for _, theirs, measured in loops])
        table.append(line)
    order = {"all rows": 2, "split fit": 0, "split held-out": 1}
    table.sort(key=lambda line: (line["group"] in order, order.get(line["group"], 0),
                                 line["group"]))
    return table


def _pct(x):
    return "-" if x is None else f"{x:.1%}"


def render(table, markdown: bool) -> None:
    head = ["group", "rows", "gnomon answers", "peer answers", "both",
            "TTFT gnomon", "TTFT peer", "TPOT gnomon", "TPOT peer", "throughput gnomon",
            "throughput peer"]
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for line in table:
        cells = [line["group"], str(line["rows"]), str(line["gnomon_answers"]),
                 str(line["peer_answers"]), str(line["both"]), _pct(line["gnomon_ttft"]),
                 _pct(line["peer_ttft"]), _pct(line["gnomon_tpot"]), _pct(line["peer_tpot"]),
                 _pct(line["gnomon_loop"]), _pct(line["peer_loop"])]
        print(("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells))
    groups = [t for t in table if " | " in t["group"] and t["both"] >= MIN_PEER_ROWS]
    behind = [t for t in groups if t["gnomon_ttft"] >= t["peer_ttft"]
              or t["gnomon_tpot"] >= t["peer_tpot"]]
    print(f"\ngroups where the peer answers >= {MIN_PEER_ROWS} of the rows gnomon answers: "
          f"{len(groups)}; gnomon ahead on both metrics in {len(groups) - len(behind)}")
    for t in behind:
        print(f"  behind: {t['group']}: TTFT {_pct(t['gnomon_ttft'])} vs "
              f"{_pct(t['peer_ttft'])}, TPOT {_pct(t['gnomon_tpot'])} vs {_pct(t['peer_tpot'])}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("accuracy", help="a gnomon accuracy document")
    parser.add_argument("--peer", default=PEER, help="the peer's rows (JSONL)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    render(compare(scorecard.load(args.accuracy), _load_peer(args.peer)), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
