"""guardrail config rows and decisions

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 08:25:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "guardrail_setting",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", S(), nullable=False),
        sa.Column("reason", S(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_guardrail_setting")),
    )
    op.create_table(
        "guardrail_decision",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("mode", S(), nullable=False),
        sa.Column("outcome", S(), nullable=False),
        sa.Column("reason", S(), nullable=False),
        sa.Column("current", sa.JSON(), nullable=False),
        sa.Column("chosen", sa.JSON(), nullable=False),
        sa.Column("predicted_current", sa.JSON(), nullable=False),
        sa.Column("predicted", sa.JSON(), nullable=False),
        sa.Column("candidates", sa.JSON(), nullable=False),
        sa.Column("observed_before", sa.JSON(), nullable=True),
        sa.Column("correction", sa.Float(), nullable=False),
        sa.Column("trace_requests", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("observed_after", sa.JSON(), nullable=True),
        sa.Column("prediction_error", sa.JSON(), nullable=True),
        sa.Column("filled_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_guardrail_decision")),
    )
    with op.batch_alter_table("guardrail_decision", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_guardrail_decision_at"), ["at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("guardrail_decision", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_guardrail_decision_at"))
    op.drop_table("guardrail_decision")
    op.drop_table("guardrail_setting")
