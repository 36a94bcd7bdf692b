"""`SimulationSpec`: one simulation, whole, as one frozen value that round-trips through JSON.

A spec names:

- the model (a preset or a model folder) and the dtypes that override its config's
  (``weight_dtype``, ``kv_dtype``);
- the hardware and the predictor;
- the workload (`WorkloadSpec`: a preset or ``trace:PATH``, the requests, the arrival rate, the
  cap on requests in flight, and lengths that replace a preset's);
- the engine: its profile (``engine``: ``vllm``, ``trtllm``, ... or a .json file) and
  ``engine_settings``, the `EngineConfig` fields set over that profile's defaults on the
  hardware (tensor, expert and data parallelism among them). The profile's defaults depend on
  the hardware, which a sweep varies, so the spec holds what was set and the report records
  the whole `EngineConfig` it resolved to;
- the SLO and the seed.

`gnomon simulate`'s flags build one, ``simulate(spec)`` runs it, a sweep is a base spec and
axes (`with_flags` for each point), the accuracy command builds one per measured row, and every
report embeds its spec (`to_json`), so ``gnomon simulate --spec report.json`` runs it again.

**Flag names.** `of` and `with_flags` take the names of ``gnomon simulate``'s flags (a sweep's
axes and the keys of a sweep spec file are the same): ``tp``, ``ep``, ``dp``,
``max_num_seqs``, ``max_num_batched_tokens`` and ``enable_hybrid_kv`` set engine settings (None
leaves the profile's); ``workload``, ``num_requests``, ``rate``, ``concurrency``, ``input_len``
and ``output_len`` set the workload; ``engine_settings`` adds to the spec's; the rest are the
spec's own fields. Text is parsed as a command line gives it (``"inf"``, ``"819:1024"``). A new
workload name starts a new workload: the workload names given with it are all it keeps.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping, Optional, Union

from gnomon import documents
from gnomon.engine.engine_config import check_fields

from .defaults import (DEFAULT_ENGINE, DEFAULT_HARDWARE, DEFAULT_MODEL, DEFAULT_NUM_REQUESTS,
                       DEFAULT_RATE, DEFAULT_WORKLOAD)
from .metrics import SLO
from .workloads import LengthDist, parse_length, parse_rate

KIND = "gnomon.predict.spec"
SCHEMA_VERSION = 1
ACCEPTED_VERSIONS = (1,)

# flag name -> the engine setting it sets
ENGINE_FLAGS = {"tp": "tensor_parallel_size", "ep": "expert_parallel_size",
                "dp": "data_parallel_size", "max_num_seqs": "max_num_seqs",
                "max_num_batched_tokens": "max_num_batched_tokens",
                "enable_hybrid_kv": "enable_hybrid_kv"}
# flag name -> the workload field it sets
WORKLOAD_FLAGS = {"workload": "name", "num_requests": "num_requests", "rate": "rate",
                  "concurrency": "concurrency", "input_len": "input_len",
                  "output_len": "output_len"}


def _text_int(value):
    """`value`, or the int its decimal text spells (as a command line gives it)."""
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


def _count(name: str, value) -> Optional[int]:
    """A positive int, None, or its decimal text."""
    value = _text_int(value)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValueError(f"{name}: expected a positive integer or none, got {value!r}")
    return value


def _length(name: str, value) -> Optional[LengthDist]:
    if value is None or isinstance(value, LengthDist):
        return value
    if isinstance(value, Mapping):
        try:
            return LengthDist(**value)
        except TypeError as error:
            raise ValueError(f"{name}: {error}") from None
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return parse_length(str(value), name)
    raise ValueError(f"{name}: expected N, LOW:HIGH or a LengthDist, got {value!r}")


def _length_json(dist: Optional[LengthDist]) -> Optional[dict]:
    return None if dist is None else {k: v for k, v in asdict(dist).items() if v is not None}


@dataclass(frozen=True)
class WorkloadSpec:
    """What requests a simulation serves (module docstring). A preset takes `num_requests`
    and `rate` (requests/s, inf: all at once), each its default where None; a trace carries
    its own arrivals and lengths, and `num_requests` keeps its first that many rows (None:
    all). `concurrency` caps the requests in flight (a closed loop at rate inf)."""

    name: str = DEFAULT_WORKLOAD
    num_requests: Optional[int] = None
    rate: Optional[float] = None
    concurrency: Optional[int] = None
    input_len: Optional[LengthDist] = None
    output_len: Optional[LengthDist] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"workload: expected a preset name or 'trace:PATH', got "
                             f"{self.name!r}")
        trace = self.name.startswith("trace:")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("num_requests", _count("num_requests", self.num_requests))
        set_("concurrency", _count("concurrency", self.concurrency))
        set_("input_len", _length("input_len", self.input_len))
        set_("output_len", _length("output_len", self.output_len))
        rate = self.rate
        if isinstance(rate, str) or (rate is not None and not isinstance(rate, bool)
                                     and isinstance(rate, (int, float))):
            rate = parse_rate(str(rate), "rate")
        elif rate is not None:
            raise ValueError(f"rate: expected requests/s > 0, inf or none, got {rate!r}")
        if not trace:
            rate = DEFAULT_RATE if rate is None else rate
            if self.num_requests is None:
                set_("num_requests", DEFAULT_NUM_REQUESTS)
        set_("rate", rate)

    def to_json(self) -> dict:
        rate = "inf" if self.rate is not None and math.isinf(self.rate) else self.rate
        return {"name": self.name, "num_requests": self.num_requests, "rate": rate,
                "concurrency": self.concurrency, "input_len": _length_json(self.input_len),
                "output_len": _length_json(self.output_len)}


@dataclass(frozen=True)
class SimulationSpec:
    """One simulation (module docstring). Build it with its fields, or with `of` from
    ``gnomon simulate``'s flag names."""

    model: str = DEFAULT_MODEL
    hardware: str = DEFAULT_HARDWARE
    predictor: str = "roofline"
    workload: WorkloadSpec = WorkloadSpec()
    engine: str = DEFAULT_ENGINE
    engine_settings: Mapping[str, Any] = field(default_factory=dict)
    weight_dtype: str = "auto"
    kv_dtype: str = "auto"
    slo: SLO = SLO()
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("model", "engine"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
        for name in ("model", "hardware", "predictor", "engine", "weight_dtype", "kv_dtype"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name}: expected a non-empty string, got {value!r}")
        if not isinstance(self.workload, WorkloadSpec):
            raise ValueError(f"workload: expected a WorkloadSpec, got "
                             f"{type(self.workload).__name__}")
        check_fields(self.engine_settings, "engine_settings")
        object.__setattr__(self, "engine_settings", dict(self.engine_settings))
        if isinstance(self.slo, Mapping):
            object.__setattr__(self, "slo", SLO(**self.slo))
        if not isinstance(self.slo, SLO):
            raise ValueError(f"slo: expected an SLO or {{ttft_s, tpot_s}}, got {self.slo!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed: expected an integer >= 0, got {self.seed!r}")

    # ------------------------------------------------------------------ flag names
    @classmethod
    def of(cls, **flags) -> "SimulationSpec":
        """The default spec with `flags` (module docstring: flag names) over it."""
        return cls().with_flags(**flags)

    def with_flags(self, **flags) -> "SimulationSpec":
        """This spec with `flags` (module docstring: flag names) over it."""
        own = {f.name for f in fields(self)} - {"workload"}
        known = own | set(ENGINE_FLAGS) | set(WORKLOAD_FLAGS)
        unknown = sorted(set(flags) - known)
        if unknown:
            raise ValueError(f"unknown {', '.join(unknown)}; expected {', '.join(sorted(known))}")
        settings = dict(self.engine_settings)
        settings.update(flags.get("engine_settings") or {})
        for flag, name in ENGINE_FLAGS.items():
            if flag in flags:
                value = _text_int(flags[flag])
                if value is None:
                    settings.pop(name, None)
                else:
                    settings[name] = value
        workload = {WORKLOAD_FLAGS[f]: flags[f] for f in WORKLOAD_FLAGS if f in flags}
        if workload.get("name", self.workload.name) != self.workload.name:
            work = WorkloadSpec(**workload)
        else:
            work = replace(self.workload, **workload) if workload else self.workload
        top = {k: v for k, v in flags.items() if k in own and k != "engine_settings"}
        return replace(self, workload=work, engine_settings=settings, **top)

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        """The spec as a document (`gnomon.documents`)."""
        return {"schema_version": SCHEMA_VERSION, "kind": KIND, "model": self.model,
                "hardware": self.hardware, "predictor": self.predictor,
                "workload": self.workload.to_json(), "engine": self.engine,
                "engine_settings": dict(self.engine_settings),
                "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype,
                "slo": asdict(self.slo), "seed": self.seed}

    @classmethod
    def from_json(cls, doc: Any, source: str = "spec") -> "SimulationSpec":
        """The spec of a document `to_json` wrote; DocumentError names what is wrong."""
        documents.check_header(doc, KIND, ACCEPTED_VERSIONS, source)
        documents.check_fields(doc, {"model": str, "hardware": str, "predictor": str,
                                     "workload": dict, "engine": str, "engine_settings": dict,
                                     "weight_dtype": str, "kv_dtype": str, "slo": dict,
                                     "seed": int}, "the spec", source)
        work = doc["workload"]
        documents.check_fields(work, {"name": str}, "workload", source)
        known = {f.name for f in fields(WorkloadSpec)}
        try:
            if set(work) - known:
                raise ValueError(f"unknown {sorted(set(work) - known)}")
            return cls(model=doc["model"], hardware=doc["hardware"],
                       predictor=doc["predictor"], workload=WorkloadSpec(**work),
                       engine=doc["engine"], engine_settings=doc["engine_settings"],
                       weight_dtype=doc["weight_dtype"], kv_dtype=doc["kv_dtype"],
                       slo=doc["slo"], seed=doc["seed"])
        except (TypeError, ValueError) as error:
            raise documents.DocumentError(f"{source}: {error}") from None

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "SimulationSpec":
        """The spec in a spec file, or the one a simulation report embeds."""
        from . import report

        source = os.fspath(path)
        doc = documents.load_any(path, {KIND: ACCEPTED_VERSIONS,
                                        report.KIND: report.ACCEPTED_VERSIONS})
        if doc["kind"] == report.KIND:
            if "spec" not in doc:
                raise documents.DocumentError(f"{source}: this report embeds no spec (it was "
                                              f"not made by gnomon simulate from one)")
            doc = doc["spec"]
        return cls.from_json(doc, f"{source}: spec")
