"""Adapter versions (which version of each pair's adapter serves, and the shadow scores of each) and stored
glossaries.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "adapter_versions",
        sa.Column("pair", sa.String(16), primary_key=True),
        sa.Column("version", sa.String(16), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("parent", sa.String(16)),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("promoted", sa.Float),
        sa.Column("report", sa.Text),
    )
    op.create_table(
        "glossaries",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("pair", sa.String(16), primary_key=True),
        sa.Column("terms", sa.Text, nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("who", sa.String(128)),
        sa.Column("updated", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("glossaries")
    op.drop_table("adapter_versions")
