"""fleet: several nodes' hangd share one database

Each node writes its ranks with their world size, last progress and whether they wait in a
collective, so that the other nodes can diagnose a job that spans nodes; the jobs carry what
their key was made of; an open incident of a job that spans nodes holds a unique ``open_key``
("<job>/<family>") so that the whole fleet has one open incident per job and family, whichever
node opens it first.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None
oldest_hangd = '0.1.0'  # the oldest hangd release that runs on this schema


def upgrade() -> None:
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('world_size', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('last_progress', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('waits', sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column('reading', sa.Text(), nullable=True))
        batch_op.create_index('ix_processes_job_last_seen', ['job', 'last_seen'], unique=False)
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('world_size', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('identity', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('spans_nodes', sa.String(length=255), nullable=True))
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.add_column(sa.Column('open_key', sa.String(length=300), nullable=True))
        # NULLs are distinct in both SQLite and PostgreSQL: only open incidents of jobs that span
        # nodes take part
        batch_op.create_index('ux_incidents_open_key', ['open_key'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.drop_index('ux_incidents_open_key')
        batch_op.drop_column('open_key')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('spans_nodes')
        batch_op.drop_column('identity')
        batch_op.drop_column('world_size')
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.drop_index('ix_processes_job_last_seen')
        batch_op.drop_column('reading')
        batch_op.drop_column('waits')
        batch_op.drop_column('last_progress')
        batch_op.drop_column('world_size')
