"""``hangd watch``: one line per state change and per incident change, as they happen.

Readable lines start with the local ISO-8601 time; JSON lines keep Unix seconds (``t``) and add
``t_iso``. Whether GPUs can be seen is said at the start and again whenever it changes, on stderr
(for the person) and in the stream (for whoever reads the output later)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TextIO

from hangd.analysis.engine import StateChange
from hangd.humanize import ago, gpus_unseen, iso_field, iso_local
from hangd.incidents import Incident
from hangd.snapshot import Snapshot


class Watcher:
    def __init__(self, json_lines: bool, out: TextIO, warn: Callable[[str], None]) -> None:
        self.json = json_lines
        self.out = out
        self.warn = warn
        self.unseen: str | None = None
        self.started = False
        self.blind = False  # GPUs could not be seen on some tick
        self.seen_any = False  # some GPU process or distributed job showed up
        self.said: set[tuple[str, str]] = set()  # (source, why) already said

    def _print(self, doc: dict[str, Any], text: str) -> None:
        print(json.dumps(doc, default=str) if self.json else text, file=self.out, flush=True)

    def emit(self, snap: Snapshot, changes: list[StateChange], incidents: list[Incident]) -> None:
        unseen = gpus_unseen(snap.unavailable)
        if unseen != self.unseen or not self.started:
            if unseen is not None:
                self.warn(unseen)
                self._print({"type": "gpus_unseen", "t": snap.t, "t_iso": iso_field(snap.t), "why": unseen},
                            f"{iso_local(snap.t)} {unseen}")
            elif self.started:
                self._print({"type": "gpus_seen", "t": snap.t, "t_iso": iso_field(snap.t), "gpus": len(snap.gpus)},
                            f"{iso_local(snap.t)} GPUs can be seen again ({len(snap.gpus)})")
            self.unseen = unseen
        for name, why in sorted(snap.unavailable.items()):
            # the other sources: each reason said once (a capture source fails only on the ticks it is asked)
            if name != "nvml" and (name, why) not in self.said:
                self.said.add((name, why))
                self.warn(f"source {name} {why}")
                self._print({"type": "source_unavailable", "t": snap.t, "t_iso": iso_field(snap.t), "source": name,
                             "why": why}, f"{iso_local(snap.t)} source {name} {why}")
        self.started = True
        self.blind = self.blind or unseen is not None
        self.seen_any = self.seen_any or bool(changes) or bool(snap.procs)
        for c in changes:
            d = c.to_dict()
            d.pop("evidence", None)
            self._print({"type": "state", **d, "t_iso": iso_field(c.t)},
                        f"{iso_local(c.t)} pid {c.pid} rank {c.rank} job {c.job} -> {c.state}: {c.reason}")
        for inc in incidents:
            d = inc.to_dict()
            d.update({f"{k}_iso": iso_field(d.get(k)) for k in ("opened_at", "updated_at", "resolved_at", "hang_started_at")})
            status = "open" if inc.open else "resolved"
            text = (f"{iso_local(inc.updated_at)} INCIDENT #{inc.id} {inc.kind} {status} job {inc.job}: opened "
                    f"{iso_local(inc.opened_at)} ({ago(inc.opened_at, snap.t)}), culprit ranks "
                    f"{inc.culprit_ranks or '-'}\n    {inc.summary_with_who()}")
            if inc.next_step and inc.open:
                text += f"\n    next step: {inc.next_step}"
            self._print({"type": "incident", **d}, text)
