"""The validation document `gnomon validate --out` writes and the accuracy document `gnomon
accuracy --out` writes, as the accuracy figures the dashboard tracks from them. Imports neither
torch nor numpy: `gnomon dash ingest` reads these.

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

The dashboard also tracks the accuracy document `gnomon accuracy --out` writes
(`gnomon.predict.scorecard`, kind `SCORECARD_KIND`): a simulation of measured serving runs, row
by row. Its series (`scorecard_figures`) are one per predictor x engine (its name, without the
version) x hardware, keyed ``accuracy/<figure>[engine=...,hardware=...,predictor=...]``, with
the figures

- ``ttft_mape``, ``tpot_mape``: the mean |ratio - 1| (ratio = predicted / measured) over the
  series' answered rows that have that ratio (absent when none has);
- ``refused_share``: the share of the series' counted rows (all but the excluded ones) that the
  predictor refused, i.e. 1 - coverage, so that lower is better as for every figure.

A simulation is deterministic, so no noise is measured: a figure's "noise floor" is the stated
tolerance `MAPE_TOLERANCE` (or `REFUSED_TOLERANCE`), and the dashboard judges it with the same
rule as a validation's.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Tuple

from gnomon import documents
from gnomon.documents import DocumentError

from . import scorecard

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
    _check_commit(doc["commit"], source)
    return doc


def _check_commit(commit: str, source: str) -> None:
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        raise DocumentError(f"{source}: commit {commit!r}: expected a 40-hex git sha")


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


# --------------------------------------------------------------------------- accuracy documents

SCORECARD_KIND = scorecard.KIND
SCORECARD_VERSIONS = scorecard.ACCEPTED_VERSIONS
SCORECARD_FIGURES = ("ttft_mape", "tpot_mape", "refused_share")

MAPE_TOLERANCE = 0.005
"""How far (absolute, as a fraction: 0.5 percentage point) an accuracy document's TTFT or TPOT
MAPE must move between two commits to count. A simulation is deterministic, so any change is
real: there is no run-to-run noise to measure. The tolerance only keeps rounding-level changes
(a sum taken in another order, a constant printed with fewer digits) from flagging."""

REFUSED_TOLERANCE = 0.0
"""How far an accuracy document's ``refused_share`` must move to count: not at all. It is a
count of rows over a count of rows, with no rounding, so one more refused row is a change."""

_OPT_NUM = (int, float, type(None))
_GROUP = {"engine": str, "hardware": str}
_RATIO = {"ttft": _OPT_NUM, "tpot": _OPT_NUM}


def validate_scorecard(doc: Any, source: str = "accuracy") -> dict:
    """Checks an accuracy document (`scorecard.validate`) and the fields the dashboard reads:
    a commit (null, as outside a git checkout, is refused: the dashboard places every figure at
    a commit), each row's group engine and hardware, and each answered row's ratios."""
    scorecard.validate(doc, source)
    if doc["commit"] is None:
        raise DocumentError(f"{source}: commit is null (the document was made outside a git "
                            "checkout); the dashboard places every figure at a commit: make "
                            "it again in the checkout or with `gnomon accuracy --commit SHA`")
    _check_commit(doc["commit"], source)
    for i, row in enumerate(doc["rows"]):
        documents.check_fields(row["group"], _GROUP, f"rows[{i}].group", source)
        if row["status"] == scorecard.ANSWERED:
            documents.check_fields(row, {"ratio": dict}, f"rows[{i}]", source)
            documents.check_fields(row["ratio"], _RATIO, f"rows[{i}].ratio", source)
    return doc


def engine_name(engine: str) -> str:
    """An engine without its version: ``"vllm 0.15.1"`` -> ``"vllm"``."""
    return engine.split(" ")[0]


def scorecard_key(figure: str, predictor: str, engine: str, hardware: str) -> str:
    return f"accuracy/{figure}[engine={engine},hardware={hardware},predictor={predictor}]"


def scorecard_figures(doc: dict) -> Dict[str, Tuple[str, float, float]]:
    """{series key: (figure, value, tolerance)} of an accuracy document (module docstring), in
    key order; a series with no counted row has no figures, and one with no ratio of a metric
    no MAPE of it."""
    groups: Dict[Tuple[str, str], List[dict]] = defaultdict(list)
    for row in doc["rows"]:
        if row["status"] != scorecard.EXCLUDED:
            group = row["group"]
            groups[(engine_name(group["engine"]), group["hardware"])].append(row)
    out: Dict[str, Tuple[str, float, float]] = {}
    for (engine, hardware), rows in groups.items():
        answered = [r for r in rows if r["status"] == scorecard.ANSWERED]
        for metric in scorecard.METRICS:
            ratios = [r["ratio"][metric] for r in answered if r["ratio"][metric] is not None]
            if ratios:
                out[scorecard_key(f"{metric}_mape", doc["predictor"], engine, hardware)] = (
                    f"{metric}_mape", sum(abs(float(x) - 1) for x in ratios) / len(ratios),
                    MAPE_TOLERANCE)
        out[scorecard_key("refused_share", doc["predictor"], engine, hardware)] = (
            "refused_share", (len(rows) - len(answered)) / len(rows), REFUSED_TOLERANCE)
    return dict(sorted(out.items()))
