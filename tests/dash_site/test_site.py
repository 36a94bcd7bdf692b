"""The static site: pages, escaping, validation and the all-or-nothing write."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

import pytest

from gnomon.dash import site
from gnomon.dash.site import write_site

from .conftest import COMMITS, FINGERPRINT, SLOW, STEADY

PAGES = ("index.html", "sweep.html", "roofline.html", "accuracy.html", "compare.html",
         "machines.html", "style.css")


def _read(path) -> str:
    return path.read_text(encoding="utf-8")


def _bench_pages(out):
    return sorted((out / "bench").glob("*.html"))


def test_all_pages_exist_and_name_every_benchmark(tmp_path, data):
    out = tmp_path / "site"
    files = write_site(data, out)
    assert all(f.is_file() and f.parent.resolve().is_relative_to(out.resolve()) for f in files)
    for name in PAGES:
        assert out / name in files
    pages = _bench_pages(out)
    assert len(pages) == 2
    svgs = sorted((out / "plots").glob("*.svg"))
    assert len(svgs) == 5  # two time series, one sweep, one roofline, one accuracy series
    for svg in svgs:
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg")
    for key in (SLOW, STEADY):
        for name in ("index.html", "sweep.html", "roofline.html", "compare.html"):
            assert html.escape(key) in _read(out / name), (key, name)
        assert sum(f"<h1>{html.escape(key)}</h1>" in _read(p) for p in pages) == 1
    # every local link and image resolves
    for page in [out / p for p in PAGES if p.endswith(".html")] + pages:
        for target in re.findall(r'(?:href|src)="([^"#:]+)"', _read(page)):
            assert (page.parent / html.unescape(target)).is_file(), (page.name, target)
    # the index shows the latest median and a sparkline per benchmark
    index = _read(out / "index.html")
    assert index.count('<svg class="spark"') == 2
    machines = _read(out / "machines.html")
    assert "0123456789abcdef" in machines and "Test CPU @ 3.0GHz" in machines
    assert "40" in machines and "bf16: 1.2" in machines


def _section(text: str, element_id: str) -> str:
    start = text.index(f'id="{element_id}"')
    return text[start:text.index("</table>", start)]


def test_regression_is_listed_on_index_and_compare(tmp_path, data):
    out = tmp_path / "site"
    write_site(data, out)
    regressions = _section(_read(out / "index.html"), "regressions")
    assert html.escape(SLOW) in regressions
    assert html.escape(STEADY) not in regressions
    assert "open" in regressions and "+15.0%" in regressions and COMMITS[3][:8] in regressions
    compare = _read(out / "compare.html")
    rows = re.findall(r'<tr class="verdict-(\w+)">(.*?)</tr>', compare, re.S)
    assert [(verdict, html.escape(SLOW) in row) for verdict, row in rows] == [
        ("REGRESSION", True), ("SAME", False)]
    page = next(p for p in _bench_pages(out) if f"<h1>{html.escape(SLOW)}</h1>" in _read(p))
    assert "+15.0%" in _section(_read(page), "steps")


def test_acknowledged_step_shows_reason_and_fixed_step_leaves_the_index(tmp_path, data):
    step = data["benchmarks"][0]["steps"][0]
    step.update(state="acknowledged", reason="expected: <new> kernel & layout")
    write_site(data, tmp_path / "a")
    regressions = _section(_read(tmp_path / "a" / "index.html"), "regressions")
    assert "acknowledged" in regressions
    assert "expected: &lt;new&gt; kernel &amp; layout" in regressions
    step["state"] = "fixed"
    write_site(data, tmp_path / "b")
    index = _read(tmp_path / "b" / "index.html")
    assert 'id="regressions"' in index and "No open or acknowledged" in index


def test_text_is_escaped_and_file_names_are_safe(tmp_path, data):
    evil = 'attention/x[<script>alert("x")</script>&"\'/../../etc]'
    data["benchmarks"][0]["key"] = evil
    data["benchmarks"][0]["op"] = "<b>op</b>"
    data["compare"]["rows"][0]["key"] = evil
    data["machines"][0]["cpu_model"] = "<img src=x onerror=alert(1)>"
    out = tmp_path / "site"
    files = write_site(data, out)
    for f in files:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", f.name), f
        if f.suffix in (".html", ".svg"):
            text = _read(f)
            assert "<script" not in text and "<b>op" not in text and "<img src=x" not in text
    assert html.escape(evil) in _read(out / "index.html")
    assert html.escape(evil) in _read(out / "compare.html")


def test_keys_that_slug_alike_get_different_pages(tmp_path, data):
    data["benchmarks"][1]["key"] = SLOW.replace("[", "(")  # same slug, different key
    write_site(data, tmp_path / "site")
    assert len(_bench_pages(tmp_path / "site")) == 2


@pytest.mark.parametrize("path, name", [
    (("machines", 0), "cores"),
    (("benchmarks", 1), "definition_hash"),
    (("benchmarks", 0, "series", 2), "q1_ns"),
    (("benchmarks", 0, "steps", 0), "state"),
    (("compare", "rows", 0), "verdict"),
    (("peaks", "0123456789abcdef"), "memory_gbps"),
    ((), "compare"),
])
def test_missing_field_raises_value_error_naming_it(tmp_path, data, path, name):
    obj = data
    for part in path:
        obj = obj[part]
    del obj[name]
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        write_site(data, tmp_path / "site")
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["benchmarks"][0].update(machine="ffff"), "not in machines"),
    (lambda d: d["benchmarks"][0]["steps"][0].update(state="closed"), "state 'closed'"),
    (lambda d: d["benchmarks"][0]["steps"][0].update(commit="f" * 40), "not in the benchmark"),
    (lambda d: d["compare"]["rows"][0].update(verdict="WORSE"), "verdict 'WORSE'"),
    (lambda d: d["benchmarks"][0]["series"][1].update(median_ns="fast"), "median_ns"),
    (lambda d: d["benchmarks"][0]["series"][1].update(median_ns=float("nan")), "finite"),
    (lambda d: d["benchmarks"][0]["series"][1].update(commit=COMMITS[0]), "repeats commit"),
    (lambda d: d.update(benchmarks={}), "benchmarks"),
])
def test_bad_values_raise_value_error(tmp_path, data, mutate, message):
    mutate(data)
    with pytest.raises(ValueError, match=re.escape(message)):
        write_site(data, tmp_path / "site")


def test_optional_parts_may_be_absent(tmp_path, data):
    data["compare"] = None
    data["peaks"] = {}
    data["benchmarks"][1]["series"] = []
    data["benchmarks"][1]["params"] = {"dtype": "bf16"}
    out = tmp_path / "site"
    write_site(data, out)
    assert "No comparison" in _read(out / "compare.html")
    assert "no ceilings" in _read(out / "roofline.html")


def test_failed_render_leaves_no_site_and_keeps_the_old_one(tmp_path, data, monkeypatch):
    out = tmp_path / "site"

    def boom(self):
        raise RuntimeError("render failed")

    monkeypatch.setattr(site._Site, "roofline", boom)
    with pytest.raises(RuntimeError, match="render failed"):
        write_site(data, out)
    assert list(tmp_path.iterdir()) == []  # no site, no temporary folder

    monkeypatch.undo()
    write_site(data, out)
    before = _read(out / "index.html")
    monkeypatch.setattr(site._Site, "roofline", boom)
    data["benchmarks"][0]["key"] = "changed/key"
    with pytest.raises(RuntimeError):
        write_site(data, out)
    assert _read(out / "index.html") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_rewrite_replaces_an_old_site_but_refuses_other_folders(tmp_path, data):
    out = tmp_path / "site"
    write_site(data, out)
    (out / "bench" / "stale.html").write_text("old")
    write_site(data, out)
    assert not (out / "bench" / "stale.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]

    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holds other files"):
        write_site(data, other)
    assert (other / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a plain folder"):
        write_site(data, tmp_path / "file")
    empty = tmp_path / "empty"
    empty.mkdir()
    write_site(data, empty)
    assert (empty / "index.html").is_file()


def test_output_is_deterministic(tmp_path, data):
    a = write_site(data, tmp_path / "a")
    b = write_site(data, tmp_path / "b")
    assert [p.relative_to(tmp_path / "a") for p in a] == [p.relative_to(tmp_path / "b") for p in b]
    for x, y in zip(a, b):
        assert x.read_bytes() == y.read_bytes(), x.name


def test_unusual_but_valid_data_renders(tmp_path, data):
    """One commit only, an op that counts no FLOPs, a zero median, a second machine without
    peaks, the same key on both machines and a compare row missing its base."""
    other = dict(data["machines"][0], fingerprint="fedcba9876543210", device="cuda",
                 gpu_name="NVIDIA H200")
    data["machines"].append(other)
    lone = dict(data["benchmarks"][1], machine=other["fingerprint"], op="rms_norm",
                series=[dict(data["benchmarks"][1]["series"][0], flops=0, tflops=0.0,
                             median_ns=0, q1_ns=0, q3_ns=0)], steps=[])
    data["benchmarks"].append(lone)
    data["compare"]["rows"].append({"key": "new/case[x=1]", "base_median_ns": None,
                                    "head_median_ns": 5.0e3, "ratio": None, "q": None,
                                    "verdict": "AMBIGUOUS"})
    out = tmp_path / "site"
    write_site(data, out)
    assert len(_bench_pages(out)) == 3
    roofline = _read(out / "roofline.html")
    assert "NVIDIA H200" in roofline and "Not on the roofline" in roofline
    assert "no ceilings" in roofline
    compare = _read(out / "compare.html")
    assert 'class="verdict-AMBIGUOUS"' in compare and "new/case[x=1]" in compare
    assert "NVIDIA H200" in _read(out / "machines.html")


def _roofline_legends(monkeypatch) -> list:
    """Collects the legend texts of every roofline plot the site saves."""
    legends = []
    save = site._Plots.save

    def spy(self, fig, name):
        if name.startswith("roofline-"):
            legends.extend(t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts())
        return save(self, fig, name)

    monkeypatch.setattr(site._Plots, "save", spy)
    return legends


def test_a_ceiling_below_its_points_is_said_and_their_fraction_flagged(tmp_path, data,
                                                                       monkeypatch):
    """The issue's case: a bf16 peak measured 1000x too low drew the ceiling under the points."""
    legends = _roofline_legends(monkeypatch)
    data["peaks"][FINGERPRINT] = {"memory_gbps": 40.0, "tflops": {"bf16": 0.000914}}
    out = tmp_path / "site"
    write_site(data, out)
    roofline = _read(out / "roofline.html")
    assert 'class="above-peak worse"' in roofline and "bf16 (2 points)" in roofline
    assert roofline.count("% (!)") == 2  # both points' % of roof
    assert any(t.startswith("compute bf16") and "below 2 points: suspect" in t for t in legends)
    assert "above a ceiling" in legends  # the points are ringed


def test_points_under_their_ceilings_carry_no_warning(tmp_path, data, monkeypatch):
    legends = _roofline_legends(monkeypatch)
    out = tmp_path / "site"
    write_site(data, out)
    roofline = _read(out / "roofline.html")
    assert "above-peak" not in roofline and "(!)" not in roofline
    assert "% of roof" in roofline
    # % of roof: the lower of the top compute ceiling and bandwidth x intensity
    bench = data["benchmarks"][0]
    latest = max(bench["series"], key=lambda p: p["commit_order"])
    roof = min(1.2, 40.0 * latest["flops"] / latest["bytes"] / 1000)
    assert f"{100 * latest['tflops'] / roof:.1f}%" in roofline
    assert not any("suspect" in t for t in legends) and "above a ceiling" not in legends
