"""What the analysis tells an operator about recorded jobs, pinned word for word.

Each case replays a real recorded trace through the analyzer and compares everything a person or
a dashboard reads from it with a reviewed copy in ``golden/``: every state change with its reason,
what the analysis asked the sources to capture (stacks, flight-recorder dumps, RAS), the
process/job/GPU views every 20 s of the trace, and the incidents and findings with their
summaries, culprits, next steps and evidence. The accuracy tests say whether the diagnosis is
right; these say that nothing an operator reads changed unnoticed: a reworded reason, a rank
named differently, a culprit's evidence gone, a threshold that moves an incident by a second.

After an intended change, regenerate with ``HANGD_UPDATE_GOLDEN=1 pytest tests/analysis/test_golden.py``
and review the diff of ``tests/analysis/golden/`` like code."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from hangd.analysis.engine import Analyzer
from hangd.snapshot import Snapshot

from ..conftest import DATA
from ..replays import snapshots

GOLDEN = Path(__file__).parent / "golden"
VIEW_EVERY_S = 20.0
# every recorded trace, those quickest to judge first (a broken analysis usually fails the first):
# training, inference, loading, compiling, graph capture, a host hang, NCCL stalls (with flight
# recorder), launches back to back, a handshake that never completes, dead and killed workers, a
# stopped rank, a straggler, a size mismatch, an orphan
CASES = [
    "h200x2/compute", "h200x2/idle_server", "h200x2/train", "h200x2/load", "h200x2/cpu_hang",
    "h200x2/nccl_stall", "h200x1-live/gloo_cuda_stall", "h200x2-hf2/back_to_back", "h200x2-hf2/healthy", "h200x2-hf2/slow_load",
    "h200x2-live/straggler", "h200x2-hf2/gloo_handshake", "h200x2-hf2/worker_died", "h200x2-live/kill",
    "h200x2-live/mismatch", "h200x2-live/sigstop", "h200x2-live/orphan", "h200x2-live/nccl_stall",
    "h200x2-hf/back_to_back", "h200x2-hf/healthy", "h200x2-hf/slow_load", "h200x2-hf/gloo_handshake",
    "h200x2-hf/worker_died", "h200x2/graph_capture", "h200x2-live/compile",
]
# read and decoded once, when this module is collected (tests/replays.py keeps them for the session,
# the accuracy tests replay them too): the flight-recorder dumps take most of a replay's time, and a
# forked test run (mutation testing) inherits them from its parent. A pytest-xdist worker (`make
# test-fast`) reads them when first asked instead: only the one that runs these tests needs them.
if not os.environ.get("PYTEST_XDIST_WORKER"):
    for _case in CASES:
        snapshots(DATA / "traces" / _case)


def _plain(x: Any) -> Any:
    """JSON-ready and stable: floats to 4 decimals, tuples and sets as lists, keys as strings."""
    if isinstance(x, str):
        return str(x)  # a StrEnum as the text it stands for
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted(_plain(v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _plain(dataclasses.asdict(x))
    return x


def observe(snaps: Iterable[Snapshot]) -> dict[str, Any]:
    """Everything the analysis says about a recorded node, in the order it says it."""
    said: dict[str, Any] = {"changes": [], "requests": [], "views": []}
    an = Analyzer()
    next_view = last_t = 0.0
    for snap in snaps:
        said["changes"] += [c.to_dict() for c in an.step(snap)]
        req = an.take_requests()
        if req.stacks or req.fr_dumps or req.fr_probes or req.ras:
            said["requests"].append({"t": snap.t, **dataclasses.asdict(req)})
        if snap.t >= next_view:
            said["views"].append({"t": snap.t, "processes": an.processes(), "jobs": an.jobs(), "gpus": an.gpus()})
            next_view = snap.t + VIEW_EVERY_S
        last_t = snap.t
    said["views"].append({"t": last_t, "processes": an.processes(), "jobs": an.jobs(), "gpus": an.gpus()})
    said["incidents"] = [i.to_dict() for i in an.incidents()]
    said["open"] = [i.id for i in an.incidents(open_only=True)]
    said["opened_counts"] = an.opened_counts()
    said["findings"] = list(an.findings)
    return _plain(said)


def _diff(want: Any, got: Any, where: str = "") -> str | None:
    """The first place where two JSON values differ, for a readable failure."""
    if type(want) is not type(got):
        return f"{where or '/'}: {json.dumps(want)[:300]} != {json.dumps(got)[:300]}"
    if isinstance(want, dict):
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                return f"{where}/{k}: only in {'the golden copy' if k in want else 'this run'}"
            if (d := _diff(want[k], got[k], f"{where}/{k}")) is not None:
                return d
        return None
    if isinstance(want, list):
        for i, (a, b) in enumerate(zip(want, got, strict=False)):
            if (d := _diff(a, b, f"{where}[{i}]")) is not None:
                return d
        if len(want) != len(got):
            return f"{where}: {len(want)} entries in the golden copy, {len(got)} now"
        return None
    return None if want == got else f"{where or '/'}: {json.dumps(want)[:300]} != {json.dumps(got)[:300]}"


@pytest.mark.parametrize("case", CASES)
def test_what_the_operator_reads_is_unchanged(case):
    got = observe(snapshots(DATA / "traces" / case))
    path = GOLDEN / (case.replace("/", "--") + ".json")
    if os.environ.get("HANGD_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert (d := _diff(want, got)) is None, f"{case}: {d}"


def test_the_golden_copies_are_of_what_users_read():
    """The pinned copies are not empty shells: every case says something, and together they hold
    hang incidents with culprits, healthy jobs without one, and the words of each."""
    seen_kinds: set[str] = set()
    culprits = 0
    for case in CASES:
        g = json.loads((GOLDEN / (case.replace("/", "--") + ".json")).read_text())
        assert g["changes"] and g["views"], case
        assert all(c["reason"] for c in g["changes"]), case
        seen_kinds |= {i["kind"] for i in g["incidents"]}
        culprits += sum(bool(i["culprit_ranks"]) for i in g["incidents"])
    assert {"nccl_stall", "host_stall"} <= seen_kinds, seen_kinds
    assert culprits >= 3
