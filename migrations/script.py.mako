"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""
from alembic import op
import sqlalchemy as sa
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}
# the oldest hangd release that runs on the schema this leaves: an older release's hangd keeps serving
# on it during a rolling upgrade when it is additive (new tables, nullable columns); a migration that
# an older release cannot run on names the release that ships it (docs/operator-guide.md, "Upgrades")
oldest_hangd = 'SET-ME'  # until set: taken as the release that ships it (no older one runs on it)


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
