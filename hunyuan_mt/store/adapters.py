"""Adapter versions in the store: candidates as they are trained, which one serves each pair, and the way back.

A pair with no row serves its shipped adapter, version "v1" (the pair's own folder). Promoting makes a version
current and retires the one before; rolling back makes the last retired one current again and marks the one it
replaces "rejected". Every replica reads the same rows."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert, select, update

from ..errors import InvalidInput
from .schema import adapter_versions

#: The version a pair's own folder holds (the adapter it shipped with).
SHIPPED = "v1"


@dataclass(frozen=True)
class AdapterVersion:
    pair: str
    version: str
    state: str
    parent: str | None
    created: float
    promoted: float | None
    report: dict[str, Any] | None


class AdapterVersions:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def all(self, pair: str | None = None) -> list[AdapterVersion]:
        query = select(adapter_versions).order_by(adapter_versions.c.pair, adapter_versions.c.created)
        if pair is not None:
            query = query.where(adapter_versions.c.pair == pair)
        with self.engine.connect() as connection:
            rows = connection.execute(query).mappings().all()
        return [AdapterVersion(r["pair"], r["version"], r["state"], r["parent"], r["created"], r["promoted"],
                               json.loads(r["report"]) if r["report"] else None) for r in rows]

    def current(self) -> dict[str, str]:
        """pair → its current version, for the pairs that have moved on from "v1"."""
        with self.engine.connect() as connection:
            return {p: v for p, v in connection.execute(
                select(adapter_versions.c.pair, adapter_versions.c.version)
                .where(adapter_versions.c.state == "current"))}

    def next_version(self, pair: str) -> str:
        numbers = [int(v.version[1:]) for v in self.all(pair) if v.version[1:].isdigit()]
        return f"v{max([1, *numbers]) + 1}"

    def add_candidate(self, pair: str, version: str, parent: str, report: dict[str, Any]) -> None:
        with self.engine.begin() as connection:
            connection.execute(insert(adapter_versions).values(
                pair=pair, version=version, state="candidate", parent=parent, created=time.time(),
                report=json.dumps(report)))

    def promote(self, pair: str, version: str) -> str:
        """Make `version` serve `pair`; returns the version it replaces. InvalidInput for an unknown version."""
        known = {v.version: v for v in self.all(pair)}
        if version != SHIPPED and version not in known:
            raise InvalidInput(f"No version {version!r} of {pair}; known: {', '.join([SHIPPED, *known]) }.")
        before = self.current().get(pair, SHIPPED)
        now = time.time()
        with self.engine.begin() as connection:
            if SHIPPED not in known:  # the shipped version gets a row once it stops being the default
                connection.execute(insert(adapter_versions).values(pair=pair, version=SHIPPED, state="retired",
                                                                   created=0.0))
            connection.execute(update(adapter_versions).where(adapter_versions.c.pair == pair,
                                                              adapter_versions.c.state == "current")
                               .values(state="retired"))
            connection.execute(update(adapter_versions).where(adapter_versions.c.pair == pair,
                                                              adapter_versions.c.version == version)
                               .values(state="current", promoted=now))
        return before

    def rollback(self, pair: str) -> tuple[str, str]:
        """Serve the version that served before the current one; (from, to). InvalidInput when there is none."""
        versions = self.all(pair)
        current = next((v for v in versions if v.state == "current"), None)
        retired = sorted((v for v in versions if v.state == "retired"), key=lambda v: v.promoted or v.created)
        if current is None or not retired:
            raise InvalidInput(f"{pair} has no earlier version to roll back to.")
        back = retired[-1]
        now = time.time()
        with self.engine.begin() as connection:
            connection.execute(update(adapter_versions).where(adapter_versions.c.pair == pair,
                                                              adapter_versions.c.version == current.version)
                               .values(state="rejected"))
            connection.execute(update(adapter_versions).where(adapter_versions.c.pair == pair,
                                                              adapter_versions.c.version == back.version)
                               .values(state="current", promoted=now))
        return current.version, back.version
