"""The dashboard store's backends: SQLite in a temporary folder, and a fresh database on the
PostgreSQL server that ``GNOMON_TEST_PG_URL`` names (``eval "$(bash .ci/postgres.sh start)"``
starts a throwaway one; `.ci/run` does). Without the URL the PostgreSQL cases are skipped, and
under ``CI=true`` they fail: a server that did not start must not leave CI green."""

from __future__ import annotations

import os
import uuid

import pytest

BACKENDS = ("sqlite", "postgresql")


def pg_server_url() -> str:
    url = os.environ.get("GNOMON_TEST_PG_URL")
    if url:
        return url
    if os.environ.get("CI") == "true":
        pytest.fail("GNOMON_TEST_PG_URL is not set under CI=true: the PostgreSQL server that "
                    ".ci/run starts is missing")
    pytest.skip('the PostgreSQL store tests need a server: eval "$(bash .ci/postgres.sh '
                'start)" sets GNOMON_TEST_PG_URL')


def fresh_pg_database(server_url: str):
    """A context: a new empty database on the server, its URL yielded, dropped after."""
    import contextlib

    import sqlalchemy as sa

    @contextlib.contextmanager
    def database():
        name = f"gnomon_test_{uuid.uuid4().hex[:12]}"
        admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield sa.engine.make_url(server_url).set(database=name).render_as_string(
                hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.dispose()
    return database()


@pytest.fixture(params=BACKENDS)
def db(request, tmp_path):
    """A URL of an empty dashboard database, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'bench.sqlite'}"
        return
    with fresh_pg_database(pg_server_url()) as url:
        yield url


@pytest.fixture
def sqlite_db(tmp_path):
    """For the tests of SQLite's own mechanisms (WAL, BEGIN IMMEDIATE)."""
    return f"sqlite:///{tmp_path / 'bench.sqlite'}"


@pytest.fixture
def pg_db():
    """A fresh PostgreSQL database only (concurrency at PostgreSQL's scale, its errors)."""
    with fresh_pg_database(pg_server_url()) as url:
        yield url
