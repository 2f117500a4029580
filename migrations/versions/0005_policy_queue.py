"""policy versions: the queue axis

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 05:20:00

The setting's second axis (``policies.queue.QueueSpec``) beside the batching policy. Rows
stored before it keep ``NULL``: they read as ``fcfs``, the only queue order there was.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("policy_version", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policy_version", schema=None) as batch_op:
        batch_op.drop_column("queue")
