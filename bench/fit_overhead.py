"""Fit each engine profile's exposed per-sequence overhead (`EngineOverhead.exposed_per_seq_s`)
on the fit split.

The measured TPOTs of vLLM and SGLang runs grow with the batch faster than the simulation's
steps: at concurrency 16 to 512 a simulation without it leaves tens of microseconds per running
sequence per step in most models (TensorRT-LLM a few). Part of it is host work per sequence that
the engine's overlap (async scheduling, the overlap scheduler) does not hide; part is GPU work
the roofline under-prices, since rows with 8k prompts leave more per sequence than rows with 1k
ones (the prompts' prefill runs between the decodes). The figure does not tell them apart; it is
what the steps miss per sequence. So, per engine, on the fit-split rows at concurrency >= `BUSY`
without attention data parallelism, of the sources whose benchmark client is known
(silicon.json's ``workload.client_sources``, as `bench/fit_serving.py`):

1. simulate each row with the profile's exposed per-sequence overhead set to zero (everything
   else as shipped);
2. take the TPOT left over per sequence in the step, ``(measured - predicted) / concurrency``
   (a closed loop keeps about `concurrency` sequences running);
3. the figure is the one that minimises those rows' TPOT MAPE once each row's TPOT grows by it
   times its concurrency: the median of the leftovers weighted by ``concurrency / measured``
   (each row's relative error is ``|leftover - x| * concurrency / measured``), clipped at 0 (a
   negative cost does not exist). A median, not least squares: rows where something else is
   wrong (a preemption storm, a launch setting not read) would pull a mean after them.

Held-out rows (h200_sxm) are never read. ``--write`` stores the figures in
``gnomon/predict/data/engines.json`` with the rows they were fitted on (the groups and the count).

    python bench/fit_overhead.py [--points PATH/silicon_sample.csv] [--model M,...]
        [--engine E,...] [--write]
"""

from __future__ import annotations

import sys
from collections import Counter

from fit_serving import answered_by_engine, group_name, run_cli, write_entries

BUSY = 16  # the lowest concurrency a row may run at to enter the fit


def weighted_median(pairs) -> float:
    """The value at half the total weight of ``(value, weight)`` pairs sorted by value."""
    ranked = sorted(pairs)
    half, seen = sum(w for _, w in ranked) / 2, 0.0
    for value, weight in ranked:
        seen += weight
        if seen >= half:
            return value
    raise ValueError("weighted_median: expected pairs of positive weight")


def _unexposed(raw: dict) -> dict:
    """The entry with no exposed per-sequence overhead."""
    return dict(raw, overhead=dict(raw["overhead"], exposed_per_seq_s=0.0))


def fit(points, jobs: int, models=None, engine_names=None):
    """The fit per engine profile; `models` / `engine_names` (sets) keep only those rows."""
    def busy(p):
        return p.concurrency >= BUSY and p.dp == 1

    out = {}
    for name, pairs in answered_by_engine(points, jobs, busy, _unexposed, models, engine_names):
        pairs = [(p, r) for p, r in pairs if r["measured"]["tpot_ms"]]
        left = [((r["measured"]["tpot_ms"] - r["predicted"]["tpot_ms"]) / 1e3 / p.concurrency,
                 p.concurrency / r["measured"]["tpot_ms"]) for p, r in pairs]
        used = Counter(group_name(p) for p, _ in pairs)
        if len(left) < 3:
            print(f"{name}: {len(left)} busy fit rows answered; not fitted")
            continue
        per_seq = max(weighted_median(left), 0.0)
        ranked = sorted(x for x, _ in left)
        out[name] = {"exposed_per_seq_s": per_seq, "rows": len(left), "groups": dict(used),
                     "tpot_left_us": {"p25": ranked[len(left) // 4] * 1e6,
                                      "p75": ranked[3 * len(left) // 4] * 1e6}}
        print(f"{name}: {per_seq * 1e6:.1f} us per sequence per step, on {len(left)} rows "
              f"(quartiles {out[name]['tpot_left_us']['p25']:.1f} to "
              f"{out[name]['tpot_left_us']['p75']:.1f} us)")
        for g, n in used.items():
            print(f"    {n:3d} {g}")
    return out


def _store(entry: dict, fig: dict, groups: str) -> None:
    entry["overhead"]["exposed_per_seq_s"] = round(fig["exposed_per_seq_s"], 8)
    q = fig["tpot_left_us"]
    entry["sources"]["exposed_overhead"] = (
        f"fitted by bench/fit_overhead.py on {fig['rows']} fit-split rows of "
        f"aiconfigurator-core 0.12.0's silicon_sample.csv at concurrency >= {BUSY} without "
        f"attention data parallelism ({groups}): of the TPOT a simulation without it leaves per "
        f"running sequence (quartiles {q['p25']:.1f} to {q['p75']:.1f} us), the figure that "
        f"minimises those rows' TPOT MAPE; the time per sequence per step that the roofline "
        f"and the engine's overlapped host work do not account for")


def write(fitted) -> None:
    write_entries(fitted, _store)


if __name__ == "__main__":
    sys.exit(run_cli(None, __doc__, fit, write))
