"""schema releases: which hangd releases can run on each revision (rolling upgrades)

Every migration names the oldest hangd release that runs on the schema it leaves
(``oldest_hangd`` below); the hangd that migrates writes it here, one row per applied revision.
A hangd that meets a revision it does not know reads this table to decide whether it can serve
on that schema as it is, or must refuse with one line naming the release it needs
(hangd/store/schema.py; docs/operator-guide.md, "Upgrades").

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None
oldest_hangd = '0.1.0'  # the oldest hangd release that runs on this schema


def upgrade() -> None:
    op.create_table(
        'hangd_schema',
        sa.Column('revision', sa.String(length=32), nullable=False),
        sa.Column('oldest_hangd', sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint('revision'),
    )


def downgrade() -> None:
    op.drop_table('hangd_schema')
