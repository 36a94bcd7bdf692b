"""TablePredictor: exact on a power law (linear in log space), measured / interpolated labels,
refusals outside the grid, files."""

import dataclasses
import json

import numpy as np
import pytest

from gnomon.documents import DocumentError
from gnomon.engine.config import ModelConfig
from gnomon.predict.cost import PredictionRefused
from gnomon.predict.shapes import ModelSpec, StepShape
from gnomon.predict.table import TablePredictor

SPEC = ModelSpec.from_config(ModelConfig.preset("tiny-llama"))
TOKENS = [1, 16, 256, 4096]
CONTEXT = [0, 100, 10000]


def law(tokens, context):  # log-linear in log(1 + x): the interpolation must be exact
    return 1e-3 * (1 + tokens) ** 0.7 * (1 + context) ** 0.2


def _table():
    grid = [[{"gemm": law(t, c), "overhead": 1e-4} for c in CONTEXT] for t in TOKENS]
    return TablePredictor({"num_tokens": TOKENS, "context_tokens": CONTEXT}, grid)


def test_power_law_is_interpolated_exactly():
    table = _table()
    rng = np.random.default_rng(0)
    for _ in range(50):
        t = int(rng.integers(1, 4096))
        c = int(rng.integers(0, 10000))
        cost = table.predict(StepShape.of(SPEC, [(t, c)]))
        assert cost.breakdown["gemm"] == pytest.approx(law(t, c), rel=1e-9)
        assert cost.breakdown["overhead"] == pytest.approx(1e-4, rel=1e-12)
        assert cost.breakdown["attention"] == 0


def test_labels_measured_on_the_grid_interpolated_between():
    table = _table()
    on = table.predict(StepShape.of(SPEC, [(16, 100)]))
    assert on.provenance["gemm"] == "measured"
    assert on.breakdown["gemm"] == pytest.approx(law(16, 100), rel=1e-12)
    between = table.predict(StepShape.of(SPEC, [(17, 100)]))
    assert between.provenance["gemm"] == "interpolated"


def test_refuses_outside_the_grid():
    table = _table()
    with pytest.raises(PredictionRefused, match="num_tokens = 5000"):
        table.predict(StepShape.of(SPEC, [(5000, 0)]))
    with pytest.raises(PredictionRefused, match="context_tokens = 20000"):
        table.predict(StepShape.of(SPEC, [(1, 20000)]))


def test_refuses_expert_and_data_parallel_steps():
    # a table measured on gnomon's engine holds no such step: refused, never read as plain TP
    moe = ModelSpec.from_config(ModelConfig.preset("tiny-mixtral"))
    plain = StepShape.of(moe, [(16, 100)])
    assert _table().predict(plain).seconds > 0
    for ep, dp in ((2, 1), (1, 2)):
        shape = dataclasses.replace(plain, ep=ep, dp=dp, dp_tokens=32 if dp > 1 else 0)
        with pytest.raises(PredictionRefused, match=f"ep = {ep}, dp = {dp}: a table's steps"):
            _table().predict(shape)


def test_context_sums_over_sequences():
    table = _table()
    two = table.predict(StepShape.of(SPEC, [(1, 50), (1, 50)]))
    assert two.breakdown["gemm"] == pytest.approx(law(2, 100), rel=1e-9)


def test_file_round_trip_and_bad_input(tmp_path):
    table = _table()
    path = tmp_path / "t.json"
    table.save(path)
    back = TablePredictor.load(path)
    shape = StepShape.of(SPEC, [(100, 500)])
    assert back.predict(shape) == table.predict(shape)
    doc = json.loads(path.read_text())
    doc["points"] = doc["points"][1:]
    (tmp_path / "hole.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="hole.json.*no point"):
        TablePredictor.load(tmp_path / "hole.json")
    with pytest.raises(ValueError, match="strictly increasing"):
        TablePredictor({"num_tokens": [4, 2]}, [{}, {}])
    with pytest.raises(ValueError, match="unknown"):
        TablePredictor({"batch": [1]}, [{}])
    with pytest.raises(ValueError, match="unknown families"):
        TablePredictor({"num_tokens": [1]}, [{"gpu": 1.0}])
    with pytest.raises(DocumentError, match="missing.json: cannot read"):
        TablePredictor.load(tmp_path / "missing.json")
