"""The dashboard's store: SQLAlchemy Core tables and ingestion of results files.

The database is chosen by ``--db URL``, else the ``GNOMON_DB`` environment variable, else
``sqlite:///.gnomon/bench.sqlite`` under the current directory. PostgreSQL is reached by URL
through the same code (install the ``postgres`` extra for psycopg).

Concurrent writers queue, one write transaction at a time: on SQLite every transaction starts
with ``BEGIN IMMEDIATE`` (WAL mode, a busy timeout); on PostgreSQL every write transaction
(`with_retry`) first takes one transaction-scoped advisory lock, `WRITE_LOCK`. Without it, two
ingests of new commits both read the same ``max(commit_order)`` and store one order for two
commits, and two inserts of a new machine or benchmark collide on its unique key. A writer that
dies mid-transaction releases the lock with its connection, and its rows roll back.

Tables::

    schema_version(version)                      one row; a newer version is refused
    machines(fingerprint unique, device, cpu_model, cores, ram_gb, gpu_name, driver, runtime)
    runs(machine, commit, commit_order, run_index, content_hash, peaks, mode, gnomon_version)
         unique (machine, commit, content_hash): ingesting a run twice changes nothing;
         commit_order is the order in which each commit was first ingested
    benchmarks(key, suite, op, params, dtypes, definition_hash)
         unique (key, definition_hash): history restarts when a definition changes
    results(run, benchmark, count, min, q1, median, q3, max, flops, bytes, tflops, gbps,
            samples)                             samples: zlib of little-endian int64
    steps(benchmark, machine, commit, commit_order, ratio, q, state, reason)
         written by `gnomon dash history`; state is open, acknowledged or fixed
    accuracy(machine, commit, commit_order, content_hash, series, predictor, model, tp, figure,
             value, noise_floor)                 one row per series of a `gnomon validate`
         document or a `gnomon accuracy` document (`gnomon.predict.accuracy`); unique (machine,
         commit, content_hash, series). An accuracy document's series span models and tp:
         its rows hold model `ALL_MODELS` and tp `ALL_TP`, and as noise_floor the stated
         tolerance. It is a simulation, the same on every machine, so its rows are stored
         under one machine entry, `SIMULATION_MACHINE` (fingerprint ``simulation``, device
         ``simulation``, no CPU, 0 cores and 0 GB), whatever machine ran it.

Schema versions: 1 had no accuracy table; `migrate` (``gnomon dash migrate``) brings a version-1
database to version 2 by creating it. A database at a newer version is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import struct
import time
import zlib
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from gnomon import documents
from gnomon.bench import results as results_file
from gnomon.dash import stats
from gnomon.documents import DocumentError
from gnomon.predict import accuracy as accuracy_doc

SCHEMA_VERSION = 2
MIGRATIONS = {2: "create the table accuracy (predictor accuracy series from gnomon validate)"}
DEFAULT_PATH = Path(".gnomon") / "bench.sqlite"
WRITE_LOCK = 0x676E6F6D6F6E  # "gnomon": the advisory lock key every PostgreSQL writer takes
SIMULATION = "simulation"
SIMULATION_MACHINE = {"fingerprint": SIMULATION, "device": SIMULATION,
                      "cpu_model": "none: a deterministic simulation, the same on any machine",
                      "cores": 0, "ram_gb": 0, "gpu_name": None, "driver": None, "runtime": None}
ALL_MODELS, ALL_TP = "*", 0  # an accuracy document's series: every model and tp it holds

T = TypeVar("T")


class DashError(ValueError):
    """Bad input to the dashboard (a database, commit, machine, key or argument); the message
    names the thing and what is accepted."""


class StoreError(DashError):
    """A database this gnomon cannot use."""


metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version", metadata,
    sa.Column("version", sa.Integer, nullable=False),
)

machines = sa.Table(
    "machines", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("fingerprint", sa.String(64), nullable=False, unique=True),
    sa.Column("device", sa.String(16), nullable=False),
    sa.Column("cpu_model", sa.Text, nullable=False),
    sa.Column("cores", sa.Integer, nullable=False),
    sa.Column("ram_gb", sa.Integer, nullable=False),
    sa.Column("gpu_name", sa.Text),
    sa.Column("driver", sa.Text),
    sa.Column("runtime", sa.Text),
)

def _placed() -> list:
    """The columns that place a measurement: its id, its machine, and its commit in commit
    order."""
    return [sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("machine_id", sa.Integer, sa.ForeignKey("machines.id"), nullable=False),
            sa.Column("commit", sa.String(64), nullable=False, index=True),
            sa.Column("commit_order", sa.Integer, nullable=False, index=True)]


runs = sa.Table(
    "runs", metadata, *_placed(),
    sa.Column("run_index", sa.Integer, nullable=False),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.Column("peaks", sa.JSON, nullable=False),
    sa.Column("mode", sa.String(8), nullable=False),
    sa.Column("gnomon_version", sa.String(64), nullable=False),
    sa.UniqueConstraint("machine_id", "commit", "content_hash", name="uq_runs_content"),
)

benchmarks = sa.Table(
    "benchmarks", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("key", sa.Text, nullable=False, index=True),
    sa.Column("suite", sa.Text, nullable=False),
    sa.Column("op", sa.Text, nullable=False),
    sa.Column("params", sa.JSON, nullable=False),
    sa.Column("dtypes", sa.JSON, nullable=False),
    sa.Column("definition_hash", sa.String(64), nullable=False),
    sa.UniqueConstraint("key", "definition_hash", name="uq_benchmarks_definition"),
)

results = sa.Table(
    "results", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), nullable=False, index=True),
    sa.Column("benchmark_id", sa.Integer, sa.ForeignKey("benchmarks.id"), nullable=False,
              index=True),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("min", sa.Float, nullable=False),
    sa.Column("q1", sa.Float, nullable=False),
    sa.Column("median", sa.Float, nullable=False),
    sa.Column("q3", sa.Float, nullable=False),
    sa.Column("max", sa.Float, nullable=False),
    sa.Column("flops", sa.BigInteger, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("tflops", sa.Float, nullable=False),
    sa.Column("gbps", sa.Float, nullable=False),
    sa.Column("samples", sa.LargeBinary, nullable=False),
    sa.UniqueConstraint("run_id", "benchmark_id", name="uq_results_run_benchmark"),
)

steps = sa.Table(
    "steps", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("benchmark_id", sa.Integer, sa.ForeignKey("benchmarks.id"), nullable=False),
    sa.Column("machine_id", sa.Integer, sa.ForeignKey("machines.id"), nullable=False),
    sa.Column("commit", sa.String(64), nullable=False),
    sa.Column("commit_order", sa.Integer, nullable=False),
    sa.Column("ratio", sa.Float, nullable=False),
    sa.Column("q", sa.Float, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text),
    sa.UniqueConstraint("benchmark_id", "machine_id", "commit", name="uq_steps_commit"),
)

accuracy = sa.Table(
    "accuracy", metadata, *_placed(),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.Column("series", sa.Text, nullable=False, index=True),
    sa.Column("predictor", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("tp", sa.Integer, nullable=False),
    sa.Column("figure", sa.String(32), nullable=False),
    sa.Column("value", sa.Float, nullable=False),
    sa.Column("noise_floor", sa.Float, nullable=False),
    sa.UniqueConstraint("machine_id", "commit", "content_hash", "series",
                        name="uq_accuracy_content"),
)

STEP_STATES = ("open", "acknowledged", "fixed")


# --------------------------------------------------------------------------- samples

def run_value():
    """The value of a result's run that compare and history judge, as a column expression: its
    suite's column of `stats.RUN_VALUE_BY_SUITE`, else `stats.RUN_VALUE`. A query selecting it
    joins `benchmarks`."""
    return sa.case(*((benchmarks.c.suite == suite, results.c[column])
                     for suite, column in stats.RUN_VALUE_BY_SUITE.items()),
                   else_=results.c[stats.RUN_VALUE])


def pack_samples(samples: Sequence[int]) -> bytes:
    """zlib of the samples as little-endian int64."""
    return zlib.compress(struct.pack(f"<{len(samples)}q", *samples), 6)


def unpack_samples(blob: bytes) -> list[int]:
    raw = zlib.decompress(blob)
    return list(struct.unpack(f"<{len(raw) // 8}q", raw))


# --------------------------------------------------------------------------- engine

def default_url(db: str | None = None) -> str:
    """``db``, else $GNOMON_DB, else the SQLite file .gnomon/bench.sqlite under the current
    directory (its folder is created)."""
    if db:
        return db
    env = os.environ.get("GNOMON_DB")
    if env:
        return env
    path = Path.cwd() / DEFAULT_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def _is_locked(error: BaseException) -> bool:
    text = str(error).lower()
    return "database is locked" in text or "database is busy" in text or "locked" in text


def shown_url(url) -> str:
    """`url` as it may be printed: its password replaced by ***."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))


def with_retry(engine: Engine, work: Callable[[Connection], T], attempts: int = 12) -> T:
    """Runs ``work`` in one write transaction (module docstring: under the write lock),
    retrying with backoff while SQLite says the database is locked (PostgreSQL: on a
    serialization failure or a unique-key race)."""
    delay = 0.05
    for attempt in range(attempts):
        try:
            with engine.begin() as conn:
                if engine.dialect.name == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"),
                                 {"key": WRITE_LOCK})
                return work(conn)
        except (sa.exc.OperationalError, sa.exc.IntegrityError) as error:
            retryable = (_is_locked(error) if engine.dialect.name == "sqlite"
                         else isinstance(error, sa.exc.IntegrityError)
                         or "serializ" in str(error).lower())
            if not retryable or attempt == attempts - 1:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")


def open_engine(db: str | None = None, *, create: bool = True) -> Engine:
    """An engine on the dashboard database with its schema checked (and created when empty).

    Raises StoreError for a URL SQLAlchemy cannot use, a missing driver, a server that cannot
    be reached, or a database at another schema version than this gnomon's (an older one names
    `gnomon dash migrate`)."""
    return _on_database(db, lambda conn, url: _ensure_schema(conn, url, create))[0]


def migrate(db: str | None = None, *, dry_run: bool = False) -> dict:
    """Brings a dashboard database to `SCHEMA_VERSION` (an empty one is created), or with
    `dry_run` only says what that would change: ``{"url", "found", "target", "changes"}``,
    `found` being None for an empty database. A newer schema is refused."""

    def work(conn: Connection, url: str) -> dict:
        found = _stored_version(conn, url)
        changes = (["create the dashboard schema"] if found is None else
                   [MIGRATIONS[v] for v in range(found + 1, SCHEMA_VERSION + 1)])
        if changes and not dry_run:
            metadata.create_all(conn, checkfirst=True)
            if found is None:
                conn.execute(sa.insert(schema_version).values(version=SCHEMA_VERSION))
            else:
                conn.execute(sa.update(schema_version).values(version=SCHEMA_VERSION))
        return {"url": url, "found": found, "target": SCHEMA_VERSION, "changes": changes}

    engine, report = _on_database(db, work)
    engine.dispose()
    return report


def _on_database(db: str | None, work: Callable[[Connection, str], T]) -> tuple[Engine, T]:
    """An engine on `db` and what `work(conn, shown url)` returned, in one write transaction;
    StoreError for a URL, driver or server that does not work."""
    raw = default_url(db)
    url = shown_url(raw)  # what messages show
    try:
        parsed = sa.engine.make_url(raw)
    except sa.exc.ArgumentError:
        raise StoreError(f"database URL {url!r} is not a URL SQLAlchemy understands "
                         "(e.g. sqlite:///path/bench.sqlite or "
                         "postgresql+psycopg://user@host/db)") from None
    kwargs: dict = {}
    if parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": 30}
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            if not Path(database).parent.exists():
                raise StoreError(f"database URL {url!r}: the folder {Path(database).parent} "
                                 "does not exist")
    try:
        engine = sa.create_engine(parsed, **kwargs)
    except (ImportError, sa.exc.NoSuchModuleError) as error:
        hint = " (pip install 'gnomon[postgres]')" if "postgres" in url else ""
        raise StoreError(f"database URL {url!r}: no driver: {error}{hint}") from None
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine)
    try:
        return engine, with_retry(engine, lambda conn: work(conn, url))
    except sa.exc.DatabaseError as error:
        engine.dispose()
        reason = error.orig if error.orig is not None else error
        # one line: a driver's message spans several ("Is the server running...")
        raise StoreError(f"database {url!r} cannot be opened: "
                         f"{' '.join(str(reason).split())}") from None
    except DashError:
        engine.dispose()
        raise


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):  # noqa: ANN001 - DB-API objects
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout = 30000")
        cursor.execute("PRAGMA foreign_keys = ON")
        if engine.url.database not in (None, "", ":memory:"):
            for attempt in range(50):
                try:
                    cursor.execute("PRAGMA journal_mode = WAL")
                    break
                except Exception as error:  # sqlite3.OperationalError: locked
                    if not _is_locked(error) or attempt == 49:
                        raise
                    time.sleep(0.05)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):  # noqa: ANN001
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _stored_version(conn: Connection, url: str) -> int | None:
    """The database's schema version, None when it is empty; StoreError for a newer one or a
    database that is not the dashboard's."""
    inspector = sa.inspect(conn)
    if inspector.has_table("schema_version"):
        found = conn.execute(sa.select(schema_version.c.version)).scalar()
        if found is not None and found > SCHEMA_VERSION:
            raise StoreError(f"database {url} was written by dashboard schema version "
                             f"{found}; this gnomon reads schema version {SCHEMA_VERSION} "
                             "(upgrade gnomon)")
        return found
    if inspector.get_table_names():
        raise StoreError(f"database {url} holds tables but no schema_version table; "
                         "it is not a gnomon dashboard database")
    return None


def _ensure_schema(conn: Connection, url: str, create: bool) -> None:
    found = _stored_version(conn, url)
    if found == SCHEMA_VERSION:
        return
    if found is not None:
        changes = "; ".join(MIGRATIONS[v] for v in range(found + 1, SCHEMA_VERSION + 1))
        raise StoreError(f"database {url} has dashboard schema version {found}; this gnomon "
                         f"reads schema version {SCHEMA_VERSION}: `gnomon dash migrate` "
                         f"brings it there ({changes})")
    if not create:
        raise StoreError(f"database {url} is empty")
    metadata.create_all(conn, checkfirst=True)
    conn.execute(sa.insert(schema_version).values(version=SCHEMA_VERSION))


# --------------------------------------------------------------------------- ingestion

def run_content_hash(doc: dict, run: dict) -> str:
    """sha256 of one run as it sits in its file, with the file's mode (canonical JSON)."""
    return _canonical_hash({"mode": doc["mode"], "run": run})


def read_document(path: str | Path) -> dict:
    """A bench results file, a validation document or an accuracy document
    (`gnomon.predict.accuracy`), checked."""
    doc = documents.load_any(path, {results_file.KIND: results_file.ACCEPTED_VERSIONS,
                                    accuracy_doc.KIND: accuracy_doc.ACCEPTED_VERSIONS,
                                    accuracy_doc.SCORECARD_KIND: accuracy_doc.SCORECARD_VERSIONS})
    if doc["kind"] == accuracy_doc.KIND:
        return accuracy_doc.validate(doc, str(path))
    if doc["kind"] == accuracy_doc.SCORECARD_KIND:
        return accuracy_doc.validate_scorecard(doc, str(path))
    doc = results_file.validate(doc, str(path))
    for r, run in enumerate(doc["runs"]):
        keys = [case["key"] for case in run["cases"]]
        if len(set(keys)) != len(keys):
            raise DocumentError(f"{path}: runs[{r}] holds the same benchmark key twice")
    return doc


def ingest(engine: Engine, paths: Iterable[str | Path]) -> dict:
    """Reads every file first (bench results files, validation documents and accuracy
    documents; a missing, truncated, malformed or unknown-version file, or an accuracy document
    without a commit, raises DocumentError before anything is written), then writes them all in
    one transaction.

    Idempotent: a run (or a document's figures) already stored for the same machine and
    commit with the same content is skipped. Returns counts: files, runs_added, runs_skipped,
    results_added, figures_added, figures_skipped."""
    docs = [(str(path), read_document(path)) for path in paths]
    if not docs:
        raise DashError("ingest needs at least one results file")
    return with_retry(engine, lambda conn: _ingest(conn, docs))


def _canonical_hash(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def _commit_order(conn: Connection, commit: str, cache: dict[str, int]) -> int:
    """The commit's order: the one stored with its runs or figures, else one past the last."""
    if commit not in cache:
        stored = [conn.execute(sa.select(sa.func.min(table.c.commit_order))
                               .where(table.c.commit == commit)).scalar()
                  for table in (runs, accuracy)]
        known = [order for order in stored if order is not None]
        if known:
            cache[commit] = min(known)
        else:
            last = [conn.execute(sa.select(sa.func.max(table.c.commit_order))).scalar()
                    for table in (runs, accuracy)]
            cache[commit] = max([order for order in last if order is not None], default=0) + 1
    return cache[commit]


def _ingest(conn: Connection, docs: list[tuple[str, dict]]) -> dict:
    counts = {"files": len(docs), "runs_added": 0, "runs_skipped": 0, "results_added": 0,
              "figures_added": 0, "figures_skipped": 0}
    machine_ids: dict[str, int] = {}
    bench_ids: dict[tuple[str, str], int] = {}
    commit_orders: dict[str, int] = {}
    for _source, doc in docs:
        simulated = doc["kind"] == accuracy_doc.SCORECARD_KIND
        machine_id = _machine_id(conn, SIMULATION_MACHINE if simulated else doc["machine"],
                                 machine_ids)
        commit = doc["commit"]
        order = _commit_order(conn, commit, commit_orders)
        if doc["kind"] in (accuracy_doc.KIND, accuracy_doc.SCORECARD_KIND):
            _ingest_figures(conn, doc, machine_id, order, counts)
            continue
        version = str(doc["created_with"].get("version", "unknown"))
        for run in doc["runs"]:
            digest = run_content_hash(doc, run)
            exists = conn.execute(sa.select(runs.c.id).where(
                runs.c.machine_id == machine_id, runs.c.commit == commit,
                runs.c.content_hash == digest)).first()
            if exists is not None:
                counts["runs_skipped"] += 1
                continue
            run_id = conn.execute(sa.insert(runs).values(
                machine_id=machine_id, commit=commit, commit_order=order,
                run_index=run["index"], content_hash=digest, peaks=doc["peaks"],
                mode=doc["mode"], gnomon_version=version)).inserted_primary_key[0]
            rows = []
            for case in run["cases"]:
                stats = case["stats"]
                rows.append({
                    "run_id": run_id, "benchmark_id": _benchmark_id(conn, case, bench_ids),
                    "count": int(stats["count"]), "min": float(stats["min"]),
                    "q1": float(stats["q1"]), "median": float(stats["median"]),
                    "q3": float(stats["q3"]), "max": float(stats["max"]),
                    "flops": case["flops"], "bytes": case["bytes"],
                    "tflops": float(case["tflops"]), "gbps": float(case["gbps"]),
                    "samples": pack_samples(case["samples_ns"])})
            if rows:
                conn.execute(sa.insert(results), rows)
            counts["runs_added"] += 1
            counts["results_added"] += len(rows)
    return counts


def _figure_rows(doc: dict) -> list[dict]:
    """The accuracy rows of a validation or accuracy document, less where they are placed."""
    if doc["kind"] == accuracy_doc.SCORECARD_KIND:
        return [{"series": series, "predictor": doc["predictor"], "model": ALL_MODELS,
                 "tp": ALL_TP, "figure": figure, "value": value, "noise_floor": tolerance}
                for series, (figure, value, tolerance)
                in accuracy_doc.scorecard_figures(doc).items()]
    setup = doc["setup"]
    return [{"series": accuracy_doc.series_key(doc, figure), "predictor": setup["predictor"],
             "model": setup["model"], "tp": setup["tp"], "figure": figure, "value": value,
             "noise_floor": noise}
            for figure, (value, noise) in accuracy_doc.figures(doc).items()]


def _ingest_figures(conn: Connection, doc: dict, machine_id: int, order: int,
                    counts: dict) -> None:
    digest = _canonical_hash(doc)
    for row in _figure_rows(doc):
        series = row["series"]
        exists = conn.execute(sa.select(accuracy.c.id).where(
            accuracy.c.machine_id == machine_id, accuracy.c.commit == doc["commit"],
            accuracy.c.content_hash == digest, accuracy.c.series == series)).first()
        if exists is not None:
            counts["figures_skipped"] += 1
            continue
        conn.execute(sa.insert(accuracy).values(
            machine_id=machine_id, commit=doc["commit"], commit_order=order,
            content_hash=digest, **row))
        counts["figures_added"] += 1


def _machine_id(conn: Connection, machine: dict, cache: dict[str, int]) -> int:
    fingerprint = machine["fingerprint"]
    if fingerprint in cache:
        return cache[fingerprint]
    row = conn.execute(sa.select(machines.c.id)
                       .where(machines.c.fingerprint == fingerprint)).first()
    if row is None:
        fields = {name: machine.get(name) for name in
                  ("device", "cpu_model", "cores", "ram_gb", "gpu_name", "driver", "runtime")}
        machine_id = conn.execute(sa.insert(machines).values(
            fingerprint=fingerprint, **fields)).inserted_primary_key[0]
    else:
        machine_id = row[0]
    cache[fingerprint] = machine_id
    return machine_id


def _benchmark_id(conn: Connection, case: dict, cache: dict[tuple[str, str], int]) -> int:
    ident = (case["key"], case["definition_hash"])
    if ident in cache:
        return cache[ident]
    row = conn.execute(sa.select(benchmarks.c.id).where(
        benchmarks.c.key == ident[0], benchmarks.c.definition_hash == ident[1])).first()
    if row is None:
        bench_id = conn.execute(sa.insert(benchmarks).values(
            key=case["key"], suite=case["suite"], op=case["op"], params=case["params"],
            dtypes=case["dtypes"], definition_hash=case["definition_hash"])
        ).inserted_primary_key[0]
    else:
        bench_id = row[0]
    cache[ident] = bench_id
    return bench_id


def row_counts(engine: Engine) -> dict[str, int]:
    """Rows in each table (used by tests and `gnomon dash ingest`'s summary)."""
    with engine.connect() as conn:
        return {table.name: conn.execute(sa.select(sa.func.count()).select_from(table))
                .scalar() for table in metadata.sorted_tables}
