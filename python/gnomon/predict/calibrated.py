"""`CalibratedPredictor`: the roofline's features, with coefficients fitted on this machine.

A step's seconds are modelled as ``sum_k theta_k * x_k`` over the features of
`opcount.step_ops`: FLOPs and bytes per op family, kernel launches, and the engine's per-step
costs (a constant, one term per sequence, one per token). A GEMM's rate depends on its M (on a
CPU, M = 1 runs as a matrix-vector product at twice the speed of M = 2, and small M is far from
either roof), so the gemm family's FLOPs and bytes are split over `GEMM_KNOTS` (M = 1, 2, 4, ...)
with piecewise-linear weights in log2 M: its coefficients are an efficiency curve in M (measured
here: a 512-wide fp32 projection set takes 1.6 ms at M = 1, 3.5 ms at M = 2, 3.0 ms at M = 8).
The coefficients are non-negative, fitted by least squares on relative error (each row divided
by its measured seconds) over these rows:

- per-op results from ``gnomon bench`` (each case: its family's FLOPs and bytes, one launch);
- the model's own GEMMs timed at each knot of M (`calibrate.gemm_sweep`): the kernels this
  CPU runs for them, which a step's time alone cannot tell from the per-step terms;
- whole steps timed by running the real engine (``gnomon calibrate``), and each of their op
  families as the runner timed it; only whole steps reach the per-step terms, which is where
  the engine overhead and launch gaps the operator sums miss end up.

Communication is a term per collective plus one per byte a rank sends in the ring, for the
all-reduce and the all-gather apart, fitted on the ``comm`` bench suite's rows and, at
``tp > 1``, on the calibration steps' own collectives as the runner timed them.

The breakdown gives each family its FLOP, byte and launch terms and ``overhead`` the per-step
terms, all labelled ``fitted``. It refuses what it has not seen: another ``tp`` than the one its
steps ran at (on a CPU the ranks split the cores, so a rank's compute rate depends on tp), and
steps with more tokens, sequences or context than the calibration steps had, or whose features
exceed by more than `HEADROOM` those of the calibration steps and timed ops (a GEMM sweep's
knots count as calibrated).
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from gnomon import documents
from gnomon.costing import COLLECTIVES

from .cost import FAMILIES, PredictionRefused, StepCost
from .opcount import step_ops
from .shapes import StepShape

SCHEMA_VERSION = 1
ACCEPTED_VERSIONS = (1,)
KIND = "gnomon.predict.calibration"

COMPUTE_FAMILIES = ("attention", "gemm", "moe", "elementwise", "sampling")
GEMM_KNOTS = tuple(2 ** i for i in range(15))  # M = 1 .. 16384
FEATURES = tuple(
    [f"gemm_{x}@{m}" for m in GEMM_KNOTS for x in ("flops", "bytes")]
    + [f"{f}_{x}" for f in COMPUTE_FAMILIES if f != "gemm" for x in ("flops", "bytes")]
    + [f"{c}_bytes" for c in COLLECTIVES] + ["collectives"]
    + ["launches", "step", "seqs", "tokens"])
COMM_FEATURES = tuple(f"{c}_bytes" for c in COLLECTIVES) + ("collectives",)
OVERHEAD_FEATURES = ("step", "seqs", "tokens")
HEADROOM = 1.25

# gnomon bench ops -> the family that op's time belongs to in a step
BENCH_FAMILIES = {"paged_attention": "attention", "reshape_and_cache": "attention",
                  "mxfp4_gemm": "gemm", "fused_moe": "moe", "topk_routing": "moe",
                  "rms_norm": "elementwise", "rotary_embedding": "elementwise",
                  "all_reduce": "communication", "all_gather": "communication"}


def _knot_weights(m: int) -> List[Tuple[int, float]]:
    """(knot, weight) pairs placing M between its two neighbouring knots, linear in log2 M."""
    if not 1 <= m <= GEMM_KNOTS[-1]:
        raise PredictionRefused(f"a GEMM with M = {m} is outside the calibrated knots "
                                f"1..{GEMM_KNOTS[-1]}")
    position = np.log2(m)
    low = min(int(position), len(GEMM_KNOTS) - 2)
    upper = position - low
    return [(GEMM_KNOTS[low], 1.0 - upper), (GEMM_KNOTS[low + 1], upper)]


def _add_op(x: Dict[str, float], family: str, flops: float, nbytes: float, rows: int) -> None:
    """A compute op's FLOPs and bytes (a GEMM's between the knots around its M)."""
    if family == "gemm":
        for knot, w in _knot_weights(rows):
            x[f"gemm_flops@{knot}"] += w * flops
            x[f"gemm_bytes@{knot}"] += w * nbytes
    else:
        x[f"{family}_flops"] += flops
        x[f"{family}_bytes"] += nbytes


def _add_collective(x: Dict[str, float], name: str, ring_bytes: float, count: int) -> None:
    x[f"{name}_bytes"] += ring_bytes
    x["collectives"] += count


def _op_features(ops) -> Tuple[Dict[str, float], Dict[str, int]]:
    x = dict.fromkeys(FEATURES, 0.0)
    launches: Dict[str, int] = dict.fromkeys(FAMILIES, 0)
    for op in ops:
        if op.family == "communication":
            _add_collective(x, op.name, op.comm_bytes, op.collectives)
            continue
        if op.family not in COMPUTE_FAMILIES:
            raise PredictionRefused(f"a calibrated predictor has no coefficients for "
                                    f"{op.family}")
        _add_op(x, op.family, op.flops, op.bytes, op.rows)
        x["launches"] += op.launches
        launches[op.family] += op.launches
    return x, launches


def step_features(shape: StepShape) -> Tuple[np.ndarray, Dict[str, int]]:
    """The feature vector (`FEATURES` order) and each family's launches."""
    x, launches = _op_features(step_ops(shape))
    x.update(step=1.0, seqs=float(shape.num_seqs), tokens=float(shape.num_tokens))
    return np.array([x[k] for k in FEATURES]), launches


def op_rows(timed) -> Tuple[np.ndarray, np.ndarray]:
    """Rows from ``(ops, seconds)`` pairs: a list of `opcount.Op` timed together (a sweep of
    a model's own GEMMs, `calibrate.gemm_sweep`)."""
    X, y = [], []
    for ops, seconds in timed:
        x, _ = _op_features(ops)
        X.append([x[k] for k in FEATURES])
        y.append(float(seconds))
    return np.array(X).reshape(-1, len(FEATURES)), np.array(y)


def bench_rows(results: dict) -> Tuple[np.ndarray, np.ndarray, List[str]]:
    """Rows from a ``gnomon bench`` results document: per case the median over runs of its
    per-run medians. Returns (features, seconds, keys); cases of ops no step runs are skipped."""
    per_case: Dict[str, List[float]] = {}
    cases: Dict[str, dict] = {}
    for run in results["runs"]:
        for case in run["cases"]:
            if case["op"] in BENCH_FAMILIES:
                per_case.setdefault(case["key"], []).append(case["stats"]["median"] * 1e-9)
                cases[case["key"]] = case
    X, y, keys = [], [], []
    for key, medians in per_case.items():
        case = cases[key]
        x = dict.fromkeys(FEATURES, 0.0)
        family = BENCH_FAMILIES[case["op"]]
        if family == "communication":  # a comm case's bytes are its ring bytes
            _add_collective(x, case["op"], float(case["bytes"]), 1)
        else:
            _add_op(x, family, float(case["flops"]), float(case["bytes"]),
                    int(case["params"].get("m", 0)))
            x["launches"] = 1.0
        X.append([x[k] for k in FEATURES])
        y.append(float(np.median(medians)))
        keys.append(key)
    return np.array(X).reshape(-1, len(FEATURES)), np.array(y), keys


def fit(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error: min ||(X theta - y) / y||, theta >= 0."""
    from scipy.optimize import nnls

    if len(y) == 0 or (y <= 0).any():
        raise ValueError("calibration: expected at least one row, every seconds > 0")
    A = X / y[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    theta, _ = nnls(A / scale, np.ones(len(y)), maxiter=50 * A.shape[1])
    return theta / scale


class CalibratedPredictor:
    """See the module docstring. Build with `fit_from` or `load`."""

    def __init__(self, coefficients: Sequence[float], domain: Dict[str, float],
                 info: Optional[dict] = None) -> None:
        theta = np.asarray(coefficients, dtype=float)
        if theta.shape != (len(FEATURES),) or not np.isfinite(theta).all() or (theta < 0).any():
            raise ValueError(f"coefficients: expected {len(FEATURES)} finite non-negative "
                             f"numbers ({', '.join(FEATURES)})")
        missing = {"tp", "num_tokens", "num_seqs", "max_context", "features"} - set(domain)
        if missing:
            raise ValueError(f"domain: missing {sorted(missing)}")
        self.theta = theta
        self.domain = domain
        self.info = info or {}
        self.name = "calibrated" + (f"({self.info['source']})" if "source" in self.info else "")

    # ---------------------------------------------------------------- fitting
    @classmethod
    def fit_from(cls, steps: Iterable[Tuple[StepShape, float]], bench_results: Iterable[dict] = (),
                 info: Optional[dict] = None, timed_ops=()) -> "CalibratedPredictor":
        """Fit on measured ``(shape, seconds)`` steps, ``gnomon bench`` results documents and
        `timed_ops` (``(ops, seconds)`` pairs, `op_rows`)."""
        steps = list(steps)
        if not steps:
            raise ValueError("steps: a calibration needs at least one measured step")
        X_steps = np.array([step_features(s)[0] for s, _ in steps])
        y_steps = np.array([float(t) for _, t in steps])
        X_ops, y_ops = op_rows(timed_ops)
        X_parts, y_parts, bench_keys = [X_steps, X_ops], [y_steps, y_ops], []
        for doc in bench_results:
            Xb, yb, keys = bench_rows(doc)
            X_parts.append(Xb)
            y_parts.append(yb)
            bench_keys += keys
        X, y = np.vstack(X_parts), np.concatenate(y_parts)
        tps = {s.tp for s, _ in steps}
        if len(tps) != 1:
            raise ValueError(f"steps: expected steps at one tp, got {sorted(tps)}")
        theta = fit(X, y)
        domain = {"tp": tps.pop(), "num_tokens": max(s.num_tokens for s, _ in steps),
                  "num_seqs": max(s.num_seqs for s, _ in steps),
                  "max_context": max(s.max_context for s, _ in steps),
                  # a GEMM knot the sweep timed is calibrated though no step landed on it
                  "features": dict(zip(FEATURES, np.vstack([X_steps, X_ops]).max(axis=0)
                                       .tolist()))}
        rel = np.abs(X_steps @ theta - y_steps) / y_steps
        meta = dict(info or {})
        meta.update(step_rows=len(steps), bench_rows=len(bench_keys), op_rows=len(y_ops),
                    in_sample_step_ape_median=float(np.median(rel)),
                    in_sample_step_ape_p90=float(np.percentile(rel, 90)))
        return cls(theta, domain, meta)

    # ---------------------------------------------------------------- predicting
    def _check_domain(self, shape: StepShape, x: np.ndarray) -> None:
        d = self.domain
        if shape.tp != d["tp"]:
            raise PredictionRefused(f"tp = {shape.tp}: calibrated at tp {d['tp']} only "
                                    f"(gnomon calibrate --tp {shape.tp} calibrates that)")
        if (shape.ep, shape.dp) != (1, 1):
            raise PredictionRefused(f"ep = {shape.ep}, dp = {shape.dp}: calibrated on gnomon's "
                                    f"engine, which has no expert or data parallelism")
        for what, value in (("num_tokens", shape.num_tokens), ("num_seqs", shape.num_seqs),
                            ("max_context", shape.max_context)):
            if value > d[what]:
                raise PredictionRefused(f"{what} = {value} is beyond the calibrated range "
                                        f"(at most {d[what]})")
        for name, value in zip(FEATURES, x):
            limit = d["features"][name] * HEADROOM
            if value > limit and name not in OVERHEAD_FEATURES:
                raise PredictionRefused(f"{name} = {value:.3g} is beyond the calibrated range "
                                        f"(at most {limit:.3g})")

    def predict(self, shape: StepShape) -> StepCost:
        if not isinstance(shape, StepShape):
            raise TypeError(f"shape: expected a StepShape, got {type(shape).__name__}")
        x, launches = step_features(shape)
        self._check_domain(shape, x)
        terms = dict(zip(FEATURES, x * self.theta))
        per_launch = self.theta[FEATURES.index("launches")]
        parts = {f: per_launch * launches[f] for f in COMPUTE_FAMILIES}
        for name, value in terms.items():
            family = name.split("_", 1)[0]
            if family in parts:
                parts[family] += value
        parts["overhead"] = sum(terms[k] for k in OVERHEAD_FEATURES)
        parts["communication"] = sum(terms[k] for k in COMM_FEATURES)
        return StepCost.from_parts(parts, {f: "fitted" for f in COMPUTE_FAMILIES +
                                           ("overhead", "communication")})

    # ---------------------------------------------------------------- files
    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "kind": KIND, "features": list(FEATURES),
                "coefficients": self.theta.tolist(), "domain": self.domain, "info": self.info}

    def save(self, path) -> None:
        documents.dump(self.to_json(), path)

    @classmethod
    def load(cls, path) -> "CalibratedPredictor":
        doc = documents.load(path, KIND, ACCEPTED_VERSIONS)
        path = os.fspath(path)
        if doc.get("features") != list(FEATURES):
            raise documents.DocumentError(f"{path}: features {doc.get('features')} differ "
                                          f"from this gnomon's {list(FEATURES)}; calibrate "
                                          "again")
        info = dict(doc.get("info") or {})
        info.setdefault("source", os.path.basename(path))
        try:
            return cls(doc["coefficients"], doc["domain"], info)
        except (KeyError, TypeError, ValueError) as exc:
            raise documents.DocumentError(f"{path}: malformed calibration ({exc})") from None
