"""The results file that `gnomon bench` writes and `gnomon dash ingest` reads.

A results file is JSON::

    {
      "schema_version": 1,
      "kind": "gnomon.bench.results",
      "commit": "<40-hex git sha>",
      "created_with": {"version": "0.1.0", "build": {...gnomon._C.build_info()}},
      "machine": {"fingerprint": "<16 hex>", "device": "cpu" | "cuda" | "hip",
                  "cpu_model": str, "cores": int, "ram_gb": int,
                  "gpu_name": str | null, "driver": str | null, "runtime": str | null},
      "peaks": PEAKS,
      "mode": "hot" | "cold",
      "runs": [{"index": int, "cases": [CASE, ...]}, ...]
    }

    CASE = {"key": "<suite>/<name>[<params>]", "suite": str, "op": str,
            "params": {str: int | float | str}, "dtypes": {str: str},
            "definition_hash": "<16 hex>",
            "samples_ns": [int, ...],
            "stats": {"count": int, "min": float, "q1": float, "median": float, "q3": float,
                      "max": float},          # nanoseconds
            "flops": int, "bytes": int, "tflops": float, "gbps": float,
            "fraction_of_peak": {"compute": float | null, "memory": float | null}}

    PEAKS = {"memory_gbps": float | null, "tflops": {"<dtype>": float}, "source": str,
             # the rates fractions of peak are taken against; a CPU run adds (optional, so
             # files written before them still load):
             "measured_tflops": {"<dtype>": float},   # the best measured, trusted or not
             "nominal": {"tflops": {"<dtype>": float}, "simd": str, "ghz": float,
                         "cores": int, "flops_per_cycle": {"<dtype>": int}, "source": str},
             "floor_fraction": float,     # measured below this x nominal: not a peak
             "implausible": {"<dtype>": str},    # measured, left out of tflops, and why
             "stand_ins": {"<dtype>": "<dtype>"},  # bf16's peak is fp32's (no bf16 math)
             "measurements": [PEAKS, ...]}         # before and after the sweep

    A fraction of peak above 1 is possible (a peak measured too low); readers flag it.

Renaming or removing a field is a major version bump; readers say which versions they accept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gnomon import documents
from gnomon.documents import DocumentError

SCHEMA_VERSION = 1
ACCEPTED_VERSIONS = (1,)
KIND = "gnomon.bench.results"

_TOP = {"schema_version": int, "kind": str, "commit": str, "created_with": dict, "machine": dict,
        "peaks": dict, "mode": str, "runs": list}
_MACHINE = {"fingerprint": str, "device": str, "cpu_model": str, "cores": int, "ram_gb": int}
_CASE = {"key": str, "suite": str, "op": str, "params": dict, "dtypes": dict,
         "definition_hash": str, "samples_ns": list, "stats": dict, "flops": int, "bytes": int,
         "tflops": (int, float), "gbps": (int, float), "fraction_of_peak": dict}
_STATS = {k: (int, float) for k in ("count", "min", "q1", "median", "q3", "max")}


def _check_rates(obj: Any, where: str, source: str) -> None:
    if not isinstance(obj, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            and v >= 0 for k, v in obj.items()):
        raise DocumentError(f"{source}: {where}: expected an object of dtype -> non-negative "
                            "number")


def _check_peaks(peaks: dict, where: str, source: str) -> None:
    """The peaks object: the fields every version has, and the optional ones when present."""
    documents.check_fields(peaks, {"memory_gbps": (int, float, type(None)), "tflops": dict,
                                   "source": str}, where, source)
    _check_rates(peaks["tflops"], f"{where}.tflops", source)
    if "measured_tflops" in peaks:
        _check_rates(peaks["measured_tflops"], f"{where}.measured_tflops", source)
    if "nominal" in peaks:
        documents.check_fields(peaks["nominal"], {"tflops": dict, "simd": str,
                                                  "ghz": (int, float), "source": str},
                               f"{where}.nominal", source)
        _check_rates(peaks["nominal"]["tflops"], f"{where}.nominal.tflops", source)
    for name in ("implausible", "stand_ins"):
        if name in peaks and not (isinstance(peaks[name], dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in peaks[name].items())):
            raise DocumentError(f"{source}: {where}.{name}: expected an object of dtype -> "
                                "string")
    if "floor_fraction" in peaks and (isinstance(peaks["floor_fraction"], bool) or
                                      not isinstance(peaks["floor_fraction"], (int, float))):
        raise DocumentError(f"{source}: {where}.floor_fraction: expected a number")
    if "vector_units" in peaks:
        units = peaks["vector_units"]
        documents.check_fields(units, {"kernel_isa": str, "tflops": dict, "source": str},
                               f"{where}.vector_units", source)
        _check_rates(units["tflops"], f"{where}.vector_units.tflops", source)
    for m, measurement in enumerate(peaks.get("measurements") or []):
        _check_peaks(measurement, f"{where}.measurements[{m}]", source)


def validate(doc: Any, source: str = "results") -> dict:
    """Checks a parsed results document and returns it; DocumentError names the problem."""
    documents.check_header(doc, KIND, ACCEPTED_VERSIONS, source)
    documents.check_finite(doc, source)
    documents.check_fields(doc, _TOP, "the document", source)
    if doc["mode"] not in ("hot", "cold"):
        raise DocumentError(f"{source}: mode is {doc['mode']!r}; expected 'hot' or 'cold'")
    documents.check_fields(doc["machine"], _MACHINE, "machine", source)
    _check_peaks(doc["peaks"], "peaks", source)
    if not doc["runs"]:
        raise DocumentError(f"{source}: runs is empty; expected at least one run")
    for r, run in enumerate(doc["runs"]):
        documents.check_fields(run, {"index": int, "cases": list}, f"runs[{r}]", source)
        for c, case in enumerate(run["cases"]):
            where = f"runs[{r}].cases[{c}]"
            documents.check_fields(case, _CASE, where, source)
            if not case["samples_ns"] or not all(
                    isinstance(s, int) and not isinstance(s, bool) and s >= 0
                    for s in case["samples_ns"]):
                raise DocumentError(f"{source}: {where}.samples_ns: expected a non-empty list "
                                    "of non-negative integers")
            documents.check_fields(case["stats"], _STATS, f"{where}.stats", source)
    return doc


def load(path: str | Path) -> dict:
    """Reads and validates a results file; DocumentError for a missing, truncated, malformed
    or unknown-version file."""
    return validate(documents.load(path, KIND, ACCEPTED_VERSIONS), str(path))


def dump(doc: dict, path: str | Path) -> None:
    """Validates `doc` and writes it atomically."""
    documents.dump(validate(doc, str(path)), path)
