"""fleet flight recorder: each node writes its ranks' newest flight-recorder entries

For a job that spans nodes, the cross-rank flight-recorder analysis (who never entered which
collective, who issued another size) needs every rank's entries, and a node reads only its own
ranks' dumps. Each node writes, per rank of such a job, its newest dump's process-group status
(``fr_ranks``) and its newest entries per process group (``fr_entries``: op, sequence numbers,
sizes, dtypes, state; never frames), replaced when a newer dump of that rank is read.

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None
oldest_hangd = '0.1.0'  # the oldest hangd release that runs on this schema


def upgrade() -> None:
    op.create_table('fr_ranks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('job', sa.String(length=255), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('read_at', sa.Float(), nullable=False),
    sa.Column('version', sa.String(length=32), nullable=True),
    sa.Column('pg_config', sa.JSON(), nullable=False),
    sa.Column('pg_status', sa.JSON(), nullable=False),
    sa.Column('entries', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('node_id', 'job', 'rank')
    )
    with op.batch_alter_table('fr_ranks', schema=None) as batch_op:
        batch_op.create_index('ix_fr_ranks_job', ['job'], unique=False)
    op.create_table('fr_entries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('dump_id', sa.Integer(), nullable=False),
    sa.Column('pg', sa.String(length=255), nullable=False),
    sa.Column('pg_id', sa.BigInteger(), nullable=True),
    sa.Column('seq', sa.BigInteger(), nullable=True),
    sa.Column('p2p_seq', sa.BigInteger(), nullable=True),
    sa.Column('op', sa.String(length=128), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('completed', sa.Boolean(), nullable=False),
    sa.Column('is_p2p', sa.Boolean(), nullable=False),
    sa.Column('input_sizes', sa.JSON(), nullable=False),
    sa.Column('input_dtypes', sa.JSON(), nullable=False),
    sa.Column('output_sizes', sa.JSON(), nullable=False),
    sa.Column('time_created_ns', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['dump_id'], ['fr_ranks.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('fr_entries', schema=None) as batch_op:
        batch_op.create_index('ix_fr_entries_dump', ['dump_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('fr_entries', schema=None) as batch_op:
        batch_op.drop_index('ix_fr_entries_dump')
    op.drop_table('fr_entries')
    with op.batch_alter_table('fr_ranks', schema=None) as batch_op:
        batch_op.drop_index('ix_fr_ranks_job')
    op.drop_table('fr_ranks')
