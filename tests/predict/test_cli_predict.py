"""`gnomon simulate`, `gnomon calibrate` and their bad input, through the installed command."""

import json
import subprocess
import sys

import pytest

from gnomon.predict import report as reports
from gnomon.predict import sweep


def gnomon(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "gnomon.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_bare_simulate_runs_the_embedded_case():
    run = gnomon("simulate")
    assert run.returncode == 0, run.stderr
    for text in ("gpt-oss-120b", "MI355X", "TTFT", "queueing", "prefill", "TPOT", "goodput",
                 "KV usage peak", "full attention", "window 128"):
        assert text in run.stdout
    assert "keep full KV" not in run.stdout


def test_no_hybrid_kv_keeps_full_kv_and_says_so(tmp_path):
    runs = {}
    for flags in ((), ("--no-hybrid-kv",)):
        out = tmp_path / f"{len(flags)}.json"
        run = gnomon("simulate", "--num-requests", "20", "--out", str(out), *flags)
        assert run.returncode == 0, run.stderr
        runs[flags] = (run.stdout, reports.load(out))
    (hybrid_text, hybrid), (full_text, full) = runs[()], runs[("--no-hybrid-kv",)]
    assert "keep full KV (hybrid KV cache off)" in full_text and "window 128" not in full_text
    assert [g["window"] for g in hybrid["metrics"]["kv"]["groups"]] == [None, 128]
    assert [g["window"] for g in full["metrics"]["kv"]["groups"]] == [None]
    # gpt-oss-120b has 18 full and 18 sliding layers: a hybrid block holds half the bytes
    blocks = [doc["setup"]["engine"]["num_kv_blocks"] for doc in (hybrid, full)]
    assert blocks[0] in (2 * blocks[1], 2 * blocks[1] + 1)


def test_simulate_writes_report_and_plot(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    run = gnomon("simulate", "--model", "llama-3.1-8b", "--hardware", "H100", "--rate", "4",
                 "--num-requests", "30", "--tp", "2", "--out", str(out), "--plot", str(png))
    assert run.returncode == 0, run.stderr
    doc = reports.load(out)
    assert doc["setup"]["tp"] == 2 and doc["metrics"]["requests"] == 30
    assert doc["metrics"]["steps"]["breakdown_s"]["communication"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_azure_trace(tmp_path):
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:50.9951690,396,109\n"
                     "2023-11-16 18:15:51.2000000,879,20\n")
    run = gnomon("simulate", "--workload", f"trace:{trace}", "--out", str(tmp_path / "r.json"))
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["metrics"]["requests"] == 3
    assert doc["metrics"]["throughput"]["output_tokens"] == 44 + 109 + 20


@pytest.mark.parametrize("args, expected", [
    (["--hardware", "TPU-v5"], ["unknown 'TPU-v5'", "H100 SXM", "MI355X", "A100", "host"]),
    (["--model", "gpt-5"], ["gpt-5", "gpt-oss-120b", "llama-3.1-8b"]),
    (["--predictor", "oracle"], ["oracle", "roofline, calibrated:FILE or table:FILE"]),
    (["--predictor", "calibrated:/nope/cal.json"], ["/nope/cal.json"]),
    (["--workload", "trace:/nope/t.csv"], ["/nope/t.csv"]),
    (["--workload", "burst"], ["burst", "chat", "long-context", "trace:"]),
    (["--model", "llama-3.1-70b", "--hardware", "H100"], ["does not fit", "GB is available"]),
    (["--tp", "3"], ["tp: 3"]),
    (["--rate", "-1"], ["--rate", "inf"]),
    (["--rate", "nan"], ["--rate"]),
    (["--rate", "fast"], ["--rate", "'fast'"]),
    (["--num-requests", "0"], ["num_requests"]),
    (["--concurrency", "0"], ["--concurrency", "positive integer"]),
    (["--concurrency", "-3"], ["--concurrency"]),
    (["--concurrency", "many"], ["--concurrency", "'many'"]),
    (["--input-len", "-5"], ["--input-len", "LOW:HIGH"]),
    (["--output-len", "x"], ["--output-len"]),
    (["--input-len", "900:100"], ["--input-len", "LOW <= HIGH"]),
    (["--max-num-seqs", "0"], ["--max-num-seqs"]),
    (["--max-num-batched-tokens", "-1"], ["--max-num-batched-tokens"]),
    (["--engine", "tgi"], ["engine: unknown 'tgi'", "vllm", "sglang", "gnomon"]),
    (["--weight-dtype", "int4"], ["weight_dtype", "fp8"]),
    (["--kv-dtype", "fp4"], ["kv_dtype", "fp8"]),
    (["--workload", "trace:x.csv", "--input-len", "10"], ["input_len", "trace"]),
    (["--engine-settings", "colour=red"], ["engine_settings: unknown ['colour']",
                                           "batch_wait_timeout_iters"]),
    (["--engine-settings", "batch_wait_timeout_iters"], ["--engine-settings", "KEY=VALUE"]),
    (["--engine-settings", "batch_wait_max_tokens_ratio=2"], ["batch_wait_max_tokens_ratio",
                                                              "[0, 1]"]),
])
def test_bad_input_is_one_line_naming_it(args, expected):
    run = gnomon("simulate", *args, timeout=120)
    assert run.returncode == 2, run.stdout
    err = run.stderr.strip()
    assert err.startswith("gnomon: error:") and len(err.splitlines()) == 1, err
    for text in expected:
        assert text in err


def test_malformed_trace_row_names_its_line(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0.0,10,5\n0.5,ten,5\n")
    run = gnomon("simulate", "--workload", f"trace:{trace}", timeout=120)
    assert run.returncode == 2
    assert f"{trace}:3:" in run.stderr


def test_calibrate_then_simulate_with_it(tmp_path):
    cal = tmp_path / "cal.json"
    run = gnomon("calibrate", "--model", "tiny-llama", "--bench-suites", "",
                 "--num-requests", "40", "--out", str(cal))
    assert run.returncode == 0, run.stderr
    assert "fitted on" in run.stdout
    doc = json.loads(cal.read_text())
    assert doc["kind"] == "gnomon.predict.calibration" and doc["info"]["bench_rows"] == 0
    # one-token prompts a second apart: every step is one sequence's prefill or decode (GEMMs of
    # M = 1), as the calibration's last request ran alone. Longer prompts had GEMMs of M = 4..7,
    # whose features the calibration covers only if its drain passed through 4 or 5 running
    # sequences; under load one went from 6 to 3 or fewer, and the simulation was refused.
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps({"arrival_time": 1.0 * i, "prompt_tokens": 1,
                                           "output_tokens": 8}) for i in range(10)))
    sim = gnomon("simulate", "--model", "tiny-llama", "--hardware", "host", "--predictor",
                 f"calibrated:{cal}", "--workload", f"trace:{trace}")
    assert sim.returncode == 0, sim.stderr
    assert "calibrated(cal.json)" in sim.stdout
    # a workload beyond the calibrated range is refused, not extrapolated
    long = tmp_path / "long.jsonl"  # 500-token sequences; calibration stopped at 320 + 80
    long.write_text(json.dumps({"arrival_time": 0, "prompt_tokens": 450, "output_tokens": 50}))
    far = gnomon("simulate", "--model", "tiny-llama", "--hardware", "host", "--predictor",
                 f"calibrated:{cal}", "--workload", f"trace:{long}")
    assert far.returncode == 2 and "beyond the calibrated range" in far.stderr


def test_cli_defaults_import_no_torch_and_exports_resolve():
    code = ("import sys, gnomon.predict.defaults; assert 'torch' not in sys.modules; "
            "import gnomon.predict as p; "
            "assert all(getattr(p, n).__name__ == n for n in p.__all__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr


def test_rate_sweep_and_slo(tmp_path):
    out = tmp_path / "sweep.json"
    run = gnomon("simulate", "--rate", "2,16", "--num-requests", "40", "--slo-tpot-ms", "0.001",
                 "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert "rate sweep" in run.stdout and "TPOT <= 0.001 ms" in run.stdout
    again = gnomon("simulate", "--rate", "2,16", "--num-requests", "40", "--slo-tpot-ms",
                   "0.001", "--out", str(out))
    assert again.returncode == 0, again.stderr  # simulate replaces its --out
    doc = sweep.load(out)  # a rate list is a one-axis sweep, through gnomon sweep's code
    assert doc["spec"]["axes"] == {"rate": [2.0, 16.0]}
    done = [p["report"] for p in doc["points"]]
    assert [r["setup"]["workload"]["rate"] for r in done] == [2.0, 16.0]
    for r in done:
        reports.validate(r)
        assert r["metrics"]["goodput"]["fraction"] == 0.0  # no TPOT meets 1 µs
    # the same requests, arriving faster: queueing can only grow
    slow, fast = (r["metrics"]["queueing"]["p99"] for r in done)
    assert fast >= slow


@pytest.mark.parametrize("args, expected", [
    (["--rate", "2,x"], "--rate: expected a number of requests/s > 0 or inf, got 'x'"),
    (["--rate", "2,4", "--plot", "p.png"], "--plot: draws one run"),
    (["--slo-ttft-ms", "0"], "ttft_s"),
])
def test_bad_sweep_and_slo_flags(args, expected):
    run = gnomon("simulate", "--num-requests", "5", *args, timeout=120)
    assert run.returncode == 2 and expected in run.stderr, run.stderr


def test_engine_settings_launch_the_simulated_server(tmp_path):
    out = tmp_path / "r.json"
    run = gnomon("simulate", "--model", "tiny-llama", "--hardware", "H100 SXM", "--engine",
                 "trtllm", "--num-requests", "8", "--input-len", "64", "--output-len", "8",
                 "--engine-settings", "batch_wait_timeout_iters=20; batch_wait_max_tokens_ratio=0.9",
                 "--out", str(out), timeout=120)
    assert run.returncode == 0, run.stderr
    engine = json.loads(out.read_text())["setup"]["engine"]
    assert (engine["batch_wait_timeout_iters"], engine["batch_wait_max_tokens_ratio"]) == (20, 0.9)
