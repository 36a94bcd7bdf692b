"""The predict report: build, JSON round trip, refusals, table and plot."""

import io
import json

import pytest
from rich.console import Console

import gnomon
from gnomon.documents import DocumentError
from gnomon.predict import report as rpt
from gnomon.predict.metrics import SLO, compute_metrics

from predict.test_metrics import make_trace

SETUP = {"model": "tiny-llama", "hardware": "H100-SXM", "predictor": "roofline", "tp": 1,
         "workload": {"name": "hand", "description": "three hand-made requests"},
         "engine_args": {"block_size": 16, "max_num_seqs": 256}}
LIMITS = ["no CPU overhead between steps is modelled", "activation memory is an estimate"]


def _report():
    trace = make_trace()
    return rpt.build_report(trace=trace, metrics=compute_metrics(trace, SLO(1.2, 0.15)),
                            setup=SETUP, limits=LIMITS)


def test_build_report_fields():
    r = _report()
    assert r["schema_version"] == rpt.SCHEMA_VERSION == 1
    assert r["kind"] == rpt.KIND == "gnomon.predict.report"
    assert rpt.ACCEPTED_VERSIONS == (1,)
    assert r["created_with"] == {"version": gnomon.__version__}
    assert r["setup"] == SETUP and r["limits"] == LIMITS
    assert r["wall_seconds"] == 0.25
    assert r["metrics"]["requests"] == 3


def test_dump_load_round_trip(tmp_path):
    r = _report()
    path = tmp_path / "report.json"
    rpt.dump(r, path)
    assert rpt.load(path) == r
    assert json.loads(path.read_text())["kind"] == rpt.KIND


def _write(tmp_path, doc, name="bad.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.mark.parametrize("change,message", [
    ({"metrics": None}, r"the report.metrics is NoneType; expected an object"),
    ({"limits": [1]}, r"limits: expected a list of strings"),
])
def test_load_refuses_wrong_documents(tmp_path, change, message):
    path = _write(tmp_path, {**_report(), **change})
    with pytest.raises(DocumentError, match=message) as info:
        rpt.load(path)
    assert str(path) in str(info.value)


def test_load_names_a_missing_field(tmp_path):
    # the header, JSON and file errors are the documents module's (tests/test_documents.py)
    doc = _report()
    del doc["setup"]
    with pytest.raises(DocumentError, match="lacks the field 'setup'"):
        rpt.load(_write(tmp_path, doc))


def test_dump_refuses_nan(tmp_path):
    r = _report()
    r["metrics"]["duration_s"] = float("nan")
    path = tmp_path / "nan.json"
    with pytest.raises(DocumentError, match="metrics.duration_s is not a finite number") as info:
        rpt.dump(r, path)
    assert str(path) in str(info.value) and not path.exists()


def test_render_table_rows():
    buf = io.StringIO()
    console = Console(file=buf, width=200, record=True)
    rpt.render_table(_report(), console=console)
    text = console.export_text()
    lines = text.splitlines()
    for label in ("TTFT", "queueing", "prefill", "TPOT", "ITL", "E2E", "throughput", "goodput",
                  "KV usage peak", "KV usage mean", "prefix hit rate", "preemptions", "steps",
                  "Limits:", "tiny-llama", "roofline"):
        assert label in text, label
    ttft = next(line for line in lines if line.lstrip("│ ").startswith("TTFT"))
    # count, mean, p50, p90, p99, max in ms
    for cell in ("3", "900.00", "1000.00", "1400.00", "1490.00", "1500.00"):
        assert cell in ttft.split(), (cell, ttft)
    queue = next(line for line in lines if "queueing" in line and "│" in line)
    assert "500.00" in queue.split() and "1000.00" in queue.split()
    order = [text.index(s) for s in ("TTFT", "queueing", "prefill", "TPOT", "ITL", "E2E")]
    assert order == sorted(order)
    assert "33.3% of requests good" in text and "1 missed TTFT, 1 missed TPOT" in text
    assert "60.0%" in text and "of 100 blocks" in text
    assert "4 of 12 queried tokens" in text
    assert "1 prefill-only, 1 decode-only, 1 mixed" in text
    assert "attention 0.15 s, gemm 0.7 s, unattributed 0.15 s" in text
    for limit in LIMITS:
        assert f"• {limit}" in text
    assert buf.getvalue()  # printed to the given console, not stdout


def test_render_table_without_tpot_or_prefix_queries():
    trace = make_trace(requests=[("x", 3, 0.0, 0.0, 0.1, 0.1, [0.1])], queried=0, hit=0)
    doc = rpt.build_report(trace=trace, metrics=compute_metrics(trace), setup={}, limits=[])
    console = Console(file=io.StringIO(), width=200, record=True)
    rpt.render_table(doc, console=console)
    text = console.export_text()
    tpot = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("TPOT"))
    assert tpot.split().count("—") == 5
    assert "Limits:" not in text


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "report.png"
    rpt.plot(_report(), path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_plot_needs_per_request(tmp_path):
    pytest.importorskip("matplotlib")
    r = _report()
    del r["metrics"]["per_request"]
    with pytest.raises(ValueError, match="per_request"):
        rpt.plot(r, tmp_path / "x.png")
