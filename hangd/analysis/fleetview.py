"""Cross-rank judgments over what every node of a fleet wrote of its ranks' flight recorders.

Pure: the store reads the rows (each rank's newest dump, per process group) and asks these what
they mean, so that which rank is behind and which finding stands are decided in analysis, where
the findings themselves are made (``hangd.flightrec.analyze``), not in the database layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Mapping[str, Any])


def newest_completed(said: Any, done_seq: int | None) -> int | None:
    """The newest collective a rank completed in a group: the larger of what its dump's group
    status says (``last_completed_collective``; only a non-negative int counts) and the sequence
    number of its newest entry marked completed. None when neither says."""
    known = [x for x in (said if isinstance(said, int) and not isinstance(said, bool) and said >= 0 else None,
                         done_seq) if x is not None]
    return max(known) if known else None


def behind_furthest(positions: Iterable[tuple[str, int | None]]) -> list[int | None]:
    """Per ``(pg, seq)`` (a rank's newest collective in a process group): how many collectives
    the rank furthest on in that group entered after it; None for a rank whose newest collective
    is not known. A rank that never entered the collective its peers are in is behind them."""
    positions = list(positions)
    furthest: dict[str, int] = {}
    for pg, seq in positions:
        if seq is not None:
            furthest[pg] = max(furthest.get(pg, seq), seq)
    return [furthest[pg] - seq if seq is not None else None for pg, seq in positions]


def standing_findings(findings: Iterable[F]) -> list[F]:
    """The findings that stand once every node's dumps are in: "all ranks entered #61 and none
    completed it" (``stuck``) was said over one node's ranks before the other nodes' dumps came;
    "rank 3 never entered #61" (``missing_rank``) over all of them overrules it, per group and
    sequence number. The order is kept."""
    findings = list(findings)
    missing = {(f["pg"], f["seq"]) for f in findings if f["kind"] == "missing_rank"}
    return [f for f in findings if f["kind"] != "stuck" or (f["pg"], f["seq"]) not in missing]
