"""Evidence decoded where it arrives: flight-recorder bytes and NCCL RAS text become typed records
on the snapshot, so the analysis reads records, not bytes, and a hostile file fails here, once.

Also what the analysis asks the sources to capture next (``Requests``): it lives here, between
the two, so neither imports the other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hangd.flightrec.reader import DumpError, decode
from hangd.snapshot import Snapshot


@dataclass
class Requests:
    """What the analysis would like the sources to capture next (ignored on replay)."""

    stacks: list[tuple[int, bool]] = field(default_factory=list)  # (pid, native)
    fr_dumps: list[int] = field(default_factory=list)
    # dumps asked to see whether collectives still complete (no hang judged): of ranks with a dump
    # pipe only, and nothing said of the others
    fr_probes: list[int] = field(default_factory=list)
    ras: bool = False  # ask NCCL's RAS thread for its view
    # pid -> rank, of the ranks dumps are asked of whose rank the analysis knows on evidence (an
    # argument, a log prefix) and their environment does not say: their pipe and files are named by it
    ranks: dict[int, int] = field(default_factory=dict)


_LAUNCHED = re.compile(r"Rank (\d+) has launched up to operation (\d+) -- GPU (\d+) managed by process (\d+)")
_MISSING = re.compile(r"Missing communicator data from (\d+) ranks? -- GPU (\d+) managed by process (\d+)")
_STATUS = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([A-Z_]+)\s+([A-Z_]+)?\s*$", re.M)
_OPCOUNT = re.compile(r"different (\w+) operation counts")
# the count several ranks share (NCCL prints the one rank of a count of its own on its line instead)
_SHARED = re.compile(r"(\d+) ranks have launched up to operation (\d+)")


@dataclass
class RasStatus:
    """NCCL RAS's ``VERBOSE STATUS`` answer, parsed."""

    version: str | None = None
    groups: list[dict[str, object]] = field(default_factory=list)  # {"group", "status", "errors"}
    launched: list[dict[str, int]] = field(default_factory=list)  # {"rank", "op", "gpu", "pid"}
    op: str | None = None  # the collective whose counts differ (AllReduce, ...)
    missing: list[dict[str, int]] = field(default_factory=list)  # {"ranks", "gpu", "pid"}
    collectives: list[str] = field(default_factory=list)  # the collective of each block of counts
    shared: list[dict[str, int]] = field(default_factory=list)  # {"ranks", "op", "block"}: counts several ranks share

    def words(self) -> str:
        """What each rank launched, in words ("NCCL RAS: rank 0 (pid 7) launched up to AllReduce #9; ...")."""
        return words(self.to_dict())

    def behind(self) -> list[dict[str, int]]:
        """The ranks that launched fewer operations than the others, each count compared within its
        own block (a communicator's counts of one collective): the ones the others wait for. A rank
        behind in several blocks is listed once, at its first."""
        out: list[dict[str, int]] = []
        for block in sorted({x.get("block", 0) for x in self.launched}):  # one block where no "block" is given
            rows = [x for x in self.launched if x.get("block", 0) == block]
            top = max(x["op"] for x in rows)
            # a count several ranks share: a rank more than one operation below it is behind them
            # (a spread of one is RAS sampling ranks that launch as it asks: healthy jobs show it)
            shared = max((x["op"] for x in self.shared if x.get("block", 0) == block), default=top)
            out += [x for x in rows if (x["op"] < top or x["op"] < shared - 1) and x["pid"] not in {y["pid"] for y in out}]
        return out

    def pids(self) -> set[int]:
        return {x["pid"] for x in self.launched} | {x["pid"] for x in self.missing}

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "groups": self.groups, "launched": self.launched, "op": self.op,
                "missing": self.missing, "behind": self.behind(),
                **({"collectives": self.collectives} if len(self.collectives) > 1 else {})}


def words(d: dict[str, Any]) -> str:
    """A RAS answer's counts in words, from its dict (``RasStatus.to_dict``, a finding of a trace)."""
    names = d.get("collectives") or []
    op = d.get("op") or "operation"
    launched = sorted(d.get("launched") or [], key=lambda x: (x.get("block", 0), x["rank"]))
    return "NCCL RAS: " + ("; ".join(
        f"rank {x['rank']} (pid {x['pid']}) launched up to "
        f"{names[x['block']] if 'block' in x and x['block'] < len(names) else op} #{x['op']}"
        for x in launched) or "no rank reported what it launched")


def parse_ras_text(text: str) -> RasStatus:
    """A pure function over the text NCCL returns (the text format of NCCL 2.24-2.28)."""
    st = RasStatus()
    m = re.search(r"NCCL version (\S+)", text)
    st.version = m.group(1) if m else None
    for g in _STATUS.finditer(text):
        st.groups.append({"group": int(g.group(1)), "status": g.group(7), "errors": g.group(8) or ""})
    # each "different X operation counts" warning opens a block of counts of its own (a communicator
    # can differ in several collectives; a job can have several communicators)
    heads = [(m.start(), m.group(1)) for m in _OPCOUNT.finditer(text)]
    def blocked(entry: dict[str, int], at: int) -> dict[str, int]:
        """Which block, and of which collective, only where there are several."""
        if len(heads) > 1:
            entry["block"] = sum(1 for h, _ in heads if h < at) - 1
        return entry

    for m in _LAUNCHED.finditer(text):
        st.launched.append(blocked({"rank": int(m.group(1)), "op": int(m.group(2)), "gpu": int(m.group(3)),
                                    "pid": int(m.group(4))}, m.start()))
    for m in _SHARED.finditer(text):
        st.shared.append(blocked({"ranks": int(m.group(1)), "op": int(m.group(2))}, m.start()))
    st.collectives = [name for _, name in heads]
    st.op = heads[0][1] if heads else None
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
