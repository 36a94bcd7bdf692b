"""The report of one serving prediction (or timed run): a JSON file, a table and a plot.

A report is JSON::

    {
      "schema_version": 1,
      "kind": "gnomon.predict.report",
      "created_with": {"version": "<gnomon version>"},
      "spec": {...},           # the `SimulationSpec` that ran (`gnomon simulate --spec` runs
                               # it again); absent from a report that no spec made
      "setup": {...},          # what produced it: model, hardware, predictor, tp, workload,
                               # the engine's whole `EngineConfig` (whatever the caller passes)
      "metrics": {...},        # `gnomon.predict.metrics.compute_metrics`
      "limits": [str, ...],    # what the prediction does not model
      "wall_seconds": float    # how long the run took on the machine that made it
    }

Renaming or removing a field is a major version bump; readers say which versions they accept.
"""

from __future__ import annotations

import json
import math
from typing import Any, List, Optional

from gnomon import documents
from gnomon.documents import DocumentError

SCHEMA_VERSION = 1
KIND = "gnomon.predict.report"
ACCEPTED_VERSIONS = (1,)

_TOP = {"schema_version": int, "kind": str, "created_with": dict, "setup": dict,
        "metrics": dict, "limits": list, "wall_seconds": (int, float)}


def build_report(*, trace, metrics: dict, setup: dict, limits: List[str],
                 spec: Optional[dict] = None) -> dict:
    import gnomon

    return {"schema_version": SCHEMA_VERSION, "kind": KIND,
            "created_with": {"version": gnomon.__version__},
            **({} if spec is None else {"spec": dict(spec)}), "setup": dict(setup),
            "metrics": metrics, "limits": list(limits),
            "wall_seconds": float(trace.wall_seconds)}


def validate(doc: Any, source: str = "report") -> dict:
    """Checks a parsed report and returns it; DocumentError names `source` and the problem."""
    documents.check_header(doc, KIND, ACCEPTED_VERSIONS, source)
    documents.check_finite(doc, source)
    documents.check_fields(doc, _TOP, "the report", source)
    if "spec" in doc and not isinstance(doc["spec"], dict):
        raise DocumentError(f"{source}: spec: expected an object (a simulation spec)")
    if not all(isinstance(x, str) for x in doc["limits"]):
        raise DocumentError(f"{source}: limits: expected a list of strings")
    return doc


def dump(report: dict, path) -> None:
    """Validates `report` and writes it (no NaN or infinity: JSON has none)."""
    documents.dump(validate(report, str(path)), path)


def load(path) -> dict:
    """Reads and validates a report; DocumentError for a missing, malformed, wrong-kind or
    unknown-version file."""
    return validate(documents.load(path, KIND, ACCEPTED_VERSIONS), str(path))


# --------------------------------------------------------------------------- table

def _ms(seconds: Optional[float]) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f}"


def _num(x: Optional[float], fmt: str = "{:.3g}") -> str:
    return "—" if x is None else fmt.format(x)


def _pct(x: Optional[float]) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def render_table(report: dict, console=None) -> None:
    """Prints the report: the setup, latencies (ms), throughput and the rest, then the
    limits."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    m = report["metrics"]

    setup = Table.grid(padding=(0, 2))
    setup.add_column(style="bold")
    setup.add_column(overflow="fold")
    for key, value in report["setup"].items():
        shown = (json.dumps(value, sort_keys=True) if isinstance(value, (dict, list))
                 else str(value))
        setup.add_row(escape(str(key)), escape(shown))
    console.print(setup)

    lat = Table(title=f"Latency (ms) over {m['requests']} requests, "
                      f"{m['duration_s']:.3f} s from first arrival to last finish")
    lat.add_column("metric")
    for name in ("count", "mean", "p50", "p90", "p99", "max"):
        lat.add_column(name, justify="right")
    for label, key in (("TTFT", "ttft"), ("  serving", "serving"), ("  queueing", "queueing"),
                       ("  prefill", "prefill"), ("TPOT", "tpot"), ("ITL", "itl"),
                       ("E2E", "e2e")):
        if key not in m:  # a report written before the serving path
            continue
        s = m[key]
        lat.add_row(label, str(s["count"]), *(_ms(s[q]) for q in ("mean", "p50", "p90", "p99",
                                                                  "max")))
    console.print(lat)

    t, g, kv, pc, st = m["throughput"], m["goodput"], m["kv"], m["prefix_cache"], m["steps"]
    other = Table(title="Throughput, goodput, KV cache, scheduling")
    other.add_column("metric")
    other.add_column("value", justify="right")
    other.add_column("detail", overflow="fold")
    other.add_row("throughput", f"{_num(t['requests_per_s'])} req/s",
                  f"{_num(t['output_tokens_per_s'])} output tok/s, "
                  f"{_num(t['total_tokens_per_s'])} total tok/s")
    if "num_gpus" in t:  # older reports lack the per-GPU and per-user figures
        other.add_row("  per GPU", f"{_num(t['total_tokens_per_s_per_gpu'])} tok/s",
                      f"total over {t['num_gpus']} GPU(s); "
                      f"{_num(t['output_tokens_per_s_per_gpu'])} output tok/s")
        other.add_row("  per user", f"{_num(t['output_tokens_per_s_per_user'])} tok/s",
                      "1 / mean TPOT")
    other.add_row("goodput", f"{_num(g['requests_per_s'])} req/s",
                  f"{_pct(g['fraction'])} of requests good "
                  f"(SLO: TTFT <= {g['slo']['ttft_s'] * 1e3:g} ms, "
                  f"TPOT <= {g['slo']['tpot_s'] * 1e3:g} ms; {g['ttft_violations']} missed "
                  f"TTFT, {g['tpot_violations']} missed TPOT)")
    other.add_row("KV usage peak", _pct(kv["peak_usage"]), f"of {kv['num_blocks']} blocks")
    other.add_row("KV usage mean", _pct(kv["mean_usage"]), "time-weighted")
    groups = kv.get("groups", [])  # older reports lack them
    for group in groups if len(groups) > 1 else ():
        w = group["window"]
        other.add_row(f"  {'full attention' if w is None else f'window {w}'}",
                      f"{_pct(group['peak_usage'])} peak",
                      f"{_pct(group['mean_usage'])} mean; {group['peak_blocks']} blocks at most")
    other.add_row("prefix hit rate", _pct(pc["hit_rate"]),
                  f"{pc['hit_tokens']} of {pc['queried_tokens']} queried tokens")
    other.add_row("preemptions", str(m["preemptions"]), "")
    other.add_row("steps", str(st["count"]),
                  f"{st['prefill']} prefill-only, {st['decode']} decode-only, "
                  f"{st['mixed']} mixed; mean {_num(st['mean_batch_tokens'])} tokens, "
                  f"{_num(st['mean_batch_seqs'])} seqs")
    rest = st["unattributed_s"]
    rest = 0.0 if abs(rest) <= 1e-9 * max(st["busy_s"], 1.0) else rest  # float round-off
    parts = [f"{escape(k)} {v:.3g} s" for k, v in st["breakdown_s"].items()]
    other.add_row("busy", f"{st['busy_s']:.3f} s",
                  ", ".join(parts + [f"unattributed {rest:.3g} s"]))
    console.print(other)

    if report["limits"]:
        console.print("Limits:")
        for limit in report["limits"]:
            console.print(f"  • {escape(limit)}", soft_wrap=True, highlight=False)


def render_sweep(reports: List[dict], console=None) -> None:
    """One row per report of a rate sweep (same model, hardware and workload shape): where the
    latencies bend and the KV cache runs out as the load grows."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    first = reports[0]["setup"]
    table = Table(box=box.SIMPLE, title=f"{first['model']} on {first['tp']} x {first['hardware']}, "
                        f"{first['predictor']}: rate sweep (req/s; latencies in ms)")
    for name in ("rate", "TTFT\np50", "TTFT\np99", "queue\np99", "TPOT\np50", "TPOT\np99",
                 "out\ntok/s", "good-\nput", "KV\npeak", "pre-\nempt"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in reports:
        m = r["metrics"]
        table.add_row(_num(r["setup"]["workload"].get("rate")), _ms(m["ttft"]["p50"]),
                      _ms(m["ttft"]["p99"]), _ms(m["queueing"]["p99"]), _ms(m["tpot"]["p50"]),
                      _ms(m["tpot"]["p99"]), _num(m["throughput"]["output_tokens_per_s"], "{:.0f}"),
                      _pct(m["goodput"]["fraction"]), _pct(m["kv"]["peak_usage"]),
                      str(m["preemptions"]))
    console.print(table)
    slo = reports[0]["metrics"]["goodput"]["slo"]
    console.print(f"goodput SLO: TTFT <= {slo['ttft_s'] * 1e3:g} ms, TPOT <= "
                  f"{slo['tpot_s'] * 1e3:g} ms; workload {first['workload']['name']}, "
                  f"{first['workload']['num_requests']} requests per rate", highlight=False)


# --------------------------------------------------------------------------- plot

def plot(report: dict, path) -> None:
    """Writes a PNG: latency CDFs (TTFT, TPOT, E2E) and KV usage over time."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib "
                           "(or pip install 'gnomon[dash]')") from None
    m = report["metrics"]
    per = m.get("per_request")
    if not isinstance(per, dict):
        raise ValueError("report: metrics lacks per_request, which the latency CDFs need")
    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    cdf, kv = fig.subplots(1, 2)
    for label, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s")):
        values = sorted(v * 1e3 for v in per.get(key, ()) if v is not None and math.isfinite(v))
        if values:
            ys = [i / len(values) for i in range(len(values) + 1)]
            cdf.step([values[0]] + values, ys, where="post", label=f"{label} (n={len(values)})")
    cdf.set_xscale("symlog", linthresh=1.0)
    cdf.set_xlabel("latency (ms)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_ylim(0, 1.02)
    cdf.set_title("Latency CDFs")
    cdf.grid(True, alpha=0.3)
    cdf.legend(loc="lower right")

    series = m["kv"]["series"]
    if series:
        ts, us = zip(*series)
        kv.plot(ts, [u * 100 for u in us], lw=1, drawstyle="steps-post")
    kv.set_xlabel("time on the run's clock (s)")
    kv.set_ylabel("KV blocks in use (%)")
    kv.set_ylim(0, 105)
    kv.set_title(f"KV usage after each step ({m['kv']['num_blocks']} blocks)")
    kv.grid(True, alpha=0.3)
    title = report.get("setup", {}).get("workload")
    if isinstance(title, dict):
        title = title.get("name")
    if title:
        fig.suptitle(str(title))
    fig.tight_layout()
    fig.savefig(str(path), format="png", dpi=100)
