"""`gnomon accuracy`: `simulate` against measured serving runs, row by row, and how far it is.

Each `MeasuredPoint` (`gnomon.predict.measured`) runs as its benchmark ran (its workload, its
closed loop or rate, its engine, tp and dtypes) through `simulate`, in parallel across local
processes or Ray tasks (the sweep's executors).

A closed loop of N requests at concurrency C runs as N / C waves: the first C requests all start
at once (a ramp-up), the last C finish as the load drains (a ramp-down), and those between see
the steady state. Simulating all of them costs N / C times the output length in steps (74,000
for 10 waves of 8k outputs), so a row keeps at most ``max_waves`` waves (`closed_loop_waves`):
the first wave, the last, and steady ones between, and its means weigh the steady requests as
the N - 2C the benchmark ran (`closed_loop_means`). The figures without that cap are what
``--max-waves 0`` gives.

The document (kind `KIND`, `gnomon.documents`) holds:

- ``rows``: per point, what was measured, what was predicted, the ratios predicted / measured, the
  KV capacity in tokens and the preemptions; or the refusal with its reason;
- ``groups``: per model x hardware x engine x dtype x source, the rows answered and, for TTFT and
  TPOT, the MAPE (mean |predicted - measured| / measured) with the median and p90 of the ratio;
- ``coverage``: the rows answered and the refusals counted by reason, and the share answered
  of the rows whose own fields state what ran (less the refusals marked ``inconsistent``:
  `measured.PointRefused`);
- ``overall``: the same figures over every answered row, and the share within 2x on both metrics.

A closed loop's throughput follows from its means (`loop_throughput`, Little's law), so each
closed-loop row that states its output lengths also holds that throughput of its measured and of
its predicted means and their ratio (``loop_throughput``), with its figures beside TTFT's and
TPOT's. It tells a prediction whose capacity is right but whose latency is split wrongly between
the first token and the rest (the ratio near 1, TTFT's and TPOT's apart) from one whose capacity
is wrong.

Rows whose measurement the source under-specifies are excluded from every figure, with the rule
that excluded them (`under_specified`).
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter, defaultdict
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from gnomon import documents

from .measured import MEASURES, SPLITS, MeasuredPoint
from .workloads import parse_length

KIND = "gnomon.predict.accuracy"
SCHEMA_VERSION = 1
ACCEPTED_VERSIONS = (1,)
METRICS = ("ttft", "tpot")
LOOP_THROUGHPUT = "loop_throughput"  # a figure derived from TTFT and TPOT, not in METRICS
MAX_WAVES = 3
ANSWERED, REFUSED, EXCLUDED = "answered", "refused", "excluded"
# under_specified: a row at this concurrency or more whose TPOT is this far below the same
# configuration's at a lower concurrency ran under a server cap the row does not state
UNDER_SPECIFIED_CONCURRENCY = 256
UNDER_SPECIFIED_DROP = 0.10


def under_specified(points: Sequence[MeasuredPoint]) -> Dict[str, str]:
    """``{id: reason}`` of points whose measurement depends on a setting they do not state: at
    concurrency >= 256, a mean TPOT more than 10% below that of the same configuration
    (everything but the concurrency, the source and the engine's version) at the nearest lower
    concurrency measured. TPOT does not fall as the load
    grows; it does when the server caps its running batch (``max_num_seqs``) and the rest
    queue, which the row does not say."""
    by_config: Dict[tuple, List[MeasuredPoint]] = defaultdict(list)
    for p in points:
        if p.concurrency is not None and p.tpot_ms is not None:
            key = tuple(v for k, v in p.to_json().items()
                        if k not in ("id", "source", "engine_version", "concurrency",
                                     "num_requests") + MEASURES)
            by_config[key].append(p)
    out = {}
    for group in by_config.values():
        for p in group:
            if p.concurrency < UNDER_SPECIFIED_CONCURRENCY:
                continue
            lower = [q for q in group if q.concurrency < p.concurrency]
            if lower:
                nearest = max(q.concurrency for q in lower)
                below = [q.tpot_ms for q in lower if q.concurrency == nearest]
                floor = sum(below) / len(below)
                if p.tpot_ms < (1 - UNDER_SPECIFIED_DROP) * floor:
                    out[p.id] = (f"under-specified: TPOT {p.tpot_ms:.3g} ms at concurrency "
                                 f"{p.concurrency} is more than {UNDER_SPECIFIED_DROP:.0%} "
                                 f"below {floor:.3g} ms at concurrency {nearest} of the same "
                                 f"configuration (a server cap the row does not state)")
    return out


def _group_key(group: Mapping[str, str]) -> str:
    return " | ".join(group[k] for k in ("model", "hardware", "engine", "dtype", "source"))


def closed_loop_means(values: Sequence[Optional[float]], concurrency: int,
                      benchmark_requests: int) -> Optional[float]:
    """The mean over `benchmark_requests` of a closed loop at `concurrency` whose first
    ``len(values)`` requests (in send order) were simulated: the first and the last
    `concurrency` as they are, the steady ones between weighed as the ``benchmark_requests - 2
    concurrency`` the benchmark ran between its ramps. None values (no TPOT) are left out."""
    n, c = len(values), concurrency
    weights = [1.0] * n
    if benchmark_requests > n and n > 2 * c:
        steady = (benchmark_requests - 2 * c) / (n - 2 * c)
        weights[c:n - c] = [steady] * (n - 2 * c)
    pairs = [(v, w) for v, w in zip(values, weights) if v is not None]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def mean_length(text: str) -> float:
    """The mean token count of a point's length text (``N`` or ``LOW:HIGH``, uniform)."""
    length = parse_length(text, "length")
    return length.value if length.kind == "fixed" else (length.low + length.high) / 2


def loop_throughput(ttft_ms: Optional[float], tpot_ms: Optional[float], concurrency: int,
                    mean_output: float) -> Optional[float]:
    """Output tokens per second of a closed loop of `concurrency` users, from its mean TTFT and
    TPOT (Little's law): a request of n output tokens takes ``TTFT + (n - 1) x TPOT``, and the
    loop completes `concurrency` of them per such time, `mean_output` tokens each. It takes the
    mean TPOT (a mean over requests of their ``(latency - TTFT) / (n - 1)``) as the mean
    request's, and leaves out the client's time between a response and its next request. None
    when a mean is missing."""
    if ttft_ms is None or tpot_ms is None:
        return None
    return concurrency * mean_output / ((ttft_ms + (mean_output - 1) * tpot_ms) / 1e3)


def closed_loop_waves(point: MeasuredPoint, max_waves: int) -> int:
    """Requests to simulate for `point`: all of them, or for a closed loop at most
    `max_waves` (>= 3: a ramp-up, a steady wave, a ramp-down) waves of its concurrency."""
    if not max_waves or point.concurrency is None or not math.isinf(point.rate):
        return point.num_requests
    return min(point.num_requests, max(max_waves, 3) * point.concurrency)


def _cost(point: MeasuredPoint, max_waves: int) -> float:
    """A row's simulation cost, roughly: its steps (requests over concurrency, times the output
    length) times the batch it runs."""
    concurrency = point.concurrency or point.num_requests
    output = int((point.output_len or "1").split(":")[-1])
    return closed_loop_waves(point, max_waves) / concurrency * output * (1 + concurrency / 64)


def run_row(base: Mapping, point_json: Mapping) -> dict:
    """One point's record (the document's ``rows`` entry); the executors' task."""
    from .simulate import simulate

    data = dict(point_json)
    data["rate"] = math.inf if data["rate"] == "inf" else data["rate"]
    point = MeasuredPoint(**data)
    record = {"id": point.id, "split": point.split, "group": point.group,
              "point": point.to_json()}
    began = time.perf_counter()
    try:
        spec = point.simulation_spec().with_flags(
            num_requests=closed_loop_waves(point, base.get("max_waves", MAX_WAVES)),
            predictor=base.get("predictor", "roofline"))
        report, _ = simulate(spec)
    except ValueError as refusal:  # PointRefused and PredictionRefused are ValueErrors
        record.update(status=REFUSED, reason=str(getattr(refusal, "reason", refusal)))
    except MemoryError:
        from .sweep import out_of_memory

        record.update(status=REFUSED, reason=out_of_memory())
    else:
        m = report["metrics"]
        per = m["per_request"]
        conc = point.concurrency or point.num_requests
        ttft = closed_loop_means(per["ttft_s"], conc, point.num_requests)
        tpot = closed_loop_means(per["tpot_s"], conc, point.num_requests)
        predicted = {"ttft_ms": ttft * 1e3, "tpot_ms": None if tpot is None else tpot * 1e3,
                     "output_tokens_per_s": m["throughput"]["output_tokens_per_s"],
                     "total_tokens_per_s": m["throughput"]["total_tokens_per_s"]}
        measured = {k: getattr(point, k) for k in MEASURES}
        ratio = {k.replace("_ms", ""): (predicted[k] / measured[k]
                                        if measured[k] and predicted[k] else None)
                 for k in MEASURES}
        if point.concurrency is not None and math.isinf(point.rate) and point.output_len:
            mean_output = mean_length(point.output_len)
            loop = {side: loop_throughput(m["ttft_ms"], m["tpot_ms"], point.concurrency,
                                          mean_output)
                    for side, m in (("measured", measured), ("predicted", predicted))}
            record[LOOP_THROUGHPUT] = loop
            ratio[LOOP_THROUGHPUT] = (loop["predicted"] / loop["measured"]
                                      if loop["measured"] and loop["predicted"] else None)
        engine = report["setup"]["engine"]
        record.update(status=ANSWERED, predicted=predicted, measured=measured, ratio=ratio,
                      requests_simulated=spec.workload.num_requests,
                      kv_capacity_tokens=engine["num_kv_blocks"] * engine["block_size"],
                      preemptions=m["preemptions"],
                      ttft_parts_ms={k: m[k]["mean"] * 1e3
                                     for k in ("serving", "queueing", "prefill")},
                      engine_profile=engine["profile"])
    record["wall_seconds"] = time.perf_counter() - began
    return record


# --------------------------------------------------------------------------- figures

def _stats(ratios: List[float]) -> dict:
    if not ratios:
        return {"rows": 0, "mape": None, "median_ratio": None, "p90_ratio": None}
    s = sorted(ratios)

    def pct(q: float) -> float:  # linear interpolation, numpy's default
        x = q * (len(s) - 1)
        lo = int(math.floor(x))
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (x - lo)

    return {"rows": len(s), "mape": sum(abs(r - 1) for r in s) / len(s),
            "median_ratio": pct(0.5), "p90_ratio": pct(0.9)}


def figures(records: Iterable[dict]) -> dict:
    """TTFT, TPOT and closed-loop throughput figures (`_stats`) of the answered records, and the
    share of rows with both TTFT and TPOT within 2x."""
    answered = [r for r in records if r["status"] == ANSWERED]
    out = {m: _stats([r["ratio"][m] for r in answered if r["ratio"].get(m) is not None])
           for m in METRICS + (LOOP_THROUGHPUT,)}
    both = [r for r in answered if all(r["ratio"][m] is not None for m in METRICS)]
    within = sum(all(0.5 <= r["ratio"][m] <= 2 for m in METRICS) for r in both)
    out["within_2x"] = {"rows": len(both), "share": within / len(both) if both else None}
    return out


def refusal_kind(reason: str) -> str:
    """A refusal's reason with its numbers blanked, so that like refusals count together."""
    return re.sub(r"\d+(\.\d+)?", "#", reason)


def coverage(records: Sequence[dict]) -> dict:
    """The rows answered of those counted (not excluded), and of those whose own fields state
    what ran (``consistent``: less the refusals marked ``inconsistent``)."""
    counted = [r for r in records if r["status"] != EXCLUDED]
    answered = sum(r["status"] == ANSWERED for r in counted)
    reasons = Counter(refusal_kind(r["reason"]) for r in counted if r["status"] == REFUSED)
    inconsistent = sum(bool(r.get("inconsistent")) for r in counted if r["status"] == REFUSED)
    consistent = len(counted) - inconsistent
    excluded = Counter(refusal_kind(r["reason"]) for r in records if r["status"] == EXCLUDED)
    return {"rows": len(counted), "answered": answered,
            "share": answered / len(counted) if counted else None,
            "inconsistent": inconsistent,
            "consistent_share": answered / consistent if consistent else None,
            "refused_by_reason": dict(reasons.most_common()),
            "excluded": sum(excluded.values()), "excluded_by_reason": dict(excluded)}


def summarize(records: Sequence[dict]) -> dict:
    """The document's ``groups``, ``coverage``, ``overall`` and per-split figures."""
    groups: Dict[str, List[dict]] = defaultdict(list)
    for r in records:
        if r["status"] != EXCLUDED:
            groups[_group_key(r["group"])].append(r)
    out_groups = []
    for key in sorted(groups):
        rows = groups[key]
        out_groups.append({"key": key, "group": rows[0]["group"],
                           "split": sorted({r["split"] for r in rows}),
                           "rows": len(rows), **figures(rows)})
    counted = [r for r in records if r["status"] != EXCLUDED]
    return {"groups": out_groups, "coverage": coverage(records), "overall": figures(counted),
            "splits": {s: figures([r for r in counted if r["split"] == s]) for s in SPLITS}}


# --------------------------------------------------------------------------- the run

def run(points: Sequence[MeasuredPoint], *, predictor: str = "roofline",
        max_waves: int = MAX_WAVES, jobs: int = 1,
        use_ray: bool = False, ray_address: Optional[str] = None, source: str = "",
        refused: Sequence[dict] = (), commit: Optional[str] = None,
        progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """The accuracy document of `points` (module docstring). `refused` are points refused
    before they could be read (`measured.load_silicon`); they count in the coverage. `commit`
    is the gnomon commit it measures (None: the checkout's, null outside one)."""
    from gnomon.bench.machine import resolve_commit

    from .sweep import _local_results, _ray_results

    try:
        commit = resolve_commit(commit)
    except ValueError:
        if commit is not None:
            raise
        commit = None

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs: expected a positive integer, got {jobs!r}")
    if isinstance(max_waves, bool) or not isinstance(max_waves, int) or max_waves < 0 \
            or 0 < max_waves < 3:
        raise ValueError(f"--max-waves: expected 0 (every request) or an integer >= 3, got "
                         f"{max_waves!r}")
    began = time.perf_counter()
    excluded = under_specified(points)
    records: List[dict] = []
    for p in points:
        if p.id in excluded:
            records.append({"id": p.id, "split": p.split, "group": p.group,
                            "point": p.to_json(), "status": EXCLUDED, "reason": excluded[p.id]})
    for r in refused:
        labels = r.get("labels") or {}
        records.append({"id": r["id"], "split": labels.get("split") or "", "group": {
            "model": labels.get("model") or r["row"].get("model_path") or "?",
            "hardware": labels.get("hardware") or r["row"].get("system") or "?",
            "engine": labels.get("engine") or r["row"].get("backend") or "?", "dtype": "?",
            "source": "?"}, "point": None, "status": REFUSED, "reason": r["reason"],
            "inconsistent": bool(r.get("inconsistent", False))})
    # the costliest rows first, so that the workers end together rather than one of them
    # running a long row alone at the end
    todo = [p.to_json() for p in sorted((p for p in points if p.id not in excluded),
                                        key=lambda p: -_cost(p, max_waves))]
    base = {"predictor": predictor, "max_waves": max_waves}
    results = (_ray_results(base, todo, ray_address, task=run_row) if use_ray
               else _local_results(base, todo, jobs, task=run_row))
    total = len(todo)
    for done, record in enumerate(results, start=1):
        records.append(record)
        if progress:
            progress(done, total)
    order = {p.id: i for i, p in enumerate(points)}
    records.sort(key=lambda r: order.get(r["id"], len(order)))
    import gnomon

    doc = {"schema_version": SCHEMA_VERSION, "kind": KIND,
           "created_with": {"version": gnomon.__version__}, "commit": commit,
           "source": source, "predictor": predictor, "max_waves": max_waves,
           "wall_seconds": time.perf_counter() - began, **summarize(records), "rows": records}
    return doc


def filter_points(points: Sequence[MeasuredPoint], *, split: str = "all",
                  models: Sequence[str] = (), hardware: Sequence[str] = (),
                  engines: Sequence[str] = ()) -> List[MeasuredPoint]:
    """The points of `split` (fit, held-out or all) whose model, hardware and engine are among
    those given (each filter: any when empty)."""
    if split not in ("all",) + SPLITS:
        raise ValueError(f"--split: expected fit, held-out or all, got {split!r}")

    def keep(p: MeasuredPoint) -> bool:
        return ((split == "all" or p.split == split)
                and (not models or p.model in models)
                and (not hardware or p.hardware in hardware)
                and (not engines or p.engine in engines))
    return [p for p in points if keep(p)]


def filter_refusals(refused: Sequence[dict], *, split: str = "all", models: Sequence[str] = (),
                    hardware: Sequence[str] = (), engines: Sequence[str] = ()) -> List[dict]:
    """The refusals of `measured.load_silicon` that `filter_points`' filters keep: each given
    filter must name the model, hardware, engine or split the silicon table makes of the row
    (its ``labels``); a row of which the table knows none of a filtered field is left out."""
    def keep(r: dict) -> bool:
        labels = r.get("labels") or {}
        return ((split == "all" or labels.get("split") == split)
                and (not models or labels.get("model") in models)
                and (not hardware or labels.get("hardware") in hardware)
                and (not engines or labels.get("engine") in engines))
    return [r for r in refused if keep(r)]


# --------------------------------------------------------------------------- the document

_TOP = {"source": str, "predictor": str, "commit": (str, type(None)), "groups": list,
        "coverage": dict, "overall": dict, "splits": dict, "rows": list}
_ROW = {"id": str, "split": str, "group": dict, "status": str}


def validate(doc, source: str = "accuracy") -> dict:
    documents.check_header(doc, KIND, ACCEPTED_VERSIONS, source)
    documents.check_finite(doc, source)
    documents.check_fields(doc, _TOP, "the document", source)
    for i, row in enumerate(doc["rows"]):
        documents.check_fields(row, _ROW, f"rows[{i}]", source)
        if row["status"] not in (ANSWERED, REFUSED, EXCLUDED):
            raise documents.DocumentError(f"{source}: rows[{i}].status: expected answered, "
                                          f"refused or excluded, got {row['status']!r}")
    return doc


def load(path) -> dict:
    return validate(documents.load(path, KIND, ACCEPTED_VERSIONS), str(path))


def dump(doc: dict, path) -> None:
    documents.dump(validate(doc), path)


# --------------------------------------------------------------------------- table and plot

def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"


def _ratio(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(doc: dict, console=None) -> None:
    """Prints the per-group table, the splits, the overall figures and the coverage."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"gnomon accuracy ({doc['predictor']}) against {doc['source']}")
    for col in ("model", "hardware", "engine", "dtype", "source", "split", "rows",
                "TTFT MAPE", "TTFT med", "TPOT MAPE", "TPOT med"):
        table.add_column(col, justify="right" if col in ("rows",) or " " in col else "left")
    for g in doc["groups"]:
        grp = g["group"]
        answered = g["ttft"]["rows"] or g["tpot"]["rows"]
        table.add_row(grp["model"], grp["hardware"], grp["engine"], grp["dtype"],
                      grp["source"][:28], ",".join(g["split"]), f"{answered}/{g['rows']}",
                      _pct(g["ttft"]["mape"]), _ratio(g["ttft"]["median_ratio"]),
                      _pct(g["tpot"]["mape"]), _ratio(g["tpot"]["median_ratio"]))
    console.print(table)
    for name, figs in [("all", doc["overall"])] + list(doc["splits"].items()):
        if figs["ttft"]["rows"] or figs["tpot"]["rows"]:
            console.print(f"{name}: TTFT MAPE {_pct(figs['ttft']['mape'])} over "
                          f"{figs['ttft']['rows']} rows, TPOT MAPE {_pct(figs['tpot']['mape'])} "
                          f"over {figs['tpot']['rows']}; both within 2x: "
                          f"{_pct(figs['within_2x']['share'])}")
        loop = figs.get(LOOP_THROUGHPUT)
        if loop and loop["rows"]:
            console.print(f"  closed-loop throughput from the means (Little's law): MAPE "
                          f"{_pct(loop['mape'])}, median ratio {_ratio(loop['median_ratio'])}, "
                          f"over {loop['rows']} rows")
    cov = doc["coverage"]
    console.print(f"answered {cov['answered']} of {cov['rows']} rows ({_pct(cov['share'])}); "
                  f"excluded {cov['excluded']} under-specified")
    if cov.get("inconsistent"):
        console.print(f"  of the {cov['rows'] - cov['inconsistent']} rows whose fields state "
                      f"what ran (less {cov['inconsistent']} refused as inconsistent): "
                      f"{_pct(cov['consistent_share'])} answered")
    for reason, n in cov["refused_by_reason"].items():
        console.print(f"  refused {n}: {reason}")


def plot(doc: dict, path) -> None:
    """Predicted against measured, log-log, a panel per metric, coloured by engine, with the
    1:1 line and the +-20% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    engines = sorted({r["group"]["engine"].split(" ")[0] for r in doc["rows"]
                      if r["status"] == ANSWERED})
    colours = dict(zip(engines, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, metric in zip(axes, METRICS):
        lo, hi = math.inf, 0.0
        for engine in engines:
            pts = [(r["measured"][f"{metric}_ms"], r["predicted"][f"{metric}_ms"])
                   for r in doc["rows"] if r["status"] == ANSWERED
                   and r["group"]["engine"].split(" ")[0] == engine
                   and r["ratio"][metric] is not None]
            if pts:
                xs, ys = zip(*pts)
                lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
                ax.scatter(xs, ys, s=9, alpha=0.6, color=colours[engine], label=engine)
        if hi > 0:
            line = [lo / 1.5, hi * 1.5]
            ax.plot(line, line, color="black", lw=1, label="1:1")
            ax.fill_between(line, [v * 0.8 for v in line], [v * 1.2 for v in line],
                            color="grey", alpha=0.2, label="±20%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {metric.upper()} (ms)")
        ax.set_ylabel(f"predicted {metric.upper()} (ms)")
        figs = doc["overall"][metric]
        ax.set_title(f"{metric.upper()}: MAPE {_pct(figs['mape'])} over {figs['rows']} rows")
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"gnomon accuracy ({doc['predictor']}) against {doc['source']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
