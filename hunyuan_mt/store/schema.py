"""The store's tables, as SQLAlchemy Core metadata: what the migrations create and what the code reads and writes.

Times are Unix seconds (float), so that they mean the same after a restart and on another replica. Who did
something is the caller's identity ("key:…" hashed by the access policy, "addr:…", "page", "cli").
"""

from __future__ import annotations

from sqlalchemy import Column, Float, ForeignKey, Index, Integer, MetaData, String, Table, Text

metadata = MetaData()

#: The user's translation memory: imports and corrections, appended; for one source (its masked key) the latest
#: row wins. The shipped memory stays with the model it was built from (read-only files beside its weights).
memory_entries = Table(
    "memory_entries", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pair", String(16), nullable=False),
    Column("source", Text, nullable=False),
    Column("target", Text, nullable=False),
    #: "import" (a TSV/TMX file, the CLI or /admin), "correction", "legacy" (a tm/ folder read once).
    Column("origin", String(16), nullable=False),
    Column("who", String(128)),
    Column("created", Float, nullable=False),
    #: What produced the text this entry replaces, where known (a correction's): route kind and adapter version.
    Column("route", String(64)),
    Column("adapter_version", String(64)),
)
Index("ix_memory_pair_id", memory_entries.c.pair, memory_entries.c.id)

#: "This translation is wrong, here is the right one": kept as said, for adapter training and review.
corrections = Table(
    "corrections", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pair", String(16), nullable=False),
    Column("source", Text, nullable=False),
    Column("translation", Text, nullable=False),
    #: What the server had answered, where the client says (LibreTranslate's /suggest does not).
    Column("machine", Text),
    Column("context", Text),
    Column("who", String(128)),
    Column("created", Float, nullable=False),
    Column("route", String(64)),
    Column("adapter_version", String(64)),
)
Index("ix_corrections_pair_id", corrections.c.pair, corrections.c.id)

#: Document jobs: enough to answer for them, and to run them again after a restart from their upload on disk.
jobs = Table(
    "jobs", metadata,
    Column("id", String(64), primary_key=True),
    Column("seq", Integer, nullable=False),
    Column("filename", Text, nullable=False),
    Column("source", String(16), nullable=False),
    Column("target", String(16), nullable=False),
    Column("detected_source", String(16)),
    #: Whose it is (None: anyone with the id) and whose quota it counts against, as identities.
    Column("owner", Text),
    Column("caller", Text),
    Column("state", String(16), nullable=False),
    Column("done", Integer, nullable=False, default=0),
    Column("total", Integer, nullable=False, default=0),
    Column("created", Float, nullable=False),
    Column("started", Float),
    Column("ended", Float),
    Column("error", Text),
    Column("error_status", Integer),
    #: What the work needs to run again: the upload on disk, the glossary's terms and the context (JSON).
    Column("upload_path", Text, nullable=False),
    Column("options", Text, nullable=False),
    Column("result_path", Text),
    Column("result_filename", Text),
    Column("media_type", String(128)),
    Column("note", Text),
    #: The process running (or to run) an unfinished job, "host:pid:token", and when it last said it is alive: a
    #: job is taken over only from a process that is gone (DocumentJobs._claimable).
    Column("runner", String(128)),
    Column("heartbeat", Float),
)
Index("ix_jobs_state", jobs.c.state)

#: A job's finished segments (by their index among its distinct segments), written as they finish: a job run
#: again after a restart sends only the others.
job_segments = Table(
    "job_segments", metadata,
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("translation", Text, nullable=False),
    Column("origin", String(16)),
)

#: Files imported once (a legacy tm/ folder's TSVs): by path, with their size and mtime when read.
imports = Table(
    "imports", metadata,
    Column("path", String(1024), primary_key=True),
    Column("signature", String(128), nullable=False),
    Column("created", Float, nullable=False),
)

#: Adapter versions per pair: the folder `adapters/<pair>/<version>/` (the pair's own folder for "v1", the one it
#: shipped with), what it was trained from, its shadow scores, and which is current. One row per version.
adapter_versions = Table(
    "adapter_versions", metadata,
    Column("pair", String(16), primary_key=True),
    Column("version", String(16), primary_key=True),
    #: "candidate" (trained, scored, not serving), "current" (serving), "retired" (served before), "rejected".
    Column("state", String(16), nullable=False),
    Column("parent", String(16)),
    Column("created", Float, nullable=False),
    #: When it became current (the latest promotion or rollback); what a rollback goes back from.
    Column("promoted", Float),
    #: The shadow scores and the decision, as JSON (retrain.ShadowReport).
    Column("report", Text),
)

#: Stored glossaries: one list of terms per (name, pair), as written (JSON [[source, target], …]). Files in the
#: glossaries folder are imported once per file version (`imports`); lists added over the admin API live here only.
glossaries = Table(
    "glossaries", metadata,
    Column("name", String(64), primary_key=True),
    Column("pair", String(16), primary_key=True),
    Column("terms", Text, nullable=False),
    Column("origin", String(16), nullable=False),
    Column("who", String(128)),
    Column("updated", Float, nullable=False),
)
