"""`SimulationSpec`: one simulation as one value; the CLI builds it, `simulate` runs it, a
report embeds it, and `gnomon simulate --spec` runs a report's spec again exactly."""

import json
import math

import pytest

from gnomon.cli import build_parser, main
from gnomon.documents import DocumentError
from gnomon.predict import report as reports
from gnomon.predict.metrics import SLO
from gnomon.predict.simulate import simulate
from gnomon.predict.spec import SimulationSpec, WorkloadSpec
from gnomon.predict.sweep import SweepSpec
from gnomon.predict.workloads import LengthDist

SMALL = dict(model="llama-3.1-8b", hardware="H100", workload="random", num_requests=6,
             rate="inf", concurrency=3, input_len="100:200", output_len="8")


def test_flags_set_the_engine_settings_and_the_workload():
    spec = SimulationSpec.of(**SMALL, tp="2", max_num_seqs=64, engine="vllm",
                             engine_settings={"batch_wait_timeout_iters": 4})
    assert spec.engine_settings == {"tensor_parallel_size": 2, "max_num_seqs": 64,
                                    "batch_wait_timeout_iters": 4}
    assert spec.workload == WorkloadSpec("random", num_requests=6, rate=math.inf,
                                         concurrency=3, input_len=LengthDist.uniform(100, 200),
                                         output_len=LengthDist.fixed(8))
    # None leaves the profile's default; a point of a sweep changes one axis
    assert "max_num_seqs" not in spec.with_flags(max_num_seqs=None).engine_settings
    assert spec.with_flags(concurrency=8).workload.input_len == LengthDist.uniform(100, 200)
    # a new workload name starts a new workload: a trace has no rate or lengths of its own
    trace = spec.with_flags(workload="trace:t.jsonl")
    assert trace.workload == WorkloadSpec("trace:t.jsonl")
    assert (trace.workload.rate, trace.workload.num_requests) == (None, None)
    assert SimulationSpec.of(workload="chat").workload.rate == 8.0  # a preset's defaults


@pytest.mark.parametrize("flags, match", [
    ({"colour": 1}, "unknown colour; expected concurrency, dp, "),
    ({"engine_settings": {"colour": 1}}, r"engine_settings: unknown \['colour'\]"),
    ({"concurrency": 0}, "concurrency: expected a positive integer"),
    ({"rate": -1}, "rate: expected a number of requests/s > 0 or inf"),
    ({"input_len": "9:3"}, "input_len: expected a token count N >= 1 or a range"),
    ({"seed": -1}, "seed: expected an integer >= 0"),
    ({"model": ""}, "model: expected a non-empty string"),
    ({"slo": {"ttft_s": 0, "tpot_s": 1}}, "ttft_s: expected a positive number"),
])
def test_bad_flags_are_refused_naming_them(flags, match):
    with pytest.raises(ValueError, match=match):
        SimulationSpec.of(**flags)


def test_a_spec_round_trips_through_its_document(tmp_path):
    spec = SimulationSpec(
        model="gpt-oss-120b", hardware="B200", predictor="roofline",
        workload=WorkloadSpec("random", num_requests=40, rate=math.inf, concurrency=8,
                              input_len=LengthDist.lognormal(900, 0.5, 10, 4000),
                              output_len=LengthDist.uniform(80, 100)),
        engine="trtllm", engine_settings={"tensor_parallel_size": 4, "expert_parallel_size": 2},
        weight_dtype="auto", kv_dtype="fp8", slo=SLO(0.5, 0.02), seed=7)
    doc = spec.to_json()
    assert doc["workload"]["rate"] == "inf"  # JSON has no infinity
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    assert SimulationSpec.load(path) == spec == SimulationSpec.from_json(doc)
    with pytest.raises(DocumentError, match=r"the spec lacks the field 'seed'"):
        SimulationSpec.from_json({k: v for k, v in doc.items() if k != "seed"})
    with pytest.raises(DocumentError, match=r"unknown \['colour'\]"):
        SimulationSpec.from_json({**doc, "workload": {**doc["workload"], "colour": 1}})


def test_the_cli_builds_the_spec_of_its_flags():
    args = build_parser().parse_args([
        "simulate", "--model", "llama-3.1-8b", "--hardware", "H100", "--workload", "random",
        "--num-requests", "6", "--rate", "inf", "--concurrency", "3", "--input-len", "100:200",
        "--output-len", "8", "--tp", "2", "--engine", "vllm", "--no-hybrid-kv",
        "--engine-settings", "batch_wait_timeout_iters=4", "--slo-tpot-ms", "50"])
    from gnomon.cli import _serving_spec

    built = _serving_spec(args, sweep=False)
    assert built.axes == {}
    assert built.base == SimulationSpec.of(
        **SMALL, tp=2, ep=1, dp=1, max_num_seqs=None, max_num_batched_tokens=None,
        engine="vllm", enable_hybrid_kv=False, slo={"ttft_s": 2.0, "tpot_s": 0.05},
        engine_settings={"batch_wait_timeout_iters": 4})


def test_a_report_embeds_its_spec_and_simulate_spec_runs_it_again(tmp_path, capsys):
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    assert main(["simulate", *flags, "--tp", "2", "--engine", "sglang", "--out",
                 str(first)]) == 0
    report = reports.load(first)
    spec = SimulationSpec.from_json(report["spec"])
    assert spec.engine_settings["tensor_parallel_size"] == 2 and spec.engine == "sglang"
    # the report records the whole engine the spec resolved to
    assert report["setup"]["engine"]["tensor_parallel_size"] == 2
    assert report["setup"]["engine"]["max_num_batched_tokens"] == 8192  # sglang's, on H100
    assert main(["simulate", "--spec", str(first), "--out", str(again)]) == 0
    assert reports.load(again)["metrics"] == report["metrics"]
    assert simulate(spec)[0]["metrics"] == report["metrics"]
    capsys.readouterr()
    stripped = {k: v for k, v in report.items() if k != "spec"}
    (tmp_path / "old.json").write_text(json.dumps(stripped))
    assert main(["simulate", "--spec", str(tmp_path / "old.json")]) == 2
    assert "this report embeds no spec" in capsys.readouterr().err


def test_a_sweep_is_a_base_spec_and_axes():
    fixed = {k: v for k, v in SMALL.items() if k != "concurrency"}
    sweep = SweepSpec(fixed, {"tp": [1, 2], "concurrency": [2, 4]})
    assert sweep.base == SimulationSpec.of(**fixed)
    specs = [sweep.base.with_flags(**p) for p in sweep.points()]
    assert [(s.engine_settings.get("tensor_parallel_size"), s.workload.concurrency)
            for s in specs] == [(1, 2), (1, 4), (2, 2), (2, 4)]
    assert {s.workload.input_len for s in specs} == {LengthDist.uniform(100, 200)}
    with pytest.raises(ValueError, match="concurrency: given both as an axis and as a fixed"):
        SweepSpec(SMALL, {"concurrency": [2]})
    with pytest.raises(TypeError, match="spec: expected a SimulationSpec"):
        simulate({"model": "llama-3.1-8b"})
