"""who to page: the owner, Slurm job and pod of jobs and incidents

A JSON column ``who`` on jobs and on incidents: the owner of the job's processes, its Slurm job
(id, user, name, account, partition) and its Kubernetes pod (uid, name, namespace, container, or
why the name is unknown). Additive and nullable: a hangd that does not know it leaves it alone,
and rows written before it read as unknown.

Revision ID: 0007
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None
oldest_hangd = '0.1.0'  # the oldest hangd release that runs on this schema: the columns are new and nullable


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('who', sa.JSON(), nullable=True))
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.add_column(sa.Column('who', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.drop_column('who')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('who')
