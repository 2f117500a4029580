"""policy version states: pending -> applied | failed

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 05:38:58

Versions stored before this revision were all put into force at once (or at the next start),
so existing rows become ``applied``. The server default only fills those rows: it is dropped
again, so a row stored without a state cannot pass for applied.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("policy_version", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "state",
                sqlmodel.sql.sqltypes.AutoString(),
                nullable=False,
                server_default="applied",
            )
        )
        batch_op.add_column(
            sa.Column("state_reason", sqlmodel.sql.sqltypes.AutoString(), nullable=True)
        )
        batch_op.add_column(sa.Column("state_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE policy_version SET state_at = created_at")
    with op.batch_alter_table("policy_version", schema=None) as batch_op:
        batch_op.alter_column("state", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("policy_version", schema=None) as batch_op:
        batch_op.drop_column("state_at")
        batch_op.drop_column("state_reason")
        batch_op.drop_column("state")
