"""fleet: rows marked gone, so that the heartbeat moves one row per node

A node's processes and jobs rows were rewritten every heartbeat only to move ``last_seen``, which
told the other nodes the row was still listed: about 70% of the rows a fleet wrote. A node now
marks what it stops listing with ``gone_at`` and moves the rows' ``last_seen`` every 10 s only.
The index on (job, last_seen) becomes one on job: with no index on a column a heartbeat or a
state change updates, PostgreSQL updates those rows in place (HOT), without new index entries.

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None
oldest_hangd = '0.1.0'  # the oldest hangd release that runs on this schema


def upgrade() -> None:
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gone_at', sa.Float(), nullable=True))
        batch_op.drop_index('ix_processes_job_last_seen')
        batch_op.create_index('ix_processes_job', ['job'], unique=False)
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gone_at', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('gone_at')
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.drop_index('ix_processes_job')
        batch_op.create_index('ix_processes_job_last_seen', ['job', 'last_seen'], unique=False)
        batch_op.drop_column('gone_at')
