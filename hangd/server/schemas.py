"""Public response models (the table models are in hangd/store/models.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, computed_field

from hangd.humanize import iso_field


class SlurmJob(BaseModel):
    job_id: str
    user: str | None = None
    name: str | None = None
    account: str | None = None
    partition: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    step_id: str | None = None


class Pod(BaseModel):
    uid: str = Field(description="from the cgroup path the kubelet gave the container")
    name: str | None = None
    namespace: str | None = None
    container: str | None = None
    container_id: str | None = None
    qos: str | None = Field(default=None, description="guaranteed | burstable | besteffort")
    name_from: str | None = Field(default=None, description="where the name was found")
    unresolved: str | None = Field(default=None, description="why the name is unknown")


class Who(BaseModel):
    """Whom to page about a job: its processes' owner, its Slurm job, its Kubernetes pod (each
    absent where unknown)."""

    user: str | None = Field(default=None, description="the owner (real uid) of its ranks, by name, or 'uid N'")
    uid: int | None = None
    slurm: SlurmJob | None = None
    pod: Pod | None = None
    text: str | None = Field(default=None, description="the same in words")


class IncidentSummary(BaseModel):
    id: int
    kind: str = Field(description="nccl_stall | host_stall | io_stall | orphaned_gpu_memory | collective_mismatch | straggler | rank_exited")
    severity: str
    job: str
    status: str = Field(description="open | resolved")
    opened_at: float
    updated_at: float | None = None
    resolved_at: float | None = None
    hang_started_at: float | None = None
    acked: bool = False
    summary: str
    next_step: str = ""
    pids: list[int] = []
    ranks: list[int] = []
    culprit_pids: list[int] = []
    culprit_ranks: list[int] = []
    who: Who | None = Field(default=None, description="the job's owner, Slurm job and pod")

    # the same instants for a person reading the JSON: local time with its offset
    @computed_field(description="opened_at as ISO-8601 (local time with offset)")  # type: ignore[prop-decorator]
    @property
    def opened_at_iso(self) -> str | None:
        return iso_field(self.opened_at)

    @computed_field(description="updated_at as ISO-8601 (local time with offset)")  # type: ignore[prop-decorator]
    @property
    def updated_at_iso(self) -> str | None:
        return iso_field(self.updated_at)

    @computed_field(description="resolved_at as ISO-8601 (local time with offset); null while open")  # type: ignore[prop-decorator]
    @property
    def resolved_at_iso(self) -> str | None:
        return iso_field(self.resolved_at)

    @computed_field(description="hang_started_at as ISO-8601 (local time with offset)")  # type: ignore[prop-decorator]
    @property
    def hang_started_at_iso(self) -> str | None:
        return iso_field(self.hang_started_at)


class IncidentDetail(IncidentSummary):
    evidence: dict[str, Any] = {}
    findings: list[Any] = []
    timeline: list[Any] = []


class IncidentList(BaseModel):
    total: int
    limit: int
    offset: int
    incidents: list[IncidentSummary]


class ProcessOut(BaseModel):
    pid: int
    rank: int | None
    rank_from: str | None = None
    job: str
    state: str
    since: float
    for_s: float
    reason: str
    gpus: list[int] = []
    gpu_mem_bytes: int | None = None
    cpu_cores: float | None = None
    last_progress: float | None = None
    last_progress_why: str = ""
    # the evidence record it was judged on, per source: "yes: what moved", "no", or "unknown"
    moved: dict[str, str] = {}
    command: str | None = None

    @computed_field(description="since as ISO-8601 (local time with offset)")  # type: ignore[prop-decorator]
    @property
    def since_iso(self) -> str | None:
        return iso_field(self.since)

    @computed_field(description="last_progress as ISO-8601 (local time with offset)")  # type: ignore[prop-decorator]
    @property
    def last_progress_iso(self) -> str | None:
        return iso_field(self.last_progress)


class JobNode(BaseModel):
    node: str
    last_report: float = Field(description="when that node's hangd last reported (Unix seconds, its clock)")
    stale: bool = Field(description="its hangd stopped reporting: its ranks are not judged, never blamed")
    ranks: dict[str, int] = Field(description="rank -> pid on that node")


class FleetRank(BaseModel):
    node: str
    pid: int
    state: str | None = None
    reason: str | None = None
    last_progress: float | None = None
    waits: bool | None = Field(default=None, description="blocked in a collective, waiting for a peer")
    reported_at: float


class FrP2p(BaseModel):
    seq: int | None = Field(default=None, description="its p2p sequence number")
    op: str
    state: str
    completed: bool


class FrGroup(BaseModel):
    """Where one rank stands in one process group, from the newest flight-recorder dump its node wrote."""

    node: str = Field(description="the node whose hangd read the dump")
    pg: str = Field(description="the process group's name in the dump")
    read_at: float = Field(description="when that node read the dump (Unix seconds, its clock)")
    seq: int | None = Field(default=None, description="the newest collective the rank entered (collective_seq_id); "
                            "null when the group has only point-to-point entries")
    op: str | None = None
    sizes: list[Any] | None = Field(default=None, description="its input sizes")
    dtypes: list[Any] | None = Field(default=None, description="its input dtypes")
    state: str | None = Field(default=None, description="scheduled | started | completed, as the dump says")
    completed: bool | None = Field(default=None, description="completed or retired (gloo's entries stay scheduled)")
    completed_seq: int | None = Field(default=None, description="the newest collective it completed; null when unknown")
    behind: int | None = Field(default=None, description="how many collectives of this group the rank furthest on "
                               "entered after this one (0: none)")
    p2p: FrP2p | None = Field(default=None, description="the newest point-to-point entry, if any")

    @computed_field(description="read_at as ISO-8601 (local time with offset)")  # type: ignore[prop-decorator]
    @property
    def read_at_iso(self) -> str | None:
        return iso_field(self.read_at)


class FrFindingOut(BaseModel):
    incident: int = Field(description="the open incident that holds it")
    kind: str | None = Field(default=None, description="missing_rank | op_mismatch | size_mismatch | dtype_mismatch | "
                             "stuck | node_silent | ...")
    pg: str | None = None
    seq: int | None = None
    message: str


class JobOut(BaseModel):
    job: str
    name: str
    state: str | None
    ranks: dict[str, int]
    rank_from: dict[str, str | None] = Field(default={}, description="per rank: how its rank was known (environment RANK, flight-recorder dump, [rankN] log prefix, command line, GPU index order, ...)")
    identity: dict[str, str] = Field(default={}, description="what the job key was made of (rendezvous, run_id, slurm_job, restart, launcher)")
    world_size: int | None = None
    launcher: int | None = None
    last_progress: float | None = None
    open_incidents: list[int] = []
    who: Who | None = Field(default=None, description="its owner, Slurm job and pod, as this node knows them")
    spans_nodes: str | None = Field(default=None, description="why the job has ranks on other nodes (absent: one node)")
    nodes: list[JobNode] | None = Field(default=None, description="a job that spans nodes, with a shared database: "
                                        "every node that reports it")
    rank_nodes: dict[str, str] | None = Field(default=None, description="rank -> the node it runs on")
    fleet_ranks: dict[str, FleetRank] | None = Field(default=None, description="rank -> where it is, as its node reports")
    stopped_reporting: list[str] | None = Field(default=None, description="nodes of the job whose hangd stopped reporting")
    flight_recorder: dict[str, list[FrGroup]] | None = Field(
        default=None, description="/jobs/{key} of a job that spans nodes: rank -> where it stands per process group, from "
        "the newest flight-recorder dump each node wrote (empty: no dump written)")
    fr_findings: list[FrFindingOut] | None = Field(
        default=None, description="/jobs/{key} of a job that spans nodes: the cross-rank flight-recorder findings of its "
        "open incidents")

    @computed_field(description="last_progress as ISO-8601 (local time with offset)")  # type: ignore[prop-decorator]
    @property
    def last_progress_iso(self) -> str | None:
        return iso_field(self.last_progress)


class GpuOut(BaseModel):
    index: int
    uuid: str | None = None
    name: str | None = None
    util_gpu: int | None = None
    util_mem: int | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    power_w: float | None = None
    temp_c: int | None = None
    sm_clock: int | None = None
    gpm: dict[str, float] | None = None
    processes: list[dict[str, Any]] = []
    # hardware health: null where NVML could not say (never 0)
    clock_events: list[str] | None = Field(default=None, description="clock-event (throttle) reasons now: sw_power_cap, "
                                           "hw_slowdown, hw_thermal_slowdown, ... (hangd/analysis/hardware.toml)")
    ecc_uncorrected: int | None = Field(default=None, description="volatile uncorrected ECC errors")
    ecc_corrected: int | None = Field(default=None, description="volatile corrected ECC errors")
    remap_pending: bool | None = Field(default=None, description="a row remapping waits for a GPU reset")
    remap_failure: bool | None = Field(default=None, description="a row remapping failed")
    nvlink_errors: dict[str, int] | None = Field(default=None, description="NVLink error counters over its links")
    xids: list[dict[str, Any]] = Field(default=[], description="XIDs it reported in the last 15 minutes: "
                                       "{xid, meaning, severity, t}")


class GpuMinuteOut(BaseModel):
    """One minute of a GPU's history: the means of that minute's readings; null where none was read."""

    gpu: int = Field(description="the GPU's index on the node")
    t: float = Field(description="the minute's start, Unix seconds")
    util: float | None = Field(default=None, description="GPU utilization, %")
    sm: float | None = Field(default=None, description="SM activity, % (GPM; null without GPM)")
    power_w: float | None = Field(default=None, description="power, W")
    mem_used: float | None = Field(default=None, description="memory used, bytes")

    @computed_field(description="t as ISO-8601 (local time with offset)")  # type: ignore[prop-decorator]
    @property
    def t_iso(self) -> str | None:
        return iso_field(self.t)


class TimelineEntry(BaseModel):
    t: float
    pid: int
    rank: int | None
    job: str | None
    state: str
    reason: str

    @computed_field(description="t as ISO-8601 (local time with offset)")  # type: ignore[prop-decorator]
    @property
    def t_iso(self) -> str | None:
        return iso_field(self.t)


class Health(BaseModel):
    status: str
    detail: str = ""
