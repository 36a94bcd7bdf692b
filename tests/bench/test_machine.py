"""Machine fingerprint, commit resolution and peaks."""

import re
import socket
import subprocess

import pytest

from gnomon.bench import machine, results


def test_fingerprint_uses_stable_fields_only():
    first, second = machine.machine_info("cpu"), machine.machine_info("cpu")
    assert first == second
    assert re.fullmatch(r"[0-9a-f]{16}", first["fingerprint"])
    assert set(first) == {"fingerprint", "device", "cpu_model", "cores", "ram_gb", "gpu_name",
                          "driver", "runtime"}
    assert socket.gethostname() not in set(map(str, first.values())) - {first["cpu_model"]}
    assert isinstance(first["ram_gb"], int) and first["ram_gb"] >= 1
    assert first["gpu_name"] is None


def test_fingerprint_changes_with_a_stable_field(monkeypatch):
    before = machine.machine_info("cpu")["fingerprint"]
    monkeypatch.setattr(machine, "_ram_gb", lambda: 4096)
    assert machine.machine_info("cpu")["fingerprint"] != before


def test_commit_argument_is_validated():
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert machine.resolve_commit(sha.upper()) == sha
    with pytest.raises(ValueError, match="--commit: expected a full 40-hex-digit"):
        machine.resolve_commit("abc123")


def test_commit_is_read_from_the_current_checkout(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f").write_text("x")
    subprocess.run(git + ["-C", str(tmp_path), "add", "f"], check=True)
    subprocess.run(git + ["-C", str(tmp_path), "commit", "-qm", "c"], check=True)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert machine.resolve_commit(None, cwd=tmp_path) == head


def test_no_checkout_and_no_commit_says_pass_commit(monkeypatch, tmp_path):
    monkeypatch.setattr(machine, "_git_head", lambda directory: None)
    with pytest.raises(ValueError, match="pass --commit SHA"):
        machine.resolve_commit(None, cwd=tmp_path)


def test_cpu_peaks_are_measured():
    peaks = machine.measure_cpu_peaks(1 << 20, quick=True)
    assert peaks["memory_gbps"] > 0.1
    assert set(peaks["tflops"]) == {"float32", "bfloat16"}
    assert all(v > 0 for v in peaks["tflops"].values())
    assert "measured in this run" in peaks["source"]
    assert set(peaks["measured_tflops"]) == {"float32", "bfloat16"}
    assert set(peaks["nominal"]["tflops"]) == {"float32", "bfloat16"}
    assert peaks["nominal"]["simd"] == machine.simd_path(machine.cpu_flags())
    # a trusted peak is a measured one (or fp32's standing in for bf16), never the nominal
    for dtype, rate in peaks["tflops"].items():
        assert rate == peaks["measured_tflops"][peaks["stand_ins"].get(dtype, dtype)]
    assert "float32" not in peaks["implausible"]  # torch's fp32 GEMM is sound everywhere
    units = peaks["vector_units"]
    from gnomon import _C

    assert units["kernel_isa"] == _C.cpu_kernel_isa()
    assert units["tflops"]["float32"] > 0
    assert ("bfloat16" in units["tflops"]) == (units["kernel_isa"] in ("avx512-bf16", "amx-bf16"))


AVX2 = {"sse2", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl"}


@pytest.mark.parametrize("flags, path, fp32, bf16", [
    (AVX2, "avx2_fma", 32, 32),
    (AVX2 - {"fma"}, "baseline", 8, 8),  # AVX2 without FMA: no FMA rate is assumed
    (AVX512, "avx512", 64, 64),
    (AVX512 | {"avx512_bf16"}, "avx512_bf16", 64, 128),
    (AVX512 | {"avx512_bf16", "amx_bf16", "amx_tile"}, "amx_bf16", 64, 1024),
    ({"fp", "asimd"}, "neon", 16, 16),
    (set(), "baseline", 8, 8),
])
def test_nominal_rate_is_cores_times_clock_times_flops_per_cycle(flags, path, fp32, bf16):
    nominal = machine.nominal_cpu_peaks(4, flags=flags, ghz=3.0, clock_source="test", cores=4)
    assert nominal["simd"] == path
    assert nominal["flops_per_cycle"] == {"float32": fp32, "bfloat16": bf16}
    assert nominal["tflops"]["float32"] == pytest.approx(4 * 3.0e9 * fp32 / 1e12)
    assert nominal["tflops"]["bfloat16"] == pytest.approx(4 * 3.0e9 * bf16 / 1e12)
    assert "3 GHz (test)" in nominal["source"] and path in nominal["source"]


def test_nominal_rate_counts_no_more_cores_than_threads_or_the_machine_has():
    one = machine.nominal_cpu_peaks(1, flags=AVX2, ghz=2.0, cores=8)
    assert one["cores"] == 1 and one["tflops"]["float32"] == pytest.approx(2.0e9 * 32 / 1e12)
    assert machine.nominal_cpu_peaks(16, flags=AVX2, ghz=2.0, cores=2)["cores"] == 2


def test_flags_and_smt_are_read_from_cpuinfo(monkeypatch):
    x86 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\nsiblings\t: 8\ncpu cores\t: 4\n"
    assert machine.cpu_flags(x86) == {"fpu", "sse2", "avx2", "fma"}
    assert machine.cpu_flags("Features\t: fp asimd evtstrm\n") == {"fp", "asimd", "evtstrm"}
    assert machine.cpu_flags("") == set()
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert machine.physical_cores(x86) == 4  # an SMT pair shares its FMA units
    assert machine.physical_cores("") == 8


def test_the_clock_comes_from_sysfs_then_cpuinfo_then_the_model_name(tmp_path):
    (tmp_path / "cpuinfo_max_freq").write_text("3500000\n")  # kHz
    assert machine.cpu_ghz("", sysfs=str(tmp_path)) == (3.5, f"{tmp_path}/cpuinfo_max_freq")
    missing = str(tmp_path / "none")
    text = "cpu MHz\t\t: 1800.000\ncpu MHz\t\t: 2596.102\nmodel name\t: X @ 2.20GHz\n"
    assert machine.cpu_ghz(text, sysfs=missing) == (2.5961, "/proc/cpuinfo cpu MHz")
    assert machine.cpu_ghz("model name\t: Intel Xeon @ 2.20GHz\n", sysfs=missing) == (
        2.2, "/proc/cpuinfo model name")
    ghz, source = machine.cpu_ghz("", sysfs=missing)
    assert ghz == machine.FALLBACK_GHZ and "assumed" in source


def _fake_timing(monkeypatch, seconds):
    """Replaces the timed loop: each matmul 'call' returns its dtype, and its time is
    seconds[dtype] (a list: one value per measurement, the last repeated). Returns the calls
    made, as (dtype, repeats, min_seconds)."""
    calls = []

    def best(fn, repeats, min_seconds, warmup=True, cap=None):
        what = fn()
        if not isinstance(what, str):
            return 0.01  # the copy
        calls.append((what, repeats, min_seconds))
        times = seconds[what]
        return times[min(sum(c[0] == what for c in calls) - 1, len(times) - 1)]

    monkeypatch.setattr(machine, "_best_seconds", best)
    return calls


FLOPS_512 = 2 * 512 ** 3


def test_an_implausibly_slow_measurement_is_measured_again_longer_then_not_used(monkeypatch):
    # nominal 2 TFLOP/s fp32 and 4 bf16 (avx512_bf16 on 8 cores at 3.9 GHz)
    nominal = machine.nominal_cpu_peaks(8, flags=AVX512 | {"avx512_bf16"}, ghz=3.90625, cores=8)
    fp32_s = FLOPS_512 / 1.0e12  # 1 TFLOP/s: half the nominal, sound
    bf16_s = FLOPS_512 / 0.9e9   # 0.9 GFLOP/s: 1/4400 of the nominal, as seen on a loaded box
    calls = _fake_timing(monkeypatch, {"float32": [fp32_s], "bfloat16": [bf16_s]})
    peaks = machine.measure_cpu_peaks(1 << 20, quick=True, nominal=nominal,
                                      matmul=lambda dtype, n: (lambda: dtype))
    first = [c for c in calls if c[0] == "float32"]
    slow = [c for c in calls if c[0] == "bfloat16"]
    assert len(first) == 2  # best of two rounds, not measured again
    assert len(slow) == 3 and slow[-1][1] == 2 * slow[0][1] and slow[-1][2] >= 4 * slow[0][2]
    assert peaks["tflops"] == {"float32": pytest.approx(1.0)}  # no bf16 peak at all
    assert peaks["measured_tflops"]["bfloat16"] == pytest.approx(0.0009)
    assert "not used as a peak" in peaks["implausible"]["bfloat16"]
    assert "1/16" in peaks["implausible"]["bfloat16"]
    assert peaks["nominal"] == nominal and peaks["floor_fraction"] == machine.FLOOR_FRACTION
    assert "measured again" in peaks["source"]
    results._check_peaks(peaks, "peaks", "test")  # the results schema holds the new fields


def test_a_measurement_that_recovers_when_measured_longer_is_used(monkeypatch):
    nominal = machine.nominal_cpu_peaks(2, flags=AVX2, ghz=2.5, cores=2)  # 0.16 TFLOP/s
    busy, quiet = FLOPS_512 / 1e9, FLOPS_512 / 0.1e12  # 1 GFLOP/s while busy, 0.1 TFLOP/s
    _fake_timing(monkeypatch, {"float32": [busy, busy, quiet], "bfloat16": [quiet]})
    peaks = machine.measure_cpu_peaks(1 << 20, quick=True, nominal=nominal,
                                      matmul=lambda dtype, n: (lambda: dtype))
    assert peaks["tflops"] == {"float32": pytest.approx(0.1), "bfloat16": pytest.approx(0.1)}
    assert peaks["implausible"] == {}


def test_without_bf16_arithmetic_the_fp32_rate_stands_in_for_an_implausible_bf16():
    nominal = machine.nominal_cpu_peaks(2, flags=AVX2, ghz=2.5, cores=2)  # 0.16 TFLOP/s
    peaks = machine.cpu_peaks(20.0, {"float32": 0.1, "bfloat16": 0.0009}, nominal, "test")
    assert peaks["tflops"] == {"float32": 0.1, "bfloat16": 0.1}
    assert peaks["stand_ins"] == {"bfloat16": "float32"} and "bfloat16" in peaks["implausible"]
    assert "FMA rate" in peaks["source"]
    # with bf16 arithmetic (AVX512-BF16) fp32 is no bound for bf16: no stand-in, no bf16 peak
    native = machine.nominal_cpu_peaks(2, flags=AVX512 | {"avx512_bf16"}, ghz=2.5, cores=2)
    peaks = machine.cpu_peaks(20.0, {"float32": 0.1, "bfloat16": 0.0009}, native, "test")
    assert peaks["tflops"] == {"float32": 0.1} and peaks["stand_ins"] == {}
    # the floor is FLOOR_FRACTION of nominal, inclusive
    at_floor = machine.FLOOR_FRACTION * native["tflops"]["bfloat16"]
    assert "bfloat16" in machine.cpu_peaks(1.0, {"bfloat16": at_floor}, native, "t")["tflops"]
    below = at_floor * 0.99
    assert machine.cpu_peaks(1.0, {"bfloat16": below}, native, "t")["tflops"] == {}


def test_the_better_of_before_and_after_is_judged_again():
    from gnomon.bench import runner

    native = machine.nominal_cpu_peaks(2, flags=AVX512 | {"avx512_bf16"}, ghz=2.5, cores=2)
    before = machine.cpu_peaks(20.0, {"float32": 0.1, "bfloat16": 0.001}, native, "m")
    after = machine.cpu_peaks(25.0, {"float32": 0.09, "bfloat16": 0.3}, native, "m")
    best = runner.best_peaks(before, after)
    assert best["tflops"] == {"float32": 0.1, "bfloat16": 0.3} and best["implausible"] == {}
    assert best["memory_gbps"] == 25.0 and best["measurements"] == [before, after]
    units = {"kernel_isa": "avx512-bf16", "source": "s"}
    before["vector_units"] = dict(units, tflops={"float32": 0.2, "bfloat16": 0.1})
    after["vector_units"] = dict(units, tflops={"float32": 0.1, "bfloat16": 0.4})
    assert runner.best_peaks(before, after)["vector_units"] == dict(
        units, tflops={"float32": 0.2, "bfloat16": 0.4})
    worse = runner.best_peaks(before, before)
    assert "bfloat16" in worse["implausible"] and "bfloat16" not in worse["tflops"]
    assert worse["source"].count("the better of before and after") == 1


def test_gpu_peaks_come_from_the_catalogue_or_not_at_all():
    peaks = machine.gpu_peaks("NVIDIA H200")
    assert peaks["memory_gbps"] == 4800 and peaks["tflops"]["bfloat16"] == 989
    assert "fp4" not in peaks["tflops"]
    unknown = machine.gpu_peaks("NVIDIA A10")
    assert unknown["memory_gbps"] is None and unknown["tflops"] == {}
