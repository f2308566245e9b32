"""The first schema: memory entries, corrections, document jobs and their finished segments, imports.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memory_entries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("pair", sa.String(16), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("who", sa.String(128)),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("route", sa.String(64)),
        sa.Column("adapter_version", sa.String(64)),
    )
    op.create_index("ix_memory_pair_id", "memory_entries", ["pair", "id"])
    op.create_table(
        "corrections",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("pair", sa.String(16), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("translation", sa.Text, nullable=False),
        sa.Column("machine", sa.Text),
        sa.Column("context", sa.Text),
        sa.Column("who", sa.String(128)),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("route", sa.String(64)),
        sa.Column("adapter_version", sa.String(64)),
    )
    op.create_index("ix_corrections_pair_id", "corrections", ["pair", "id"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("target", sa.String(16), nullable=False),
        sa.Column("detected_source", sa.String(16)),
        sa.Column("owner", sa.Text),
        sa.Column("caller", sa.Text),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("done", sa.Integer, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("started", sa.Float),
        sa.Column("ended", sa.Float),
        sa.Column("error", sa.Text),
        sa.Column("error_status", sa.Integer),
        sa.Column("upload_path", sa.Text, nullable=False),
        sa.Column("options", sa.Text, nullable=False),
        sa.Column("result_path", sa.Text),
        sa.Column("result_filename", sa.Text),
        sa.Column("media_type", sa.String(128)),
        sa.Column("note", sa.Text),
        sa.Column("runner", sa.String(128)),
        sa.Column("heartbeat", sa.Float),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "job_segments",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("translation", sa.Text, nullable=False),
        sa.Column("origin", sa.String(16)),
    )
    op.create_table(
        "imports",
        sa.Column("path", sa.String(1024), primary_key=True),
        sa.Column("signature", sa.String(128), nullable=False),
        sa.Column("created", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("imports", "job_segments", "jobs", "corrections", "memory_entries"):
        op.drop_table(table)
