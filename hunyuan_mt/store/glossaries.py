"""Stored glossaries in the store: one list of terms per (name, pair), replaced whole when it is stored again."""

from __future__ import annotations

import json
import time

from sqlalchemy import Engine, delete, insert, select

from .imports import Imports
from .schema import glossaries


class GlossaryRows:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.imports = Imports(engine)

    def put(self, name: str, pair: str, terms: list[tuple[str, str]], origin: str, who: str | None = None) -> None:
        with self.engine.begin() as connection:
            connection.execute(delete(glossaries).where(glossaries.c.name == name, glossaries.c.pair == pair))
            connection.execute(insert(glossaries).values(name=name, pair=pair, terms=json.dumps(terms),
                                                         origin=origin, who=who, updated=time.time()))

    def get(self, name: str, pair: str) -> tuple[list[tuple[str, str]], float] | None:
        """(terms, when they were stored) or None."""
        with self.engine.connect() as connection:
            row = connection.execute(select(glossaries.c.terms, glossaries.c.updated)
                                     .where(glossaries.c.name == name, glossaries.c.pair == pair)).first()
        return None if row is None else ([(s, t) for s, t in json.loads(row[0])], float(row[1]))

    def available(self) -> dict[str, list[str]]:
        """name → its pairs, e.g. {"ui-terms": ["en2de", "en2es"]}."""
        found: dict[str, list[str]] = {}
        with self.engine.connect() as connection:
            for name, pair in connection.execute(select(glossaries.c.name, glossaries.c.pair)
                                                 .order_by(glossaries.c.name, glossaries.c.pair)):
                found.setdefault(name, []).append(pair)
        return found
