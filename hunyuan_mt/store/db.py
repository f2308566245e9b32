"""Opening the store: an SQLAlchemy engine for SQLite (the embedded default: one file, WAL) or PostgreSQL (what
Ray Serve replicas share), migrated to the newest schema by Alembic before anything reads it.

    engine = open_engine("sqlite:////srv/hmt/data/hunyuan.db")   # or postgresql+psycopg://user@host/db

Two processes starting on the same database at once migrate one after the other: SQLite under an owned lock file
beside the database (`locks.py`), PostgreSQL under a session advisory lock. Neither outlives its holder: the kernel
drops the file lock of a dead process, and PostgreSQL the advisory lock of a closed session. A waiter says once
what it waits for and gives up after `MIGRATION_WAIT_S` with `StoreUnavailable`.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from ..errors import ConfigError, StoreUnavailable

log = logging.getLogger(__name__)
_MIGRATIONS = Path(__file__).with_name("migrations")
#: PostgreSQL's advisory lock key for migrations (any constant; "hmt" in ASCII).
_PG_LOCK = 0x686D74
#: Seconds a start waits for another process's migration of the same database before it gives up.
MIGRATION_WAIT_S = 300.0
#: Seconds between two tries for PostgreSQL's advisory lock while another session holds it.
_PG_POLL_S = 0.5
#: Environment variable naming the folder for what the server writes (the database, job files); default ./data.
DATA_ENV = "HMT_DATA"


def data_dir(configured: str) -> Path:
    """The folder for the database and job files: `store.dir` when set, else $HMT_DATA, else `data/` in the
    project folder."""
    from ..config import project_path

    return project_path(configured or os.environ.get(DATA_ENV) or "data")


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def open_engine(url: str) -> Engine:
    """An engine on `url`, its schema migrated to the newest revision. ConfigError, in one line, when the
    database cannot be reached or the URL names no driver this install has."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"store.url: not a database URL: {url!r}") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        # Threads of one process share the engine: check_same_thread off; busy_timeout: writers of other
        # processes (the CLI, a restarted server) are waited for, not failed.
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        try:
            engine = create_engine(url, pool_pre_ping=True)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"store.url: the driver for {parsed.drivername} is not installed ({exc.name}); "
                              "PostgreSQL is postgresql+psycopg://user:password@host/database") from None
    try:
        migrate(engine)
    except OperationalError as exc:
        raise ConfigError(f"store.url: cannot open {parsed.render_as_string(hide_password=True)}: "
                          f"{str(exc.orig).strip().splitlines()[0]}") from None
    return engine


def _sqlite_pragmas(connection, _record) -> None:  # type: ignore[no-untyped-def]
    cursor = connection.cursor()
    # WAL: readers never wait for the writer. synchronous=NORMAL: a commit survives the process being killed
    # (kill -9), though not the machine losing power in the last moments.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def migrate(engine: Engine) -> str:
    """Bring the schema to the newest revision; returns it. Safe for processes starting together."""
    from alembic import command
    from alembic.config import Config as AlembicConfig
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    config = AlembicConfig()
    config.set_main_option("script_location", str(_MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    with _migration_lock(engine), engine.begin() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
        if current != head:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            log.info("store: schema migrated from %s to %s", current or "nothing", head)
    return str(head)


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    from ..host.locks import LockTimeout, owned_lock

    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            _pg_lock(connection)
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK})
                connection.commit()
        return
    database = engine.url.database
    if not database or database == ":memory:":
        yield
        return
    try:
        with owned_lock(f"{database}.migrate.lock", "migrating the store's schema", MIGRATION_WAIT_S, log):
            yield
    except LockTimeout as exc:
        raise StoreUnavailable(str(exc)) from None


def _pg_lock(connection: Any) -> None:
    """PostgreSQL's advisory lock, tried until MIGRATION_WAIT_S: one log line names the session that holds it."""
    deadline = time.monotonic() + MIGRATION_WAIT_S
    said = False
    while not connection.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _PG_LOCK}).scalar():
        if not said:
            holder = connection.execute(text(
                "SELECT a.pid, a.client_addr, a.backend_start FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.objid = :k AND l.granted"),
                {"k": _PG_LOCK}).first()
            who = (f"PostgreSQL session {holder[0]} (client {holder[1] or 'local'}, since {holder[2]})"
                   if holder is not None else "another session")
            log.info("waiting for %s to finish migrating the store's schema (at most %.0f s)", who, MIGRATION_WAIT_S)
            said = True
        if time.monotonic() >= deadline:
            raise StoreUnavailable(f"migrating the store's schema: another session still holds the migration lock "
                                   f"after {MIGRATION_WAIT_S:.0f} s")
        time.sleep(_PG_POLL_S)
