"""The user's translation memory and corrections in the store: appended rows, read back per pair.

Readers keep what they read and ask for rows newer than the newest they have (`since`), so a process sees another
one's import or correction on its next look-up, for the cost of one indexed query (`stamp`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, func, insert, select
from sqlalchemy.exc import DBAPIError

from .imports import Imports
from .schema import corrections, memory_entries


@dataclass(frozen=True)
class Provenance:
    """Who added an entry and what produced the text it replaces (a correction's route and adapter version)."""

    origin: str = "import"
    who: str | None = None
    route: str | None = None
    adapter_version: str | None = None


@dataclass(frozen=True)
class Correction:
    """One correction: the right `translation` of `source` for `pair`, as a client said it."""

    pair: str
    source: str
    translation: str
    machine: str | None = None
    context: str | None = None


class MemoryRows:
    """Memory entries and corrections of one database. Thread-safe (the engine pools connections)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.imports = Imports(engine)
        #: The connection `stamp` keeps (autocommit: it holds no snapshot between checks), opened on first use, and
        #: its query compiled once for this database's driver.
        self._stamp_connection: Connection | None = None
        self._stamp_lock = threading.Lock()
        self._stamp_query = (select(func.max(memory_entries.c.id), func.count(memory_entries.c.id))
                             .where(memory_entries.c.pair == bindparam("pair")))
        self._stamp_sql = self._stamp_query.compile(dialect=engine.dialect)

    def add(self, pair: str, rows: list[tuple[str, str]], provenance: Provenance = Provenance()) -> None:
        """Append `rows` (source, target) for `pair`."""
        now = time.time()
        values = [{"pair": pair, "source": s, "target": t, "origin": provenance.origin, "who": provenance.who,
                   "created": now, "route": provenance.route, "adapter_version": provenance.adapter_version}
                  for s, t in rows]
        with self.engine.begin() as connection:
            connection.execute(insert(memory_entries), values)

    def stamp(self, pair: str) -> tuple[int, int]:
        """(newest id, row count) of a pair: what changes when anyone adds to it. The count catches a row that
        committed after a newer id was read (PostgreSQL hands out ids before commits).

        Every request asks (tm.FRESH_S), so the query runs on a connection of its own, kept open, through the
        driver's own cursor: through the pool and SQLAlchemy's execution, the check took ~1 ms of a request that
        came after an idle moment, the largest part of a lone stream's work before the model starts (SQLite, AMD
        EPYC, in a stream's request: 0.94-1.19 ms pooled, 0.21-0.22 ms by the kept connection's cursor)."""
        with self._stamp_lock:
            try:
                if self._stamp_connection is None:
                    self._stamp_connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                newest, count = self._driver_stamp(self._stamp_connection, pair)
            except self.engine.dialect.loaded_dbapi.Error:  # the driver's own errors, not SQLAlchemy's
                # The database went away under the kept connection (a PostgreSQL restart): a pooled connection
                # now (the pool checks it first), a new kept one next time.
                self._close_stamp_connection()
                with self.engine.connect() as connection:
                    newest, count = connection.execute(self._stamp_query, {"pair": pair}).one()
        return int(newest or 0), int(count)

    def _driver_stamp(self, connection: Connection, pair: str) -> tuple[Any, Any]:
        """The stamp query on `connection`'s driver connection, parameters in the driver's own style."""
        compiled = self._stamp_sql
        params = compiled.construct_params({"pair": pair})
        if compiled.positiontup is not None:  # qmark / format / numeric drivers (sqlite3)
            params = tuple(params[name] for name in compiled.positiontup)  # type: ignore[assignment]
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(str(compiled), params)
            return cursor.fetchone()
        finally:
            cursor.close()

    def _close_stamp_connection(self) -> None:
        connection, self._stamp_connection = self._stamp_connection, None
        if connection is not None:
            try:
                connection.close()
            except DBAPIError:
                pass

    def close(self) -> None:
        """Give back the connection `stamp` keeps (the pool's are the engine's to close)."""
        with self._stamp_lock:
            self._close_stamp_connection()

    def since(self, pair: str, after: int = 0) -> list[tuple[int, str, str]]:
        """(id, source, target) of a pair's rows newer than `after`, oldest first (a later row wins)."""
        with self.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(  # type: ignore[misc]
                select(memory_entries.c.id, memory_entries.c.source, memory_entries.c.target)
                .where(memory_entries.c.pair == pair, memory_entries.c.id > after)
                .order_by(memory_entries.c.id))]

    def provenance(self, pair: str) -> dict[tuple[str, str], tuple[float, str]]:
        """(source, target) of each of a pair's rows → when the latest such row was added and by whom (`who`, else
        its origin: "import", "correction", "legacy"), for an export."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(memory_entries.c.source, memory_entries.c.target, memory_entries.c.created,
                       memory_entries.c.who, memory_entries.c.origin)
                .where(memory_entries.c.pair == pair).order_by(memory_entries.c.id)).all()
        return {(source, target): (float(created), who or origin) for source, target, created, who, origin in rows}

    def correct(self, correction: Correction, provenance: Provenance) -> int:
        """Record a correction and its memory entry in one transaction; returns the correction's id."""
        now = time.time()
        with self.engine.begin() as connection:
            found = connection.execute(insert(corrections).values(
                pair=correction.pair, source=correction.source, translation=correction.translation,
                machine=correction.machine, context=correction.context, who=provenance.who, created=now,
                route=provenance.route, adapter_version=provenance.adapter_version))
            connection.execute(insert(memory_entries).values(
                pair=correction.pair, source=correction.source, target=correction.translation,
                origin="correction", who=provenance.who, created=now, route=provenance.route,
                adapter_version=provenance.adapter_version))
            return int(found.inserted_primary_key[0])

    def corrections(self, pair: str) -> list[Correction]:
        """A pair's corrections, oldest first; for one source the latest stands (training reads them so)."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(corrections.c.source, corrections.c.translation, corrections.c.machine,
                       corrections.c.context)
                .where(corrections.c.pair == pair).order_by(corrections.c.id)).all()
        latest: dict[str, Correction] = {}
        for source, translation, machine, context in rows:
            latest.pop(source, None)
            latest[source] = Correction(pair, source, translation, machine, context)
        return list(latest.values())

    def correction_count(self) -> dict[str, int]:
        with self.engine.connect() as connection:
            return {pair: int(n) for pair, n in connection.execute(
                select(corrections.c.pair, func.count()).group_by(corrections.c.pair))}
