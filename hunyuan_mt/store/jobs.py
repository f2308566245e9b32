"""Document jobs in the store: each change of a job's state is written as it happens, and each finished segment,
so that a server killed at any moment (kill -9 included) finds its jobs again at the next start and sends only
the segments not yet done."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, delete, insert, select, update

from .schema import job_segments, jobs

#: The states of a job that some process still has to run.
UNFINISHED = ("queued", "translating")
#: The columns a job row has, besides its id (what `save` may be given).
FIELDS = tuple(c.name for c in jobs.columns if c.name != "id")


class JobRecords:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def create(self, job_id: str, **fields: Any) -> None:
        """A new job row (its `seq`, the submission order, is the queue's: it continues from the rows at start)."""
        with self.engine.begin() as connection:
            connection.execute(insert(jobs).values(id=job_id, **fields))

    def save(self, job_id: str, **fields: Any) -> None:
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise KeyError(f"jobs has no column {sorted(unknown)}")
        with self.engine.begin() as connection:
            connection.execute(update(jobs).where(jobs.c.id == job_id).values(**fields))

    def load(self, unfinished: bool = False) -> list[dict[str, Any]]:
        """Every job row (or, `unfinished`, those queued or translating), in submission order."""
        query = select(jobs).order_by(jobs.c.seq)
        if unfinished:
            query = query.where(jobs.c.state.in_(UNFINISHED))
        with self.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(query)]

    def delete(self, job_ids: list[str]) -> None:
        if job_ids:
            with self.engine.begin() as connection:
                connection.execute(delete(job_segments).where(job_segments.c.job_id.in_(job_ids)))
                connection.execute(delete(jobs).where(jobs.c.id.in_(job_ids)))

    def finish_segments(self, job_id: str, done: list[tuple[int, str, str | None]], progress: int) -> None:
        """Record finished segments (index, translation, origin) and the job's progress in one transaction."""
        if not done:
            return
        with self.engine.begin() as connection:
            connection.execute(insert(job_segments), [
                {"job_id": job_id, "idx": idx, "translation": text, "origin": origin} for idx, text, origin in done])
            connection.execute(update(jobs).where(jobs.c.id == job_id).values(done=progress))

    def claim(self, job_id: str, runner: str, now: float, previous: str | None) -> bool:
        """Take an unfinished job over for `runner`, if it is still held by `previous` (the process found gone):
        of two processes that try at once, one gets it."""
        holder = jobs.c.runner.is_(None) if previous is None else jobs.c.runner == previous
        with self.engine.begin() as connection:
            done = connection.execute(update(jobs).where(jobs.c.id == job_id, holder,
                                                         jobs.c.state.in_(UNFINISHED))
                                      .values(runner=runner, heartbeat=now))
        return done.rowcount == 1

    def release(self, runner: str) -> None:
        """`runner` stops: its unfinished jobs are free for the next process to take over at once."""
        with self.engine.begin() as connection:
            connection.execute(update(jobs).where(jobs.c.runner == runner,
                                                  jobs.c.state.in_(UNFINISHED))
                               .values(runner=None))

    def beat(self, runner: str, now: float) -> None:
        """`runner` is alive: its unfinished jobs' heartbeat."""
        with self.engine.begin() as connection:
            connection.execute(update(jobs).where(jobs.c.runner == runner,
                                                  jobs.c.state.in_(UNFINISHED))
                               .values(heartbeat=now))

    def segments(self, job_id: str) -> dict[int, tuple[str, str | None]]:
        """A job's finished segments: index → (translation, origin)."""
        with self.engine.connect() as connection:
            return {int(i): (t, o) for i, t, o in connection.execute(
                select(job_segments.c.idx, job_segments.c.translation, job_segments.c.origin)
                .where(job_segments.c.job_id == job_id))}
