"""Generate every mutant of ``[tool.mutmut]`` without judging any, so that a seeded sample can be
drawn from ``mutmut results`` before the one ``mutmut run`` that collects the test statistics and
judges just the sample (``scripts/mutate-sample.sh``). The steps are the first ones of mutmut's
own run (mutmut 3.8.1)."""

from __future__ import annotations

import sys
from os import makedirs

import mutmut.__main__ as mm


def main(children: int) -> int:
    mm.set_mutant_under_test("mutant_generation")
    makedirs("mutants", exist_ok=True)
    mm.copy_src_dir()
    mm.copy_also_copy_files()
    mm.setup_source_paths()
    mm.store_lines_covered_by_tests()
    stats = mm.create_mutants(children)
    print(f"{stats.mutated} files mutated, {stats.ignored} ignored, {stats.unmodified} unmodified")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2))
