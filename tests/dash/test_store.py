"""Round trips through the store, idempotence, concurrency and refusal of bad input."""

import json
import multiprocessing
import sqlite3

import pytest
import sqlalchemy as sa

from dash.synthetic import KEYS, document, sha, write
from gnomon.bench.results import ResultsError
from gnomon.dash import store


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'bench.sqlite'}"


@pytest.fixture
def engine(db):
    engine = store.open_engine(db)
    yield engine
    engine.dispose()


def test_sqlite_is_in_wal_mode_with_a_schema_version(engine, tmp_path):
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert conn.execute(sa.select(store.schema_version.c.version)).scalars().all() == [1]
    assert set(store.row_counts(engine)) == {"schema_version", "machines", "runs",
                                            "benchmarks", "results", "steps"}


def test_round_trip_keeps_samples_stats_and_machine(engine, tmp_path):
    doc = document(sha("a"), runs=2, seed=1)
    counts = store.ingest(engine, [write(doc, tmp_path / "a.json")])
    assert counts == {"files": 1, "runs_added": 2, "runs_skipped": 0,
                      "results_added": 2 * len(KEYS)}
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(store.results, store.benchmarks.c.key, store.runs.c.run_index,
                      store.runs.c.commit, store.runs.c.peaks, store.runs.c.mode)
            .join(store.benchmarks, store.benchmarks.c.id == store.results.c.benchmark_id)
            .join(store.runs, store.runs.c.id == store.results.c.run_id)).all()
        machine = conn.execute(sa.select(store.machines)).one()
        bench = conn.execute(sa.select(store.benchmarks)).first()
    assert len(rows) == 2 * len(KEYS)
    cases = {(run["index"], case["key"]): case for run in doc["runs"] for case in run["cases"]}
    for row in rows:
        case = cases[(row.run_index, row.key)]
        assert store.unpack_samples(row.samples) == case["samples_ns"]
        assert isinstance(row.samples, bytes) and len(row.samples) < 8 * len(case["samples_ns"])
        for name in ("count", "min", "q1", "median", "q3", "max"):
            assert getattr(row, name) == pytest.approx(case["stats"][name])
        assert (row.flops, row.bytes) == (case["flops"], case["bytes"])
        assert row.tflops == pytest.approx(case["tflops"])
        assert row.commit == doc["commit"] and row.mode == "hot"
        assert row.peaks == doc["peaks"]
    for name, value in doc["machine"].items():
        assert getattr(machine, name) == value
    case = cases[(0, bench.key)]
    assert (bench.params, bench.dtypes, bench.definition_hash) == (
        case["params"], case["dtypes"], case["definition_hash"])


def test_samples_pack_exactly():
    values = [0, 1, 2**40, 123_456_789_012, 7]
    assert store.unpack_samples(store.pack_samples(values)) == values


def test_ingest_is_idempotent(engine, tmp_path):
    path = write(document(sha("a"), seed=1), tmp_path / "a.json")
    store.ingest(engine, [path])
    before = store.row_counts(engine)
    counts = store.ingest(engine, [path, path])
    assert counts["runs_added"] == 0 and counts["runs_skipped"] == 6
    # the same runs under another file name change nothing either
    copy = tmp_path / "copy.json"
    copy.write_text(path.read_text())
    store.ingest(engine, [copy])
    assert store.row_counts(engine) == before


def test_commit_order_is_the_order_of_first_ingestion(engine, tmp_path):
    for name in ("c", "a", "b"):
        store.ingest(engine, [write(document(sha(name)), tmp_path / f"{name}.json")])
    store.ingest(engine, [write(document(sha("c"), seed=9), tmp_path / "c2.json")])
    with engine.connect() as conn:
        orders = dict(conn.execute(sa.select(store.runs.c.commit, store.runs.c.commit_order)
                                   .distinct()).all())
    assert orders == {sha("c"): 1, sha("a"): 2, sha("b"): 3}


def test_a_changed_definition_restarts_the_benchmark(engine, tmp_path):
    store.ingest(engine, [write(document(sha("a")), tmp_path / "a.json")])
    store.ingest(engine, [write(document(sha("b"), definition="v2"), tmp_path / "b.json")])
    with engine.connect() as conn:
        keys = conn.execute(sa.select(store.benchmarks.c.key)).scalars().all()
    assert len(keys) == 2 * len(KEYS) and set(keys) == set(KEYS)


@pytest.mark.parametrize("damage", ["truncated", "malformed", "unknown_version", "missing",
                                    "duplicate_key"])
def test_a_bad_file_leaves_the_database_unchanged(engine, tmp_path, damage):
    store.ingest(engine, [write(document(sha("a")), tmp_path / "a.json")])
    before = store.row_counts(engine)
    good = write(document(sha("b")), tmp_path / "b.json")
    bad = tmp_path / "bad.json"
    text = json.dumps(document(sha("c")))
    if damage == "truncated":
        bad.write_text(text[: len(text) // 2])
    elif damage == "malformed":
        doc = document(sha("c"))
        del doc["runs"][1]["cases"][0]["samples_ns"]
        bad.write_text(json.dumps(doc))
    elif damage == "duplicate_key":
        doc = document(sha("c"))
        doc["runs"][0]["cases"].append(doc["runs"][0]["cases"][0])
        bad.write_text(json.dumps(doc))
    elif damage == "unknown_version":
        bad.write_text(text.replace('"schema_version": 1', '"schema_version": 99'))
    with pytest.raises(ResultsError, match="bad.json"):
        store.ingest(engine, [good, bad])
    assert store.row_counts(engine) == before


def test_a_newer_schema_is_refused(db):
    engine = store.open_engine(db)
    with engine.begin() as conn:
        conn.execute(sa.update(store.schema_version).values(version=7))
    engine.dispose()
    with pytest.raises(store.StoreError, match=r"schema version 7.*schema version 1"):
        store.open_engine(db)


def test_a_foreign_database_is_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE people (name TEXT)")
    with pytest.raises(store.StoreError, match="not a gnomon dashboard database"):
        store.open_engine(f"sqlite:///{path}")


def test_bad_urls_are_named(tmp_path):
    with pytest.raises(store.StoreError, match="not a URL"):
        store.open_engine("no such url")
    with pytest.raises(store.StoreError, match="does not exist"):
        store.open_engine(f"sqlite:///{tmp_path}/missing/folder/x.sqlite")


def test_default_url_follows_flag_env_then_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GNOMON_DB", raising=False)
    assert store.default_url() == f"sqlite:///{tmp_path / '.gnomon' / 'bench.sqlite'}"
    assert (tmp_path / ".gnomon").is_dir()
    monkeypatch.setenv("GNOMON_DB", "sqlite:///env.sqlite")
    assert store.default_url() == "sqlite:///env.sqlite"
    assert store.default_url("sqlite:///flag.sqlite") == "sqlite:///flag.sqlite"


def _ingest_worker(db, paths, barrier):
    engine = store.open_engine(db)
    barrier.wait()
    for path in paths:
        store.ingest(engine, [path])
    engine.dispose()


def test_four_processes_ingesting_at_once_lose_nothing(db, tmp_path):
    files = {w: [write(document(sha(f"w{w}c{i}"), runs=2, seed=w, samples=200),
                       tmp_path / f"w{w}-{i}.json") for i in range(3)] for w in range(4)}
    ctx = multiprocessing.get_context("spawn")  # no inherited threads or handles
    barrier = ctx.Barrier(4)
    workers = [ctx.Process(target=_ingest_worker, args=(db, [str(p) for p in files[w]], barrier))
               for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
    engine = store.open_engine(db)
    counts = store.row_counts(engine)
    assert counts["runs"] == 4 * 3 * 2
    assert counts["results"] == 4 * 3 * 2 * len(KEYS)
    assert counts["machines"] == 1 and counts["benchmarks"] == len(KEYS)
    with engine.connect() as conn:
        orders = conn.execute(sa.select(store.runs.c.commit, store.runs.c.commit_order)
                              .distinct()).all()
    assert sorted(order for _, order in orders) == list(range(1, 13))  # one per commit
    engine.dispose()


def test_ingest_waits_for_another_writer(db, engine, tmp_path):
    import threading
    import time

    path = write(document(sha("a")), tmp_path / "a.json")
    holder = sqlite3.connect(db.removeprefix("sqlite:///"), isolation_level=None,
                             check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process's write transaction
    holder.execute("INSERT INTO schema_version (version) VALUES (1)")
    release = threading.Timer(0.5, holder.execute, args=("ROLLBACK",))
    release.start()
    start = time.monotonic()
    counts = store.ingest(engine, [path])
    assert time.monotonic() - start >= 0.4  # it waited for the lock instead of failing
    release.join()
    holder.close()
    assert counts["runs_added"] == 3 and store.row_counts(engine)["schema_version"] == 1
