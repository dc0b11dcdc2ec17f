"""Shared by the benchmarks: output as a table or one JSON object."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit(result: dict[str, Any], title: str) -> None:
    if "--json" in sys.argv:
        print(json.dumps(result))
        return
    print(title)
    width = max(len(k) for k in result)
    for k, v in result.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        print(f"  {k:<{width}}  {v}")
