"""The static site that `gnomon dash site OUT` writes.

`write_site(data, out_dir)` takes the dictionary that `gnomon.dash.store.site_data` builds::

    {"machines":   [{"fingerprint", "device", "cpu_model", "cores", "ram_gb", "gpu_name"}],
     "benchmarks": [{"key", "suite", "op", "params", "definition_hash", "machine": fingerprint,
                     "series": [{"commit", "commit_order", "median_ns", "q1_ns", "q3_ns", "runs",
                                 "flops", "bytes", "tflops", "gbps"}],
                     "steps":  [{"commit", "ratio", "q", "state", "reason"}]}],
     "compare":    {"base", "head", "machine",
                    "rows": [{"key", "base_median_ns", "head_median_ns", "ratio", "q",
                              "verdict"}]} | None,
     "peaks":      {fingerprint: {"memory_gbps", "tflops": float | {dtype: float}}},
     "accuracy":   [{"series", "machine": fingerprint, "steps": [commit, ...],
                     "points": [{"commit", "commit_order", "value", "noise_floor",
                                 "validations"}]}]}

and writes plain HTML, one CSS file and matplotlib SVG plots. The site needs no network and
runs no JavaScript. Pages:

- ``index.html``: per benchmark the latest median, the change against the previous commit, a
  sparkline and a link; and the open or acknowledged regression steps with their state and reason;
- ``bench/<slug>-<hash>.html``: the median over commits with the IQR band (q1..q3) and a marker
  at each step, followed by every point of the series;
- ``sweep.html``: per machine and op, the median and TFLOP/s against the size parameter that
  varies most, across the cases measured at that op's latest commit;
- ``roofline.html``: per machine, arithmetic intensity (FLOPs / bytes) against achieved
  TFLOP/s at each benchmark's latest commit, under the memory and compute ceilings of ``peaks``,
  with each point's % of the roof; a ceiling that points lie above (a peak measured too low)
  says so in its legend and in the page, the points are ringed, and % of roof above 100% is
  marked (!);
- ``accuracy.html``: per predictor accuracy series, its value over commits inside the band of
  its noise floor (an accuracy document's: its stated tolerance), a marker where it moved beyond
  it, and its points;
- ``compare.html``: the rows of ``compare``, verdicts highlighted;
- ``machines.html``: the machines and their peaks.

The site is rendered into a temporary folder beside ``out_dir`` and moved into place only once
complete, so a failed render leaves no half-written site.
"""

from __future__ import annotations

import hashlib
import html
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

from gnomon import documents
from gnomon.documents import DocumentError

__all__ = ["write_site", "validate_site_data", "slug"]

_MARKER = ".gnomon-site"  # marks a folder as one this module wrote, so it may be replaced
_STATES = ("open", "acknowledged", "fixed")
_VERDICTS = ("REGRESSION", "IMPROVEMENT", "SAME", "AMBIGUOUS", "NEW", "GONE")
_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_STR = (str, type(None))

_MACHINE = {"fingerprint": str, "device": str, "cpu_model": str, "cores": int, "ram_gb": _NUM,
            "gpu_name": _OPT_STR}
_BENCH = {"key": str, "suite": str, "op": str, "params": dict, "definition_hash": str,
          "machine": str, "series": list, "steps": list}
_POINT = {"commit": str, "commit_order": int, "median_ns": _NUM, "q1_ns": _NUM, "q3_ns": _NUM,
          "runs": int, "flops": _NUM, "bytes": _NUM, "tflops": _NUM, "gbps": _NUM}
_STEP = {"commit": str, "ratio": _NUM, "q": _OPT_NUM, "state": str, "reason": _OPT_STR}
_COMPARE = {"base": str, "head": str, "machine": str, "rows": list}
_ROW = {"key": str, "base_median_ns": _OPT_NUM, "head_median_ns": _OPT_NUM, "ratio": _OPT_NUM,
        "q": _OPT_NUM, "verdict": str}
_PEAK = {"memory_gbps": _OPT_NUM, "tflops": (int, float, dict, type(None))}
_ACCURACY = {"series": str, "machine": str, "points": list, "steps": list}
_ACCURACY_POINT = {"commit": str, "commit_order": int, "value": _NUM, "noise_floor": _NUM,
                   "validations": int}


# ----------------------------------------------------------------------------------------------
# validation


def _check(obj: Any, fields: dict, where: str) -> None:
    documents.check_fields(obj, fields, where, "site data")


def validate_site_data(data: Any) -> dict:
    """Checks the shape of the site data and returns it; DocumentError names the field."""
    documents.check_finite(data, "site data")
    _check(data, {"machines": list, "benchmarks": list, "compare": (dict, type(None)),
                  "peaks": dict, "accuracy": list}, "the data")
    fingerprints = set()
    for i, machine in enumerate(data["machines"]):
        _check(machine, _MACHINE, f"machines[{i}]")
        if machine["fingerprint"] in fingerprints:
            raise DocumentError(f"site data: machines[{i}].fingerprint "
                                f"{machine['fingerprint']!r} appears twice")
        fingerprints.add(machine["fingerprint"])
    identities = set()
    for b, bench in enumerate(data["benchmarks"]):
        where = f"benchmarks[{b}]"
        _check(bench, _BENCH, where)
        if bench["machine"] not in fingerprints:
            raise DocumentError(f"site data: {where}.machine {bench['machine']!r} is not in "
                                "machines")
        for name, value in bench["params"].items():
            if not isinstance(name, str) or isinstance(value, bool) or not isinstance(
                    value, (int, float, str)):
                raise DocumentError(f"site data: {where}.params[{name!r}] must be an int, float "
                                    "or string")
        identity = (bench["key"], bench["machine"], bench["definition_hash"])
        if identity in identities:
            raise DocumentError(f"site data: {where} repeats benchmark {bench['key']!r} on machine "
                                f"{bench['machine']!r} with the same definition_hash")
        identities.add(identity)
        commits, orders = set(), set()
        for p, point in enumerate(bench["series"]):
            _check(point, _POINT, f"{where}.series[{p}]")
            if point["commit"] in commits or point["commit_order"] in orders:
                raise DocumentError(f"site data: {where}.series[{p}] repeats commit "
                                    f"{point['commit']!r}")
            commits.add(point["commit"])
            orders.add(point["commit_order"])
        for s, step in enumerate(bench["steps"]):
            _check(step, _STEP, f"{where}.steps[{s}]")
            if step["state"] not in _STATES:
                raise DocumentError(f"site data: {where}.steps[{s}].state {step['state']!r} is not "
                                    f"one of {', '.join(_STATES)}")
            if step["commit"] not in commits:
                raise DocumentError(f"site data: {where}.steps[{s}].commit {step['commit']!r} is "
                                    "not in the benchmark's series")
    compare = data["compare"]
    if compare is not None:
        _check(compare, _COMPARE, "compare")
        for r, row in enumerate(compare["rows"]):
            _check(row, _ROW, f"compare.rows[{r}]")
            if row["verdict"] not in _VERDICTS:
                raise DocumentError(f"site data: compare.rows[{r}].verdict {row['verdict']!r} is "
                                    f"not one of {', '.join(_VERDICTS)}")
    for fingerprint, peak in data["peaks"].items():
        where = f"peaks[{fingerprint!r}]"
        if fingerprint not in fingerprints:
            raise DocumentError(f"site data: {where} names a machine that is not in machines")
        _check(peak, _PEAK, where)
        if isinstance(peak["tflops"], dict):
            for dtype, value in peak["tflops"].items():
                if isinstance(value, bool) or not isinstance(value, _NUM) or not math.isfinite(
                        value):
                    raise DocumentError(f"site data: {where}.tflops[{dtype!r}] must be a number")
    for a, series in enumerate(data["accuracy"]):
        where = f"accuracy[{a}]"
        _check(series, _ACCURACY, where)
        if series["machine"] not in fingerprints:
            raise DocumentError(f"site data: {where}.machine is not in machines")
        for p, point in enumerate(series["points"]):
            _check(point, _ACCURACY_POINT, f"{where}.points[{p}]")
        commits = {point["commit"] for point in series["points"]}
        if not set(series["steps"]) <= commits:
            raise DocumentError(f"site data: {where}.steps name commits not in its points")
    return data


# ----------------------------------------------------------------------------------------------
# small helpers


def slug(text: str, salt: str = "") -> str:
    """A file-name-safe name for `text`: a readable slug plus a short hash of text and salt, so
    two keys that slug alike still get different names."""
    readable = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "x"
    digest = hashlib.sha256(f"{text}\0{salt}".encode()).hexdigest()[:10]
    return f"{readable}-{digest}"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "—"
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def _time_unit(max_ns: float) -> tuple[float, str]:
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if max_ns >= scale:
            return scale, unit
    return 1.0, "ns"


def _fmt_num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def _fmt_fraction(value: float, of: float | None) -> str:
    """value / of as a percentage (HTML); above 100% marked (!) and coloured: a point above
    its ceiling means the ceiling (a measured peak) is suspect."""
    if not of:
        return "—"
    fraction = value / of
    if fraction > 1:
        return (f'<span class="worse" title="above its ceiling: the peak is suspect">'
                f'{100 * fraction:.1f}% (!)</span>')
    return f"{100 * fraction:.1f}%"


def _fmt_ratio(ratio: float | None) -> str:
    """A ratio head/base as a signed percentage change."""
    return "—" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def _fmt_q(q: float | None) -> str:
    return "—" if q is None else f"{q:.2g}"


def _short(commit: str) -> str:
    return commit[:8]


def _params(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()))


def _series(bench: dict) -> list[dict]:
    return sorted(bench["series"], key=lambda p: p["commit_order"])


def _ceilings(peak: dict | None) -> tuple[dict, float | None]:
    """A machine's compute ceilings ({label: TFLOP/s}) and memory ceiling (GB/s)."""
    compute = {}
    if peak is not None and peak["tflops"] is not None:
        compute = (peak["tflops"] if isinstance(peak["tflops"], dict)
                   else {"peak": peak["tflops"]})
    return compute, peak["memory_gbps"] if peak is not None else None


def _roof(point: dict, compute: dict, memory: float | None) -> float | None:
    """The roofline's TFLOP/s at a point's intensity: the lower of the highest compute ceiling
    and bandwidth x intensity (whichever exist)."""
    bounds = [max(compute.values())] if compute else []
    if memory and point["bytes"] > 0:
        bounds.append(memory * point["flops"] / point["bytes"] / 1000)
    return min(bounds) if bounds else None


def _above(point: dict, compute: dict, memory: float | None) -> list[str]:
    """The ceilings a point lies above: compute labels it exceeds, and "memory" when it beats
    bandwidth x intensity. No case can beat the machine's limit, so each names a peak that
    was measured too low (or a memory figure that cache served, in hot mode)."""
    over = [label for label, tflops in sorted(compute.items()) if point["tflops"] > tflops]
    if memory and point["bytes"] > 0 and point["gbps"] > memory:
        over.append("memory")
    return over


# ----------------------------------------------------------------------------------------------
# page frame

_CSS = """\
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1b1f24;
       background: #fff; }
header { background: #24292f; padding: 0.6em 1.5em; }
header a { color: #fff; margin-right: 1.5em; text-decoration: none; font-weight: 600; }
header a.here { text-decoration: underline; }
main { padding: 1em 1.5em 3em; max-width: 1200px; }
h1 { font-size: 1.5em; word-break: break-all; }
h2 { font-size: 1.2em; margin-top: 1.8em; word-break: break-all; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border-bottom: 1px solid #d0d7de; padding: 0.3em 0.7em; text-align: left;
         vertical-align: middle; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.key { font-family: ui-monospace, monospace; word-break: break-all; }
code { font-family: ui-monospace, monospace; }
.worse { color: #b42318; }
.better { color: #067647; }
.muted { color: #57606a; }
tr.verdict-REGRESSION { background: #fde8e7; }
tr.verdict-IMPROVEMENT { background: #e6f6ea; }
tr.verdict-AMBIGUOUS { background: #fff6db; }
span.verdict { font-weight: 700; }
tr.verdict-REGRESSION span.verdict { color: #b42318; }
tr.verdict-IMPROVEMENT span.verdict { color: #067647; }
tr.verdict-AMBIGUOUS span.verdict { color: #8a6100; }
span.state-open { color: #b42318; font-weight: 700; }
span.state-acknowledged { color: #8a6100; font-weight: 700; }
span.state-fixed { color: #57606a; }
img.plot { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
svg.spark { display: block; }
"""

_PAGES = (("index.html", "Benchmarks"), ("sweep.html", "Shape sweep"),
          ("roofline.html", "Roofline"), ("accuracy.html", "Accuracy"),
          ("compare.html", "Compare"), ("machines.html", "Machines"))


def _page(title: str, body: str, here: str, root: str = "") -> str:
    here_attr = ' class="here"'
    nav = "".join(f'<a href="{root}{name}"{here_attr if name == here else ""}>{label}</a>'
                  for name, label in _PAGES)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>{_e(title)} · gnomon dash</title>\n'
            f'<link rel="icon" href="data:,">\n'
            f'<link rel="stylesheet" href="{root}style.css">\n</head>\n<body>\n'
            f'<header><nav>{nav}</nav></header>\n<main>\n<h1>{_e(title)}</h1>\n{body}\n'
            f'</main>\n</body>\n</html>\n')


def _table(headers: Iterable[str], rows: Iterable[str], attrs: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f"<table{attrs}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(rows) + \
        "\n</tbody>\n</table>"


# ----------------------------------------------------------------------------------------------
# plots


class _Plots:
    """Renders matplotlib figures to SVG files without pyplot (no global backend state)."""

    def __init__(self, root: Path):
        try:
            import matplotlib
            from matplotlib.figure import Figure
        except ImportError as error:  # pragma: no cover - the dash extra declares matplotlib
            raise RuntimeError("gnomon dash site needs matplotlib: pip install 'gnomon[dash]'"
                               ) from error
        self._figure = Figure
        self.style = lambda: matplotlib.rc_context({"svg.hashsalt": "gnomon", "font.size": 9,
                                                    "axes.grid": True, "grid.alpha": 0.3})
        self.root = root
        (root / "plots").mkdir()

    def new(self, width: float, height: float, ncols: int = 1):
        fig = self._figure(figsize=(width, height), layout="constrained")
        axes = fig.subplots(1, ncols, squeeze=False)[0]
        return fig, axes

    def save(self, fig, name: str) -> str:
        fig.savefig(self.root / "plots" / name, format="svg", metadata={"Date": None})
        return f"plots/{name}"


def _sparkline(points: list[dict], step_commits: set[str]) -> str:
    """An inline SVG of the medians, with the IQR band and a red dot at each step."""
    width, height, pad = 120, 28, 3
    if not points:
        return '<span class="muted">—</span>'
    lo = min(min(p["q1_ns"], p["median_ns"]) for p in points)
    hi = max(max(p["q3_ns"], p["median_ns"]) for p in points)
    span = hi - lo or 1.0
    n = len(points)

    def xy(i: int, v: float) -> tuple[float, float]:
        x = pad + (width - 2 * pad) * (i / (n - 1) if n > 1 else 0.5)
        y = pad + (height - 2 * pad) * (1 - (v - lo) / span)
        return round(x, 1), round(y, 1)

    upper = [xy(i, p["q3_ns"]) for i, p in enumerate(points)]
    lower = [xy(i, p["q1_ns"]) for i, p in enumerate(points)][::-1]
    band = " ".join(f"{x},{y}" for x, y in upper + lower)
    line = " ".join(f"{x},{y}" for x, y in (xy(i, p["median_ns"]) for i, p in enumerate(points)))
    dots = "".join(
        f'<circle cx="{x}" cy="{y}" r="2.5" fill="#d1242f"/>'
        for (x, y), p in ((xy(i, p["median_ns"]), p) for i, p in enumerate(points))
        if p["commit"] in step_commits)
    return (f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="median over {n} commits">'
            f'<polygon points="{band}" fill="#9ec5fe" fill-opacity="0.5" stroke="none"/>'
            f'<polyline points="{line}" fill="none" stroke="#0b57d0" stroke-width="1.5"/>'
            f'{dots}</svg>')


_STATE_COLOR = {"open": "#d1242f", "acknowledged": "#bf8700", "fixed": "#8c959f"}


def _plot_series(plots: _Plots, bench: dict, name: str) -> str:
    points = _series(bench)
    scale, unit = _time_unit(max(p["q3_ns"] for p in points))
    x = list(range(len(points)))
    fig, (ax,) = plots.new(9, 3.8)
    ax.fill_between(x, [p["q1_ns"] / scale for p in points], [p["q3_ns"] / scale for p in points],
                    color="#0b57d0", alpha=0.2, linewidth=0, label="IQR (q1..q3)")
    ax.plot(x, [p["median_ns"] / scale for p in points], color="#0b57d0", marker="o",
            markersize=4, label="median")
    index = {p["commit"]: i for i, p in enumerate(points)}
    seen = set()
    for step in bench["steps"]:
        i = index[step["commit"]]
        state = step["state"]
        ax.axvline(i, color=_STATE_COLOR[state], linestyle="--", linewidth=1.2,
                   label=None if state in seen else f"step ({state})")
        seen.add(state)
        ax.annotate(_fmt_ratio(step["ratio"]), (i, points[i]["median_ns"] / scale),
                    xytext=(4, 8), textcoords="offset points", color=_STATE_COLOR[state],
                    fontweight="bold")
        ax.plot([i], [points[i]["median_ns"] / scale], marker="v", markersize=9,
                color=_STATE_COLOR[state], linestyle="none")
    every = max(1, math.ceil(len(points) / 25))
    ax.set_xticks(x[::every], [_short(p["commit"]) for p in points][::every], rotation=45,
                  ha="right", fontfamily="monospace")
    ax.set_xlim(-0.5, len(points) - 0.5)
    top = max(max(p["q3_ns"], p["median_ns"]) for p in points) / scale
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)  # room for the step labels
    ax.set_xlabel("commit (in commit order)")
    ax.set_ylabel(f"time ({unit})")
    ax.legend(loc="best", fontsize=8)
    return plots.save(fig, name)


# ----------------------------------------------------------------------------------------------
# the site


class _Site:
    def __init__(self, data: dict, root: Path):
        self.data = data
        self.root = root
        self.machines = {m["fingerprint"]: m for m in data["machines"]}
        self.benchmarks = sorted(data["benchmarks"],
                                 key=lambda b: (b["key"], b["machine"], b["definition_hash"]))
        self.pages: dict[int, str] = {}
        for bench in self.benchmarks:
            self.pages[id(bench)] = "bench/" + slug(
                bench["key"], f"{bench['machine']}\0{bench['definition_hash']}") + ".html"
        self.plots = _Plots(root)

    # -- helpers --

    def machine_label(self, fingerprint: str) -> str:
        m = self.machines[fingerprint]
        if m["device"] == "simulation":  # the store's machine for simulations (no hardware)
            return "simulation (the same on any machine)"
        what = m["gpu_name"] or m["cpu_model"]
        return f"{what} ({m['device']}, {fingerprint[:8]})"

    def write(self, relative: str, text: str) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def bench_link(self, bench: dict, root: str = "") -> str:
        return f'<a href="{_e(root + self.pages[id(bench)])}">{_e(bench["key"])}</a>'

    # -- pages --

    def render(self) -> None:
        self.write("style.css", _CSS)
        self.write(_MARKER, "written by gnomon dash site; the folder is replaced on each run\n")
        self.index()
        with self.plots.style():
            for bench in self.benchmarks:
                self.benchmark(bench)
            self.sweep()
            self.roofline()
            self.accuracy()
        self.compare()
        self.machines_page()

    def index(self) -> None:
        steps = []
        for bench in self.benchmarks:
            order = {p["commit"]: p["commit_order"] for p in bench["series"]}
            for step in bench["steps"]:
                if step["state"] in ("open", "acknowledged"):
                    steps.append((order[step["commit"]], bench, step))
        steps.sort(key=lambda t: (t[2]["state"] != "open", -t[0], t[1]["key"]))
        if steps:
            rows = [
                f'<tr class="state-{_e(s["state"])}"><td class="key">{self.bench_link(b)}</td>'
                f"<td>{_e(self.machine_label(b['machine']))}</td>"
                f'<td><code>{_e(_short(s["commit"]))}</code></td>'
                f'<td class="num">{_e(_fmt_ratio(s["ratio"]))}</td>'
                f'<td class="num">{_e(_fmt_q(s["q"]))}</td>'
                f'<td><span class="state-{_e(s["state"])}">{_e(s["state"])}</span></td>'
                f'<td>{_e(s["reason"] or "")}</td></tr>' for _, b, s in steps]
            regressions = _table(["benchmark", "machine", "commit", "change", "q", "state",
                                  "reason"], rows, ' id="regressions"')
        else:
            regressions = ('<p id="regressions" class="muted">No open or acknowledged '
                           "regression steps.</p>")
        rows = []
        for bench in self.benchmarks:
            points = _series(bench)
            latest = points[-1] if points else None
            change, cls = "—", ""
            if len(points) >= 2 and points[-2]["median_ns"] > 0:
                ratio = points[-1]["median_ns"] / points[-2]["median_ns"]
                change = _fmt_ratio(ratio)
                cls = " worse" if ratio > 1 else " better" if ratio < 1 else ""
            step_commits = {s["commit"] for s in bench["steps"]}
            rows.append(
                f'<tr><td class="key">{self.bench_link(bench)}</td>'
                f"<td>{_e(self.machine_label(bench['machine']))}</td>"
                f'<td><code>{_e(_short(latest["commit"])) if latest else "—"}</code></td>'
                f'<td class="num">{_e(_fmt_ns(latest["median_ns"] if latest else None))}</td>'
                f'<td class="num{cls}">{_e(change)}</td>'
                f'<td class="num">{_e(_fmt_num(latest["tflops"] if latest else None))}</td>'
                f'<td class="num">{_e(_fmt_num(latest["gbps"] if latest else None))}</td>'
                f"<td>{_sparkline(points, step_commits)}</td></tr>")
        body = (
            "<h2>Regressions</h2>\n<p>Steps found by <code>gnomon dash history</code> that are "
            "open or acknowledged. A change is the median ratio at the step commit (positive "
            "means slower).</p>\n" + regressions +
            f"\n<h2>Benchmarks ({len(self.benchmarks)})</h2>\n<p>The latest median, its change "
            "against the previous commit (positive means slower), and the median over commits "
            "with its IQR band; a red dot marks a step.</p>\n" +
            _table(["benchmark", "machine", "latest commit", "median", "change", "TFLOP/s",
                    "GB/s", "history"], rows, ' id="benchmarks"'))
        self.write("index.html", _page("gnomon kernel benchmarks", body, "index.html"))

    def benchmark(self, bench: dict) -> None:
        page = self.pages[id(bench)]
        points = _series(bench)
        parts = [
            '<table class="facts">',
            f'<tr><th>key</th><td class="key">{_e(bench["key"])}</td></tr>',
            f'<tr><th>suite / op</th><td>{_e(bench["suite"])} / {_e(bench["op"])}</td></tr>',
            f'<tr><th>params</th><td><code>{_e(_params(bench["params"]))}</code></td></tr>',
            f"<tr><th>machine</th><td>{_e(self.machine_label(bench['machine']))}</td></tr>",
            f'<tr><th>definition hash</th><td><code>{_e(bench["definition_hash"])}</code>'
            "</td></tr>", "</table>"]
        if points:
            svg = _plot_series(self.plots, bench, Path(page).stem + ".svg")
            parts.append(f'<img class="plot" src="../{_e(svg)}" alt="median time of '
                         f'{_e(bench["key"])} over commits, with the IQR band and steps">')
        else:
            parts.append('<p class="muted">No results yet.</p>')
        parts.append("<h2>Steps</h2>")
        if bench["steps"]:
            parts.append(_table(["commit", "change", "q", "state", "reason"], [
                f'<tr><td><code>{_e(_short(s["commit"]))}</code></td>'
                f'<td class="num">{_e(_fmt_ratio(s["ratio"]))}</td>'
                f'<td class="num">{_e(_fmt_q(s["q"]))}</td>'
                f'<td><span class="state-{_e(s["state"])}">{_e(s["state"])}</span></td>'
                f'<td>{_e(s["reason"] or "")}</td></tr>' for s in bench["steps"]], ' id="steps"'))
        else:
            parts.append('<p class="muted">No steps detected.</p>')
        parts.append("<h2>Series</h2>")
        parts.append(_table(["commit", "median", "q1", "q3", "runs", "FLOPs", "bytes", "TFLOP/s",
                             "GB/s"], [
            f'<tr><td><code>{_e(p["commit"])}</code></td>'
            f'<td class="num">{_e(_fmt_ns(p["median_ns"]))}</td>'
            f'<td class="num">{_e(_fmt_ns(p["q1_ns"]))}</td>'
            f'<td class="num">{_e(_fmt_ns(p["q3_ns"]))}</td>'
            f'<td class="num">{p["runs"]}</td><td class="num">{_e(_fmt_num(p["flops"], 4))}</td>'
            f'<td class="num">{_e(_fmt_num(p["bytes"], 4))}</td>'
            f'<td class="num">{_e(_fmt_num(p["tflops"]))}</td>'
            f'<td class="num">{_e(_fmt_num(p["gbps"]))}</td></tr>' for p in reversed(points)],
            ' id="series"'))
        self.write(page, _page(bench["key"], "\n".join(parts), "", root="../"))

    def sweep(self) -> None:
        groups: dict[tuple[str, str], list[dict]] = {}
        for bench in self.benchmarks:
            if bench["series"]:
                groups.setdefault((bench["machine"], bench["op"]), []).append(bench)
        parts = ["<p>For each op, the cases measured at that op's latest commit on one machine, "
                 "against the numeric shape parameter that varies most among them; the other "
                 "parameters that vary label the lines.</p>"]
        for (fingerprint, op), benches in sorted(groups.items()):
            latest = max((p for b in benches for p in b["series"]),
                         key=lambda p: p["commit_order"])["commit"]
            cases = [(b, next(p for p in b["series"] if p["commit"] == latest))
                     for b in benches if any(p["commit"] == latest for p in b["series"])]
            parts.append(f"<h2>{_e(op)} on {_e(self.machine_label(fingerprint))}</h2>")
            parts.append(f"<p>{len(cases)} cases at commit <code>{_e(_short(latest))}</code>."
                         "</p>")
            names = set.intersection(*(set(b["params"]) for b, _ in cases))
            numeric = [n for n in names if all(isinstance(b["params"][n], (int, float))
                                               for b, _ in cases)]
            distinct = {n: len({b["params"][n] for b, _ in cases}) for n in numeric}
            varying = [n for n in numeric if distinct[n] > 1]
            x_name = max(sorted(varying), key=lambda n: distinct[n]) if varying else None
            if x_name is not None:
                svg = self._plot_sweep(op, fingerprint, x_name, cases)
                parts.append(f'<img class="plot" src="{_e(svg)}" alt="{_e(op)}: median and '
                             f'TFLOP/s against {_e(x_name)}">')
            else:
                parts.append('<p class="muted">No numeric shape parameter varies across these '
                             "cases; nothing to sweep.</p>")
            cases.sort(key=lambda c: (c[0]["params"].get(x_name, 0) if x_name else 0,
                                      c[0]["key"]))
            parts.append(_table([x_name or "case", "benchmark", "median", "TFLOP/s", "GB/s"], [
                f'<tr><td class="num">{_e(b["params"].get(x_name, "—") if x_name else "—")}</td>'
                f'<td class="key">{self.bench_link(b)}</td>'
                f'<td class="num">{_e(_fmt_ns(p["median_ns"]))}</td>'
                f'<td class="num">{_e(_fmt_num(p["tflops"]))}</td>'
                f'<td class="num">{_e(_fmt_num(p["gbps"]))}</td></tr>' for b, p in cases]))
        if not groups:
            parts.append('<p class="muted">No results yet.</p>')
        self.write("sweep.html", _page("Shape sweep", "\n".join(parts), "sweep.html"))

    def _plot_sweep(self, op: str, fingerprint: str, x_name: str, cases: list) -> str:
        others = sorted({n for b, _ in cases for n in b["params"]
                         if n != x_name and len({str(c["params"].get(n)) for c, _ in cases}) > 1})
        lines: dict[str, list] = {}
        for b, p in cases:
            label = ", ".join(f"{n}={b['params'].get(n, '—')}" for n in others) or op
            lines.setdefault(label, []).append((b["params"][x_name], p))
        with_flops = any(p["flops"] > 0 and p["tflops"] > 0 for _, p in cases)
        fig, axes = self.plots.new(10 if with_flops else 6, 3.8, 2 if with_flops else 1)
        xs = [b["params"][x_name] for b, _ in cases]
        log_x = min(xs) > 0 and max(xs) / min(xs) >= 8
        scale, unit = _time_unit(max(p["median_ns"] for _, p in cases))
        for label, pts in sorted(lines.items()):
            pts.sort(key=lambda t: t[0])
            axes[0].plot([x for x, _ in pts], [p["median_ns"] / scale for _, p in pts],
                         marker="o", markersize=4, label=label)
            if with_flops:
                axes[1].plot([x for x, _ in pts], [p["tflops"] for _, p in pts], marker="o",
                             markersize=4, label=label)
        axes[0].set_ylabel(f"median time ({unit})")
        if with_flops:
            axes[1].set_ylabel("TFLOP/s")
        for ax in axes:
            ax.set_xlabel(x_name)
            if log_x:
                ax.set_xscale("log", base=2)
        if len(lines) > 1:
            axes[-1].legend(fontsize=7, loc="best")
        return self.plots.save(fig, "sweep-" + slug(op, fingerprint) + ".svg")

    def roofline(self) -> None:
        peaks = self.data["peaks"]
        parts = ["<p>Arithmetic intensity (FLOPs per byte moved) against achieved TFLOP/s, each "
                 "benchmark at its latest commit. The slanted line is the memory ceiling "
                 "(bandwidth × intensity); the flat lines are the compute ceilings.</p>"]
        by_machine: dict[str, list] = {}
        for bench in self.benchmarks:
            if bench["series"]:
                by_machine.setdefault(bench["machine"], []).append((bench, _series(bench)[-1]))
        for fingerprint in sorted(by_machine):
            cases = by_machine[fingerprint]
            plotted = [(b, p) for b, p in cases
                       if p["flops"] > 0 and p["bytes"] > 0 and p["tflops"] > 0]
            skipped = [b for b, p in cases if (b, p) not in plotted]
            parts.append(f"<h2>{_e(self.machine_label(fingerprint))}</h2>")
            peak = peaks.get(fingerprint)
            if peak is None:
                parts.append('<p class="muted">No peaks recorded for this machine: no '
                             "ceilings drawn.</p>")
            compute, memory = _ceilings(peak)
            exceeded: dict[str, list] = {}
            for b, p in plotted:
                for label in _above(p, compute, memory):
                    exceeded.setdefault(label, []).append(b)
            if exceeded:
                parts.append(
                    '<p class="above-peak worse">Points lie above ceilings of this machine: ' +
                    "; ".join(f"{_e(label)} ({len(found)} point{'s' * (len(found) > 1)})"
                              for label, found in sorted(exceeded.items())) +
                    ". No case can beat the machine's limit: a compute ceiling below its own "
                    "dtype's points is a peak measured too low (for instance under load), and "
                    "points above the memory line were served from cache or the bandwidth "
                    "was measured too low. Rings mark those points; a % of roof above 100% is "
                    "marked (!).</p>")
            if plotted:
                svg = self._plot_roofline(fingerprint, plotted, peak, exceeded)
                parts.append(f'<img class="plot" src="{_e(svg)}" alt="roofline of '
                             f'{_e(self.machine_label(fingerprint))}">')
            parts.append(_table(["benchmark", "commit", "FLOPs/byte", "TFLOP/s", "GB/s",
                                 "% of roof"], [
                f'<tr><td class="key">{self.bench_link(b)}</td>'
                f'<td><code>{_e(_short(p["commit"]))}</code></td>'
                f'<td class="num">{_e(_fmt_num(p["flops"] / p["bytes"]))}</td>'
                f'<td class="num">{_e(_fmt_num(p["tflops"]))}</td>'
                f'<td class="num">{_e(_fmt_num(p["gbps"]))}</td>'
                f'<td class="num">{_fmt_fraction(p["tflops"], _roof(p, compute, memory))}'
                f'</td></tr>' for b, p in plotted]))
            if skipped:
                parts.append("<p class=\"muted\">Not on the roofline (no FLOPs or no bytes "
                             "counted): " + ", ".join(self.bench_link(b) for b in skipped) +
                             ".</p>")
        if not by_machine:
            parts.append('<p class="muted">No results yet.</p>')
        self.write("roofline.html", _page("Roofline", "\n".join(parts), "roofline.html"))

    def _plot_roofline(self, fingerprint: str, cases: list, peak: dict | None,
                       exceeded: dict | None = None) -> str:
        """The roofline; a ceiling that points lie above says so in its label, and those
        points are ringed."""
        exceeded = exceeded or {}

        def above(label: str) -> str:
            count = len(exceeded.get(label, ()))
            return f" (below {count} point{'s' * (count > 1)}: suspect)" if count else ""

        fig, (ax,) = self.plots.new(8, 5)
        intensity = [p["flops"] / p["bytes"] for _, p in cases]
        lo, hi = min(intensity) / 4, max(intensity) * 4
        compute, memory = _ceilings(peak)
        top = max(compute.values(), default=None)
        if memory and top:  # show the ridge point
            ridge = top * 1000 / memory
            lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)
        if memory:
            xs = [lo, hi]
            ax.plot(xs, [memory * x / 1000 for x in xs], color="#57606a", linewidth=1.5,
                    label=f"memory {memory:.4g} GB/s{above('memory')}")
        for i, (dtype, tflops) in enumerate(sorted(compute.items())):
            ax.axhline(tflops, color="#b42318" if dtype in exceeded else "#57606a",
                       linewidth=1.2, linestyle=("-", "--", ":", "-.")[i % 4],
                       label=f"compute {dtype} {tflops:.4g} TFLOP/s{above(dtype)}")
        ops = sorted({b["op"] for b, _ in cases})
        for op in ops:
            pts = [(p["flops"] / p["bytes"], p["tflops"]) for b, p in cases if b["op"] == op]
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=22, label=op, zorder=3)
        flagged = [(p["flops"] / p["bytes"], p["tflops"]) for b, p in cases
                   if _above(p, compute, memory)]
        if flagged:
            ax.scatter([x for x, _ in flagged], [y for _, y in flagged], s=90,
                       facecolors="none", edgecolors="#b42318", linewidths=1.2, zorder=4,
                       label="above a ceiling")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ys = [p["tflops"] for _, p in cases] + list(compute.values())
        ax.set_ylim(min(ys) / 4, max(ys) * 3)
        ax.set_xlabel("arithmetic intensity (FLOPs / byte)")
        ax.set_ylabel("achieved TFLOP/s")
        ax.legend(fontsize=7, loc="lower right")
        return self.plots.save(fig, "roofline-" + slug(fingerprint) + ".svg")

    def accuracy(self) -> None:
        """Per accuracy series: its value over commits, the band of its noise floor around
        it (a later commit outside the band of the one before moved for real), and the
        points."""
        parts = ['<p>Predictor accuracy from <code>gnomon validate</code>, one series per '
                 'figure, predictor, model and tp on each machine, and from '
                 '<code>gnomon accuracy</code> against measured serving runs, one series per '
                 'figure, predictor, engine and hardware (TTFT and TPOT MAPE, and the share of '
                 'rows refused); lower is better. The band is the noise floor the same '
                 'validation measured, or for <code>gnomon accuracy</code>, a deterministic '
                 'simulation, the stated tolerance; a triangle marks a commit whose figure '
                 'moved beyond it.</p>']
        if not self.data["accuracy"]:
            parts.append('<p class="muted">No validation or accuracy documents are stored: '
                         '<code>gnomon validate --out FILE</code> or '
                         '<code>gnomon accuracy --out FILE</code>, then '
                         '<code>gnomon dash ingest FILE</code>.</p>')
        for n, series in enumerate(self.data["accuracy"]):
            points = sorted(series["points"], key=lambda p: p["commit_order"])
            plot = self._plot_accuracy(series, points, f"accuracy-{n}.svg")
            rows = [f'<tr><td><code>{_e(_short(p["commit"]))}</code></td>'
                    f'<td>{p["value"]:.1%}</td><td>{p["noise_floor"]:.1%}</td>'
                    f'<td>{p["validations"]}</td>'
                    f'<td>{"moved" if p["commit"] in series["steps"] else ""}</td></tr>'
                    for p in points]
            parts.append(f'<section class="accuracy-series"><h2>{_e(series["series"])}</h2>'
                         f'<p>{_e(self.machine_label(series["machine"]))}</p>'
                         f'<img class="plot" src="{_e(plot)}" '
                         f'alt="{_e(series["series"])} over commits">'
                         + _table(("commit", "value", "noise floor", "validations", ""), rows)
                         + "</section>")
        self.write("accuracy.html", _page("Predictor accuracy", "\n".join(parts),
                                          "accuracy.html"))

    def _plot_accuracy(self, series: dict, points: list, name: str) -> str:
        x = list(range(len(points)))
        values = [100 * p["value"] for p in points]
        noise = [100 * p["noise_floor"] for p in points]
        fig, (ax,) = self.plots.new(9, 3.2)
        ax.fill_between(x, [max(v - f, 0) for v, f in zip(values, noise)],
                        [v + f for v, f in zip(values, noise)], color="#0b57d0", alpha=0.15,
                        linewidth=0, label="noise floor")
        ax.plot(x, values, color="#0b57d0", marker="o", markersize=4, label="value")
        for i, p in enumerate(points):
            if p["commit"] in series["steps"]:
                ax.plot([i], [values[i]], marker="v", markersize=9, color="#d1242f",
                        linestyle="none")
        every = max(1, math.ceil(len(points) / 25))
        ax.set_xticks(x[::every], [_short(p["commit"]) for p in points][::every], rotation=45,
                      ha="right", fontfamily="monospace")
        ax.set_xlim(-0.5, len(points) - 0.5)
        ax.set_ylim(0, max(v + f for v, f in zip(values, noise)) * 1.15 or 1.0)
        ax.set_xlabel("commit (in commit order)")
        ax.set_ylabel("rows refused (%)" if series["series"].startswith("accuracy/refused_share[")
                      else "error (%)")
        ax.legend(loc="best", fontsize=8)
        return self.plots.save(fig, name)

    def compare(self) -> None:
        compare = self.data["compare"]
        if compare is None:
            body = ('<p class="muted">No comparison in this site. Run '
                    "<code>gnomon dash site</code> with a base and a head commit to add one.</p>")
            self.write("compare.html", _page("Compare", body, "compare.html"))
            return
        fingerprint = compare["machine"]
        latest: dict[str, dict] = {}  # key -> the benchmark on this machine, newest definition
        for bench in self.benchmarks:
            if bench["machine"] == fingerprint:
                order = max((p["commit_order"] for p in bench["series"]), default=-1)
                old = latest.get(bench["key"])
                if old is None or order > old[0]:
                    latest[bench["key"]] = (order, bench)
        rank = {v: i for i, v in enumerate(_VERDICTS)}
        rows = sorted(compare["rows"], key=lambda r: (rank[r["verdict"]], r["key"]))
        counts = {v: sum(r["verdict"] == v for r in rows) for v in _VERDICTS}
        machine = (self.machine_label(fingerprint) if fingerprint in self.machines
                   else fingerprint)

        def key_cell(key: str) -> str:
            found = latest.get(key)
            return self.bench_link(found[1]) if found else _e(key)

        table = _table(["benchmark", "base median", "head median", "change", "q", "verdict"], [
            f'<tr class="verdict-{_e(r["verdict"])}"><td class="key">{key_cell(r["key"])}</td>'
            f'<td class="num">{_e(_fmt_ns(r["base_median_ns"]))}</td>'
            f'<td class="num">{_e(_fmt_ns(r["head_median_ns"]))}</td>'
            f'<td class="num">{_e(_fmt_ratio(r["ratio"]))}</td>'
            f'<td class="num">{_e(_fmt_q(r["q"]))}</td>'
            f'<td><span class="verdict">{_e(r["verdict"])}</span></td></tr>' for r in rows],
            ' id="compare"')
        body = (f"<p>Base <code>{_e(compare['base'])}</code> against head "
                f"<code>{_e(compare['head'])}</code> on {_e(machine)}. A change is the "
                "ratio of the head's runs to the base's, each run's fastest sample, as "
                "geometric means (positive means slower); q is the Benjamini–Hochberg "
                "corrected p-value of the one-sided t-test that the change is beyond the "
                "threshold (gnomon.dash.stats).</p>\n<p>" +
                ", ".join(f'<span class="verdict">{counts[v]}</span> {_e(v)}'
                          for v in _VERDICTS) + "</p>\n" + table)
        self.write("compare.html", _page("Compare", body, "compare.html"))

    def machines_page(self) -> None:
        peaks = self.data["peaks"]
        counts = {}
        for bench in self.benchmarks:
            counts[bench["machine"]] = counts.get(bench["machine"], 0) + 1

        def peak_text(fingerprint: str) -> tuple[str, str]:
            peak = peaks.get(fingerprint)
            if peak is None:
                return "—", "—"
            tflops = peak["tflops"]
            if isinstance(tflops, dict):
                tflops_text = ", ".join(f"{k}: {v:.4g}" for k, v in sorted(tflops.items()))
            else:
                tflops_text = _fmt_num(tflops, 4)
            return _fmt_num(peak["memory_gbps"], 4), tflops_text or "—"

        rows = []
        for m in sorted(self.data["machines"], key=lambda m: m["fingerprint"]):
            memory, tflops = peak_text(m["fingerprint"])
            rows.append(
                f'<tr><td><code>{_e(m["fingerprint"])}</code></td><td>{_e(m["device"])}</td>'
                f'<td>{_e(m["cpu_model"])}</td><td class="num">{_e(m["cores"])}</td>'
                f'<td class="num">{_e(m["ram_gb"])}</td><td>{_e(m["gpu_name"] or "—")}</td>'
                f'<td class="num">{_e(memory)}</td><td>{_e(tflops)}</td>'
                f'<td class="num">{counts.get(m["fingerprint"], 0)}</td></tr>')
        body = ("<p>A machine is identified by a fingerprint of its stable fields only.</p>\n" +
                _table(["fingerprint", "device", "CPU", "cores", "RAM (GB)", "GPU",
                        "peak memory (GB/s)", "peak TFLOP/s", "benchmarks"], rows,
                       ' id="machines"'))
        self.write("machines.html", _page("Machines", body, "machines.html"))


def write_site(data: dict, out_dir: str | os.PathLike) -> list[Path]:
    """Validates `data` and writes the static site into `out_dir`; returns the files written.

    `out_dir` may be missing, empty, or a site this function wrote before (which is replaced);
    any other existing folder or file is refused with ValueError. The site is rendered into a
    temporary folder beside `out_dir` and moved into place only when complete."""
    validate_site_data(data)
    out = Path(out_dir)
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            raise ValueError(f"{out}: exists and is not a plain folder (a file or a link); "
                             "give a new or empty folder")
        if any(out.iterdir()) and not (out / _MARKER).is_file():
            raise ValueError(f"{out}: is a folder that holds other files and no site written "
                             "by gnomon dash; give an empty or new folder")
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    try:
        _Site(data, staging).render()
        files = sorted(p.relative_to(staging) for p in staging.rglob("*") if p.is_file())
        os.chmod(staging, 0o755)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.rename(out, old / "site")
            try:
                os.rename(staging, out)
            except BaseException:
                os.rename(old / "site", out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [out / f for f in files]
