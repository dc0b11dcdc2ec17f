"""Evidence decoded where it arrives: flight-recorder bytes and NCCL RAS text become typed records
on the snapshot, so the analysis reads records, not bytes, and a hostile file fails here, once.

Also what the analysis asks the sources to capture next (``Requests``): it lives here, between
the two, so neither imports the other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hangd.flightrec.reader import DumpError, decode
from hangd.snapshot import Snapshot


@dataclass
class Requests:
    """What the analysis would like the sources to capture next (ignored on replay)."""

    stacks: list[tuple[int, bool]] = field(default_factory=list)  # (pid, native)
    fr_dumps: list[int] = field(default_factory=list)
    ras: bool = False  # ask NCCL's RAS thread for its view


_LAUNCHED = re.compile(r"Rank (\d+) has launched up to operation (\d+) -- GPU (\d+) managed by process (\d+)")
_MISSING = re.compile(r"Missing communicator data from (\d+) ranks? -- GPU (\d+) managed by process (\d+)")
_STATUS = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([A-Z_]+)\s+([A-Z_]+)?\s*$", re.M)
_OPCOUNT = re.compile(r"different (\w+) operation counts")


@dataclass
class RasStatus:
    """NCCL RAS's ``VERBOSE STATUS`` answer, parsed."""

    version: str | None = None
    groups: list[dict[str, object]] = field(default_factory=list)  # {"group", "status", "errors"}
    launched: list[dict[str, int]] = field(default_factory=list)  # {"rank", "op", "gpu", "pid"}
    op: str | None = None  # the collective whose counts differ (AllReduce, ...)
    missing: list[dict[str, int]] = field(default_factory=list)  # {"ranks", "gpu", "pid"}

    def behind(self) -> list[dict[str, int]]:
        """The ranks that launched fewer operations than the others: the ones the others wait for."""
        if not self.launched:
            return []
        top = max(x["op"] for x in self.launched)
        return [x for x in self.launched if x["op"] < top]

    def pids(self) -> set[int]:
        return {x["pid"] for x in self.launched} | {x["pid"] for x in self.missing}

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "groups": self.groups, "launched": self.launched, "op": self.op,
                "missing": self.missing, "behind": self.behind()}


def parse_ras_text(text: str) -> RasStatus:
    """A pure function over the text NCCL returns (the text format of NCCL 2.24-2.28)."""
    st = RasStatus()
    m = re.search(r"NCCL version (\S+)", text)
    st.version = m.group(1) if m else None
    for g in _STATUS.finditer(text):
        st.groups.append({"group": int(g.group(1)), "status": g.group(7), "errors": g.group(8) or ""})
    for m in _LAUNCHED.finditer(text):
        st.launched.append({"rank": int(m.group(1)), "op": int(m.group(2)), "gpu": int(m.group(3)), "pid": int(m.group(4))})
    m = _OPCOUNT.search(text)
    st.op = m.group(1) if m else None
    for m in _MISSING.finditer(text):
        st.missing.append({"ranks": int(m.group(1)), "gpu": int(m.group(2)), "pid": int(m.group(3))})
    return st


def decode_evidence(snap: Snapshot) -> Snapshot:
    """Decode the snapshot's flight-recorder dumps and RAS answers in place (idempotent). A dump
    that cannot be read keeps its error; nothing here raises."""
    for d in snap.fr_dumps:
        if d.dump is not None or d.error is not None or d.data is None:
            continue
        try:
            d.dump = decode(d.data, d.rank)
        except DumpError as e:
            d.error = str(e)
        except (RecursionError, OverflowError, ValueError, TypeError, MemoryError) as e:  # belt and braces
            d.error = f"undecodable: {type(e).__name__}"
    for r in snap.ras:
        if r.status is None:
            try:
                r.status = parse_ras_text(r.text)
            except (re.error, ValueError) as e:
                r.error = str(e)
    return snap
