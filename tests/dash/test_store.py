"""Round trips through the store, idempotence, concurrency and refusal of bad input, on SQLite
and on a real PostgreSQL server (conftest.py: the `db` fixture runs each test on both)."""

import json
import multiprocessing
import sqlite3

import pytest
import sqlalchemy as sa

from dash.synthetic import KEYS, document, sha, write
from gnomon.documents import DocumentError
from gnomon.dash import store


@pytest.fixture
def engine(db):
    engine = store.open_engine(db)
    yield engine
    engine.dispose()


def test_sqlite_is_in_wal_mode_with_a_schema_version(sqlite_db):
    engine = store.open_engine(sqlite_db)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert conn.execute(sa.select(store.schema_version.c.version)).scalars().all() == [2]
    assert set(store.row_counts(engine)) == {"schema_version", "machines", "runs",
                                            "benchmarks", "results", "steps", "accuracy"}
    engine.dispose()


def test_round_trip_keeps_samples_stats_and_machine(engine, tmp_path):
    doc = document(sha("a"), runs=2, seed=1)
    counts = store.ingest(engine, [write(doc, tmp_path / "a.json")])
    assert counts == {"files": 1, "runs_added": 2, "runs_skipped": 0,
                      "results_added": 2 * len(KEYS), "figures_added": 0, "figures_skipped": 0}
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
    with pytest.raises(DocumentError, match="bad.json"):
        store.ingest(engine, [good, bad])
    assert store.row_counts(engine) == before


def test_a_newer_schema_is_refused(db):
    engine = store.open_engine(db)
    with engine.begin() as conn:
        conn.execute(sa.update(store.schema_version).values(version=7))
    engine.dispose()
    with pytest.raises(store.StoreError, match=r"schema version 7.*schema version 2"):
        store.open_engine(db)


def test_a_foreign_database_is_refused(db):
    other = sa.create_engine(db)
    with other.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE people (name TEXT)")
    other.dispose()
    with pytest.raises(store.StoreError, match="not a gnomon dashboard database"):
        store.open_engine(db)


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


def test_ingest_waits_for_another_writer(sqlite_db, tmp_path):
    import threading
    import time

    engine = store.open_engine(sqlite_db)
    path = write(document(sha("a")), tmp_path / "a.json")
    holder = sqlite3.connect(sqlite_db.removeprefix("sqlite:///"), isolation_level=None,
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
    engine.dispose()


def _commit_orders(engine):
    """{commit: (its orders, the first run id stored for it)}."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(store.runs.c.commit, store.runs.c.commit_order,
                                      store.runs.c.id)).all()
    out: dict = {}
    for commit, order, run_id in rows:
        orders, first = out.get(commit, (set(), run_id))
        out[commit] = (orders | {order}, min(first, run_id))
    return out


def test_eight_writers_on_postgresql_lose_nothing_and_share_no_order(pg_db, tmp_path):
    # 40 files over 12 commits, 5 per writer; writers share commits (file i is commit i % 12)
    files = [write(document(sha(f"c{i % 12}"), runs=2, seed=i, samples=50),
                   tmp_path / f"f{i}.json") for i in range(40)]
    store.open_engine(pg_db).dispose()  # the schema exists before the race starts
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(8)
    workers = [ctx.Process(target=_ingest_worker,
                           args=(pg_db, [str(p) for p in files[w::8]], barrier))
               for w in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [worker.exitcode for worker in workers] == [0] * 8
    engine = store.open_engine(pg_db)
    counts = store.row_counts(engine)
    assert counts["runs"] == 40 * 2 and counts["results"] == 40 * 2 * len(KEYS)
    assert counts["machines"] == 1 and counts["benchmarks"] == len(KEYS)
    orders = _commit_orders(engine)
    assert all(len(o) == 1 for o, _ in orders.values())  # one order per commit
    by_order = sorted(orders, key=lambda c: next(iter(orders[c][0])))
    assert [next(iter(orders[c][0])) for c in by_order] == list(range(1, 13))  # none shared
    assert by_order == sorted(orders, key=lambda c: orders[c][1])  # the order of first ingest
    engine.dispose()


KILLED_WRITER = """
import sys, time
from gnomon.bench import results
from gnomon.dash import store

engine = store.open_engine(sys.argv[1])
docs = [(sys.argv[2], results.load(sys.argv[2]))]

def work(conn):
    store._ingest(conn, docs)  # every row of the file written, not yet committed
    print("inside", flush=True)
    time.sleep(120)

store.with_retry(engine, work)
"""


def test_a_writer_killed_mid_transaction_leaves_no_partial_run(db, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    engine = store.open_engine(db)
    store.ingest(engine, [write(document(sha("a")), tmp_path / "a.json")])
    before = store.row_counts(engine)
    path = write(document(sha("b"), runs=3), tmp_path / "b.json")
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, db, str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "inside"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
    assert store.row_counts(engine) == before
    start = time.monotonic()
    counts = store.ingest(engine, [path])  # the lock died with it: the next writer goes on
    assert counts["runs_added"] == 3 and time.monotonic() - start < 30
    assert store.row_counts(engine)["runs"] == before["runs"] + 3
    engine.dispose()


def _dash_cli(*argv):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "gnomon.cli", "dash", *argv],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("fault", ["wrong password", "server down", "no such database"])
def test_a_bad_postgresql_url_is_one_line_without_its_password(pg_db, tmp_path, fault):
    import socket

    url = sa.engine.make_url(pg_db)
    if fault == "wrong password":
        url = url.set(password="not-the-password")
    elif fault == "server down":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = url.set(port=s.getsockname()[1])  # nothing listens there once closed
    else:
        url = url.set(database="gnomon_no_such_database")
    text = url.render_as_string(hide_password=False)
    path = write(document(sha("a")), tmp_path / "a.json")
    result = _dash_cli("ingest", "--db", text, str(path))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gnomon: error: database "), result.stderr
    assert "Traceback" not in result.stderr
    assert url.password not in result.stderr + result.stdout
    assert "***" in lines[0]


def test_compare_judges_a_collective_on_its_runs_median_and_a_kernel_on_its_fastest(engine,
                                                                                   tmp_path):
    from gnomon.dash import comparison

    keys = {**KEYS, "comm/all_reduce[tokens=1,world=2]": ("comm", "all_reduce")}
    doc = document(sha("a"), keys=keys)
    store.ingest(engine, [write(doc, tmp_path / "a.json")])
    with engine.connect() as conn:
        machine_id, _ = comparison.resolve_machine(conn, None, (sha("a"),))
        values = comparison.run_values(conn, machine_id, sha("a"))
        ids = dict(conn.execute(sa.select(store.benchmarks.c.key, store.benchmarks.c.id)).all())
    for key, (suite, _) in keys.items():
        column = "median" if suite == "comm" else "min"
        expected = [next(c for c in run["cases"] if c["key"] == key)["stats"][column]
                    for run in doc["runs"]]
        assert sorted(values[ids[key]].values()) == pytest.approx(sorted(expected)), key
