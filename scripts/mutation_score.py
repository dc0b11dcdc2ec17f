"""Mutation score per file from ``mutmut results --all true`` output (``make mutate`` runs it).

Reads lines ``<module>.x_<function>__mutmut_<n>: <status>`` (methods: ``x\u01c1Class\u01c1method``)
and prints, per module, killed / total and the survivors by name.

``python scripts/mutation_score.py RESULTS --sample N --seed S [--prefix hangd.analysis]`` instead
prints a seeded random sample of N mutant names (to run with ``mutmut run NAMES``: a sample is
judged in a fraction of the time of all of them), and ``--only NAMES_FILE`` scores just those,
with a 95% interval (Wilson) for the score of the whole population they were drawn from."""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^\s*(?P<name>[\w.]+?)\.x(?:_|\u01c1)(?P<fn>\S+?)__mutmut_(?P<n>\d+): (?P<status>.+?)\s*$")
KILLED = {"killed", "timeout", "segfault", "caught by type check"}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% score interval of a proportion k/n (stays inside 0..1, sound for small n)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return mid - half, mid + half


def main(path: str, only: set[str] | None = None) -> int:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    survivors: dict[str, list[str]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            if only is not None and line.split(":")[0].strip() not in only:
                continue
            mod, status = m.group("name"), m.group("status")
            if status == "not checked":
                raise SystemExit(f"{line.strip()}: run it first")
            counts[mod][status] += 1
            if status in ("survived", "no tests"):
                survivors[mod].append(f"{m.group('fn')}__mutmut_{m.group('n')} ({status})")
    total_k = total_n = 0
    for mod in sorted(counts):
        n = sum(counts[mod].values())
        k = sum(v for s, v in counts[mod].items() if s in KILLED)
        total_k, total_n = total_k + k, total_n + n
        print(f"{mod}: {k}/{n} killed ({100 * k / n:.1f}%)  " + ", ".join(f"{s} {v}" for s, v in sorted(counts[mod].items())))
        for s in survivors[mod]:
            print(f"    {s}")
    if total_n:
        print(f"all: {total_k}/{total_n} killed ({100 * total_k / total_n:.1f}%)")
        if only is not None:
            lo, hi = wilson(total_k, total_n)
            print(f"95% interval for the population sampled: {100 * lo:.1f}% - {100 * hi:.1f}%")
    return 0


def sample(path: str, n: int, seed: int, prefix: str) -> int:
    with open(path) as f:
        names = [x.split(":")[0].strip() for x in f if LINE.match(x) and x.strip().startswith(prefix)]
    for name in sorted(random.Random(seed).sample(names, min(n, len(names)))):
        print(name)
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="?", default="mutmut-results.txt")
    ap.add_argument("--sample", type=int, help="print a random sample of this many mutant names")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix", default="hangd.", help="sample only mutants whose name starts with this")
    ap.add_argument("--only", help="score only the mutants named in this file, one per line")
    a = ap.parse_args()
    if a.sample:
        sys.exit(sample(a.results, a.sample, a.seed, a.prefix))
    chosen = {x.strip() for x in open(a.only) if x.strip()} if a.only else None
    sys.exit(main(a.results, chosen))
