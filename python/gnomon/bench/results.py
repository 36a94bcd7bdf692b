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
      "peaks": {"memory_gbps": float, "tflops": {"<dtype>": float}, "source": str},
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

Renaming or removing a field is a major version bump; readers say which versions they accept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
ACCEPTED_VERSIONS = (1,)
KIND = "gnomon.bench.results"

_TOP = {"schema_version": int, "kind": str, "commit": str, "created_with": dict, "machine": dict,
        "peaks": dict, "mode": str, "runs": list}
_MACHINE = {"fingerprint": str, "device": str, "cpu_model": str, "cores": int, "ram_gb": int}
_CASE = {"key": str, "suite": str, "op": str, "params": dict, "dtypes": dict,
         "definition_hash": str, "samples_ns": list, "stats": dict, "flops": int, "bytes": int,
         "tflops": (int, float), "gbps": (int, float), "fraction_of_peak": dict}
_STATS = ("count", "min", "q1", "median", "q3", "max")


class ResultsError(ValueError):
    """A results file that cannot be read: names the file and what is wrong."""


def _require(obj: Any, fields: dict, where: str, source: str) -> None:
    if not isinstance(obj, dict):
        raise ResultsError(f"{source}: {where} must be an object, got {type(obj).__name__}")
    for name, kind in fields.items():
        if name not in obj:
            raise ResultsError(f"{source}: {where} lacks the field {name!r}")
        if not isinstance(obj[name], kind) or isinstance(obj[name], bool):
            raise ResultsError(f"{source}: {where}.{name} has the wrong type "
                               f"({type(obj[name]).__name__})")


def validate(doc: Any, source: str = "results") -> dict:
    """Checks a parsed results document and returns it; raises ResultsError naming the problem."""
    if not isinstance(doc, dict):
        raise ResultsError(f"{source}: expected a JSON object at the top level")
    version = doc.get("schema_version")
    if version not in ACCEPTED_VERSIONS:
        raise ResultsError(f"{source}: schema_version {version!r} is not one this gnomon reads "
                           f"(accepted: {', '.join(map(str, ACCEPTED_VERSIONS))})")
    _require(doc, _TOP, "the document", source)
    if doc["kind"] != KIND:
        raise ResultsError(f"{source}: kind {doc['kind']!r} is not {KIND!r}")
    if doc["mode"] not in ("hot", "cold"):
        raise ResultsError(f"{source}: mode must be 'hot' or 'cold', got {doc['mode']!r}")
    _require(doc["machine"], _MACHINE, "machine", source)
    if not doc["runs"]:
        raise ResultsError(f"{source}: runs is empty")
    for r, run in enumerate(doc["runs"]):
        _require(run, {"index": int, "cases": list}, f"runs[{r}]", source)
        for c, case in enumerate(run["cases"]):
            where = f"runs[{r}].cases[{c}]"
            _require(case, _CASE, where, source)
            if not case["samples_ns"] or not all(
                    isinstance(s, int) and not isinstance(s, bool) and s >= 0
                    for s in case["samples_ns"]):
                raise ResultsError(f"{source}: {where}.samples_ns must be non-empty, "
                                   "non-negative integers")
            _require(case["stats"], {k: (int, float) for k in _STATS}, f"{where}.stats", source)
    return doc


def load(path: str | Path) -> dict:
    """Reads and validates a results file; raises ResultsError for a missing, truncated,
    malformed or unknown-version file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ResultsError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise ResultsError(f"{path}: not valid JSON (truncated?): {error}") from None
    return validate(doc, str(path))


def dump(doc: dict, path: str | Path) -> None:
    validate(doc, str(path))
    Path(path).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
