"""`gnomon bench`'s table: fractions of peak, a fraction above 100% flagged, peaks left out;
and the results schema's peaks, old and new."""

import copy

import pytest
from rich.console import Console

from gnomon.bench import machine, report, results
from gnomon.documents import DocumentError

SHA = "0123456789abcdef0123456789abcdef01234567"


def _case(key: str, median_ns: float, flops: int, nbytes: int) -> dict:
    stats = {"count": 3, "min": median_ns, "q1": median_ns, "median": median_ns,
             "q3": median_ns, "max": median_ns}
    return {"key": key, "suite": "norm", "op": "rms_norm", "params": {}, "dtypes": {},
            "definition_hash": "0" * 16, "samples_ns": [int(median_ns)] * 3, "stats": stats,
            "flops": flops, "bytes": nbytes, "tflops": flops / median_ns / 1e3,
            "gbps": nbytes / median_ns, "fraction_of_peak": {"compute": None, "memory": None},
            "compute_dtype": "bfloat16"}


def _doc(peaks: dict) -> dict:
    # 1e6 FLOPs in 1 µs = 1 TFLOP/s; 1e4 bytes in 1 µs = 10 GB/s
    cases = [_case("norm/over", 1000.0, 1_000_000, 10_000),
             _case("norm/under", 1000.0, 100_000, 1_000)]
    return results.validate({
        "schema_version": 1, "kind": results.KIND, "commit": SHA,
        "created_with": {"version": "0.1.0", "build": {}},
        "machine": {"fingerprint": "0" * 16, "device": "cpu", "cpu_model": "Test CPU",
                    "cores": 2, "ram_gb": 8, "gpu_name": None, "driver": None,
                    "runtime": None},
        "peaks": peaks, "mode": "hot", "runs": [{"index": 0, "cases": cases}]})


def _text(doc: dict) -> str:
    console = Console(width=400, record=True)
    console.print(report.table(doc))
    return console.export_text()


def _row(text: str, key: str) -> str:
    return next(line for line in text.splitlines() if key + " " in line)


def test_a_fraction_above_100_percent_is_flagged_with_a_footnote():
    # a bf16 peak of 0.25 TFLOP/s against a case at 1 TFLOP/s: 400%
    text = _text(_doc({"memory_gbps": 50.0, "tflops": {"bfloat16": 0.25}, "source": "test"}))
    assert "400.0% (!)" in _row(text, "norm/over")
    assert "40.0%" in _row(text, "norm/under") and "(!)" not in _row(text, "norm/under")
    assert report.ABOVE_PEAK_NOTE.split(":")[0] in text and "suspect" in text


def test_fractions_within_the_peaks_carry_no_flag_and_no_footnote():
    text = _text(_doc({"memory_gbps": 50.0, "tflops": {"bfloat16": 2.0}, "source": "test"}))
    assert "50.0%" in _row(text, "norm/over") and "(!)" not in text
    assert "suspect" not in text


def test_a_memory_fraction_above_100_percent_is_flagged_too():
    text = _text(_doc({"memory_gbps": 5.0, "tflops": {}, "source": "test"}))
    assert "200.0% (!)" in _row(text, "norm/over") and "suspect" in text


def test_an_implausible_peak_gives_no_fraction_and_the_caption_says_why():
    nominal = machine.nominal_cpu_peaks(2, flags={"avx2", "fma"}, ghz=2.5, cores=2)
    nominal["flops_per_cycle"]["bfloat16"] = 64  # pretend bf16 arithmetic: no fp32 stand-in
    peaks = machine.cpu_peaks(50.0, {"float32": 0.1, "bfloat16": 0.000914}, nominal, "test")
    text = _text(_doc(peaks))
    assert "(!)" not in text  # no 1000% figures
    over = _row(text, "norm/over").split("│")
    assert over[-3].strip() == "—"  # % peak compute: no peak to take it against
    assert "not used as peaks" in text and "bfloat16 measured 0.000914" in text


OLD_PEAKS = {"memory_gbps": 50.0, "tflops": {"float32": 1.5, "bfloat16": 3.0},
             "source": "measured"}


def test_results_accept_old_and_new_peaks():
    _doc(copy.deepcopy(OLD_PEAKS))
    _doc({"memory_gbps": None, "tflops": {}, "source": "GPU not in gnomon.hardware"})
    nominal = machine.nominal_cpu_peaks(2, flags={"avx2", "fma"}, ghz=2.5, cores=2)
    new = machine.cpu_peaks(50.0, {"float32": 0.1, "bfloat16": 0.0009}, nominal, "test")
    from gnomon.bench.runner import best_peaks
    _doc(best_peaks(new, copy.deepcopy(new)))


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p.pop("source"), "lacks the field 'source'"),
    (lambda p: p["tflops"].update(bfloat16="fast"), "peaks.tflops"),
    (lambda p: p.update(measured_tflops={"float32": -1.0}), "peaks.measured_tflops"),
    (lambda p: p.update(implausible={"bfloat16": 3}), "peaks.implausible"),
    (lambda p: p.update(nominal={"tflops": {}}), "peaks.nominal lacks the field 'simd'"),
    (lambda p: p.update(measurements=[{"tflops": {}}]), "peaks.measurements[0]"),
])
def test_results_refuse_bad_peaks(mutate, message):
    peaks = copy.deepcopy(OLD_PEAKS)
    mutate(peaks)
    with pytest.raises(DocumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _doc(peaks)
