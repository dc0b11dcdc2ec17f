"""The baseline of every recording: how well the analysis does on each, so that none gets worse.

Every recording under tests/data/traces/ with a ground truth (truth.jsonl) is replayed (`hangd replay`,
hangd.replay.run_replay) and judged as the accuracy tests judge it: its per-second score against the
truth (hangd.evaluate.score), the incidents it opened (kind and culprit ranks, in the order opened),
and, where the recording has an expect.json, whether the diagnosis meets it (hangd.evaluate.
expect_problems) and what it misses. tests/data/traces/baseline.json holds one entry a recording;
tests/analysis/test_baseline.py replays them all again and fails on any that does worse than its
entry (`regressions` below says what worse is).

  python scripts/baseline.py            replay them all, say how each compares with the baseline
  python scripts/baseline.py --write    ... and write the baseline again (after an improvement, or a
                                        change reviewed as intended; review the diff like code)
  python scripts/baseline.py --only h200x1-live/    only the recordings whose name holds one of these
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hangd.evaluate import expect_problems, gap_key, score  # noqa: E402
from hangd.incidents import HANG_KINDS  # noqa: E402

TRACES = ROOT / "tests" / "data" / "traces"
BASELINE = TRACES / "baseline.json"
BAR = 0.95  # the per-second bar of the accuracy tests: a recording that meets it keeps meeting it
SLACK = 0.005  # a score may move this much below its entry (rounded to 3 decimals) and still pass
WRITE_HINT = "run `python scripts/baseline.py --write` and review the diff of tests/data/traces/baseline.json"


def recordings(root: Path = TRACES) -> list[str]:
    """Every recording with a ground truth, by its name under ``root`` (``matrix-cpu/<cell>``)."""
    return sorted(p.parent.relative_to(root).as_posix() for p in root.rglob("truth.jsonl"))


def entry(trace_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """How the analysis did on one recording, from its replay's result (hangd.replay.replay_result):
    the per-second score (3 decimals) over how many seconds, the incidents opened as "kind [culprit
    ranks]", and whether they meet expect.json (None without one) with what they miss."""
    sc = score(str(trace_dir), result["states"])
    out: dict[str, Any] = {
        "score": round(sc["accuracy"], 3),
        "seconds": sc["seconds"],
        "incidents": [f"{i['kind']} {sorted(i.get('culprit_ranks') or [])}" for i in result["incidents"]],
        "meets_expect": None,
    }
    expect_file = trace_dir / "expect.json"
    if expect_file.exists():
        problems = sorted({gap_key(p) for p in expect_problems(json.loads(expect_file.read_text()),
                                                               result["incidents"], HANG_KINDS)})
        out["meets_expect"] = not problems
        if problems:
            out["problems"] = problems
    return out


def regressions(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """How ``new`` does worse than the baseline's ``old`` entry of the same recording (empty if it
    does not): a score more than SLACK below the entry's, or under the bar where the entry met it; a
    recording that met its expect.json no longer meets it, or misses more of it than it did; a
    recording that met it opens other incidents, or names other culprits, than it did."""
    out = []
    if new["score"] < old["score"] - SLACK:
        out.append(f"per-second score {new['score']:.3f} < {old['score']:.3f} in the baseline")
    elif old["score"] >= BAR > new["score"]:
        out.append(f"per-second score {new['score']:.3f} fell under the bar {BAR} (baseline {old['score']:.3f})")
    if old["meets_expect"] is None and new["meets_expect"] is not None:
        out.append(f"has an expect.json the baseline did not judge: {WRITE_HINT}")
    elif old["meets_expect"] and not new["meets_expect"]:
        out.append(f"no longer meets expect.json: {new.get('problems')}")
    elif old["meets_expect"] is False and (more := sorted(set(new.get("problems", [])) - set(old.get("problems", [])))):
        out.append(f"misses more of expect.json: {more} (baseline missed {old.get('problems')})")
    if old["meets_expect"] and new["incidents"] != old["incidents"]:
        out.append(f"incidents (kind [culprit ranks]) changed: {old['incidents']} -> {new['incidents']}")
    return out


def _judge(name: str) -> tuple[str, dict[str, Any], float]:
    from hangd.replay import replay_result, run_replay

    t0 = time.monotonic()
    an, _ = run_replay(str(TRACES / name))
    return name, entry(TRACES / name, replay_result(an)), time.monotonic() - t0


def _size(name: str) -> int:
    return sum(p.stat().st_size for p in (TRACES / name).rglob("*") if p.is_file())


def judge_all(names: list[str], jobs: int) -> dict[str, dict[str, Any]]:
    """Each recording replayed and judged, ``jobs`` at a time (largest first, to end together)."""
    out: dict[str, dict[str, Any]] = {}
    order = sorted(names, key=_size, reverse=True)
    with multiprocessing.Pool(jobs) as pool:
        for name, e, took in pool.imap_unordered(_judge, order):
            out[name] = e
            print(f"  {took:6.1f}s  {name}", file=sys.stderr, flush=True)
    return out


def load() -> dict[str, dict[str, Any]]:
    return json.loads(BASELINE.read_text()) if BASELINE.exists() else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write tests/data/traces/baseline.json again")
    ap.add_argument("--only", default="", help="comma list of substrings of recording names")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: one a core)")
    a = ap.parse_args()
    names = recordings()
    if a.only:
        names = [n for n in names if any(s in n for s in a.only.split(","))]
    t0 = time.monotonic()
    got = judge_all(names, a.jobs)
    took = time.monotonic() - t0
    old = load()
    worse = 0
    for name in names:
        e = got[name]
        was = old.get(name)
        bad = regressions(was, e) if was else []
        worse += bool(bad)
        mark = "new" if was is None else ("WORSE" if bad else ("better" if e["score"] > was["score"] else ""))
        expect = {None: "-", True: "meets", False: "misses " + ", ".join(e.get("problems", []))}[e["meets_expect"]]
        kinds = ", ".join(e["incidents"]) or "-"
        print(f"{e['score']:.3f}  {name:55s} {expect:28s} {kinds}  {mark}")
        for b in bad:
            print(f"       {b}")
    scores = [got[n]["score"] for n in names]
    judged = [got[n]["meets_expect"] for n in names if got[n]["meets_expect"] is not None]
    print(f"{len(names)} recordings in {took:.0f} s on {a.jobs} processes: mean score {sum(scores) / len(scores):.3f}, "
          f"{sum(s >= BAR for s in scores)} at >= {BAR}, {sum(judged)} of {len(judged)} meet their expect.json; "
          f"{worse} worse than the baseline")
    if a.write:
        merged = {**{n: e for n, e in old.items() if n in set(recordings())}, **got}
        BASELINE.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
        print(f"wrote {BASELINE.relative_to(ROOT)} ({len(merged)} recordings)")
    return 1 if worse and not a.write else 0


if __name__ == "__main__":
    sys.exit(main())
