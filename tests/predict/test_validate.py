"""A CI-sized `gnomon validate`: the whole pipeline on few requests. The report's structure
and sanity are asserted; accuracy goals are not (a 2-core CI machine's noise would make them
flaky), the closing note reports the full run's figures."""

import json
import math

import pytest

from gnomon.predict import validate as val

FIGURES = ("ttft_error", "tpot_error", "throughput_error")


@pytest.fixture(scope="module")
def report():
    return val.validate(num_requests=24, calibration_requests=60, bench_suites=("norm",))


def test_report_has_the_named_figures(report):
    for key in ("median", "p90", "max", "bias"):
        assert math.isfinite(report["step_ape"][key])
        assert math.isfinite(report["noise_floor"]["step_ape"][key])
    for key in FIGURES:
        assert math.isfinite(report[key]) and math.isfinite(report["noise_floor"][key])
    assert report["step_ape"]["median"] <= report["step_ape"]["p90"] <= report["step_ape"]["max"]
    json.dumps(report, allow_nan=False)


def test_steps_are_counted_by_kind(report):
    by_kind = report["step_ape_by_kind"]
    assert sum(by_kind[k]["count"] for k in ("prefill", "decode", "mixed")) == \
        report["step_ape"]["count"] == report["steps"]["real"]
    # the paced repeat timed exactly the first run's batches
    assert report["noise_floor"]["step_ape"]["count"] == report["steps"]["real"]


def test_calibration_is_held_out(report):
    calibration = report["setup"]["calibration"]
    assert calibration["workload"] != report["setup"]["workload"]
    assert calibration["bench_rows"] > 0 and calibration["step_rows"] > 0


@pytest.mark.timing
def test_predictions_are_sane(report):
    # Far looser than the goal: a broken feature or fit lands at tens of percent or worse. Only
    # per-step figures are asserted: a 24-request run's TTFT, TPOT and throughput swing by tens
    # of percent when anything else shares the machine (seen: +209% throughput error while
    # compilers ran beside it). The plain per-step median does too when a process starts or
    # stops between the calibration and the real run (seen: 90% with one CPU-bound process
    # beside the suite): that scales every step, so the error is asserted up to one factor,
    # and the factor itself only against a unit or scale bug. `gnomon validate`'s goal gate,
    # on a quiet machine, holds the plain figure to 5%.
    shape = report["step_ape_rescaled"]
    assert shape["median"] < 0.5, shape
    assert 0.25 < shape["factor"] < 4, shape
    print(f"step APE median {report['step_ape']['median']:.1%}; rescaled by "
          f"{shape['factor']:.3f}: {shape['median']:.1%}")


def test_rescaled_errors_take_out_one_common_factor():
    # every step predicted 2x too slow, two of them off by a further +-10%
    errors = [1.0, 1.0, 1.0, 2.0 * 1.1 - 1, 2.0 * 0.9 - 1]
    out = val.rescaled(errors)
    assert out["factor"] == pytest.approx(2.0)
    assert out["median"] == pytest.approx(0.0)
    assert out["max"] == pytest.approx(0.1)
    assert out["count"] == 5
    assert val.rescaled([])["factor"] is None


def test_goal_rows_use_the_noise_floor_rule(report):
    for name, row in report["goal"].items():
        floor = row["noise_floor"]
        assert row["bound"] == (1.5 * floor if floor > 0.033 else 0.05)
        assert row["met"] == (abs(row["value"]) <= row["bound"])


def test_a_slower_machine_runs_smaller_workloads_at_the_same_load():
    from types import SimpleNamespace

    def warm_up(busy_per_request):
        return SimpleNamespace(steps=[SimpleNamespace(seconds=busy_per_request)] * 15,
                               workload=SimpleNamespace(num_requests=15))

    budget = val.REAL_RUN_BUDGET_S
    assert val.machine_scale(warm_up(budget / 240), 120) == 1.0  # fast enough: full size
    assert val.machine_scale(warm_up(budget / 60), 120) == pytest.approx(0.5)
    assert val.machine_scale(warm_up(budget), 120) == val.MIN_SCALE


def test_report_records_its_scale(report):
    assert 0 < report["setup"]["scale"] <= 1


@pytest.fixture(scope="module")
def report_tp2():
    return val.validate(num_requests=12, calibration_requests=60, bench_suites=("norm",),
                        scale=1.0, tp=2)


def test_tp2_validates_a_tensor_parallel_run_and_reports_its_communication(report_tp2):
    import multiprocessing

    setup = report_tp2["setup"]
    assert setup["tp"] == 2 and setup["calibration"]["tp"] == 2
    assert "comm" in setup["calibration"]["bench"]  # the collectives' rows joined the fit
    real, simulated = (report_tp2["breakdown_s"][k]["communication"] for k in ("real",
                                                                              "simulated"))
    assert real > 0 and simulated > 0  # measured by the runner, priced by the predictor
    assert 0 < report_tp2["communication_share"] < 1
    assert report_tp2["step_ape"]["count"] == report_tp2["steps"]["real"] > 0
    assert report_tp2["step_ape"]["median"] < 0.5  # as loose as at tp 1 (see above)
    # this CPU's catalogue entry has no interconnect: the uncalibrated roofline says so
    assert "interconnect bandwidth" in report_tp2["roofline"]["refused"]
    json.dumps(report_tp2, allow_nan=False)
    assert not multiprocessing.active_children()  # every engine's workers were shut down


def test_the_report_is_a_document_the_dashboard_ingests(report, tmp_path):
    from gnomon.predict import accuracy

    path = tmp_path / "validation.json"
    val.dump(report, path)
    doc = accuracy.load(path)
    assert len(doc["commit"]) == 40 and doc["machine"]["device"] == "cpu"
    figures = accuracy.figures(doc)
    assert set(figures) == set(accuracy.FIGURES)
    assert figures["step_ape_median"] == (report["step_ape"]["median"],
                                          report["noise_floor"]["step_ape"]["median"])
    assert figures["ttft_error"][0] == abs(report["ttft_error"])


def test_the_uncalibrated_roofline_is_reported_beside(report):
    # the roofline of this machine as measured, with gnomon's host cost and no fit to it
    r = report["roofline"]
    assert r["predictor"].startswith("roofline") and report["setup"]["hardware"] == "host"
    assert r["step_ape"]["count"] == report["steps"]["real"]
    for key in FIGURES:
        assert math.isfinite(r[key])
    assert r["simulated"]["tpot"] > 0
