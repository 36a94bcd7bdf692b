"""`gnomon bench` end to end, and its errors."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gnomon import cli
from gnomon.bench import report, results, runner, suites, timing

SHA = "0123456789abcdef0123456789abcdef01234567"
FAST = timing.Sampling(min_samples=3, max_samples=20, time_limit_s=0.02, warmup_calls=1,
                       warmup_s=0)

# Runs the CLI in a fresh interpreter and reports which dashboard modules it imported.
PROBE = """
import json, sys
from gnomon import cli
code = cli.main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'matplotlib')
               or m == 'gnomon.dash' or m.startswith('gnomon.dash.'))
print(json.dumps({"code": code, "heavy": heavy}))
"""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "norm.json"
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "bench", "--quick", "--suite", "norm", "--runs", "2",
         "--out", str(out), "--commit", SHA], capture_output=True, text=True, timeout=120)
    return out, result


def test_quick_norm_sweep_writes_a_loadable_file(two_runs):
    out, result = two_runs
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["code"] == 0
    doc = results.load(out)
    assert doc["commit"] == SHA and doc["mode"] == "hot" and doc["machine"]["device"] == "cpu"
    keys = [c.key for c in suites.cases(["norm"], "cpu", quick=True)]
    assert [run["index"] for run in doc["runs"]] == [0, 1]
    for run in doc["runs"]:
        assert [case["key"] for case in run["cases"]] == keys
        for case in run["cases"]:
            assert case["stats"]["count"] == len(case["samples_ns"]) >= 1
            assert case["stats"]["min"] <= case["stats"]["median"] <= case["stats"]["max"]
            assert case["gbps"] > 0 and case["fraction_of_peak"]["memory"] > 0
    # Separate runs hold separate samples.
    assert doc["runs"][0]["cases"][0]["samples_ns"] is not doc["runs"][1]["cases"][0]["samples_ns"]
    assert doc["peaks"]["memory_gbps"] > 0 and doc["peaks"]["tflops"]["float32"] > 0
    assert doc["created_with"]["build"]["version"] == doc["created_with"]["version"]
    assert f"wrote {out}" in result.stdout
    assert "% peak" in result.stdout
    for key in keys:  # whole keys, brackets included (not eaten as rich markup)
        assert key in result.stdout


def test_bench_imports_no_dashboard_dependency(two_runs):
    _, result = two_runs
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["heavy"] == []


def test_runs_are_interleaved(monkeypatch):
    order = []
    monkeypatch.setattr(runner, "measure_cpu_peaks", lambda llc, quick: {
        "memory_gbps": 10.0, "tflops": {"bfloat16": 1.0}, "source": "test"})
    doc = runner.run_bench(["norm"], runs=2, quick=True, commit=SHA, settings=FAST,
                           progress=lambda done, total, key: order.append((done, total, key)))
    keys = [c.key for c in suites.cases(["norm"], "cpu", quick=True)]
    assert order == [(i, 2 * len(keys), k) for i, k in enumerate(keys + keys)] + [
        (2 * len(keys), 2 * len(keys), "")]
    case = doc["runs"][0]["cases"][0]
    assert case["fraction_of_peak"]["memory"] == pytest.approx(case["gbps"] / 10.0)
    assert case["fraction_of_peak"]["compute"] == pytest.approx(case["tflops"] / 1.0)
    assert case["tflops"] == pytest.approx(case["flops"] / case["stats"]["median"] / 1e3)
    assert case["gbps"] == pytest.approx(case["bytes"] / case["stats"]["median"])
    assert report.table(doc).row_count == len(keys)


def test_each_run_samples_every_case_in_rounds_over_all_the_cases(monkeypatch):
    # three passes over the cases within each run (asv's rounds), so a burst on the machine
    # falls on one pass of a case, not on every sample the run has of it
    order = []
    monkeypatch.setattr(runner, "measure_cpu_peaks", lambda llc, quick: {
        "memory_gbps": 10.0, "tflops": {"bfloat16": 1.0}, "source": "test"})
    settings = replace(FAST, rounds=3)
    doc = runner.run_bench(["norm"], runs=2, quick=True, commit=SHA, settings=settings,
                           progress=lambda done, total, key: order.append(key))
    keys = [c.key for c in suites.cases(["norm"], "cpu", quick=True)]
    assert order == keys * 6 + [""]
    for run in doc["runs"]:
        for case in run["cases"]:
            passes = case["sampling"]["stopped"].split("+")
            assert len(passes) == 3 and set(passes) <= {"converged", "time_limit",
                                                         "max_samples"}
            # a pass stops at its share of the time limit whatever it has (the rule): only the
            # others promise min_samples each; every pass takes one at least
            least = sum(1 if p == "time_limit" else FAST.min_samples for p in passes)
            assert len(case["samples_ns"]) >= least
            assert case["stats"]["count"] == len(case["samples_ns"])
            assert case["sampling"]["rule"]["rounds"] == 3
            assert case["sampling"]["warmup_calls"] >= 3 * FAST.warmup_calls


def test_each_pass_times_inputs_built_for_it_at_new_addresses(monkeypatch):
    # one allocation's placement must not decide a run: every pass of a case gets its own
    # inputs, built while the last pass's are alive, so no two consecutive passes share memory
    monkeypatch.setattr(runner, "measure_cpu_peaks", lambda llc, quick: {
        "memory_gbps": 10.0, "tflops": {"bfloat16": 1.0}, "source": "test"})
    timed = {}
    real = runner._prepare

    def spy(case, *args, **kwargs):
        prepared = real(case, *args, **kwargs)
        real_call = prepared.call

        def call():
            ptrs = tuple(a.data_ptr() for a in prepared.input_sets[0] if hasattr(a, "data_ptr"))
            timed.setdefault(case.key, []).append(ptrs)
            return real_call()

        prepared.call = call
        return prepared

    monkeypatch.setattr(runner, "_prepare", spy)
    settings = replace(FAST, rounds=3)
    runner.run_bench(["norm"], runs=2, quick=True, commit=SHA, settings=settings)
    keys = [c.key for c in suites.cases(["norm"], "cpu", quick=True)]
    assert set(timed) == set(keys)
    for key, calls in timed.items():
        passes = [ptrs for i, ptrs in enumerate(calls) if i == 0 or calls[i - 1] != ptrs]
        assert len(passes) == 2 * 3, key  # 2 runs x 3 passes, each on its own inputs
        assert all(a != b for a, b in zip(passes, passes[1:])), key


def test_each_of_several_runs_is_timed_in_a_process_of_its_own(monkeypatch):
    # a process's state holds for all its runs, so `gnomon bench --runs N` starts N
    launched = []
    real_run = runner.subprocess.run

    def spy(command, *args, **kwargs):
        launched.append(command)
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(runner.subprocess, "run", spy)
    monkeypatch.setattr(runner, "measure_cpu_peaks", lambda llc, quick: {
        "memory_gbps": 10.0, "tflops": {"bfloat16": 1.0}, "source": "test"})
    doc = runner.run_isolated(["norm"], runs=2, quick=True, commit=SHA)
    assert [command[:2] for command in launched] == [[sys.executable, "-c"]] * 2
    assert launched[0][2] == runner.CHILD and launched[0][-1] != launched[1][-1]
    keys = [c.key for c in suites.cases(["norm"], "cpu", quick=True)]
    assert [run["index"] for run in doc["runs"]] == [0, 1] and doc["commit"] == SHA
    for run in doc["runs"]:
        assert [case["key"] for case in run["cases"]] == keys
        for case in run["cases"]:  # against the peaks the parent measured
            assert case["fraction_of_peak"]["memory"] == pytest.approx(case["gbps"] / 10.0)
    # a run whose process fails fails the bench, with that process's own error
    monkeypatch.setattr(runner, "CHILD", "import sys; sys.exit('no such kernel')")
    with pytest.raises(RuntimeError, match=r"(?s)run 1 of 2 failed .*no such kernel"):
        runner.run_isolated(["norm"], runs=2, quick=True, commit=SHA)


def test_cold_mode_rotates_inputs_past_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(runner, "measure_cpu_peaks", lambda llc, quick: {
        "memory_gbps": 10.0, "tflops": {}, "source": "test"})
    monkeypatch.setattr(runner, "last_level_cache_bytes", lambda: (4 << 20, "test"))
    doc = runner.run_bench(["norm"], quick=True, mode="cold", commit=SHA, settings=FAST)
    assert doc["mode"] == "cold"
    for case in doc["runs"][0]["cases"]:
        inputs = case["inputs"]
        assert inputs["cold"] == "rotate" and inputs["copies"] >= 2
        assert inputs["copies"] * inputs["bytes_per_copy"] >= 2 * (4 << 20)
        assert (inputs["copies"] - 1) * inputs["bytes_per_copy"] < 2 * (4 << 20)
        assert case["fraction_of_peak"]["compute"] is None  # no measured peak for bf16 here


def test_cold_mode_flushes_the_cache_for_inputs_too_small_to_rotate(monkeypatch):
    case = suites.cases(["moe"], "cpu", quick=True)[0]  # topk_routing: ~1 KiB of logits
    prepared = runner._prepare(case, "cpu", "cold", 64 << 20)
    assert prepared.inputs_info["cold"] == "flush" and len(prepared.input_sets) == 1
    assert prepared.inputs_info["flush_bytes"] == 128 << 20
    prepared.before_sample()
    assert float(prepared.flush[0]) == 1.0
    hot = runner._prepare(case, "cpu", "hot", 64 << 20)
    assert hot.flush is None and hot.inputs_info == {"bytes_per_copy": hot.inputs_info[
        "bytes_per_copy"], "copies": 1}


def test_rotation_uses_each_input_set_in_turn():
    case = suites.cases(["norm"], "cpu", quick=True)[0]
    prepared = runner._prepare(case, "cpu", "cold", 1 << 20)
    seen = []
    prepared.fn = lambda *args: seen.append(id(args[0]))
    for _ in range(2 * len(prepared.input_sets)):
        prepared.call()
    count = len(prepared.input_sets)
    assert len(set(seen)) == count and seen[:count] == seen[count:]


def error_of(capsys, *argv):
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--suite", "norm,gemm"], "unknown suite 'gemm'; known: attention, moe, mxfp4, norm, comm"),
    (["--device", "tpu"], "--device: unknown device 'tpu'; accepted: cpu, cuda"),
    (["--runs", "0"], "--runs: expected a positive integer, got 0"),
    (["--runs", "two"], "--runs: expected a positive integer, got 'two'"),
    (["--mode", "warm"], "--mode: unknown mode 'warm'; accepted: hot, cold"),
    (["--commit", "abc"], "--commit: expected a full 40-hex-digit git SHA, got 'abc'"),
])
def test_bad_arguments_are_one_line_errors(capsys, tmp_path, argv, message):
    out = tmp_path / "r.json"
    code, err = error_of(capsys, "bench", "--quick", "--suite", "norm", "--out", str(out),
                         "--commit", SHA, *argv)
    assert code == 2
    assert err == f"gnomon: error: {message}\n"
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_on_a_cpu_only_machine_is_an_error(capsys, tmp_path):
    code, err = error_of(capsys, "bench", "--device", "cuda", "--commit", SHA, "--out",
                         str(tmp_path / "r.json"))
    assert code == 2 and err.startswith("gnomon: error: --device cuda: torch sees no CUDA")
    assert err.count("\n") == 1


def test_missing_output_folder_is_an_error_before_any_timing(capsys, tmp_path):
    code, err = error_of(capsys, "bench", "--quick", "--commit", SHA, "--out",
                         str(tmp_path / "no" / "r.json"))
    assert code == 2 and "does not exist" in err and err.count("\n") == 1


def test_default_output_name_uses_the_commit():
    assert runner.default_out(SHA) == Path("bench-0123456789ab.json")


def test_options_default_the_output_to_the_commit_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    options = runner.BenchOptions.from_cli(suite="norm,moe", device="cpu", runs="3", quick=True,
                                           mode="cold", out=None, commit=SHA)
    assert options == runner.BenchOptions(["norm", "moe"], "cpu", 3, True, "cold",
                                          Path("bench-0123456789ab.json"), SHA)


def test_no_checkout_and_no_commit_is_a_one_line_error(capsys, tmp_path, monkeypatch):
    from gnomon.bench import machine

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(machine, "_git_head", lambda directory: None)
    code, err = error_of(capsys, "bench", "--quick")
    assert code == 2 and err.startswith("gnomon: error: cannot read the git commit")
    assert err.endswith("pass --commit SHA\n") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_folder_is_an_error(capsys, tmp_path):
    code, err = error_of(capsys, "bench", "--quick", "--commit", SHA, "--out", str(tmp_path))
    assert code == 2 and "is a folder" in err
