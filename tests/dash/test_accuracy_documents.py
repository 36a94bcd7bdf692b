"""`gnomon accuracy` documents (gnomon.predict.scorecard) as tracked accuracy series: ingest,
compare, history and the site, on SQLite and PostgreSQL (conftest.py's `db`). The documents are
built by hand; no simulation runs."""

import json

import pytest
import sqlalchemy as sa

from dash.synthetic import document, sha, write
from gnomon import cli
from gnomon.dash import comparison, history, store
from gnomon.dash.export import site_data
from gnomon.documents import DocumentError
from gnomon.predict import accuracy, scorecard


def _row(rid, engine, hardware, ttft=None, tpot=None, status="answered"):
    row = {"id": rid, "split": "held-out", "point": None, "status": status,
           "group": {"model": "llama-3.1-8b", "hardware": hardware, "engine": engine,
                     "dtype": "w=bf16,kv=bf16", "source": "hand-made"}}
    if status == "answered":
        row["ratio"] = {"ttft": ttft, "tpot": tpot}
    else:
        row["reason"] = f"{status} for the test"
    return row


def _rows(a1_ttft=1.2, a1_tpot=0.9, b1_ttft=1.1):
    """vllm on B200: two answered rows (two versions of the engine, one with no TPOT ratio), one
    refused, one excluded; sglang on H200: one answered row."""
    return [_row("a1", "vllm 0.15.1", "B200", a1_ttft, a1_tpot),
            _row("a2", "vllm 0.16.0", "B200", 0.7, None),
            _row("a3", "vllm 0.15.1", "B200", status="refused"),
            _row("a4", "vllm 0.15.1", "B200", 5.0, 5.0, status="excluded"),
            _row("b1", "sglang", "H200", b1_ttft, 1.05)]


def scorecard_doc(commit, rows, predictor="roofline"):
    """An accuracy document as `gnomon accuracy --out` writes it (its summaries from the
    scorecard's own `summarize`)."""
    doc = {"schema_version": scorecard.SCHEMA_VERSION, "kind": scorecard.KIND,
           "created_with": {"version": "0.1.0"}, "commit": commit, "source": "hand-made",
           "predictor": predictor, "max_waves": scorecard.MAX_WAVES, "wall_seconds": 1.5,
           **scorecard.summarize(rows), "rows": rows}
    return scorecard.validate(doc, "test")


def key(figure, engine, hardware):
    return f"accuracy/{figure}[engine={engine},hardware={hardware},predictor=roofline]"


def expected(a1_ttft=1.2, a1_tpot=0.9, b1_ttft=1.1):
    """The figures of `_rows`, worked out by hand: the excluded row counts nowhere; a2 has no
    TPOT ratio; a3 is refused (one of vllm's three counted rows)."""
    return {key("ttft_mape", "vllm", "B200"): (abs(a1_ttft - 1) + abs(0.7 - 1)) / 2,
            key("tpot_mape", "vllm", "B200"): abs(a1_tpot - 1),
            key("refused_share", "vllm", "B200"): 1 / 3,
            key("ttft_mape", "sglang", "H200"): abs(b1_ttft - 1),
            key("tpot_mape", "sglang", "H200"): abs(1.05 - 1),
            key("refused_share", "sglang", "H200"): 0.0}


# head: vllm's TTFT MAPE 0.7 point worse (a REGRESSION), its TPOT MAPE 0.4 point better and
# sglang's TTFT MAPE 0.4 point worse (both within the 0.5-point tolerance: SAME)
HEAD = {"a1_ttft": 1.214, "a1_tpot": 0.904, "b1_ttft": 1.104}
# within the tolerance of base and, but for vllm's TTFT MAPE, of head
NEAR = {"a1_ttft": 1.202, "a1_tpot": 0.902, "b1_ttft": 1.102}


@pytest.fixture
def engine(db):
    engine = store.open_engine(db)
    yield engine
    engine.dispose()


def _ingest(engine, tmp_path, name, **change):
    path = write(scorecard_doc(sha(name), _rows(**change)), tmp_path / f"{name}.json")
    return store.ingest(engine, [path])


def _stored(engine):
    with engine.connect() as conn:
        return {row.series: row for row in conn.execute(
            sa.select(store.accuracy, store.machines.c.fingerprint)
            .join(store.machines, store.machines.c.id == store.accuracy.c.machine_id))}


def dash(db, *args):
    return cli.main(["dash", *args, "--db", db])


def test_an_accuracy_document_becomes_its_series_under_the_simulation_machine(engine,
                                                                              tmp_path):
    counts = _ingest(engine, tmp_path, "base")
    want = expected()
    assert (counts["figures_added"], counts["runs_added"]) == (len(want), 0)
    rows = _stored(engine)
    assert set(rows) == set(want)
    for series, value in want.items():
        row = rows[series]
        assert row.value == pytest.approx(value, abs=1e-12), series
        assert row.noise_floor == (accuracy.REFUSED_TOLERANCE if row.figure == "refused_share"
                                   else accuracy.MAPE_TOLERANCE)
        assert (row.fingerprint, row.predictor, row.model, row.tp) == (
            store.SIMULATION, "roofline", store.ALL_MODELS, store.ALL_TP)
        assert row.commit == sha("base")
    assert accuracy.MAPE_TOLERANCE == 0.005
    again = _ingest(engine, tmp_path, "base")
    assert (again["figures_added"], again["figures_skipped"]) == (0, len(want))


def test_a_series_without_a_ratio_has_no_mape_and_excluded_rows_make_no_series():
    rows = [_row("r", "trtllm", "GB200", status="refused"),
            _row("e", "sgl", "A100", 1.5, 1.5, status="excluded")]
    figures = accuracy.scorecard_figures(scorecard_doc(sha("x"), rows))
    assert figures == {key("refused_share", "trtllm", "GB200"): (
        "refused_share", 1.0, accuracy.REFUSED_TOLERANCE)}


def test_compare_judges_each_series_against_the_tolerance(engine, tmp_path):
    _ingest(engine, tmp_path, "base")
    _ingest(engine, tmp_path, "head", **HEAD)
    result = comparison.compare(engine, sha("base"), sha("head"))
    assert result.machine == store.SIMULATION and result.rows == []
    verdicts = {row.series: row for row in result.accuracy}
    assert set(verdicts) == set(expected())
    base, head = expected(), expected(**HEAD)
    for series, row in verdicts.items():
        assert (row.base, row.head) == pytest.approx((base[series], head[series]), abs=1e-12)
    assert verdicts[key("ttft_mape", "vllm", "B200")].verdict == "REGRESSION"
    assert verdicts[key("ttft_mape", "vllm", "B200")].noise_floor == accuracy.MAPE_TOLERANCE
    assert result.regressions == [verdicts[key("ttft_mape", "vllm", "B200")]]
    # worse by 0.4 point, and better by 0.4 point: within the tolerance
    assert verdicts[key("ttft_mape", "sglang", "H200")].verdict == "SAME"
    assert verdicts[key("tpot_mape", "vllm", "B200")].verdict == "SAME"
    assert {verdicts[key("refused_share", e, h)].verdict
            for e, h in (("vllm", "B200"), ("sglang", "H200"))} == {"SAME"}
    back = comparison.compare(engine, sha("head"), sha("base"))
    assert {r.series: r.verdict for r in back.accuracy}[
        key("ttft_mape", "vllm", "B200")] == "IMPROVEMENT"


def test_dash_compare_exits_1_on_a_regression_and_0_within_the_tolerance(db, tmp_path, capsys):
    engine = store.open_engine(db)
    _ingest(engine, tmp_path, "base")
    _ingest(engine, tmp_path, "head", **HEAD)
    _ingest(engine, tmp_path, "near", **NEAR)
    engine.dispose()
    capsys.readouterr()
    assert dash(db, "compare", sha("base")[:10], sha("head")[:10]) == 1
    out = capsys.readouterr().out
    assert "predictor accuracy" in out and "1 REGRESSION" in out
    assert dash(db, "compare", sha("base")[:10], sha("near")[:10]) == 0
    assert "0 REGRESSION, 0 IMPROVEMENT, 6 SAME" in capsys.readouterr().out


def test_a_refused_share_that_grows_by_one_row_is_a_regression(engine, tmp_path):
    _ingest(engine, tmp_path, "base")
    rows = _rows()
    rows[1] = _row("a2", "vllm 0.16.0", "B200", status="refused")
    store.ingest(engine, [write(scorecard_doc(sha("worse"), rows), tmp_path / "w.json")])
    verdicts = {r.series: r for r in comparison.compare(engine, sha("base"),
                                                        sha("worse")).accuracy}
    share = verdicts[key("refused_share", "vllm", "B200")]
    assert (share.base, share.head, share.verdict) == (pytest.approx(1 / 3),
                                                       pytest.approx(2 / 3), "REGRESSION")


def test_series_are_compared_beside_the_machine_the_bench_ran_on(db, tmp_path, capsys):
    """With bench runs on a real machine and accuracy documents of the same commits, `compare`
    picks the real machine (the simulation machine is not a second choice) and judges the
    accuracy series with its kernels."""
    engine = store.open_engine(db)
    for name, change in (("base", {}), ("head", HEAD)):
        store.ingest(engine, [write(document(sha(name)), tmp_path / f"bench-{name}.json")])
        _ingest(engine, tmp_path, name, **change)
    result = comparison.compare(engine, sha("base"), sha("head"))
    fingerprint = document(sha("base"))["machine"]["fingerprint"]
    assert result.machine == fingerprint and result.rows
    assert key("ttft_mape", "vllm", "B200") in {r.series for r in result.regressions}
    assert site_data(engine)["compare"]["machine"] == fingerprint
    engine.dispose()
    assert dash(db, "compare", sha("base"), sha("head")) == 1
    assert dash(db, "compare", sha("base"), sha("head"), "--machine", fingerprint[:6]) == 1


@pytest.mark.parametrize("commit,message", [
    (None, r"commit is null \(the document was made outside a git checkout\)"),
    ("abc", "commit 'abc': expected a 40-hex git sha"),
])
def test_a_document_without_a_commit_is_refused_and_stores_nothing(engine, tmp_path, commit,
                                                                   message):
    before = store.row_counts(engine)
    bad = write(scorecard_doc(commit, _rows()), tmp_path / "bad.json")
    good = write(scorecard_doc(sha("good"), _rows()), tmp_path / "good.json")
    with pytest.raises(DocumentError, match=message):
        store.ingest(engine, [good, bad])
    assert store.row_counts(engine) == before


def test_dash_ingest_names_the_null_commit(db, tmp_path, capsys):
    bad = write(scorecard_doc(None, _rows()), tmp_path / "bad.json")
    assert dash(db, "ingest", str(bad)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gnomon: error: ") and "bad.json: commit is null" in err


def test_an_answered_row_without_its_ratios_is_refused(engine, tmp_path):
    doc = scorecard_doc(sha("a"), _rows())
    del doc["rows"][0]["ratio"]["tpot"]
    with pytest.raises(DocumentError, match=r"rows\[0\].ratio lacks the field 'tpot'"):
        store.ingest(engine, [write(doc, tmp_path / "a.json")])


def test_history_and_the_site_show_the_series(db, tmp_path, capsys):
    engine = store.open_engine(db)
    for name, change in (("base", {}), ("near", NEAR), ("head", HEAD)):
        _ingest(engine, tmp_path, name, **change)
    with engine.connect() as conn:
        moved = [(s.series, s.machine, s.commit, s.verdict.verdict)
                 for s in history.accuracy_steps(conn)]
    assert moved == [(key("ttft_mape", "vllm", "B200"), store.SIMULATION, sha("head"),
                      "REGRESSION")]
    engine.dispose()
    assert dash(db, "history") == 0
    assert "predictor accuracy moves" in capsys.readouterr().out

    out = tmp_path / "site"
    assert dash(db, "site", str(out)) == 0
    engine = store.open_engine(db)
    data = site_data(engine)
    engine.dispose()
    json.dumps(data, allow_nan=False)
    assert store.SIMULATION in {m["fingerprint"] for m in data["machines"]}
    drawn = {s["series"]: s for s in data["accuracy"]}
    assert set(drawn) == set(expected())
    for series, line in drawn.items():
        assert line["machine"] == store.SIMULATION
        assert [p["commit"] for p in line["points"]] == [sha("base"), sha("near"), sha("head")]
        assert [p["value"] for p in line["points"]] == pytest.approx(
            [expected()[series], expected(**NEAR)[series], expected(**HEAD)[series]], abs=1e-12)
    assert drawn[key("ttft_mape", "vllm", "B200")]["steps"] == [sha("head")]
    page = (out / "accuracy.html").read_text()
    for series in expected():
        assert series in page
    assert "simulation (the same on any machine)" in page
    assert len(list(out.glob("**/accuracy-*.svg"))) == len(expected())
