"""Kernel efficiency as measured curves, per GPU generation, read from ``data/efficiency.json``.

Each curve maps what a kernel's efficiency depends on to a factor, with the source of its
points (a public kernel measurement) or, where no public figure exists, a stated default that
says so. Between points a curve is linear in log2(x); beyond its ends it holds the end value.

The roofline multiplies them (`gnomon.predict.roofline`):

- ``gemm``: a dense GEMM's compute rate against its best-shape rate, by M (the rows), and
  ``gemm_k`` by K (the reduction depth; short ones pay their prologue and epilogue);
- ``grouped_gemm``: a grouped MoE GEMM's against the dense GEMM's of the same N and K, by
  tokens per expert;
- ``gemm_memory``: a GEMM's achieved fraction of the HBM peak by the bytes the kernel moves
  (small matrices do not saturate it); ``gemm_memory_fp4``: the same for dense GEMMs of FP4
  weights (NVFP4, MXFP4: a scale per 16 or 32 codes to read and apply);
  ``grouped_gemm_memory``: the MoE's, by tokens per expert;
- ``w4a16`` / ``w8a16``: a weight-only kernel (4- or 8-bit weights, bf16 math; MXFP4 or FP8 on
  a chip without that math) against the bf16 GEMM at the same M;
- ``attention_prefill_d64`` / ``_d128``: attention's compute rate as a fraction of the bf16
  peak, by keys per query, for head dims up to 96 and above; ``attention_decode``: its KV read
  rate as a fraction of the HBM peak, by keys per query.

A generation without curves of its own (Ampere, Ada, CDNA2) borrows the nearest one's (the
factors apply to its own peaks), and `CurveSet.note` says so.

`AllReduceTable`: an engine's all-reduce kernel on one GPU as measured, the seconds of one
all-reduce by its payload per GPU count (``allreduce`` in the data file, per GPU and engine; a
GPU may take another's, ``{"as": name}``, with the reason). The roofline prices a
tensor-parallel all-reduce with it where the engine and the GPU count have one.

`FittedKernel`: an engine's kernel on one GPU as measured, fitted as a fixed time plus the
bytes it streams at a fraction of the HBM peak (plus, for the fused MoE, its FLOPs at a
fraction of the dense peak of the math it runs in, `MOE_PEAK`), per math: the fused MoE layer
by the math its experts run in (``moe`` in the data file) and decode attention by the KV
cache's dtype (``decode_attention``), per GPU and engine, ``as`` as for the all-reduce. The
roofline prices the MoE's grouped GEMMs and paged attention with them where the engine has
one for that math, and otherwise with the generation's curves.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from gnomon.hardware import Hardware

CURVES = ("gemm", "gemm_k", "gemm_memory", "gemm_memory_fp4", "grouped_gemm",
          "grouped_gemm_memory", "w4a16", "w8a16", "attention_prefill_d64",
          "attention_prefill_d128", "attention_decode")
DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "efficiency.json")
# a fused MoE's math -> the dense peak its fitted ``compute`` is a fraction of (weight-only W4A16
# runs bf16 math, INT4 weights ("w4a16") or FP4 ones ("w4a16_fp4", MXFP4 or NVFP4 experts on a
# chip without FP4 math); W4A8, FP4 weights with FP8 activations, the FP8 peak)
MOE_PEAK = {"bfloat16": "bfloat16", "fp8": "fp8", "fp4": "fp4", "w4a16": "bfloat16",
            "w4a16_fp4": "bfloat16", "w4a8": "fp8", "w8a16": "bfloat16"}


@dataclass(frozen=True)
class Curve:
    """Points ``(x, factor)`` sorted by x, and where they come from."""

    name: str
    xs: Tuple[float, ...]
    ys: Tuple[float, ...]
    source: str
    default: bool  # True: no public figure; a stated default

    @classmethod
    def from_entry(cls, name: str, entry: dict, where: str) -> "Curve":
        points = entry.get("points")
        if not isinstance(points, list) or not points:
            raise ValueError(f"{where}: {name}.points: expected a list of [x, factor] pairs")
        pairs = sorted((float(x), float(y)) for x, y in points)
        for x, y in pairs:
            if not (x > 0 and 0 < y <= 1):
                raise ValueError(f"{where}: {name}: expected x > 0 and a factor in (0, 1], "
                                 f"got [{x:g}, {y:g}]")
        source = entry.get("source")
        if not isinstance(source, str) or not source:
            raise ValueError(f"{where}: {name}.source: every curve names its source")
        return cls(name, tuple(math.log2(x) for x, _ in pairs), tuple(y for _, y in pairs),
                   source, bool(entry.get("default", False)))

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= 0:
            return ys[0]
        lx = math.log2(x)
        i = bisect.bisect_right(xs, lx)
        if i == 0:
            return ys[0]
        if i == len(xs):
            return ys[-1]
        t = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + t * (ys[i] - ys[i - 1])


@dataclass(frozen=True)
class CurveSet:
    """A generation's curves; `note` says when they were borrowed from another generation."""

    generation: str
    curves: Dict[str, Curve]
    note: Optional[str] = None

    def __getitem__(self, name: str) -> Curve:
        return self.curves[name]

    def sources(self) -> Dict[str, str]:
        return {n: ("stated default: " if c.default else "") + c.source
                for n, c in self.curves.items()}


@dataclass(frozen=True)
class AllReduceTable:
    """Seconds of one all-reduce by its payload bytes, per GPU count (`allreduce_table`).
    Between points linear in log-log; below the first its time (the kernel's floor); beyond the
    last at the last point's bytes per second."""

    engine: str
    gpus: Dict[int, Tuple[Tuple[float, float], ...]]  # ranks -> ((log2 bytes, log2 s), ...)
    source: str

    def seconds(self, ranks: int, payload: float) -> Optional[float]:
        """One all-reduce of `payload` bytes over `ranks` GPUs; None where none was measured."""
        points = self.gpus.get(ranks)
        if points is None:
            return None
        lx = math.log2(max(payload, 1.0))
        i = bisect.bisect_right(points, (lx, math.inf))
        if i == 0:
            return 2.0 ** points[0][1]
        if i == len(points):
            x, y = points[-1]
            return 2.0 ** (y + lx - x)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        return 2.0 ** (y0 + (lx - x0) / (x1 - x0) * (y1 - y0))


FITTED_KINDS = ("moe", "decode_attention")


@dataclass(frozen=True)
class FittedKernel:
    """An engine's kernel of one kind on one GPU (`fitted_kernel`): per math, ``(floor_s,
    memory, compute)``: one layer's call takes ``floor_s`` plus the bytes it streams at
    ``memory`` x the HBM peak plus its FLOPs at ``compute`` x the dense peak of `MOE_PEAK`'s
    math (0: no FLOP term). ``moe``: the fused MoE layer by its experts' math (``"bfloat16"``,
    ``"fp8"``, ``"fp4"``, ``"w4a16"`` for INT4 weights, ``"w4a16_fp4"`` for FP4 weights run
    weight-only, ``"w4a8"``) at every token count, the floor its kernels'
    fixed time (the top-k routing is not in it); ``decode_attention``: paged
    attention by the KV cache's dtype, the bytes its KV reads. `includes`: the ops of gnomon's
    count that the measured call performs too (the KV cache write, RoPE), so priced with it."""

    kind: str
    engine: str
    maths: Dict[str, Tuple[float, float, float]]
    source: str
    includes: Tuple[str, ...] = ()


@functools.lru_cache(maxsize=1)
def _data() -> dict:
    with open(DATA_FILE, encoding="utf-8") as f:
        return json.load(f)


def best_gemm(hw: Hardware) -> Dict[str, Tuple[float, str]]:
    """``{compute dtype: (best-shape fraction of peak, source)}`` for a catalogued GPU; empty
    for one without a published figure."""
    return {k: (float(v), s) for k, (v, s) in _data()["best_gemm"].get(hw.name, {}).items()}


def allreduce_table(hw: Hardware, engine: Optional[str]) -> Optional[AllReduceTable]:
    """`engine`'s measured all-reduce on `hw` (through its ``as``), or None where there is none
    (an engine or GPU without a table, no engine)."""
    return _allreduce_table(hw.name, engine)


def _engine_entry(section: str, gpu: str, engine: Optional[str], parse):
    """``parse(raw entry, alias note)`` of `engine` on `gpu` in the data file's `section`
    (through the GPU's ``as``), or None where there is none; a malformed entry's error names
    where it is."""
    tables = _data().get(section, {})
    entry, alias = tables.get(gpu), ""
    if isinstance(entry, dict) and "as" in entry:
        alias = f"{entry.get('source', 'as ' + str(entry['as']))}: "
        entry = tables.get(entry["as"])
    if engine is None or not isinstance(entry, dict) or engine not in entry:
        return None
    try:
        return parse(entry[engine], alias)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{DATA_FILE} {section}.{gpu}.{engine}: {error}") from None


@functools.lru_cache(maxsize=None)
def _allreduce_table(gpu: str, engine: Optional[str]) -> Optional[AllReduceTable]:
    def parse(raw, alias):
        gpus = {}
        for ranks, points in raw["gpus"].items():
            pairs = sorted((float(b), float(s)) for b, s in points)
            if int(ranks) < 2 or not pairs or any(b <= 0 or s <= 0 for b, s in pairs):
                raise ValueError(f"gpus.{ranks}: expected a count >= 2 and [bytes > 0, "
                                 f"seconds > 0] pairs")
            gpus[int(ranks)] = tuple((math.log2(b), math.log2(s)) for b, s in pairs)
        return AllReduceTable(engine, gpus, alias + str(raw["source"]))
    return _engine_entry("allreduce", gpu, engine, parse)


def fitted_kernel(kind: str, hw: Hardware, engine: Optional[str]) -> Optional[FittedKernel]:
    """`engine`'s measured `kind` kernel (one of `FITTED_KINDS`) on `hw` (through its ``as``),
    or None where there is none (an engine or GPU without one, no engine)."""
    if kind not in FITTED_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(FITTED_KINDS)}, got {kind!r}")
    return _fitted_kernel(kind, hw.name, engine)


@functools.lru_cache(maxsize=None)
def _fitted_kernel(kind: str, gpu: str, engine: Optional[str]) -> Optional[FittedKernel]:
    def parse(raw, alias):
        maths = {}
        for name, fit in raw["maths"].items():
            floor, memory = float(fit["floor_s"]), float(fit["memory"])
            compute = float(fit.get("compute", 0.0))
            if floor < 0 or not 0 < memory <= 1 or not 0 <= compute <= 1 \
                    or (compute and name not in MOE_PEAK):
                raise ValueError(f"maths.{name}: expected floor_s >= 0, memory in (0, 1] and "
                                 f"compute in [0, 1] (0 but for a math of "
                                 f"{', '.join(MOE_PEAK)}), got {floor}, {memory} and {compute}")
            maths[name] = (floor, memory, compute)
        return FittedKernel(kind, engine, maths, alias + str(raw["source"]),
                            tuple(str(name) for name in raw.get("includes", ())))
    return _engine_entry(kind, gpu, engine, parse)


def defaults() -> dict:
    """The stated defaults (memory efficiency, launch cost, ...) with their sources."""
    return dict(_data()["defaults"])


@functools.lru_cache(maxsize=None)
def _generation(name: str) -> Dict[str, Curve]:
    entry = _data()["generations"][name]
    where = f"{DATA_FILE} generations.{name}"
    missing = [c for c in CURVES if c not in entry]
    if missing:
        raise ValueError(f"{where}: lacks the curves {', '.join(missing)}")
    return {c: Curve.from_entry(c, entry[c], where) for c in CURVES}


def curves_for(hw: Hardware) -> Optional[CurveSet]:
    """The curves for `hw`'s generation (borrowed from the nearest where it has none); None for
    hardware of no generation (``host``, a file without one from another vendor)."""
    data = _data()
    generation = hw.generation
    note = None
    if generation is None:
        generation = data["vendor_default"].get(hw.vendor)
        if generation is None:
            return None
        note = (f"{hw.name} names no generation: the {generation} curves of its vendor "
                f"{hw.vendor} apply")
    if generation not in data["generations"]:
        nearest = data["nearest"][generation]
        note = (f"{hw.name} ({generation}) has no measured curves of its own: the nearest "
                f"generation's ({nearest}) apply to its own peaks")
        generation = nearest
    return CurveSet(generation, _generation(generation), note)
