"""Predictor accuracy as tracked series: validation documents through ingest, compare, history,
the site's data and `gnomon dash migrate`, on SQLite and PostgreSQL (conftest.py's `db`)."""

import json
import subprocess
import sys

import pytest
import sqlalchemy as sa

from dash.synthetic import document, sha, validation, write
from gnomon.dash import comparison, history, store
from gnomon.dash.export import site_data
from gnomon.documents import DocumentError
from gnomon.predict import accuracy

SERIES = "accuracy/step_ape_median[model=small-llama,predictor=calibrated,tp=1]"


@pytest.fixture
def engine(db):
    engine = store.open_engine(db)
    yield engine
    engine.dispose()


def test_a_validation_becomes_one_row_per_figure_with_its_noise_floor(engine, tmp_path):
    path = write(validation(sha("a"), step_ape=0.08, ttft=-0.04), tmp_path / "v.json")
    counts = store.ingest(engine, [path])
    assert (counts["figures_added"], counts["runs_added"]) == (len(accuracy.FIGURES), 0)
    with engine.connect() as conn:
        rows = {r.figure: r for r in conn.execute(sa.select(store.accuracy))}
    assert set(rows) == set(accuracy.FIGURES)
    assert rows["step_ape_median"].value == pytest.approx(0.08)
    assert rows["step_ape_median"].series == SERIES
    assert rows["ttft_error"].value == pytest.approx(0.04)  # the error's magnitude
    assert {r.noise_floor for n, r in rows.items() if n != "step_ape_p90"} == {0.03}
    again = store.ingest(engine, [path])
    assert (again["figures_added"], again["figures_skipped"]) == (0, len(accuracy.FIGURES))


def test_validations_and_bench_runs_share_the_commit_order(engine, tmp_path):
    store.ingest(engine, [write(document(sha("a")), tmp_path / "a.json")])
    store.ingest(engine, [write(validation(sha("b")), tmp_path / "vb.json")])
    store.ingest(engine, [write(document(sha("b")), tmp_path / "b.json"),
                          write(validation(sha("a")), tmp_path / "va.json")])
    with engine.connect() as conn:
        orders = {table.name: dict(conn.execute(sa.select(table.c.commit, table.c.commit_order)
                                                .distinct()).all())
                  for table in (store.runs, store.accuracy)}
    assert orders["runs"] == orders["accuracy"] == {sha("a"): 1, sha("b"): 2}


@pytest.mark.parametrize("change,message", [
    (lambda d: d.pop("commit"), "lacks the field 'commit'"),
    (lambda d: d["setup"].pop("tp"), "setup lacks the field 'tp'"),
    (lambda d: d.update(ttft_error=float("nan")), "ttft_error is not a finite number"),
    (lambda d: d.update(commit="abc"), "expected a 40-hex git sha"),
])
def test_a_bad_validation_document_is_refused_and_stores_nothing(engine, tmp_path, change,
                                                                 message):
    before = store.row_counts(engine)
    doc = validation(sha("a"))
    change(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(DocumentError, match=message):
        store.ingest(engine, [write(validation(sha("b")), tmp_path / "good.json"), bad])
    assert store.row_counts(engine) == before


def _three_commits(engine, tmp_path, head_ape):
    for name, ape in (("a", 0.08), ("b", 0.085), ("c", head_ape)):
        store.ingest(engine, [write(validation(sha(name), step_ape=ape, noise=0.03),
                                    tmp_path / f"{name}.json")])


def test_compare_flags_an_accuracy_change_beyond_the_noise_floor(engine, tmp_path):
    _three_commits(engine, tmp_path, head_ape=0.13)  # +4.5 points, beyond 3
    result = comparison.compare(engine, sha("b"), sha("c"))
    verdicts = {row.series: row for row in result.accuracy}
    assert verdicts[SERIES].verdict == "REGRESSION"
    assert verdicts[SERIES].noise_floor == pytest.approx(0.03)
    assert verdicts[SERIES] in result.regressions
    assert comparison.compare(engine, sha("a"), sha("b")).regressions == []  # +0.5: noise
    assert comparison.compare(engine, sha("c"), sha("b")).accuracy[
        [r.series for r in result.accuracy].index(SERIES)].verdict == "IMPROVEMENT"
    assert "REGRESSION" in comparison.to_markdown(result)


def test_history_and_the_site_mark_where_the_series_moved(engine, tmp_path):
    _three_commits(engine, tmp_path, head_ape=0.13)
    with engine.connect() as conn:
        moved = [s for s in history.accuracy_steps(conn) if s.series == SERIES]
    assert [s.commit for s in moved] == [sha("c")]
    series = next(s for s in site_data(engine)["accuracy"] if s["series"] == SERIES)
    assert [p["value"] for p in series["points"]] == pytest.approx([0.08, 0.085, 0.13])
    assert series["steps"] == [sha("c")]


def _dash(*argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "gnomon.cli", "dash", *argv],
                          capture_output=True, text=True, timeout=120, **kwargs)


def test_compare_exits_1_on_an_accuracy_regression(db, tmp_path):
    engine = store.open_engine(db)
    _three_commits(engine, tmp_path, head_ape=0.13)
    engine.dispose()
    run = _dash("compare", "--db", db, sha("b")[:10], sha("c")[:10])
    assert run.returncode == 1, run.stderr
    assert "predictor accuracy" in run.stdout and "REGRESSION" in run.stdout


def test_migrate_brings_a_version_1_database_to_version_2(db, tmp_path):
    engine = store.open_engine(db)
    store.ingest(engine, [write(document(sha("a")), tmp_path / "a.json")])
    before = store.row_counts(engine)
    with engine.begin() as conn:  # what a version-1 gnomon left: no accuracy table
        store.accuracy.drop(conn)
        conn.execute(sa.update(store.schema_version).values(version=1))
    engine.dispose()
    with pytest.raises(store.StoreError, match=r"schema version 1; .*gnomon dash migrate.*"
                                               r"create the table accuracy"):
        store.open_engine(db)
    dry = _dash("migrate", "--db", db, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "schema version 1; this gnomon's is 2" in dry.stdout and "would: create" in dry.stdout
    with pytest.raises(store.StoreError, match="gnomon dash migrate"):
        store.open_engine(db)  # a dry run changed nothing
    done = _dash("migrate", "--db", db)
    assert done.returncode == 0 and "did: create the table accuracy" in done.stdout
    engine = store.open_engine(db)
    after = store.row_counts(engine)
    assert after == {**before, "accuracy": 0}  # the kernel history kept whole
    engine.dispose()
    again = _dash("migrate", "--db", db)
    assert "nothing to change" in again.stdout


def test_migrate_refuses_a_newer_schema(db):
    engine = store.open_engine(db)
    with engine.begin() as conn:
        conn.execute(sa.update(store.schema_version).values(version=store.SCHEMA_VERSION + 1))
    engine.dispose()
    run = _dash("migrate", "--db", db)
    assert run.returncode == 2 and "upgrade gnomon" in run.stderr


def test_ingest_imports_no_torch(db, tmp_path):
    path = write(validation(sha("a")), tmp_path / "v.json")
    bench = write(document(sha("a")), tmp_path / "b.json")
    probe = ("import sys; from gnomon import cli; code = cli.main(sys.argv[1:]); "
             "print('TORCH' if 'torch' in sys.modules else 'NO TORCH'); sys.exit(code)")
    run = subprocess.run([sys.executable, "-c", probe, "dash", "ingest", "--db", db, str(path),
                          str(bench)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "5 accuracy figure(s) added" in run.stdout and "NO TORCH" in run.stdout
