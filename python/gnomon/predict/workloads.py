"""Serving workloads for the simulator and the validator: synthetic ones, named presets, and
request traces read from CSV or JSON-lines files.

A `Workload` is a tuple of `WorkloadRequest` sorted by arrival time. Every request runs with
``ignore_eos=True`` and ``max_tokens=output_len``, so its length is fixed by the workload, not by
the model. Traces give only lengths, so prompt token ids are always synthesised: uniform in
``[1, vocab_size)`` from ``numpy.random.default_rng(seed)``.

Determinism: a `SyntheticSpec` and a seed give the same workload on every run. Arrivals, lengths,
prefix groups and token ids come from independent streams spawned from the seed, so a sweep over
`rate` (with the same seed) keeps the requests identical and only stretches their arrivals.

Entry points: `synthetic(spec)`, `named(name, ...)` for the presets in `WORKLOADS`,
`load_trace(path)`, and `resolve(spec_string, ...)` which accepts a preset name (``"chat"``,
``"long-context"``, ``"random"``, ``"sharegpt"``) and ``"trace:PATH"``. `parse_rate` and
`parse_length` read the command line's ``--rate`` and ``--input-len`` / ``--output-len``.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
import os
import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

LENGTH_KINDS = ("fixed", "uniform", "lognormal")
ARRIVALS = ("poisson", "fixed")

# Trace columns. A file uses exactly one of the two sets.
TRACE_COLUMNS = ("arrival_time", "prompt_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")  # Azure LLM inference trace
TRACE_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


# --------------------------------------------------------------------------- argument checks

def _is_int(x) -> bool:
    # The exact-type test first: the ABC check costs more than the rest of a request's build.
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def _is_real(x) -> bool:
    return (type(x) is float or type(x) is int
            or (isinstance(x, numbers.Real) and not isinstance(x, bool)))


def _check_int(name: str, x, minimum: int) -> None:
    if not _is_int(x):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")


def _check_seed(seed) -> None:
    _check_int("seed", seed, 0)


def _check_rate(rate) -> None:
    if not _is_real(rate) or math.isnan(rate) or rate <= 0:
        raise ValueError(f"rate must be a number > 0 (requests/s; math.inf for all at time 0), "
                         f"got {rate!r}")


def parse_rate(text: str, flag: str = "--rate") -> float:
    """Requests per second from text: a positive number, or ``inf`` (every request at t=0)."""
    try:
        rate = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{flag}: expected a number of requests/s > 0 or inf, got {text!r}") \
            from None
    if math.isnan(rate) or rate <= 0:
        raise ValueError(f"{flag}: expected a number of requests/s > 0 or inf, got {text!r}")
    return rate


def parse_length(text: str, flag: str) -> "LengthDist":
    """A token count from text: ``N`` (fixed) or ``LOW:HIGH`` (uniform, both inclusive, as the
    random dataset of ``vllm bench`` draws with a range ratio)."""
    parts = str(text).split(":")
    try:
        values = [int(p.strip()) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values) < 1 or values != sorted(values):
        raise ValueError(f"{flag}: expected a token count N >= 1 or a range LOW:HIGH with "
                         f"1 <= LOW <= HIGH, got {text!r}")
    return LengthDist.fixed(values[0]) if len(values) == 1 else LengthDist.uniform(*values)


# --------------------------------------------------------------------------- data

@dataclass(frozen=True)
class WorkloadRequest:
    """One request: arrives `arrival_time` seconds after the workload starts, and runs with
    ``ignore_eos=True`` and ``max_tokens=output_len``."""

    request_id: str
    arrival_time: float
    prompt_token_ids: Tuple[int, ...]
    output_len: int

    def __post_init__(self):
        if not isinstance(self.request_id, str):
            raise ValueError(f"request_id must be a str, got {self.request_id!r}")
        a = self.arrival_time
        if not _is_real(a) or not math.isfinite(a) or a < 0:
            raise ValueError(f"arrival_time must be a finite number >= 0, got {a!r} "
                             f"(request {self.request_id})")
        if not isinstance(self.prompt_token_ids, tuple) or not self.prompt_token_ids:
            raise ValueError(f"prompt_token_ids must be a non-empty tuple of ints "
                             f"(request {self.request_id})")
        if not _is_int(self.output_len) or self.output_len < 1:
            raise ValueError(f"output_len must be an integer >= 1, got {self.output_len!r} "
                             f"(request {self.request_id})")


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival time, and a one-line `description` of how they were made."""

    name: str
    requests: Tuple[WorkloadRequest, ...]
    description: str

    def __post_init__(self):
        if not isinstance(self.requests, tuple) or not self.requests:
            raise ValueError(f"requests must be a non-empty tuple of WorkloadRequest "
                             f"(workload {self.name!r})")
        prev = 0.0
        for r in self.requests:
            if r.arrival_time < prev:
                raise ValueError(f"requests must be sorted by arrival_time: request "
                                 f"{r.request_id} arrives at {r.arrival_time} after one at {prev} "
                                 f"(workload {self.name!r})")
            prev = r.arrival_time
        if len({r.request_id for r in self.requests}) != len(self.requests):
            raise ValueError(f"request ids must be unique (workload {self.name!r})")
        if "\n" in self.description:
            raise ValueError("description must be one line")

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def duration(self) -> float:
        """Seconds from the start to the last arrival."""
        return self.requests[-1].arrival_time

    @property
    def mean_prompt_len(self) -> float:
        return sum(len(r.prompt_token_ids) for r in self.requests) / len(self.requests)

    @property
    def mean_output_len(self) -> float:
        return sum(r.output_len for r in self.requests) / len(self.requests)


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts. Build it with `fixed`, `uniform` or `lognormal`.

    - ``"fixed"``: always `value`.
    - ``"uniform"``: integers in ``[low, high]``, both inclusive.
    - ``"lognormal"``: ``round(exp(N(ln median, sigma)))`` clipped to ``[low, high]``. Clipping
      and rounding are monotone, so the median of the samples is `median` (to within rounding)
      as long as ``low <= median <= high``, which is required.

    Fields that a kind does not use must be left None."""

    kind: str
    value: Optional[int] = None
    low: Optional[int] = None
    high: Optional[int] = None
    median: Optional[float] = None
    sigma: Optional[float] = None

    @staticmethod
    def fixed(value: int) -> "LengthDist":
        return LengthDist("fixed", value=value)

    @staticmethod
    def uniform(low: int, high: int) -> "LengthDist":
        return LengthDist("uniform", low=low, high=high)

    @staticmethod
    def lognormal(median: float, sigma: float, low: int, high: int) -> "LengthDist":
        return LengthDist("lognormal", low=low, high=high, median=median, sigma=sigma)

    def __post_init__(self):
        uses = {"fixed": ("value",), "uniform": ("low", "high"),
                "lognormal": ("low", "high", "median", "sigma")}
        if self.kind not in uses:
            raise ValueError(f"kind must be one of {LENGTH_KINDS}, got {self.kind!r}")
        for f in ("value", "low", "high", "median", "sigma"):
            given = getattr(self, f) is not None
            if given != (f in uses[self.kind]):
                need = "is required" if not given else "is not used"
                raise ValueError(f"{f} {need} for a {self.kind!r} LengthDist "
                                 f"(it uses {', '.join(uses[self.kind])})")
        if self.kind == "fixed":
            _check_int("value", self.value, 1)
            return
        _check_int("low", self.low, 1)
        _check_int("high", self.high, 1)
        if self.low > self.high:
            raise ValueError(f"low must be <= high, got low={self.low}, high={self.high}")
        if self.kind == "lognormal":
            if not _is_real(self.median) or not math.isfinite(self.median):
                raise ValueError(f"median must be a finite number, got {self.median!r}")
            if not self.low <= self.median <= self.high:
                raise ValueError(f"median must lie in [low, high] = [{self.low}, {self.high}], "
                                 f"got {self.median}")
            if not _is_real(self.sigma) or not math.isfinite(self.sigma) or self.sigma < 0:
                raise ValueError(f"sigma must be a finite number >= 0, got {self.sigma!r}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` lengths as an int64 array."""
        _check_int("n", n, 0)
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)
        x = rng.lognormal(mean=math.log(self.median), sigma=self.sigma, size=n)
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed {self.value}"
        if self.kind == "uniform":
            return f"uniform [{self.low}, {self.high}]"
        return (f"lognormal(median={self.median:g}, sigma={self.sigma:g}) clipped "
                f"[{self.low}, {self.high}]")


@dataclass(frozen=True)
class SyntheticSpec:
    """How to generate a synthetic workload.

    - `rate`: requests per second; ``math.inf`` makes every request arrive at time 0.
    - `arrival`: ``"poisson"`` (exponential gaps of mean ``1/rate``) or ``"fixed"`` (gaps of
      exactly ``1/rate``). Either way the first request arrives at time 0.
    - `shared_prefix_groups`: 0 for no sharing; ``g > 0`` puts each request in one of `g`
      groups (drawn uniformly), and its prompt starts with that group's `shared_prefix_len`
      tokens. The prompt length drawn from `prompt_len` counts the prefix; a prompt not longer
      than the prefix is lengthened to ``shared_prefix_len + 1`` so every request has a token of
      its own. ``shared_prefix_len`` must be >= 1 with groups and 0 without.
    - Prompt token ids are uniform in ``[1, vocab_size)``.
    """

    num_requests: int
    rate: float
    prompt_len: LengthDist
    output_len: LengthDist
    arrival: str = "poisson"
    shared_prefix_groups: int = 0
    shared_prefix_len: int = 0
    vocab_size: int = 32000
    seed: int = 0

    def __post_init__(self):
        _check_int("num_requests", self.num_requests, 1)
        _check_rate(self.rate)
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        for f in ("prompt_len", "output_len"):
            if not isinstance(getattr(self, f), LengthDist):
                raise ValueError(f"{f} must be a LengthDist, got {getattr(self, f)!r}")
        _check_int("shared_prefix_groups", self.shared_prefix_groups, 0)
        _check_int("shared_prefix_len", self.shared_prefix_len, 0)
        if self.shared_prefix_groups > 0 and self.shared_prefix_len == 0:
            raise ValueError("shared_prefix_len must be >= 1 when shared_prefix_groups > 0")
        if self.shared_prefix_groups == 0 and self.shared_prefix_len != 0:
            raise ValueError(f"shared_prefix_len is {self.shared_prefix_len} but "
                             f"shared_prefix_groups is 0; set both or neither")
        _check_int("vocab_size", self.vocab_size, 2)
        _check_seed(self.seed)

    def describe(self) -> str:
        rate = ("all at t=0" if math.isinf(self.rate)
                else f"{self.arrival} arrivals at {self.rate:g} req/s")
        s = (f"{self.num_requests} requests, {rate}, prompt {self.prompt_len.describe()}, "
             f"output {self.output_len.describe()}")
        if self.shared_prefix_groups:
            s += (f", {self.shared_prefix_groups} shared-prefix groups of "
                  f"{self.shared_prefix_len} tokens")
        return s + f", token ids uniform in [1, {self.vocab_size}), seed {self.seed}"


# --------------------------------------------------------------------------- synthesis

def _arrivals(rng: np.random.Generator, n: int, rate: float, arrival: str) -> np.ndarray:
    if math.isinf(rate):
        return np.zeros(n)
    if arrival == "fixed":
        gaps = np.full(n - 1, 1.0 / rate)
    else:
        gaps = rng.exponential(1.0, size=n - 1) / rate
    return np.concatenate(([0.0], np.cumsum(gaps)))


def _build(name: str, description: str, arrivals: np.ndarray, prompt_lens: np.ndarray,
           output_lens: np.ndarray, token_rng: np.random.Generator, vocab_size: int,
           groups: Optional[np.ndarray] = None, prefixes: Optional[List[list]] = None) -> Workload:
    """Requests in arrival order (stable). With `groups`, request i's prompt is
    ``prefixes[groups[i]]`` followed by fresh tokens up to ``prompt_lens[i]``."""
    order = np.argsort(arrivals, kind="stable")
    prefix_len = len(prefixes[0]) if prefixes else 0
    own = prompt_lens - prefix_len
    ids = token_rng.integers(1, vocab_size, size=int(own.sum()), dtype=np.int64).tolist()
    ends = np.cumsum(own).tolist()
    starts = [0] + ends[:-1]
    arr = arrivals.tolist()
    outs = output_lens.tolist()
    grp = groups.tolist() if groups is not None else None
    reqs = []
    for k, i in enumerate(order.tolist()):
        toks = ids[starts[i]:ends[i]]
        if grp is not None:
            toks = prefixes[grp[i]] + toks
        reqs.append(WorkloadRequest(f"{name}-{k}", arr[i], tuple(toks), outs[i]))
    return Workload(name, tuple(reqs), description)


def synthetic(spec: SyntheticSpec, name: str = "synthetic") -> Workload:
    """Generate the workload `spec` describes. Request ids are ``f"{name}-{i}"`` in arrival
    order."""
    if not isinstance(spec, SyntheticSpec):
        raise ValueError(f"spec must be a SyntheticSpec, got {type(spec).__name__}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    n = spec.num_requests
    r_arr, r_prompt, r_out, r_group, r_tok = (
        np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(5))
    arrivals = _arrivals(r_arr, n, spec.rate, spec.arrival)
    prompt_lens = spec.prompt_len.sample(r_prompt, n)
    output_lens = spec.output_len.sample(r_out, n)
    groups = prefixes = None
    if spec.shared_prefix_groups:
        g, p = spec.shared_prefix_groups, spec.shared_prefix_len
        prompt_lens = np.maximum(prompt_lens, p + 1)
        groups = r_group.integers(0, g, size=n)
        flat = r_group.integers(1, spec.vocab_size, size=g * p, dtype=np.int64).tolist()
        prefixes = [flat[j * p:(j + 1) * p] for j in range(g)]
    return _build(name, f"{name}: synthetic, {spec.describe()}", arrivals, prompt_lens,
                  output_lens, r_tok, spec.vocab_size, groups, prefixes)


# --------------------------------------------------------------------------- presets

# The preset shapes below were chosen by us to resemble public chat and long-context serving
# traces (long-tailed prompt and output lengths, Poisson arrivals). They are not fitted to, or
# taken from, any dataset.

def _chat(*, num_requests: int, rate: float, vocab_size: int, seed: int = 0) -> SyntheticSpec:
    return SyntheticSpec(num_requests=num_requests, rate=rate,
                         prompt_len=LengthDist.lognormal(median=1000, sigma=0.8, low=16, high=4096),
                         output_len=LengthDist.lognormal(median=250, sigma=0.7, low=8, high=1024),
                         arrival="poisson", vocab_size=vocab_size, seed=seed)


def _long_context(*, num_requests: int, rate: float, vocab_size: int,
                  seed: int = 0) -> SyntheticSpec:
    return SyntheticSpec(num_requests=num_requests, rate=rate,
                         prompt_len=LengthDist.uniform(8000, 32000),
                         output_len=LengthDist.lognormal(median=300, sigma=0.6, low=16, high=2048),
                         arrival="poisson", vocab_size=vocab_size, seed=seed)


def _random(*, num_requests: int, rate: float, vocab_size: int, seed: int = 0) -> SyntheticSpec:
    # vllm bench's random dataset defaults: 1024 input and 128 output tokens
    return SyntheticSpec(num_requests=num_requests, rate=rate,
                         prompt_len=LengthDist.fixed(1024), output_len=LengthDist.fixed(128),
                         arrival="poisson", vocab_size=vocab_size, seed=seed)


def sharegpt_lengths() -> dict:
    """The ShareGPT-like length model shipped in ``data/sharegpt.json``: lognormal prompt and
    output lengths fitted to published ShareGPT statistics (the file names them)."""
    path = os.path.join(os.path.dirname(__file__), "data", "sharegpt.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _length_from_data(entry: dict) -> "LengthDist":
    return LengthDist.lognormal(median=entry["median"], sigma=entry["sigma"], low=entry["low"],
                                high=entry["high"])


def _sharegpt(*, num_requests: int, rate: float, vocab_size: int,
              seed: int = 0) -> SyntheticSpec:
    data = sharegpt_lengths()
    return SyntheticSpec(num_requests=num_requests, rate=rate,
                         prompt_len=_length_from_data(data["prompt"]),
                         output_len=_length_from_data(data["output"]),
                         arrival="poisson", vocab_size=vocab_size, seed=seed)


WORKLOADS: Dict[str, Callable[..., SyntheticSpec]] = {
    "chat": _chat,
    "long-context": _long_context,
    "random": _random,
    "sharegpt": _sharegpt,
}


def named(name: str, *, num_requests: int, rate: float, vocab_size: int, seed: int = 0,
          input_len: Optional[LengthDist] = None,
          output_len: Optional[LengthDist] = None) -> Workload:
    """The preset `name` (a key of `WORKLOADS`) with these sizes; `input_len` and `output_len`
    replace the preset's length distributions."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    spec = WORKLOADS[name](num_requests=num_requests, rate=rate, vocab_size=vocab_size, seed=seed)
    if input_len is not None:
        spec = replace(spec, prompt_len=input_len)
    if output_len is not None:
        spec = replace(spec, output_len=output_len)
    return synthetic(spec, name=name)


# --------------------------------------------------------------------------- traces

_FRACTION = re.compile(r"^(.*\d\d:\d\d:\d\d)(?:\.(\d+))?(.*)$")


def _parse_timestamp(s: str) -> Tuple[datetime, float]:
    """``(whole-second datetime in UTC, fractional seconds)``. Any number of fractional digits
    is accepted (the Azure trace writes 7, which `datetime.fromisoformat` refuses before
    Python 3.11); a timestamp without a zone is read as UTC."""
    m = _FRACTION.match(s.strip())
    if not m:
        raise ValueError("not a 'YYYY-MM-DD HH:MM:SS[.fff][+HH:MM]' timestamp")
    head, frac, zone = m.groups()
    if zone == "Z":
        zone = "+00:00"
    dt = datetime.fromisoformat(head + zone)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt, float("0." + frac) if frac else 0.0


def _positive_int(v, text_source: bool) -> int:
    if text_source:
        v = int(v.strip())
    elif not _is_int(v):
        raise ValueError
    if v < 1:
        raise ValueError
    return v


def _row(values: Dict[str, object], columns: Tuple[str, str, str], text_source: bool, where: str):
    """Parse one record into ``(arrival, prompt_tokens, output_tokens)``; arrival is seconds or,
    for Azure, ``(datetime, fraction)``."""
    t_col, p_col, o_col = columns
    for c in columns:
        if c not in values or values[c] is None or (text_source and not str(values[c]).strip()):
            raise ValueError(f"{where} missing field {c!r}")
    v = values[t_col]
    try:
        if columns is AZURE_COLUMNS:
            if not isinstance(v, str):
                raise ValueError
            t = _parse_timestamp(v)
        else:
            if text_source:
                t = float(v.strip())
            elif _is_real(v):
                t = float(v)
            else:
                raise ValueError
            if not math.isfinite(t) or t < 0:
                raise ValueError
    except ValueError:
        want = ("a timestamp like '2023-11-16 18:15:46.6805900'" if columns is AZURE_COLUMNS
                else "a finite number of seconds >= 0")
        raise ValueError(f"{where} field {t_col!r} must be {want}, got {v!r}") from None
    counts = []
    for c in (p_col, o_col):
        try:
            counts.append(_positive_int(values[c], text_source))
        except ValueError:
            raise ValueError(f"{where} field {c!r} must be an integer >= 1, "
                             f"got {values[c]!r}") from None
    return t, counts[0], counts[1]


def _pick_columns(present: Sequence[str], where: str) -> Tuple[str, str, str]:
    have = set(present)
    ours, azure = set(TRACE_COLUMNS) <= have, set(AZURE_COLUMNS) <= have
    if ours and azure:
        raise ValueError(f"{where} has both column sets {TRACE_COLUMNS} and {AZURE_COLUMNS}; "
                         f"keep one")
    if ours:
        return TRACE_COLUMNS
    if azure:
        return AZURE_COLUMNS
    closest = max((TRACE_COLUMNS, AZURE_COLUMNS), key=lambda cs: len(have & set(cs)))
    missing = [c for c in closest if c not in have]
    raise ValueError(f"{where} lacks columns {missing}; a trace needs either "
                     f"{TRACE_COLUMNS} or the Azure LLM inference trace's {AZURE_COLUMNS}")


def _read_csv(path: str):
    rows = []
    columns = None
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        for record in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in record):
                continue
            if columns is None:
                header = [h.strip() for h in record]
                columns = _pick_columns(header, f"{path}:{line}: header")
                continue
            where = f"{path}:{line}:"
            if len(record) > len(header):
                raise ValueError(f"{where} row has {len(record)} fields, the header has "
                                 f"{len(header)}")
            values = dict(zip(header, record))
            rows.append(_row(values, columns, True, where))
    return columns, rows


def _read_jsonl(path: str):
    rows = []
    columns = None
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            where = f"{path}:{line}:"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where} bad JSON ({e.msg}); each line must be one JSON "
                                 f"object") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where} each line must be one JSON object, got "
                                 f"{type(obj).__name__}")
            if columns is None:
                columns = _pick_columns(list(obj), f"{where} first record")
            rows.append(_row(obj, columns, False, where))
    return columns, rows


def load_trace(path: Union[str, os.PathLike], *, vocab_size: int = 32000, seed: int = 0,
               max_requests: Optional[int] = None) -> Workload:
    """Read a request trace: CSV (``.csv``) or JSON lines (``.jsonl``, or ``.json`` holding one
    object per line).

    Columns (or keys) are ``arrival_time`` (seconds), ``prompt_tokens`` and ``output_tokens``,
    or the Azure LLM inference trace's ``TIMESTAMP``, ``ContextTokens`` and ``GeneratedTokens``.
    Arrival times become relative to the earliest row, rows are sorted by arrival (stable), and
    `max_requests` keeps the first that many after sorting. Prompt token ids are synthesised,
    uniform in ``[1, vocab_size)`` from `seed`. A malformed row raises a ValueError starting
    ``{path}:{line}:`` (1-based line in the file) and naming the field."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in TRACE_EXTENSIONS:
        raise ValueError(f"trace {path!r}: unknown extension {ext!r}; accepted: "
                         f"{', '.join(sorted(TRACE_EXTENSIONS))}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"trace file not found: {path}")
    _check_int("vocab_size", vocab_size, 2)
    _check_seed(seed)
    if max_requests is not None:
        _check_int("max_requests", max_requests, 1)
    fmt = TRACE_EXTENSIONS[ext]
    columns, rows = _read_csv(path) if fmt == "csv" else _read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: the trace has no requests")
    if columns is AZURE_COLUMNS:
        t0 = min(rows, key=lambda r: r[0])[0]
        seconds = [(dt - t0[0]).total_seconds() + (frac - t0[1]) for (dt, frac), _, _ in rows]
    else:
        t0 = min(r[0] for r in rows)
        seconds = [r[0] - t0 for r in rows]
    arrivals = np.maximum(np.asarray(seconds, dtype=np.float64), 0.0)  # exact 0 for the earliest
    prompt_lens = np.asarray([r[1] for r in rows], dtype=np.int64)
    output_lens = np.asarray([r[2] for r in rows], dtype=np.int64)
    total = len(rows)
    if max_requests is not None and max_requests < total:
        keep = np.sort(np.argsort(arrivals, kind="stable")[:max_requests])
        arrivals, prompt_lens, output_lens = arrivals[keep], prompt_lens[keep], output_lens[keep]
    name = f"trace:{os.path.basename(path)}"
    kind = "Azure" if columns is AZURE_COLUMNS else "gnomon"
    description = (f"{name}: {len(arrivals)} of {total} rows of {path} ({kind} columns), "
                   f"prompt ids synthesised uniform in [1, {vocab_size}), seed {seed}")
    rng = np.random.default_rng(seed)
    return _build(name, description, arrivals, prompt_lens, output_lens, rng, vocab_size)


# --------------------------------------------------------------------------- resolve

def resolve(spec: str, *, num_requests: Optional[int], rate: Optional[float], vocab_size: int,
            seed: int = 0, input_len: Optional[LengthDist] = None,
            output_len: Optional[LengthDist] = None) -> Workload:
    """A workload from a string: a preset name (a key of `WORKLOADS`) or ``"trace:PATH"``.

    A preset needs `num_requests` and `rate`; `input_len` / `output_len` replace its lengths. A
    trace carries its own arrival times and lengths, so `rate` and the lengths must be None for
    it (they are refused rather than ignored); `num_requests`, if given, keeps the first that
    many requests of the trace."""
    accepted = ", ".join([*(repr(k) for k in sorted(WORKLOADS)), "'trace:PATH'"])
    if not isinstance(spec, str):
        raise ValueError(f"workload must be a str, one of {accepted}; got {spec!r}")
    if spec.startswith("trace:"):
        path = spec[len("trace:"):]
        if not path:
            raise ValueError(f"workload {spec!r} names no file; expected 'trace:PATH'")
        if rate is not None:
            raise ValueError(f"rate must be None for a trace workload ({spec!r}): a trace "
                             f"carries its own arrival times")
        if input_len is not None or output_len is not None:
            raise ValueError(f"input_len and output_len must be None for a trace workload "
                             f"({spec!r}): a trace carries its own lengths")
        return load_trace(path, vocab_size=vocab_size, seed=seed, max_requests=num_requests)
    if spec in WORKLOADS:
        if num_requests is None or rate is None:
            raise ValueError(f"workload {spec!r} needs num_requests and rate")
        return named(spec, num_requests=num_requests, rate=rate, vocab_size=vocab_size,
                     seed=seed, input_len=input_len, output_len=output_len)
    raise ValueError(f"unknown workload {spec!r}; accepted: {accepted}")
