"""fleet: what each rank does on its own, as a kind

A node judging a job that spans nodes needs to know, of a rank on another node that does not wait
in a collective, whether it waits for requests (an idle inference server's coordinator: the
others waiting for it is not a hang) or is somewhere else (the culprit of a hang). ``waits``
alone cannot tell the two apart.

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None
oldest_hangd = '0.1.0'  # the oldest hangd release that runs on this schema


def upgrade() -> None:
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('local', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.drop_column('local')
