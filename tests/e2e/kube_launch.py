"""A launcher that plays a container runtime: it starts N ranks of a script, each placed in a
kubelet-shaped cgroup before it runs, then waits.

Placing a process in a real kubelet cgroup takes a kubelet; what hangd reads of it is one line of
/proc/PID/cgroup. So each rank starts as a gate that waits on its stdin; the launcher writes the
rank's cgroup line to ``<cgroup_dir>/<pid>`` (what hangd serve reads with ``cgroup_path``), then
hands the gate its torch.distributed environment, and the gate execs the real rank. By the time the
rank is a job's process, its cgroup already reads as the pod's.

    kube_launch.py N LOG_DIR CGROUP_DIR CGROUP_LINE SCRIPT ARGS...
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workloads"))
from launch import free_port, rank_env, wait_all  # noqa: E402

GATE = ("import json, os, sys; env = json.loads(sys.stdin.readline()); "
        "os.execve(sys.executable, [sys.executable, '-W', 'ignore', *sys.argv[1:]], env)")
JOB_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def main() -> int:
    n, log_dir, cgroup_dir, line = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    cmd = sys.argv[5:]
    port = free_port()
    # the gates carry nothing that makes them a job's process: only the exec'd ranks do
    bare = {k: v for k, v in os.environ.items() if k not in JOB_ENV}
    procs = []
    for r in range(n):
        out = open(os.path.join(log_dir, f"log_{r}.txt"), "w")
        p = subprocess.Popen([sys.executable, "-c", GATE, *cmd], env=bare, stdin=subprocess.PIPE, stdout=out,
                             stderr=subprocess.STDOUT, text=True)
        with open(os.path.join(cgroup_dir, str(p.pid)), "w") as f:
            f.write(line + "\n")
        assert p.stdin is not None
        p.stdin.write(json.dumps(rank_env(bare, n, r, port, log_dir)) + "\n")
        p.stdin.close()
        procs.append(p)
    return wait_all(procs)


if __name__ == "__main__":
    sys.exit(main())
