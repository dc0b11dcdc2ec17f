"""What a minute of a GPU's history keeps (the store's ``gpu_minutes``): the mean of each value
over that minute's readings. A value that no reading of the minute had stays unknown (None), never
0: a GPU without GPM has no SM activity, not an idle SM."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# the values a minute keeps, in the order of ``reading``: GPU utilization (%), SM activity (%,
# NVML's GPM SM_UTIL), power (W), memory used (bytes)
FIELDS = ("util", "sm", "power_w", "mem_used")
Reading = tuple[float | None, float | None, float | None, float | None]


def reading(g: Mapping[str, Any]) -> Reading:
    """One GPU reading as the daemon hands it to the store (``util_gpu``, ``gpm``, ``power_w``,
    ``mem_used``), in FIELDS order."""
    return g.get("util_gpu"), (g.get("gpm") or {}).get("SM_UTIL"), g.get("power_w"), g.get("mem_used")


def minute_means(readings: Sequence[Reading]) -> dict[str, float | None]:
    """Per field, the mean of the readings that had it; None where none had it."""
    out: dict[str, float | None] = {}
    for i, name in enumerate(FIELDS):
        xs = [x for r in readings if (x := r[i]) is not None]
        out[name] = sum(xs) / len(xs) if xs else None
    return out
