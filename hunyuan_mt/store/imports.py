"""Files imported into the store once per version (a legacy memory folder's TSVs, the glossaries folder): by path,
with a signature (size and modification time) of the file as it was read."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import Engine, delete, insert, select

from .schema import imports


class Imports:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @staticmethod
    def signature(path: Path) -> str:
        stat = path.stat()
        return f"{stat.st_size}:{stat.st_mtime_ns}"

    def done(self, path: Path) -> bool:
        """Whether the file at `path` was imported as it is now."""
        with self.engine.connect() as connection:
            known = connection.execute(select(imports.c.signature)
                                       .where(imports.c.path == str(path.resolve()))).scalar()
        return known == self.signature(path)

    def mark(self, path: Path) -> None:
        key = str(path.resolve())
        with self.engine.begin() as connection:
            connection.execute(delete(imports).where(imports.c.path == key))
            connection.execute(insert(imports).values(path=key, signature=self.signature(path), created=time.time()))
