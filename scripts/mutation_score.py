"""Mutation score per file from ``mutmut results --all true`` output (``make mutate`` runs it).

Reads lines ``<module>.x_<function>__mutmut_<n>: <status>`` (methods: ``x\u01c1Class\u01c1method``)
and prints, per module, killed / total and the survivors by name."""

from __future__ import annotations

import re
import sys
from collections import defaultdict

LINE = re.compile(r"^\s*(?P<name>[\w.]+?)\.x(?:_|\u01c1)(?P<fn>\S+?)__mutmut_(?P<n>\d+): (?P<status>.+?)\s*$")
KILLED = {"killed", "timeout", "segfault", "caught by type check"}


def main(path: str) -> int:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    survivors: dict[str, list[str]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            mod, status = m.group("name"), m.group("status")
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "mutmut-results.txt"))
