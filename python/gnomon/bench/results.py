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


def validate(doc: Any, source: str = "results") -> dict:
    """Checks a parsed results document and returns it; DocumentError names the problem."""
    documents.check_header(doc, KIND, ACCEPTED_VERSIONS, source)
    documents.check_finite(doc, source)
    documents.check_fields(doc, _TOP, "the document", source)
    if doc["mode"] not in ("hot", "cold"):
        raise DocumentError(f"{source}: mode is {doc['mode']!r}; expected 'hot' or 'cold'")
    documents.check_fields(doc["machine"], _MACHINE, "machine", source)
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
