"""policy versions and maintenance runs

Revision ID: 0001
Revises:
Create Date: 2026-11-29 11:00:01

"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "maintenance_run",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("trigger", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("outcome", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("freed", sa.Integer(), nullable=False),
        sa.Column("evicted", sa.Integer(), nullable=False),
        sa.Column("free_before", sa.Integer(), nullable=True),
        sa.Column("free_after", sa.Integer(), nullable=True),
        sa.Column("reserve_breached", sa.Boolean(), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("error", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_maintenance_run")),
    )
    with op.batch_alter_table("maintenance_run", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_maintenance_run_at"), ["at"], unique=False)
        batch_op.create_index(batch_op.f("ix_maintenance_run_job_id"), ["job_id"], unique=False)

    op.create_table(
        "policy_version",
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("policy_name", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("policy_params", sa.JSON(), nullable=False),
        sa.Column("memory_reserve", sa.Float(), nullable=False),
        sa.Column("reclaim_interval_s", sa.Float(), nullable=False),
        sa.Column("explicit", sa.JSON(), nullable=False),
        sa.Column("actor", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("reason", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rollback_of", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["rollback_of"],
            ["policy_version.version"],
            name=op.f("fk_policy_version_rollback_of_policy_version"),
        ),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_policy_version")),
    )
    with op.batch_alter_table("policy_version", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_policy_version_created_at"), ["created_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("policy_version", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_policy_version_created_at"))
    op.drop_table("policy_version")

    with op.batch_alter_table("maintenance_run", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_maintenance_run_job_id"))
        batch_op.drop_index(batch_op.f("ix_maintenance_run_at"))
    op.drop_table("maintenance_run")
