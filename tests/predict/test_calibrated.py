"""CalibratedPredictor: the fit recovers a known linear model, refusals, files, bench rows."""

import json

import numpy as np
import pytest

from gnomon.documents import DocumentError
from gnomon.engine.config import ModelConfig
from gnomon.predict.calibrated import (FEATURES, CalibratedPredictor, bench_rows, fit,
                                       op_rows, step_features)
from gnomon.predict.cost import FAMILIES, PredictionRefused
from gnomon.predict.shapes import ModelSpec, StepShape

SPEC = ModelSpec.from_config(ModelConfig.preset("tiny-llama"), name="tiny-llama")


def _shapes(seed, count=60):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        decodes = int(rng.integers(0, 8))
        pairs = [(1, int(rng.integers(1, 200))) for _ in range(decodes)]
        if rng.random() < 0.6 or not pairs:
            pairs.append((int(rng.integers(2, 64)), int(rng.integers(0, 100))))
        out.append(StepShape.of(SPEC, pairs))
    return out


TRUE = dict.fromkeys(FEATURES, 0.0)
TRUE.update({"gemm_flops@1": 1e-10, "gemm_bytes@1": 1e-9, "gemm_flops@2": 3e-10,
             "gemm_bytes@4": 2e-9, "gemm_flops@16": 2e-10, "gemm_flops@64": 1e-10},
            attention_flops=5e-10, elementwise_bytes=3e-9, sampling_bytes=2e-9, launches=4e-6,
            step=2e-4, seqs=1e-5, tokens=2e-7)
THETA = np.array([TRUE[k] for k in FEATURES])


def _truth(shape):
    return float(step_features(shape)[0] @ THETA)


def test_fit_recovers_a_known_linear_model():
    train = [(s, _truth(s)) for s in _shapes(0)]
    p = CalibratedPredictor.fit_from(train)
    assert p.info["in_sample_step_ape_median"] < 1e-6
    for s in _shapes(1, 20):
        try:
            got = p.predict(s)
        except PredictionRefused:
            continue
        assert got.seconds == pytest.approx(_truth(s), rel=1e-4)
        assert got.seconds == pytest.approx(sum(got.breakdown.values()), rel=1e-12)
        assert set(got.breakdown) == set(FAMILIES)
        assert got.provenance["gemm"] == "fitted"
        assert got.breakdown["communication"] == 0  # tp 1: no collectives


def test_fit_is_non_negative_and_relative():
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = np.array([1.0, 100.0, 101.0])
    theta = fit(X, y)
    assert (theta >= 0).all()
    np.testing.assert_allclose(X @ theta, y, rtol=1e-9)
    with pytest.raises(ValueError, match="seconds > 0"):
        fit(X, np.array([1.0, 0.0, 1.0]))


def test_refuses_outside_the_calibrated_range():
    p = CalibratedPredictor.fit_from([(s, _truth(s)) for s in _shapes(0)])
    big = StepShape.of(SPEC, [(p.domain["num_tokens"] + 1, 0)])
    with pytest.raises(PredictionRefused, match="num_tokens"):
        p.predict(big)
    many = StepShape.of(SPEC, [(1, 5)] * (p.domain["num_seqs"] + 1))
    with pytest.raises(PredictionRefused, match="num_seqs"):
        p.predict(many)
    long = StepShape.of(SPEC, [(1, p.domain["max_context"] + 10)])
    with pytest.raises(PredictionRefused, match="max_context"):
        p.predict(long)
    with pytest.raises(PredictionRefused, match="tp"):
        p.predict(StepShape.of(SPEC, [(1, 5)], tp=2))


def test_a_gemm_knot_the_sweep_timed_is_calibrated_without_a_step_on_it():
    # Steps of at most 32 tokens and one of 200 never put GEMM work on the knot M = 64 (a step
    # splits its GEMMs between the two knots around its token count); a busy machine's smaller
    # calibration workload produced such steps, and its validation then refused a 48-token
    # step although the GEMM sweep had timed M = 64.
    from gnomon.predict.opcount import dense_ops

    steps = [StepShape.of(SPEC, [(1, 10)] * n) for n in range(1, 33)]
    steps.append(StepShape.of(SPEC, [(200, 0)]))
    train = [(s, _truth(s)) for s in steps]
    middle = StepShape.of(SPEC, [(48, 0)])
    with pytest.raises(PredictionRefused, match="gemm_flops@64"):
        CalibratedPredictor.fit_from(train).predict(middle)
    sweep = [([op for op in dense_ops(SPEC, m, m, 1) if op.family == "gemm"], 1e-3 * m)
             for m in (32, 64)]
    p = CalibratedPredictor.fit_from(train, timed_ops=sweep)
    assert p.predict(middle).seconds > 0


def test_file_round_trip_and_bad_files(tmp_path):
    p = CalibratedPredictor.fit_from([(s, _truth(s)) for s in _shapes(0)], info={"model": "x"})
    path = tmp_path / "cal.json"
    p.save(path)
    q = CalibratedPredictor.load(path)
    shape = _shapes(2, 1)[0]
    assert q.predict(shape) == p.predict(shape)
    assert "cal.json" in q.name
    with pytest.raises(DocumentError, match="nope.json: cannot read"):
        CalibratedPredictor.load(tmp_path / "nope.json")
    doc = json.loads(path.read_text())
    for change, match in [({"kind": "other"}, "gnomon.predict.calibration"),
                          ({"schema_version": 9}, "schema_version 9"),
                          ({"features": ["a"]}, "calibrate again"),
                          ({"coefficients": [-1.0] * len(FEATURES)}, "non-negative")]:
        (tmp_path / "bad.json").write_text(json.dumps({**doc, **change}))
        with pytest.raises(DocumentError, match=match) as e:
            CalibratedPredictor.load(tmp_path / "bad.json")
        assert "bad.json" in str(e.value)
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(DocumentError, match="garbage.json"):
        CalibratedPredictor.load(tmp_path / "garbage.json")


def test_bench_rows_take_each_cases_median_over_runs():
    def case(key, op, median_ns):
        return {"key": key, "op": op, "flops": 1000, "bytes": 2000, "params": {},
                "stats": {"median": median_ns}}
    doc = {"runs": [{"cases": [case("a", "paged_attention", 100), case("b", "rms_norm", 50),
                               case("c", "mxfp4_quantize", 10)]},
                    {"cases": [case("a", "paged_attention", 300), case("b", "rms_norm", 70),
                               case("c", "mxfp4_quantize", 10)]}]}
    X, y, keys = bench_rows(doc)
    assert keys == ["a", "b"]  # quantisation runs in no step
    np.testing.assert_allclose(y, [200e-9, 60e-9])
    assert X[0, FEATURES.index("attention_flops")] == 1000
    assert X[1, FEATURES.index("elementwise_bytes")] == 2000
    assert X[:, FEATURES.index("launches")].tolist() == [1.0, 1.0]
    assert X[:, FEATURES.index("step")].tolist() == [0.0, 0.0]


def _comm_case(key, op, ring_bytes, median_ns):
    return {"key": key, "op": op, "flops": 0, "bytes": ring_bytes, "params": {"world": 2},
            "stats": {"median": median_ns}}


def test_comm_rows_fit_a_term_per_collective_and_per_byte_and_price_tp_2():
    # the truth: 300 us per collective, 1 ns per all-reduced byte, 2 ns per all-gathered byte
    truth = dict(TRUE, all_reduce_bytes=1e-9, all_gather_bytes=2e-9, collectives=3e-4)
    theta = np.array([truth[k] for k in FEATURES])
    sizes = (1 << 10, 1 << 16, 1 << 22)
    doc = {"runs": [{"cases": [
        _comm_case(f"{op}{b}", op, b, 1e9 * (3e-4 + truth[f"{op}_bytes"] * b))
        for op in ("all_reduce", "all_gather") for b in sizes]}]}
    X, y, keys = bench_rows(doc)
    assert len(keys) == 6 and X[:, FEATURES.index("collectives")].tolist() == [1.0] * 6
    assert X[:, FEATURES.index("launches")].tolist() == [0.0] * 6
    shapes = [StepShape.of(SPEC, s.requests, tp=2) for s in _shapes(5)]
    steps = [(s, float(step_features(s)[0] @ theta)) for s in shapes]
    p = CalibratedPredictor.fit_from(steps, [doc])
    assert p.domain["tp"] == 2
    probe = shapes[3]
    x = step_features(probe)[0]
    comm = sum(x[FEATURES.index(k)] * truth[k] for k in
               ("all_reduce_bytes", "all_gather_bytes", "collectives"))
    # 5 all-reduces (the embedding's, two per layer) and the logits' all-gather
    assert x[FEATURES.index("collectives")] == 6
    got = p.predict(probe)
    assert got.breakdown["communication"] == pytest.approx(comm, rel=1e-3)
    assert got.provenance["communication"] == "fitted"
    for other in (1, 4):
        with pytest.raises(PredictionRefused, match=f"tp = {other}: calibrated at tp 2"):
            p.predict(StepShape.of(SPEC, probe.requests, tp=other))


def test_calibration_steps_at_two_tps_are_refused():
    mixed = [(s, 1e-3) for s in _shapes(0, 3)] + [
        (StepShape.of(SPEC, s.requests, tp=2), 1e-3) for s in _shapes(1, 3)]
    with pytest.raises(ValueError, match=r"steps: expected steps at one tp, got \[1, 2\]"):
        CalibratedPredictor.fit_from(mixed)


def test_gemm_rows_are_split_between_neighbouring_knots():
    from gnomon.predict.calibrated import _knot_weights
    assert _knot_weights(1) == [(1, 1.0), (2, 0.0)]
    assert _knot_weights(8) == [(8, 1.0), (16, 0.0)]
    (lo, w_lo), (hi, w_hi) = _knot_weights(12)
    assert (lo, hi) == (8, 16) and w_hi == pytest.approx(np.log2(12 / 8)) and w_lo + w_hi == 1
    with pytest.raises(PredictionRefused, match="M = 20000"):
        _knot_weights(20000)


def test_family_rows_split_terms_that_grow_together():
    # decode-only steps: sampling and the per-sequence overhead both grow with the sequences,
    # so whole steps alone cannot split them; each family's own time (as the runner reports
    # it) can. The truth puts the per-sequence cost in sampling only.
    from gnomon.predict.calibrated import COMPUTE_FAMILIES
    from gnomon.predict.opcount import step_ops

    truth = dict.fromkeys(FEATURES, 0.0)
    truth.update(sampling_bytes=5e-9, step=1e-4, launches=1e-6, attention_bytes=1e-9,
                 **{f"gemm_bytes@{m}": 1e-9 for m in (1, 2, 4, 8, 16, 32)})
    theta = np.array([truth[k] for k in FEATURES])
    rng = np.random.default_rng(4)
    shapes = [StepShape.of(SPEC, [(1, int(rng.integers(1, 100)))] * int(n))
              for n in rng.integers(1, 33, size=80)]
    steps = [(s, float(step_features(s)[0] @ theta)) for s in shapes]
    families = []
    for s in shapes:
        for family in COMPUTE_FAMILIES:
            ops = [op for op in step_ops(s) if op.family == family]
            x = op_rows([(ops, 1.0)])[0][0]
            if ops and x @ theta > 0:
                families.append((ops, float(x @ theta)))
    split = CalibratedPredictor.fit_from(steps, timed_ops=families)
    probe = StepShape.of(SPEC, [(1, 50)] * 20)
    want = float(step_features(probe)[0] @ theta)
    got = split.predict(probe)
    assert got.seconds == pytest.approx(want, rel=1e-3)
    sampling = sum(float(x) for x, k in zip(step_features(probe)[0] * theta, FEATURES)
                   if k.startswith("sampling"))
    assert got.breakdown["sampling"] == pytest.approx(sampling, rel=0.02)
    assert split.info["op_rows"] == len(families)
