"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 05:58:58.483547
"""
import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None
oldest_hangd = '0.1.0'  # the oldest hangd release that runs on this schema


def upgrade() -> None:
    op.create_table('nodes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.Column('last_seen', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('hostname')
    )
    op.create_table('gpu_minutes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('gpu_index', sa.Integer(), nullable=False),
    sa.Column('minute', sa.Integer(), nullable=False),
    sa.Column('util', sa.Float(), nullable=True),
    sa.Column('sm', sa.Float(), nullable=True),
    sa.Column('power_w', sa.Float(), nullable=True),
    sa.Column('mem_used', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('node_id', 'gpu_index', 'minute')
    )
    with op.batch_alter_table('gpu_minutes', schema=None) as batch_op:
        batch_op.create_index('ix_gpu_minutes_minute', ['minute'], unique=False)

    op.create_table('gpus',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=64), nullable=True),
    sa.Column('name', sa.String(length=128), nullable=True),
    sa.Column('mem_total', sa.BigInteger(), nullable=True),
    sa.Column('last_seen', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('node_id', 'index')
    )
    op.create_table('incidents',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('severity', sa.String(length=16), nullable=False),
    sa.Column('job', sa.String(length=255), nullable=False),
    sa.Column('family', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('opened_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=True),
    sa.Column('resolved_at', sa.Float(), nullable=True),
    sa.Column('hang_started_at', sa.Float(), nullable=True),
    sa.Column('acked', sa.Boolean(), nullable=False),
    sa.Column('acked_at', sa.Float(), nullable=True),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('next_step', sa.Text(), nullable=False),
    sa.Column('pids', sa.JSON(), nullable=False),
    sa.Column('ranks', sa.JSON(), nullable=False),
    sa.Column('culprit_pids', sa.JSON(), nullable=False),
    sa.Column('culprit_ranks', sa.JSON(), nullable=False),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.Column('findings', sa.JSON(), nullable=False),
    sa.Column('timeline', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_incidents_job'), ['job'], unique=False)
        batch_op.create_index(batch_op.f('ix_incidents_kind'), ['kind'], unique=False)
        batch_op.create_index('ix_incidents_opened', ['opened_at'], unique=False)
        batch_op.create_index('ix_incidents_status_opened', ['status', 'opened_at'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=True),
    sa.Column('ranks', sa.JSON(), nullable=False),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.Column('last_seen', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('node_id', 'key')
    )
    op.create_table('processes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('job', sa.String(length=255), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('state', sa.String(length=32), nullable=True),
    sa.Column('since', sa.Float(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.Column('last_seen', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('node_id', 'pid', 'first_seen')
    )
    op.create_table('state_changes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('t', sa.Float(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('job', sa.String(length=255), nullable=True),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('state_changes', schema=None) as batch_op:
        batch_op.create_index('ix_state_changes_pid_t', ['pid', 't'], unique=False)
        batch_op.create_index('ix_state_changes_t', ['t'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('state_changes', schema=None) as batch_op:
        batch_op.drop_index('ix_state_changes_t')
        batch_op.drop_index('ix_state_changes_pid_t')

    op.drop_table('state_changes')
    op.drop_table('processes')
    op.drop_table('jobs')
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.drop_index('ix_incidents_status_opened')
        batch_op.drop_index('ix_incidents_opened')
        batch_op.drop_index(batch_op.f('ix_incidents_kind'))
        batch_op.drop_index(batch_op.f('ix_incidents_job'))

    op.drop_table('incidents')
    op.drop_table('gpus')
    with op.batch_alter_table('gpu_minutes', schema=None) as batch_op:
        batch_op.drop_index('ix_gpu_minutes_minute')

    op.drop_table('gpu_minutes')
    op.drop_table('nodes')
