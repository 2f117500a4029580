"""schedules and their audit

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 07:35:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "schedule",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cron", S(), nullable=False),
        sa.Column("cron_seconds", S(), nullable=True),
        sa.Column("until", S(), nullable=False),
        sa.Column("timezone", S(), nullable=False),
        sa.Column("policy_name", S(), nullable=False),
        sa.Column("policy_params", sa.JSON(), nullable=False),
        sa.Column("memory_reserve", sa.Float(), nullable=True),
        sa.Column("reason", S(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("actor", S(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("applied_version", sa.Integer(), nullable=True),
        sa.Column("last_end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_end", S(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule")),
    )
    op.create_table(
        "schedule_change",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("action", S(), nullable=False),
        sa.Column("actor", S(), nullable=False),
        sa.Column("reason", S(), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_change")),
    )
    with op.batch_alter_table("schedule_change", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_schedule_change_schedule_id"), ["schedule_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("schedule_change", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_schedule_change_schedule_id"))
    op.drop_table("schedule_change")
    op.drop_table("schedule")
