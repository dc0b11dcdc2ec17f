"""A torchrun-like launcher: starts N ranks of a script with the torch.distributed env, waits."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(base: dict[str, str], n: int, r: int, port: int, log_dir: str) -> dict[str, str]:
    """Rank ``r`` of ``n``'s torch.distributed environment, as torchrun sets it."""
    return dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), LOCAL_RANK=str(r),
                WORLD_SIZE=str(n), TORCH_FR_BUFFER_SIZE="2000", PYTHONUNBUFFERED="1",
                TORCH_FR_DUMP_TEMP_FILE=os.path.join(log_dir, "fr_rank_"))


def wait_all(procs: list[subprocess.Popen]) -> int:
    rc = 0
    for p in procs:
        rc = p.wait() or rc
    return rc


def main() -> int:
    n = int(sys.argv[1])
    log_dir = sys.argv[2]
    cmd = sys.argv[3:]
    port = free_port()
    procs = []
    for r in range(n):
        out = open(os.path.join(log_dir, f"log_{r}.txt"), "w")
        procs.append(subprocess.Popen([sys.executable, "-W", "ignore", *cmd], env=rank_env(dict(os.environ), n, r, port, log_dir),
                                      stdout=out, stderr=subprocess.STDOUT))
    return wait_all(procs)


if __name__ == "__main__":
    sys.exit(main())
