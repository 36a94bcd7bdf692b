"""The validation document `gnomon validate --out` writes, and the accuracy figures the dashboard
tracks from it. Imports neither torch nor numpy: `gnomon dash ingest` reads these.

A validation document is a result document (`gnomon.documents`) of kind `KIND` holding, beside
the report `gnomon.predict.validate` builds, the ``commit`` it measured and the ``machine`` it
ran on (the fields of a bench results file's machine). Its figures, all "lower is better" and
each with the noise floor measured in the same run:

- ``step_ape_median``, ``step_ape_p90``: the per-step absolute percentage error, against the
  spread of two timings of the same batches;
- ``ttft_error``, ``tpot_error``, ``throughput_error``: the simulation's error on each (its
  magnitude), against the spread between two real runs.

A series is one figure of one predictor on one model and tp on one machine; its key is
``accuracy/<figure>[model=...,predictor=...,tp=...]``.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from gnomon import documents
from gnomon.documents import DocumentError

KIND = "gnomon.predict.validation"
SCHEMA_VERSION = 1
ACCEPTED_VERSIONS = (1,)
FIGURES = ("step_ape_median", "step_ape_p90", "ttft_error", "tpot_error", "throughput_error")

_NUM = (int, float)
_TOP = {"commit": str, "machine": dict, "setup": dict, "step_ape": dict, "noise_floor": dict,
        "ttft_error": _NUM, "tpot_error": _NUM, "throughput_error": _NUM}
_MACHINE = {"fingerprint": str, "device": str, "cpu_model": str, "cores": int, "ram_gb": int}
_SETUP = {"model": str, "predictor": str, "tp": int}
_APE = {"median": _NUM, "p90": _NUM}
_NOISE = {"step_ape": dict, "ttft_error": _NUM, "tpot_error": _NUM, "throughput_error": _NUM}


def validate(doc: Any, source: str = "validation") -> dict:
    """Checks a validation document's header and the fields the dashboard reads."""
    documents.check_header(doc, KIND, ACCEPTED_VERSIONS, source)
    documents.check_finite(doc, source)
    documents.check_fields(doc, _TOP, "the document", source)
    documents.check_fields(doc["machine"], _MACHINE, "machine", source)
    documents.check_fields(doc["setup"], _SETUP, "setup", source)
    documents.check_fields(doc["step_ape"], _APE, "step_ape", source)
    documents.check_fields(doc["noise_floor"], _NOISE, "noise_floor", source)
    documents.check_fields(doc["noise_floor"]["step_ape"], _APE, "noise_floor.step_ape", source)
    if len(doc["commit"]) != 40 or any(c not in "0123456789abcdef" for c in doc["commit"]):
        raise DocumentError(f"{source}: commit {doc['commit']!r}: expected a 40-hex git sha")
    return doc


def load(path) -> dict:
    return validate(documents.load(path, KIND, ACCEPTED_VERSIONS), str(path))


def series_key(doc: dict, figure: str) -> str:
    setup = doc["setup"]
    return (f"accuracy/{figure}[model={setup['model']},predictor={setup['predictor']},"
            f"tp={setup['tp']}]")


def figures(doc: dict) -> Dict[str, Tuple[float, float]]:
    """{figure: (value, noise floor)}, magnitudes (lower is better)."""
    noise = doc["noise_floor"]
    out = {"step_ape_median": (doc["step_ape"]["median"], noise["step_ape"]["median"]),
           "step_ape_p90": (doc["step_ape"]["p90"], noise["step_ape"]["p90"])}
    for name in ("ttft_error", "tpot_error", "throughput_error"):
        out[name] = (doc[name], noise[name])
    return {name: (abs(float(v)), abs(float(n))) for name, (v, n) in out.items()}
