"""What the server learns and must not forget, in a real database: the user's translation memory with its
provenance, corrections, and document jobs with their finished segments.

    store = Store.open(cfg.store)        # SQLite under the data folder, or PostgreSQL when store.url names it
    store.memory                          # MemoryRows
    store.jobs                            # JobRecords
    store.adapters                        # AdapterVersions: which version of each pair's adapter serves
    store.glossaries                      # GlossaryRows: stored glossaries

SQLite is the embedded default (one file, WAL mode, nothing to install); PostgreSQL is for replicas that share
what they learn (Ray Serve). The schema is versioned by Alembic and migrated when the store opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from .adapters import AdapterVersions
from .db import data_dir, open_engine, sqlite_url
from .glossaries import GlossaryRows
from .jobs import JobRecords
from .memory import Correction, MemoryRows, Provenance

__all__ = ["AdapterVersions", "Correction", "GlossaryRows", "JobRecords", "MemoryRows", "Provenance", "Store", "data_dir", "open_engine"]


@dataclass
class Store:
    engine: Engine
    #: Where job uploads and results are kept (under the data folder).
    files: Path
    memory: MemoryRows
    jobs: JobRecords
    adapters: AdapterVersions
    glossaries: GlossaryRows

    @classmethod
    def open(cls, url: str = "", folder: str | Path = "") -> "Store":
        """The store at `url` (empty: SQLite at `<data folder>/hunyuan.db`); job files under the data folder."""
        root = data_dir(str(folder))
        engine = open_engine(url or sqlite_url(root / "hunyuan.db"))
        return cls(engine, root / "jobs", MemoryRows(engine), JobRecords(engine), AdapterVersions(engine),
                   GlossaryRows(engine))

    @property
    def kind(self) -> str:
        return self.engine.dialect.name

    def describe(self) -> str:
        """The database for /status and logs, without a password."""
        return self.engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        self.memory.close()
        self.engine.dispose()
