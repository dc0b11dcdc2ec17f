"""How many examples a fuzz test draws. ``make mutate`` sets HANGD_FUZZ_SCALE=0.1: each of
thousands of mutants reruns the tests that reach it, and the hand-written cases kill most."""

from __future__ import annotations

import os


def examples(n: int) -> int:
    scale = float(os.environ.get("HANGD_FUZZ_SCALE", "1"))
    return max(10, int(n * scale))
