"""``hangd serve`` with NVML readings recorded on H200s replayed for N GPUs (for benchmarks on a
host without GPUs; NVML's own calls are not made, their cost on H200 is in BENCHMARKS.md).

python -m benchmarks.replayed_serve serve [serve's flags]
HANGD_BENCH_GPUS: how many GPUs; HANGD_BENCH_GPU_PIDS: comma-separated pids that hold them, in turn.
Everything else (the /proc sources, the analysis, the store and its writer, the API) is the daemon's own.
"""

from __future__ import annotations

import os
import sys

from hangd.config import Settings
from hangd.sources import live


def main() -> int:
    count = int(os.environ["HANGD_BENCH_GPUS"])
    holders = [int(x) for x in os.environ["HANGD_BENCH_GPU_PIDS"].split(",")]
    plain_init = live.LiveNode.__init__

    def init(self: live.LiveNode, settings: Settings) -> None:
        from benchmarks.cost import ReplayedGpus

        plain_init(self, settings)
        self.runner.sources[0] = ReplayedGpus(count, holders)

    live.LiveNode.__init__ = init  # type: ignore[method-assign]
    from hangd.cli import main as hangd_main

    return hangd_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
