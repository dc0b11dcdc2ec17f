"""Table models (SQLAlchemy 2.x). Public API shapes live in hangd/server/schemas.py, not here."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), unique=True)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)


class Gpu(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_id", "index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str | None] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(128))
    mem_total: Mapped[int | None] = mapped_column(BigInteger)
    last_seen: Mapped[float] = mapped_column(Float)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("node_id", "key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    key: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(255))
    state: Mapped[str | None] = mapped_column(String(32))
    ranks: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    world_size: Mapped[int | None] = mapped_column(Integer)
    identity: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # what the key was made of
    spans_nodes: Mapped[str | None] = mapped_column(String(255))  # why it has ranks on other nodes
    gone_at: Mapped[float | None] = mapped_column(Float)  # when its node stopped listing it
    who: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # its owner, Slurm job and pod


class Process(Base):
    __tablename__ = "processes"
    # no index holds last_seen or a state column: their updates stay heap-only (HOT) in PostgreSQL
    __table_args__ = (UniqueConstraint("node_id", "pid", "first_seen"), Index("ix_processes_job", "job"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    pid: Mapped[int] = mapped_column(Integer)
    job: Mapped[str | None] = mapped_column(String(255))
    rank: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str | None] = mapped_column(String(32))
    since: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    world_size: Mapped[int | None] = mapped_column(Integer)
    last_progress: Mapped[float | None] = mapped_column(Float)
    waits: Mapped[bool | None] = mapped_column(Boolean)  # blocked in a collective, waiting for a peer
    reading: Mapped[str | None] = mapped_column(Text)  # what the rank does on its own, in words (its state's why)
    local: Mapped[str | None] = mapped_column(String(16))  # the same as a kind: "serving", "waiting", "quiet", ...
    gone_at: Mapped[float | None] = mapped_column(Float)  # when its node stopped listing it


class StateChange(Base):
    __tablename__ = "state_changes"
    __table_args__ = (Index("ix_state_changes_pid_t", "pid", "t"), Index("ix_state_changes_t", "t"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    t: Mapped[float] = mapped_column(Float)
    pid: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int | None] = mapped_column(Integer)
    job: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)


class Incident(Base):
    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_status_opened", "status", "opened_at"), Index("ix_incidents_opened", "opened_at"),
                      Index("ux_incidents_open_key", "open_key", unique=True))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    kind: Mapped[str] = mapped_column(String(32), index=True)
    severity: Mapped[str] = mapped_column(String(16))
    job: Mapped[str] = mapped_column(String(255), index=True)
    family: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    opened_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float | None] = mapped_column(Float)
    resolved_at: Mapped[float | None] = mapped_column(Float)
    hang_started_at: Mapped[float | None] = mapped_column(Float)
    acked: Mapped[bool] = mapped_column(Boolean, default=False)
    acked_at: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[str] = mapped_column(Text, default="")
    next_step: Mapped[str] = mapped_column(Text, default="")
    pids: Mapped[list[int]] = mapped_column(JSON, default=list)
    ranks: Mapped[list[int]] = mapped_column(JSON, default=list)
    culprit_pids: Mapped[list[int]] = mapped_column(JSON, default=list)
    culprit_ranks: Mapped[list[int]] = mapped_column(JSON, default=list)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    findings: Mapped[list[Any]] = mapped_column(JSON, default=list)
    timeline: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # "<job>/<family>" while open, for a job that spans nodes: one open incident per job in the fleet
    open_key: Mapped[str | None] = mapped_column(String(300))
    who: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the job's owner, Slurm job and pod


class GpuMinute(Base):
    """Downsampled GPU history: one row per GPU per minute."""

    __tablename__ = "gpu_minutes"
    __table_args__ = (UniqueConstraint("node_id", "gpu_index", "minute"), Index("ix_gpu_minutes_minute", "minute"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    gpu_index: Mapped[int] = mapped_column(Integer)
    minute: Mapped[int] = mapped_column(Integer)  # Unix seconds // 60
    util: Mapped[float | None] = mapped_column(Float)
    sm: Mapped[float | None] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float)
    mem_used: Mapped[float | None] = mapped_column(Float)  # bytes


class FrRank(Base):
    """One rank's newest flight-recorder dump, of a job that spans nodes, as the node it runs on
    read it: when, and its process groups' status. Its entries are in ``fr_entries``."""

    __tablename__ = "fr_ranks"
    __table_args__ = (UniqueConstraint("node_id", "job", "rank"), Index("ix_fr_ranks_job", "job"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    job: Mapped[str] = mapped_column(String(255))
    rank: Mapped[int] = mapped_column(Integer)
    read_at: Mapped[float] = mapped_column(Float)  # when that node read the dump (its clock)
    version: Mapped[str | None] = mapped_column(String(32))
    # pg -> {"pg_id", "desc", "ranks"}; pg -> {"last_enqueued_collective", "last_started_collective", ...}
    pg_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    pg_status: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    entries: Mapped[int] = mapped_column(Integer)  # how many the dump held (the table keeps the newest)


class FrEntry(Base):
    """A collective of a rank's newest dump: what the ranks compare (op, sequence numbers, sizes,
    dtypes, state), never its frames."""

    __tablename__ = "fr_entries"
    __table_args__ = (Index("ix_fr_entries_dump", "dump_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dump_id: Mapped[int] = mapped_column(ForeignKey("fr_ranks.id", ondelete="CASCADE"))
    pg: Mapped[str] = mapped_column(String(255))
    pg_id: Mapped[int | None] = mapped_column(BigInteger)
    seq: Mapped[int | None] = mapped_column(BigInteger)
    p2p_seq: Mapped[int | None] = mapped_column(BigInteger)
    op: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(32))
    completed: Mapped[bool] = mapped_column(Boolean)
    is_p2p: Mapped[bool] = mapped_column(Boolean)
    input_sizes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    input_dtypes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    output_sizes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    time_created_ns: Mapped[int | None] = mapped_column(BigInteger)


class SchemaRevision(Base):
    """A migration applied, and the oldest hangd release that can run on the schema it leaves
    (written by the hangd that migrated; read by an older one: hangd/store/schema.py)."""

    __tablename__ = "hangd_schema"
    revision: Mapped[str] = mapped_column(String(32), primary_key=True)
    oldest_hangd: Mapped[str] = mapped_column(String(32))
