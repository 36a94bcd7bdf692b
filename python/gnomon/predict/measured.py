"""Measured serving points: real benchmark runs that `gnomon accuracy` compares `simulate` with.

A `MeasuredPoint` is one run of a serving benchmark on real GPUs: what ran (model, hardware,
engine and its version, parallelism, dtypes), the load (a workload, a closed loop at a
concurrency or a rate, the number of requests), what was measured (mean TTFT and TPOT, output
throughput where the source gives it) and where it comes from (``source``, part of a row's group).

Two ways in:

- **gnomon's schema**, a CSV with a header or a JSON-lines file, one point per row, the fields of
  `FIELDS` (``FIELDS`` says each one's meaning and default). `load_points` reads it.
- **aiconfigurator-core's** ``systems/silicon_sample.csv`` (NVIDIA AIConfigurator, PyPI
  ``aiconfigurator-core``, Apache-2.0): `from_silicon` maps each row through the one table in
  ``data/silicon.json`` (models and their quant labels, systems and their split, backends, the KV
  dtype per recipe; what a blank field means; the server settings a source's benchmark
  launched its engine with, by rule, or why a launch cannot be simulated: a rule's ``refuse``,
  such as InferenceMAX's DeepSeek-R1 MTP launches, told apart by their image, and its GB200
  runs, all disaggregated). `silicon_csv()`
  finds it where that package is installed; nothing is downloaded.

A point maps to a `SimulationSpec` (`MeasuredPoint.simulation_spec`), or is refused with the
reason that names what is missing (`PointRefused`). A row's ``tp_size`` is each attention
group's GPUs, ``attention_dp_size`` the groups, and ``moe_tp_size x moe_ep_size`` must be all
of their GPUs (aiconfigurator's own rule); a row that breaks it is refused, never approximated
as another layout. So is a row wider than one board of its system (tp_size 64, or
attention_dp_size 64, on an 8-GPU b200_sxm): their ids name a layout of one board (``tp8_ep8``
where tp_size is 64; ``tp4_ep4`` where tp_size x attention_dp_size is 16), so the fields
multiply what ran. ``batch_size`` is
one data-parallel group's concurrency, as aiconfigurator reads it: the closed loop runs
``batch_size x attention_dp_size`` users. Where the row's source records the concurrency its
client ran (``silicon_concurrency=N`` in ``silicon_data_source``) and it is some other multiple
of ``batch_size`` (4 x for gpt-oss-120b at tp_size 4 on h100_sxm with no attention_dp_size),
the fields do not state the layout that ran, and the row is refused.

The split: ``fit`` points may tune the predictors; ``held-out`` points are only reported. A point
of neither (``""``) counts only in ``--split all``.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Dict, Iterable, List, Optional, Tuple

from gnomon.engine import models
from gnomon.hardware import gpu

from .spec import SimulationSpec

SPLITS = ("fit", "held-out")
MEASURES = ("ttft_ms", "tpot_ms", "output_tokens_per_s", "total_tokens_per_s")
DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "silicon.json")
PUBLISHED_FILE = os.path.join(os.path.dirname(__file__), "data", "published.jsonl")

# field: (meaning, default; None: required)
FIELDS: Dict[str, Tuple[str, Optional[str]]] = {
    "id": ("a unique name for the run", None),
    "source": ("where the measurement comes from (a group key)", None),
    "model": ("a gnomon preset or a model folder", None),
    "hardware": ("a catalogue name or a hardware file", None),
    "engine": ("an engine profile (vllm, sglang, trtllm, gnomon) or a .json file", None),
    "engine_version": ("the engine's version, '' when the source does not say", ""),
    "tp": ("tensor-parallel GPUs", "1"),
    "ep": ("expert-parallel groups of the tp x dp GPUs (the routed experts split over them)",
           "1"),
    "dp": ("attention data-parallel groups of tp GPUs", "1"),
    "weight_dtype": ("auto, bfloat16, fp8, nvfp4 or mxfp4: the dense linear weights", "auto"),
    "kv_dtype": ("auto, bfloat16 or fp8", "auto"),
    "workload": ("random, sharegpt, chat or trace:FILE", "random"),
    "input_len": ("N or LOW:HIGH prompt tokens (random workloads)", ""),
    "output_len": ("N or LOW:HIGH output tokens (random workloads)", ""),
    "concurrency": ("requests in flight of a closed loop, '' for none", ""),
    "rate": ("requests/s, or inf (all at once)", "inf"),
    "num_requests": ("requests the benchmark sent", None),
    "engine_settings": ("what the server was launched with beyond its engine profile's "
                        "defaults: KEY=VALUE pairs joined by ';', KEY a field of "
                        "gnomon.EngineConfig (max_num_seqs, "
                        "max_num_batched_tokens, batch_wait_timeout_iters, ...)", ""),
    "ttft_ms": ("measured mean time to first token, ms ('' if not measured)", ""),
    "tpot_ms": ("measured mean time per output token, ms ('' if not measured)", ""),
    "output_tokens_per_s": ("measured output throughput ('' if not measured)", ""),
    "total_tokens_per_s": ("measured prompt + output throughput ('' if not measured)", ""),
    "split": ("fit, held-out or ''", ""),
}


class PointRefused(ValueError):
    """A measured point the simulator cannot answer honestly; ``reason`` names what is missing.
    ``inconsistent``: the row's own fields do not state what ran (a layout they contradict, a
    concurrency its source contradicts, a mode its launch contradicts), as opposed to a run they
    state that gnomon does not simulate; such rows leave the coverage's consistent share."""

    def __init__(self, reason: str, inconsistent: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.inconsistent = inconsistent


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured run (module docstring; `FIELDS` gives each field's meaning)."""

    id: str
    source: str
    model: str
    hardware: str
    engine: str
    num_requests: int
    engine_version: str = ""
    tp: int = 1
    ep: int = 1
    dp: int = 1
    weight_dtype: str = "auto"
    kv_dtype: str = "auto"
    workload: str = "random"
    input_len: str = ""
    output_len: str = ""
    concurrency: Optional[int] = None
    rate: float = math.inf
    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    output_tokens_per_s: Optional[float] = None
    total_tokens_per_s: Optional[float] = None
    split: str = ""
    engine_settings: str = ""

    def __post_init__(self):
        where = f"point {self.id!r}"
        for name in ("tp", "ep", "dp", "num_requests"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{where}: {name}: expected an integer >= 1, got {v!r}")
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or not
                                             isinstance(self.concurrency, int)
                                             or self.concurrency < 1):
            raise ValueError(f"{where}: concurrency: expected an integer >= 1 or blank, got "
                             f"{self.concurrency!r}")
        if not (isinstance(self.rate, (int, float)) and self.rate > 0):
            raise ValueError(f"{where}: rate: expected requests/s > 0 or inf, got {self.rate!r}")
        for name in MEASURES:
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{where}: {name}: expected a positive number or blank, got "
                                 f"{v!r}")
        if all(getattr(self, name) is None for name in MEASURES):
            raise ValueError(f"{where}: measures none of {', '.join(MEASURES)}")
        if self.split not in ("",) + SPLITS:
            raise ValueError(f"{where}: split: expected one of fit, held-out or '', got "
                             f"{self.split!r}")
        for name in ("id", "source", "model", "hardware", "engine"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{where}: {name}: expected a non-empty string")
        parse_settings(self.engine_settings, f"{where}: engine_settings")

    @property
    def dtype_label(self) -> str:
        return f"w={self.weight_dtype},kv={self.kv_dtype}"

    @property
    def group(self) -> Dict[str, str]:
        """What a group of points shares: model x hardware x engine x dtypes x source."""
        engine = self.engine + (f" {self.engine_version}" if self.engine_version else "")
        return {"model": self.model, "hardware": self.hardware, "engine": engine,
                "dtype": self.dtype_label, "source": self.source}

    def simulation_spec(self) -> SimulationSpec:
        """The `SimulationSpec` of this run (its benchmark's workload, its engine launched with
        its settings and parallel layout), or `PointRefused`."""
        flags = dict(model=self.model, hardware=self.hardware, engine=self.engine, tp=self.tp,
                     ep=self.ep, dp=self.dp, weight_dtype=self.weight_dtype,
                     kv_dtype=self.kv_dtype, workload=self.workload,
                     num_requests=self.num_requests, concurrency=self.concurrency,
                     engine_settings=parse_settings(self.engine_settings, "engine_settings"))
        if not self.workload.startswith("trace:"):
            flags.update(rate=self.rate, input_len=self.input_len or None,
                         output_len=self.output_len or None)
        return SimulationSpec.of(**flags)

    def to_json(self) -> dict:
        out = asdict(self)
        out["rate"] = "inf" if math.isinf(self.rate) else self.rate
        return out


def parse_settings(text: str, where: str) -> Dict[str, object]:
    """``KEY=VALUE;...`` as a dict, each value true or false (any case) a bool, else an int,
    else a float, else the string."""
    if not isinstance(text, str):
        raise ValueError(f"{where}: expected KEY=VALUE pairs joined by ';', got {text!r}")
    out: Dict[str, object] = {}
    for pair in filter(None, (p.strip() for p in text.split(";"))):
        key, eq, raw = (x.strip() for x in pair.partition("="))
        if not eq or not key.isidentifier() or not raw or key in out:
            raise ValueError(f"{where}: {pair!r}: expected KEY=VALUE with KEY an identifier, "
                             f"each KEY once")
        if raw.lower() in ("true", "false"):
            out[key] = raw.lower() == "true"
            continue
        for kind in (int, float, str):
            try:
                out[key] = kind(raw)
                break
            except ValueError:
                continue
    return out


def join_settings(settings: Dict[str, object]) -> str:
    return ";".join(f"{k}={v}" for k, v in settings.items())


# --------------------------------------------------------------------------- gnomon's schema

def _parse(raw: dict, where: str) -> MeasuredPoint:
    unknown = set(raw) - set(FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; the schema's fields are "
                         f"{', '.join(FIELDS)}")
    values = {}
    for name, (_, default) in FIELDS.items():
        text = raw.get(name)
        text = default if text is None or text == "" else text
        if text is None:
            raise ValueError(f"{where}: lacks the field {name!r} ({FIELDS[name][0]})")
        values[name] = text
    try:
        def number(name, kind):
            v = values[name]
            return None if v == "" else kind(v)

        return MeasuredPoint(
            id=str(values["id"]), source=str(values["source"]), model=str(values["model"]),
            hardware=str(values["hardware"]), engine=str(values["engine"]),
            engine_version=str(values["engine_version"]), tp=number("tp", int),
            ep=number("ep", int), dp=number("dp", int),
            weight_dtype=str(values["weight_dtype"]), kv_dtype=str(values["kv_dtype"]),
            workload=str(values["workload"]), input_len=str(values["input_len"]),
            output_len=str(values["output_len"]), concurrency=number("concurrency", int),
            rate=float(values["rate"]), num_requests=number("num_requests", int),
            ttft_ms=number("ttft_ms", float), tpot_ms=number("tpot_ms", float),
            output_tokens_per_s=number("output_tokens_per_s", float),
            total_tokens_per_s=number("total_tokens_per_s", float),
            split=str(values["split"]), engine_settings=str(values["engine_settings"]))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


def load_points(path) -> List[MeasuredPoint]:
    """The points of a CSV (with a header) or JSON-lines file in gnomon's schema (`FIELDS`)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"points: no file {path!r}")
    points: List[MeasuredPoint] = []
    with open(path, encoding="utf-8", newline="") as f:
        if path.endswith(".csv"):
            rows: Iterable[Tuple[int, dict]] = enumerate(csv.DictReader(f), start=2)
        elif path.endswith((".jsonl", ".json")):
            rows = []
            for i, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as error:
                        raise ValueError(f"{path}:{i}: not valid JSON ({error})") from None
                    if not isinstance(obj, dict):
                        raise ValueError(f"{path}:{i}: expected a JSON object per line")
                    rows.append((i, {k: ("" if v is None else v) for k, v in obj.items()}))
        else:
            raise ValueError(f"points: {path}: expected a .csv or .jsonl file")
        for line, raw in rows:
            points.append(_parse(raw, f"{path}:{line}"))
    _check_unique(points, path)
    return points


def _check_unique(points: List[MeasuredPoint], where: str) -> None:
    seen = set()
    for p in points:
        if p.id in seen:
            raise ValueError(f"{where}: the id {p.id!r} appears twice")
        seen.add(p.id)


# --------------------------------------------------------------------------- silicon_sample.csv

@functools.lru_cache(maxsize=1)
def silicon_table() -> dict:
    with open(DATA_FILE, encoding="utf-8") as f:
        return json.load(f)


def silicon_csv() -> str:
    """aiconfigurator-core's ``systems/silicon_sample.csv`` where that package is installed."""
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("points: silicon needs aiconfigurator-core (pip install "
                         "'gnomon[accuracy]'), or pass a silicon_sample.csv file")
    path = os.path.join(list(spec.submodule_search_locations)[0], "systems",
                        "silicon_sample.csv")
    if not os.path.exists(path):
        raise ValueError(f"points: aiconfigurator-core has no {path}")
    return path


def _int(row: dict, name: str, blank: int = 1) -> int:
    text = (row.get(name) or "").strip()
    return blank if text == "" else int(float(text))


def _source(row: dict) -> str:
    """The row's source: its first field (``source_file=...`` or ``db-dump/...``), a file's
    basename only."""
    head = (row.get("silicon_data_source") or "").split(";")[0].strip()
    key, _, value = head.partition("=")
    return f"{key}={os.path.basename(value)}" if value else head


def _recorded_concurrency(row: dict) -> Optional[int]:
    """The ``silicon_concurrency=N`` a row's silicon_data_source records, if it does."""
    for part in (row.get("silicon_data_source") or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == "silicon_concurrency":
            return int(value)
    return None


def from_silicon(row: dict) -> MeasuredPoint:
    """A silicon_sample.csv row as a point (module docstring), or `PointRefused` naming the
    field the table lacks."""
    table = silicon_table()
    rid = row.get("id") or "?"
    if (row.get("mode") or "agg") != "agg":  # first: nothing else would make it run
        raise PointRefused(f"mode {row.get('mode')!r}: disaggregated serving is not simulated")
    model = table["models"].get(row.get("model_path", ""))
    if model is None:
        raise PointRefused(f"model_path {row.get('model_path')!r}: no gnomon model for it")
    if "unpriced" in model:
        raise PointRefused(f"model_path {row.get('model_path')!r}: "
                           f"{models.UNPRICED[model['unpriced']]}")
    label = row.get("gemm_quant_mode") or ""
    moe_label = row.get("moe_quant_mode") or ""
    key = label if moe_label in ("", label) else f"{label}/{moe_label}"  # GEMM/MoE labels
    quant = model["quant"].get(key)
    if quant is None:
        raise PointRefused(f"quant label {key!r} (gemm_quant_mode, or gemm/moe_quant_mode where "
                           f"they differ) of {row.get('model_path')}: not mapped (mapped: "
                           f"{', '.join(repr(k) for k in model['quant'])})")
    system = table["systems"].get(row.get("system", ""))
    if system is None:
        raise PointRefused(f"system {row.get('system')!r}: no gnomon hardware for it")
    engine = table["backends"].get(row.get("backend", ""))
    if engine is None:
        raise PointRefused(f"backend {row.get('backend')!r}: no gnomon engine profile for it")
    if _int(row, "pp_size") > 1:
        raise PointRefused(f"pp_size {row.get('pp_size')}: pipeline parallelism is not priced")
    tp = _int(row, "tp_size")
    ep = _int(row, "moe_ep_size")
    dp = _int(row, "attention_dp_size")
    moe_tp = _int(row, "moe_tp_size", blank=tp)
    if ep == 1 and dp == 1 and moe_tp not in (1, tp):
        raise PointRefused(f"moe_tp_size {moe_tp} with tp_size {tp} and no ep: inconsistent",
                           inconsistent=True)
    if (ep > 1 or dp > 1) and moe_tp * ep != tp * dp:
        raise PointRefused(f"moe_tp_size {moe_tp} x moe_ep_size {ep} is not tp_size {tp} x "
                           f"attention_dp_size {dp}: the experts must split over the GPUs the "
                           f"attention runs on", inconsistent=True)
    board = gpu(system["hardware"]).scale_up_gpus.value
    if tp * dp > board:
        raise PointRefused(f"tp_size {tp} x attention_dp_size {dp}: {tp * dp} GPUs, more than "
                           f"one {board:g}-GPU {row.get('system')} board; such rows name "
                           f"a layout of one board in their ids (tp8_ep8 where tp_size is "
                           f"64), so their fields are inconsistent", inconsistent=True)
    work = table["workload"]
    # batch_size is one attention-DP rank's: the server's concurrency is dp of them
    # (aiconfigurator's own reading, "global_bs = bs * attention_dp_size"). Where the source
    # records the concurrency its client ran (silicon_concurrency), the two must agree: a row
    # whose batch_size is some other share of it has a layout its fields do not state.
    isl, osl, conc = _int(row, "isl"), _int(row, "osl"), _int(row, "batch_size") * dp

    def length(x: int) -> str:
        return f"{max(int(x * work['range_ratio']), 1)}:{x}"

    def measured(name: str) -> Optional[float]:
        text = (row.get(name) or "").strip()
        return float(text) if text else None

    source = _source(row)
    settings: Dict[str, object] = {}
    kv_dtype = quant["kv_dtype"]
    for rule in table["launches"]["rules"]:
        if (source in rule["sources"] and row.get("backend") in rule["backends"]
                and row.get("model_path") in rule["models"]
                and row.get("system") in rule.get("systems", (row.get("system"),))
                and all(_int(row, k) == rule[k] for k in ("isl", "osl") if k in rule)
                and tp < rule.get("tp_below", math.inf) and dp > rule.get("dp_above", 0)
                and rule.get("concurrency_above", 0) < conc < rule.get("concurrency_below",
                                                                       math.inf)
                and row.get("gemm_quant_mode") in rule.get("quant_modes",
                                                           (row.get("gemm_quant_mode"),))
                and row.get("backend_version") in rule.get("versions",
                                                           (row.get("backend_version"),))):
            if "refuse" in rule:  # the launch ran something gnomon does not simulate
                raise PointRefused(rule["refuse"], rule.get("inconsistent", False))
            settings.update(rule.get("settings", {}))
            kv_dtype = rule.get("kv_dtype", kv_dtype)
            budget = rule.get("launch_budget")
            if budget:  # the launch sizes its batch from the row (silicon.json's note)
                seqs, step = _int(row, "batch_size"), budget["multiple_of"]
                tokens = budget["tokens_per_seq"] * seqs + isl + budget["extra_tokens"]
                settings.update(max_num_seqs=seqs,
                                max_num_batched_tokens=-(-tokens // step) * step)
    point = MeasuredPoint(
        id=rid, source=source, model=model["model"], hardware=system["hardware"],
        engine=engine, engine_version=row.get("backend_version") or "", tp=tp, ep=ep, dp=dp,
        weight_dtype=quant["weight_dtype"], kv_dtype=kv_dtype, workload="random",
        input_len=length(isl), output_len=length(osl), concurrency=conc, rate=math.inf,
        num_requests=work["requests_per_concurrency"] * conc,
        ttft_ms=measured("silicon_ttft_ms"), tpot_ms=measured("silicon_tpot_ms"),
        split=system["split"], engine_settings=join_settings(settings))
    ran = _recorded_concurrency(row)
    if ran is not None and ran != conc:
        raise PointRefused(f"batch_size {_int(row, 'batch_size')} x attention_dp_size {dp} = "
                           f"{conc} is not the silicon_concurrency {ran} its source records: "
                           f"the row's parallel layout fields are inconsistent",
                           inconsistent=True)
    return point


def load_silicon(path: Optional[str] = None) -> Tuple[List[MeasuredPoint], List[dict]]:
    """``(points, refusals)`` of a silicon_sample.csv (default: the installed package's). A
    refusal is ``{"id", "row", "reason", "inconsistent"}``: kept, never dropped; a malformed
    row's fields count as inconsistent."""
    path = path or silicon_csv()
    points, refused = [], []
    table = silicon_table()
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            try:
                points.append(from_silicon(row))
            except PointRefused as refusal:
                refused.append({"id": row.get("id") or "?", "reason": refusal.reason,
                                "row": {k: row.get(k) for k in ("model_path", "system",
                                                                 "backend", "mode")},
                                "labels": _labels(row, table),
                                "inconsistent": refusal.inconsistent})
            except ValueError as error:
                refused.append({"id": row.get("id") or "?", "reason": f"malformed row: {error}",
                                "row": {}, "labels": _labels(row, table),
                                "inconsistent": True})
    _check_unique(points, path)
    return points, refused


def _labels(row: dict, table: dict) -> Dict[str, Optional[str]]:
    """What the table makes of a refused row's model, hardware, engine and split (None where
    it names none), so that the accuracy command's filters reach its refusals too."""
    system = table["systems"].get(row.get("system") or "", {})
    return {"model": table["models"].get(row.get("model_path") or "", {}).get("model"),
            "hardware": system.get("hardware"), "split": system.get("split"),
            "engine": table["backends"].get(row.get("backend") or "")}


def resolve_points(spec: str) -> Tuple[List[MeasuredPoint], List[dict], str]:
    """``(points, refusals, source)`` of ``--points``: ``silicon`` (the installed
    aiconfigurator-core's silicon_sample.csv), ``published`` (`PUBLISHED_FILE`), a
    silicon_sample.csv by its columns, or a file in gnomon's schema."""
    if spec == "published":
        return load_points(PUBLISHED_FILE), [], "published points"
    if spec == "silicon" or (spec.endswith(".csv") and os.path.exists(spec)
                             and is_silicon(spec)):
        path = silicon_csv() if spec == "silicon" else spec
        points, refused = load_silicon(path)
        return points, refused, f"aiconfigurator-core silicon_sample.csv ({path})"
    return load_points(spec), [], spec


def is_silicon(path: str) -> bool:
    """Whether a CSV file is in silicon_sample.csv's columns (rather than gnomon's schema)."""
    with open(path, encoding="utf-8", newline="") as f:
        header = next(csv.reader(f), [])
    return "silicon_ttft_ms" in header


def field_names() -> List[str]:
    return [f.name for f in fields(MeasuredPoint)]
