"""`gnomon sweep`: one simulation per point of a grid of serving configurations, and the Pareto
frontier of output tok/s per GPU against tok/s per user.

A `SweepSpec` is what every point shares (`base`: a `SimulationSpec`: model, workload,
predictor, seed, ...) and the axes that vary (`axes`: hardware, tp, ep, dp, concurrency,
max_num_batched_tokens, max_num_seqs, rate; each point is the base with its axis values over
it, `SimulationSpec.with_flags`). `run_point` runs one point, the same function in
every executor (`--jobs N` local processes, or Ray tasks), and returns its record: the full
report, or the refusal that named why the point cannot run (a model that does not fit, a tp
that does not divide the heads). A refused point is listed, never dropped.

The sweep document (kind ``gnomon.predict.sweep``, schema 4, `gnomon.documents`) holds the spec
(its base as the `SimulationSpec` document),
the gnomon version, a record per finished point and the answer: the spec's ``frontier`` part
says which points may enter it (``max_ttft_s`` and ``max_tpot_s`` bound the means) and what a
GPU-hour costs per hardware (``usd_per_gpu_hour``); each complete record carries
``on_frontier`` and, where its hardware has a price, ``usd_per_million_output_tokens``; and
the document's ``frontier`` lists the frontier's points in order of tok/s per user (so of
falling tok/s per GPU), each with its figures. Schema 2 (no frontier) and 3 documents (a base
of keyword arguments) still load; they cannot be resumed. `run_sweep` writes it atomically after
every point, so an interrupted sweep loses at most the points in flight, and resumes from it:
a point with a complete record is not run again, anything else is. A resume against another
spec is refused, naming the field that differs.

One owner per output: the sweep holds an exclusive `fcntl.flock` on ``OUT.lock`` (the OS drops
it when the process dies, so a dead owner is seen, never guessed from a timeout). A second sweep
on the same output is refused with the owner's pid, host and start time; a filesystem that
cannot lock refuses the sweep rather than going on without one.
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from gnomon import documents
from gnomon.documents import DocumentError

from .spec import SimulationSpec

KIND = "gnomon.predict.sweep"
SCHEMA_VERSION = 4
ACCEPTED_VERSIONS = (2, 3, 4)
AXES = ("hardware", "tp", "ep", "dp", "concurrency", "max_num_batched_tokens", "max_num_seqs",
        "rate")
COMPLETE, REFUSED = "complete", "refused"
FRONTIER = ("max_ttft_s", "max_tpot_s", "usd_per_gpu_hour")  # the spec's frontier part


@dataclass(frozen=True)
class SweepSpec:
    """`base`: the `SimulationSpec` every point shares (or a mapping of `gnomon simulate`'s flag
    names, `SimulationSpec.of`); `axes`: {axis: values} in `AXES` order, their product the
    points; `frontier`: which points may enter the frontier and the prices (`FRONTIER`:
    seconds, and USD per GPU-hour by hardware name)."""

    base: SimulationSpec
    axes: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    frontier: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        unknown = set(self.frontier) - set(FRONTIER)
        if unknown:
            raise ValueError(f"sweep frontier: unknown {', '.join(sorted(unknown))}; known: "
                             f"{', '.join(FRONTIER)}")
        for name in ("max_ttft_s", "max_tpot_s"):
            bound = self.frontier.get(name)
            if bound is not None and (isinstance(bound, bool) or not isinstance(
                    bound, (int, float)) or not bound > 0 or not math.isfinite(bound)):
                raise ValueError(f"sweep frontier: {name}: expected seconds > 0 or null, got "
                                 f"{bound!r}")
        prices = self.frontier.get("usd_per_gpu_hour", {})
        if not isinstance(prices, Mapping) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                and math.isfinite(v) for v in prices.values()):
            raise ValueError(f"sweep frontier: usd_per_gpu_hour: expected {{hardware: USD > 0}}, "
                             f"got {prices!r}")
        unknown = set(self.axes) - set(AXES)
        if unknown:
            raise ValueError(f"sweep axes: unknown {', '.join(sorted(unknown))}; known: "
                             f"{', '.join(AXES)}")
        for axis, values in self.axes.items():
            if not values:
                raise ValueError(f"sweep axis {axis}: expected at least one value")
        if isinstance(self.base, Mapping):
            both = sorted(set(self.axes) & set(self.base))
            if both:
                raise ValueError(f"{both[0]}: given both as an axis and as a fixed value")
            object.__setattr__(self, "base", SimulationSpec.of(**self.base))
        if not isinstance(self.base, SimulationSpec):
            raise ValueError(f"sweep base: expected a SimulationSpec or a mapping of gnomon "
                             f"simulate's flag names, got {type(self.base).__name__}")

    def points(self) -> List[Dict[str, Any]]:
        names = [a for a in AXES if a in self.axes]
        return [dict(zip(names, values))
                for values in itertools.product(*(self.axes[a] for a in names))]

    def to_json(self) -> dict:
        return {"base": self.base.to_json(), "axes": {a: list(v) for a, v in self.axes.items()},
                "frontier": dict(self.frontier)}

    @staticmethod
    def from_file(path) -> "SweepSpec":
        """A YAML or JSON spec: ``{"grid": {axis: [values]}, "frontier": {...} (optional),
        <fixed values by gnomon simulate's flag names>}``."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise DocumentError(f"{path}: cannot read the sweep spec: "
                                f"{error.strerror or error}") from None
        import yaml  # YAML is a superset of JSON, so one parser reads both

        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise DocumentError(f"{path}: not a YAML or JSON sweep spec: {error}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("grid"), dict):
            raise DocumentError(f"{path}: expected an object with a 'grid' of axes "
                                f"({', '.join(AXES)}) to lists of values")
        grid = {axis: values if isinstance(values, list) else [values]
                for axis, values in raw.pop("grid").items()}
        frontier = raw.pop("frontier", None) or {}
        if not isinstance(frontier, dict):
            raise DocumentError(f"{path}: 'frontier' must be an object with "
                                f"{', '.join(FRONTIER)}")
        return SweepSpec(raw, grid, frontier)


def run_point(base: SimulationSpec, point: Mapping[str, Any]) -> Dict[str, Any]:
    """One point's record: ``{"point", "status": "complete", "report"}``, or ``"refused"``
    with the ``reason`` (a ValueError from the model, hardware or predictor: a model that does
    not fit, a tp that does not divide it). Also where and how long it ran."""
    from .simulate import simulate

    began = time.perf_counter()
    record: Dict[str, Any] = {"point": dict(point)}
    try:
        report, _ = simulate(base.with_flags(**point))
        record.update(status=COMPLETE, report=report)
    except ValueError as refusal:  # PredictionRefused is one too
        record.update(status=REFUSED, reason=str(refusal))
    except MemoryError:
        record.update(status=REFUSED, reason=out_of_memory())
    record.update(host=socket.gethostname(), pid=os.getpid(),
                  wall_seconds=time.perf_counter() - began)
    return record


# --------------------------------------------------------------------------- the document

def new_document(spec: SweepSpec) -> dict:
    import gnomon

    return {"schema_version": SCHEMA_VERSION, "kind": KIND,
            "created_with": {"version": gnomon.__version__}, "spec": spec.to_json(),
            "points": []}


def validate(doc: Any, source: str = "sweep") -> dict:
    documents.check_header(doc, KIND, ACCEPTED_VERSIONS, source)
    documents.check_finite(doc, source)
    documents.check_fields(doc, {"created_with": dict, "spec": dict, "points": list},
                           "the document", source)
    documents.check_fields(doc["spec"], {"base": dict, "axes": dict}, "spec", source)
    for i, record in enumerate(doc["points"]):
        documents.check_fields(record, {"point": dict, "status": str}, f"points[{i}]", source)
    return doc


def load(path) -> dict:
    return validate(documents.load(path, KIND, ACCEPTED_VERSIONS), str(path))


def check_resumable(doc: dict, spec: SweepSpec, source: str) -> None:
    """Refuses a document made by another spec or gnomon version, naming the field."""
    import gnomon

    mine = {**spec.to_json()["base"], "axes": spec.to_json()["axes"],
            "gnomon version": gnomon.__version__}
    theirs = {**doc["spec"]["base"], "axes": doc["spec"]["axes"],
              "gnomon version": doc["created_with"].get("version")}
    for name in sorted(set(mine) | set(theirs)):
        if mine.get(name) != theirs.get(name):
            raise ValueError(f"--resume: {source} was made with {name} "
                             f"{theirs.get(name)!r}, this sweep has {mine.get(name)!r}; "
                             "resume it with the same spec, or write another --out")


def done_points(doc: dict) -> Dict[str, dict]:
    """{point key: record} of the records to trust: complete with a report, or refused with a
    reason. Anything else (a record cut short) is run again."""
    out = {}
    for record in doc["points"]:
        whole = (record["status"] == COMPLETE and isinstance(record.get("report"), dict)) or \
            (record["status"] == REFUSED and isinstance(record.get("reason"), str))
        if whole:
            out[point_key(record["point"])] = record
    return out


def point_key(point: Mapping[str, Any]) -> str:
    return ",".join(f"{a}={point[a]}" for a in AXES if a in point)


# --------------------------------------------------------------------------- one owner

class OutputLock:
    """An exclusive `fcntl.flock` on ``OUT.lock`` naming its owner (pid, host, start)."""

    def __init__(self, out: Path) -> None:
        import fcntl

        self.path = out.with_name(out.name + ".lock")
        self.file = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            self.file.seek(0)
            owner = self.file.read().strip() or "an unnamed process"
            self.file.close()
            if error.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise ValueError(f"--out {out}: another sweep owns it ({owner}); wait for it "
                                 "to end, or write another --out") from None
            raise ValueError(f"--out {out}: cannot take the lock {self.path} on this "
                             f"filesystem ({os.strerror(error.errno)}); a sweep without one "
                             "could be run twice into one file") from None
        self.file.seek(0)
        self.file.truncate()
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.file.write(f"pid {os.getpid()} on {socket.gethostname()} since {started}\n")
        self.file.flush()

    def release(self) -> None:
        self.file.close()  # closing drops the flock


# --------------------------------------------------------------------------- executors

# A pool worker is replaced after this many points: a long-lived worker's heap only grows (in
# an all-model accuracy run one passed 13 GB over the rows it ran, though no single row needs
# 1.5 GB and tracemalloc finds no growing Python object), and a fresh interpreter costs about a
# second.
TASKS_PER_WORKER = 25


def worker_memory_cap(jobs: int) -> int:
    """Bytes of address space each of `jobs` pool workers may take: 85% of this machine's
    memory shared among them (at least 2 GiB)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(int(total * 0.85 / jobs), 2 << 30)


def _cap_memory(limit: int) -> None:
    """A pool worker's initializer: a point that needs more than `limit` bytes raises
    MemoryError in its own worker, which records it as refused (`out_of_memory`), instead of the
    kernel's out-of-memory killer ending a worker, the pool and the whole run with it."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def out_of_memory() -> str:
    """The refusal of a point whose simulation ran out of its worker's memory."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    cap = "" if limit == resource.RLIM_INFINITY else f" of {limit / 2**30:.1f} GiB"
    return (f"the simulation ran out of its worker's memory{cap} (this machine's memory shared "
            f"by the --jobs workers; fewer jobs give each more)")


def _local_results(base, points, jobs: int, task=None):
    """Records as they finish, each ``task(base, point)`` (default `run_point`): inline for one
    job, else a process pool of `jobs`, each worker's memory capped (`worker_memory_cap`) and
    each replaced after `TASKS_PER_WORKER` points."""
    task = task or run_point
    if jobs == 1:
        for point in points:
            yield task(base, point)
        return
    import multiprocessing

    # spawn: a fresh interpreter per worker, no inherited threads or locks. multiprocessing's
    # Pool, not concurrent.futures': Python 3.11's ProcessPoolExecutor with max_tasks_per_child
    # hung once its workers were replaced (no worker left, the run waiting for ever)
    pool = multiprocessing.get_context("spawn").Pool(
        jobs, initializer=_cap_memory, initargs=(worker_memory_cap(jobs),),
        maxtasksperchild=TASKS_PER_WORKER)
    try:
        yield from pool.imap_unordered(_call, [(task, base, point) for point in points])
    finally:
        pool.terminate()
        pool.join()


def _call(job):
    """A pool worker's task: ``task(base, point)`` from the tuple `job`."""
    task, base, point = job
    return task(base, point)


RAY_CONNECT_TIMEOUT_S = 30


def _ray_results(base, points, address: Optional[str], task=None):
    """Records as they finish, each ``task(base, point)`` (default `run_point`) a Ray task;
    `address` None starts a local cluster sized for this machine."""
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray: pip install 'gnomon[ray]'") from None
    if not ray.is_initialized():
        if address:
            _check_reachable(address)
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=200 * 1024 * 1024,
                     include_dashboard=False, log_to_driver=False)
    remote = ray.remote(task or run_point)
    pending = [remote.remote(base, point) for point in points]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        yield ray.get(done[0])


def _check_reachable(address: str) -> None:
    """Fails within `RAY_CONNECT_TIMEOUT_S` for an address whose GCS port does not answer."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host or target, int(port or 6379)),
                                 timeout=RAY_CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as error:
        raise ValueError(f"--ray {address}: no Ray cluster answers there ({error})") from None


# --------------------------------------------------------------------------- the sweep

def run_sweep(spec: SweepSpec, *, out: Optional[os.PathLike] = None, resume: bool = False,
              jobs: int = 1, ray_address: Optional[str] = None, use_ray: bool = False,
              progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Runs every point of `spec` not already done and returns the sweep document, written to
    `out` after each point (module docstring: resume, lock)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs: expected a positive integer, got {jobs!r}")
    points = spec.points()
    doc = new_document(spec)
    lock = None
    if out is not None:
        out = Path(out)
        lock = OutputLock(out)
    try:
        if out is not None and out.exists():
            if not resume:
                raise ValueError(f"--out {out} exists; pass --resume to go on with it, or "
                                 "write another --out")
            doc = load(out)
            check_resumable(doc, spec, str(out))
        elif resume:
            raise ValueError(f"--resume: {out} does not exist" if out is not None
                             else "--resume needs --out")
        done = done_points(doc)
        doc["points"] = [done[point_key(p)] for p in points if point_key(p) in done]
        todo = [p for p in points if point_key(p) not in done]
        if progress:
            progress(len(doc["points"]), len(points))
        results = (_ray_results(spec.base, todo, ray_address) if use_ray
                   else _local_results(spec.base, todo, jobs))
        for record in results:
            doc["points"].append(record)
            if out is not None:
                documents.dump(doc, out)
            if progress:
                progress(len(doc["points"]), len(points))
        order = {point_key(p): i for i, p in enumerate(points)}
        doc["points"].sort(key=lambda r: order[point_key(r["point"])])
        doc["spec"]["frontier"] = dict(spec.frontier)
        mark_frontier(doc)
        if out is not None:
            documents.dump(doc, out)
        return doc
    finally:
        if lock is not None:
            lock.release()


# --------------------------------------------------------------------------- the frontier

@dataclass(frozen=True)
class Row:
    """One complete point, as the frontier sees it."""

    point: Dict[str, Any]
    per_gpu: float  # output tok/s per GPU
    per_user: float  # output tok/s per user (1 / mean TPOT)
    ttft_s: float  # mean
    tpot_s: float  # mean
    report: dict = field(repr=False, compare=False, default_factory=dict)


def _row_of(record: dict) -> Optional[Row]:
    """A complete record's `Row`, or None where it has no per-user or per-GPU rate."""
    m = record["report"]["metrics"]
    t = m["throughput"]
    per_user = t.get("output_tokens_per_s_per_user")
    if t.get("output_tokens_per_s_per_gpu") is None or per_user is None:
        return None
    return Row(record["point"], float(t["output_tokens_per_s_per_gpu"]), float(per_user),
               float(m["ttft"]["mean"]), float(m["tpot"]["mean"]), record["report"])


def rows(doc: dict) -> List[Row]:
    found = (_row_of(record) for record in doc["points"] if record["status"] == COMPLETE)
    return [r for r in found if r is not None]


def pareto(candidates: Iterable[Row]) -> List[Row]:
    """The rows no other row beats on both tok/s per GPU and tok/s per user (at least as good
    on both and better on one); equal rows are all kept. Sorted by tok/s per user."""
    items = list(candidates)
    front = [r for r in items
             if not any(o.per_gpu >= r.per_gpu and o.per_user >= r.per_user
                        and (o.per_gpu > r.per_gpu or o.per_user > r.per_user) for o in items)]
    return sorted(front, key=lambda r: (r.per_user, -r.per_gpu))


def frontier(doc: dict) -> List[Row]:
    """The frontier of the points that meet the spec's bounds (`FRONTIER`), in order of tok/s
    per user."""
    bounds = doc["spec"].get("frontier", {})
    return pareto(r for r in rows(doc)
                  if meets_slo(r, bounds.get("max_ttft_s"), bounds.get("max_tpot_s")))


def mark_frontier(doc: dict) -> dict:
    """Writes the answer into the document (module docstring): ``on_frontier`` and the cost per
    million output tokens on each complete record, and the ``frontier`` list."""
    prices = doc["spec"].get("frontier", {}).get("usd_per_gpu_hour", {})
    front = frontier(doc)
    on = {point_key(r.point) for r in front}
    for record in doc["points"]:
        if record["status"] != COMPLETE:
            continue
        record["on_frontier"] = point_key(record["point"]) in on
        cost = usd_per_million_tokens(_row_of(record), prices)
        if cost is not None:
            record["usd_per_million_output_tokens"] = cost
    doc["frontier"] = [{"point": r.point, "output_tokens_per_s_per_gpu": r.per_gpu,
                        "output_tokens_per_s_per_user": r.per_user, "ttft_s": r.ttft_s,
                        "tpot_s": r.tpot_s,
                        "usd_per_million_output_tokens": usd_per_million_tokens(r, prices)}
                       for r in front]
    return doc


def meets_slo(row: Row, ttft_s: Optional[float], tpot_s: Optional[float]) -> bool:
    """Mean TTFT and mean TPOT within the bounds given (tok/s per user is 1 / mean TPOT)."""
    return (ttft_s is None or row.ttft_s <= ttft_s) and (tpot_s is None or row.tpot_s <= tpot_s)


def parse_prices(text: Optional[str]) -> Dict[str, float]:
    """``"H100=2.5,MI300X=2.1"`` -> {hardware: USD per GPU-hour}."""
    prices: Dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or not name.strip() or not price > 0 or not math.isfinite(price):
            raise ValueError(f"--cost-per-gpu-hour: {item!r} is not NAME=USD with a positive "
                             "price, e.g. H100=2.5")
        prices[name.strip()] = price
    return prices


def usd_per_million_tokens(row: Optional[Row], prices: Mapping[str, float]) -> Optional[float]:
    """What a million output tokens cost at the point's hardware price (None if not given)."""
    if row is None:
        return None
    names = (row.point.get("hardware"), row.report.get("setup", {}).get("hardware"))
    price = next((prices[n] for n in names if n in prices), None)
    if price is None or row.per_gpu <= 0:
        return None
    return price / (row.per_gpu * 3600) * 1e6


# --------------------------------------------------------------------------- output

def describe(point: Mapping[str, Any]) -> str:
    """A point's configuration in a few characters: ``H100 tp2 c64 b8192``."""
    short = {"tp": "tp", "ep": "ep", "dp": "dp", "concurrency": "c", "max_num_batched_tokens": "b",
             "max_num_seqs": "s", "rate": "r"}
    parts = [str(point["hardware"])] if "hardware" in point else []
    parts += [f"{short[a]}{point[a]}" for a in AXES if a in point and a != "hardware"]
    return " ".join(parts) or "base"


def render(doc: dict, *, console=None) -> None:
    """The document's frontier (`mark_frontier`: of the points that meet the spec's bounds)
    ranked by tok/s per GPU, then the refused points with their reasons."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    all_rows = rows(doc)
    bounds = doc["spec"].get("frontier", {})
    prices = bounds.get("usd_per_gpu_hour", {})
    front = sorted(frontier(doc), key=lambda r: -r.per_gpu)
    slo = []
    if bounds.get("max_ttft_s") is not None:
        slo.append(f"mean TTFT <= {bounds['max_ttft_s'] * 1e3:g} ms")
    if bounds.get("max_tpot_s") is not None:
        slo.append(f"mean TPOT <= {bounds['max_tpot_s'] * 1e3:g} ms")
    base = doc["spec"]["base"]
    table = Table(box=box.SIMPLE, title=f"{base.get('model')}: Pareto frontier of "
                  f"{len(front)} of {len(all_rows)} configurations"
                  + (f" meeting {' and '.join(slo)}" if slo else ""))
    for name in ("configuration", "tok/s\nper GPU", "tok/s\nper user", "TTFT\nmean ms",
                 "TPOT\nmean ms", "$ per M\nout tok"):
        table.add_column(name, justify="left" if name == "configuration" else "right",
                         no_wrap=True)
    for r in front:
        cost = usd_per_million_tokens(r, prices)
        table.add_row(escape(describe(r.point)), f"{r.per_gpu:.0f}", f"{r.per_user:.1f}",
                      f"{r.ttft_s * 1e3:.0f}", f"{r.tpot_s * 1e3:.1f}",
                      "-" if cost is None else f"{cost:.3f}")
    console.print(table)
    refused = [rec for rec in doc["points"] if rec["status"] == REFUSED]
    for rec in refused:
        console.print(f"refused {escape(describe(rec['point']))}: {escape(rec['reason'])}",
                      highlight=False)


def plot(doc: dict, path) -> None:
    """A PNG of tok/s per GPU against tok/s per user: a curve per hardware and tp through
    its points in order of tok/s per user, the Pareto points ringed and labelled with their
    configuration."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib "
                           "(or pip install 'gnomon[dash]')") from None
    all_rows = rows(doc)
    if not all_rows:
        raise ValueError("--plot: no point of the sweep completed; nothing to draw")
    fig = Figure(figsize=(9, 6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    curves: Dict[str, List[Row]] = {}
    for r in all_rows:
        hardware = r.point.get("hardware", r.report.get("setup", {}).get("hardware"))
        tp, dp = (r.point.get(k, r.report.get("setup", {}).get(k, 1)) for k in ("tp", "dp"))
        curves.setdefault(f"{hardware} tp{tp}" + (f" dp{dp}" if dp > 1 else ""), []).append(r)
    for label, members in sorted(curves.items()):
        members.sort(key=lambda r: r.per_user)
        ax.plot([r.per_user for r in members], [r.per_gpu for r in members], marker="o",
                markersize=4, linewidth=1.2, label=label)
    front = frontier(doc)
    ax.plot([r.per_user for r in front], [r.per_gpu for r in front], color="black",
            linestyle="--", linewidth=1, label="Pareto frontier")
    ax.scatter([r.per_user for r in front], [r.per_gpu for r in front], s=90,
               facecolors="none", edgecolors="black", linewidths=1.5, zorder=3)
    labels: List[List[Any]] = []  # [x, y, text]: points within 2% of each other share one
    for r in front:
        near = next((lab for lab in labels if abs(lab[0] - r.per_user) <= 0.02 * lab[0]
                     and abs(lab[1] - r.per_gpu) <= 0.02 * lab[1]), None)
        if near is None:
            labels.append([r.per_user, r.per_gpu, describe(r.point)])
        else:
            near[2] += "\n" + describe(r.point)
    for x, y, text in labels:
        ax.annotate(text, (x, y), xytext=(5, 5), textcoords="offset points", fontsize=7)
    ax.set_xlabel("output tok/s per user (1 / mean TPOT)")
    ax.set_ylabel("output tok/s per GPU")
    ax.set_title(f"{doc['spec']['base'].get('model')}: throughput against interactivity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.savefig(path, format="png", dpi=110)
