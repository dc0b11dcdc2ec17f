"""Two nodes on one GPU host, one GPU each, NCCL between them, one real PostgreSQL shared by their hangds.

The GPU counterpart of tests/fleet/test_two_nodes.py. Each "node" is a PID namespace of its own
(tests/fleet/nodes.py) holding a real ``hangd serve --node-name`` (default thresholds) and one
``torchrun --nnodes 2 --nproc-per-node 1`` whose rank sees only that node's GPU (CUDA_VISIBLE_DEVICES)
and has a host of its own for NCCL (NCCL_HOSTID): the two torchruns meet at one rendezvous, and NCCL
runs between the two nodes over its network transport, as between two machines. With
FLEET_GPU_GPUS=0,0 both nodes use the one GPU of a host that has one. Scenarios
(tests/workloads/gpu_job.py):

  healthy     train for HOLD_HEALTHY s: one job on both nodes (2 ranks, one per node), no incident
  nccl_stall  rank 1 (node-b) stops calling collectives after 10 s; rank 0 (node-a) blocks in all_reduce:
              exactly one hang incident in the database, the same through both APIs, naming rank 1 on node-b;
              then node-b's hangd is killed: node-a says node-b stopped reporting and blames nobody on it

python scripts/fleet_gpu.py OUTDIR -> OUTDIR/fleet-gpu.json (what was checked, measured, and each check's
verdict) and OUTDIR/fleet-gpu-logs.tar.gz. Env: HANGD_PG_ROOT (where PostgreSQL's files were unpacked,
when the host has no postgresql package; see tests/realpg.py). Exit status 1 when a check failed.
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import realpg  # noqa: E402 - the repository root goes on the path first
from tests.fleet.nodes import NodeNs, unshare_prefix  # noqa: E402

WORKLOAD = ROOT / "tests" / "workloads" / "gpu_job.py"
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
HOLD_HEALTHY = float(os.environ.get("FLEET_GPU_HEALTHY_S", "40"))
# the GPU of each node; "0,0" runs both nodes on a host with one GPU
GPUS = os.environ.get("FLEET_GPU_GPUS", "0,1").split(",")


def node_env(name: str, gpu: str) -> dict[str, str]:
    """What every process of a node gets: its GPU, and a host of its own for NCCL. NCCL tells hosts
    apart by a hash of the host name, or of NCCL_HOSTID when set: with one per node, NCCL runs
    between the two nodes over its network (socket) transport, as between two machines, and does
    not refuse two ranks on one GPU as "duplicate GPU". The nodes share the host's network
    namespace: they meet on loopback."""
    return {"CUDA_VISIBLE_DEVICES": gpu, "NCCL_HOSTID": name, "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}


class Run:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.checks: list[dict[str, Any]] = []
        self.t0 = time.time()

    def check(self, scenario: str, what: str, ok: bool, seen: Any) -> bool:
        self.checks.append({"scenario": scenario, "check": what, "ok": bool(ok), "seen": seen})
        print(f"[{time.time() - self.t0:6.1f}s] {'PASS' if ok else 'FAIL'} {scenario}: {what} -- {seen}", flush=True)
        return bool(ok)


def wait(pred: Callable[[], Any], timeout: float) -> tuple[Any, float]:
    """(the first truthy value of ``pred``, or its last; seconds it took)."""
    t0 = time.time()
    last = None
    while time.time() - t0 < timeout:
        try:
            last = pred()
            if last:
                return last, time.time() - t0
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            pass
        time.sleep(0.5)
    return last, time.time() - t0


def get(url: str, path: str, **params: Any) -> Any:
    r = httpx.get(url + path, params=params, timeout=10)
    return r.json() if r.status_code == 200 else {}


def db_hangs(db: str, key: str) -> list[dict[str, Any]]:
    eng = create_engine(db)
    try:
        with eng.connect() as c:
            rows = c.execute(text("SELECT id, kind, status, culprit_ranks, summary, node_id FROM incidents "
                                  "WHERE job = :k AND family = 'hang'"), {"k": key})
            return [dict(r._mapping) for r in rows]
    finally:
        eng.dispose()


def torchrun(node: NodeNs, node_rank: int, port: int, scenario: str, work: Path) -> Any:
    # the ranks get no PYTHONPATH of hangd's: the job runs on the host's own packages
    return node.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
                     "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                     str(WORKLOAD), scenario, str(work)], node.tmp / f"job-{scenario}-{node.name}.log",
                    env={"PYTHONPATH": "", **MULTICAST_OFF})


def truth_t(work: Path, state: str) -> float | None:
    ts = [json.loads(line)["t"] for f in work.glob("truth_*.jsonl") for line in f.read_text().splitlines()
          if json.loads(line)["state"] == state]
    return min(ts) if ts else None


def healthy(run: Run, nodes: dict[str, NodeNs], urls: dict[str, str], db: str) -> None:
    port = realpg.free_port()
    key = f"rdzv:127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="healthy-", dir=nodes["node-a"].tmp))
    jobs = [torchrun(nodes[n], i, port, "train", work) for i, n in enumerate(nodes)]
    try:
        for n, url in urls.items():
            view, took = wait(lambda url=url: (j := get(url, f"/jobs/{key}")) and len(j.get("fleet_ranks") or {}) == 2
                              and j, 180)
            run.check("healthy", f"{n} shows the whole job: rank 0 on node-a, rank 1 on node-b",
                      bool(view) and view.get("rank_nodes") == {"0": "node-a", "1": "node-b"},
                      {"rank_nodes": (view or {}).get("rank_nodes"), "seconds": round(took, 1),
                       "world_size": (view or {}).get("world_size"), "identity": (view or {}).get("identity")})
        busy, _ = wait(lambda: truth_t(work, "busy"), 120)
        run.check("healthy", "both ranks train (all_reduce between the two nodes)", busy is not None, busy)
        time.sleep(HOLD_HEALTHY)
        rows = db_hangs(db, key)
        run.check("healthy", f"no hang incident after {HOLD_HEALTHY:.0f} s of training", rows == [], rows)
        for n, url in urls.items():
            inc = get(url, "/incidents", job=key)
            run.check("healthy", f"{n}'s API lists no incident for the job", inc.get("total") == 0,
                      [(i["kind"], i["summary"]) for i in inc.get("incidents", [])])
        # what each node saw of its GPU and its rank (NVML's view from inside a PID namespace)
        run.checks[-1]["gpus"] = {n: get(url, "/gpus") for n, url in urls.items()}
        run.checks[-1]["processes"] = {n: get(url, "/processes") for n, url in urls.items()}
    finally:
        for n, p in zip(nodes, jobs, strict=True):
            nodes[n].kill_tree(p)


def nccl_stall(run: Run, nodes: dict[str, NodeNs], urls: dict[str, str], db: str, hangd_b: Any) -> None:
    port = realpg.free_port()
    key = f"rdzv:127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="stall-", dir=nodes["node-a"].tmp))
    jobs = [torchrun(nodes[n], i, port, "nccl_stall", work) for i, n in enumerate(nodes)]
    try:
        def named() -> list[dict[str, Any]]:
            rows = db_hangs(db, key)
            return rows if any(1 in (r["culprit_ranks"] or []) for r in rows) else []
        rows, _ = wait(named, 240)
        hung_at = truth_t(work, "hung")
        seen_at = time.time()
        run.check("nccl_stall", "a hang incident naming rank 1 in the database", bool(rows),
                  {"rows": rows, "seconds_after_the_stall": round(seen_at - hung_at, 1) if hung_at else None})
        time.sleep(6)  # both nodes have judged by now: still one
        rows = db_hangs(db, key)
        run.check("nccl_stall", "exactly one incident row for the job", len(rows) == 1, rows)
        if not rows:
            return
        row = rows[0]
        for n, url in urls.items():
            listed = get(url, "/incidents", job=key)
            detail = get(url, f"/incidents/{row['id']}")
            culprits = [(c.get("rank"), c.get("node")) for c in (detail.get("evidence") or {}).get("culprits", [])]
            run.check("nccl_stall", f"{n}'s API shows the one incident, culprit rank 1 on node-b",
                      listed.get("total") == 1 and detail.get("culprit_ranks") == [1] and culprits == [(1, "node-b")],
                      {"id": detail.get("id"), "kind": detail.get("kind"), "summary": detail.get("summary"),
                       "culprits": culprits, "next_step": detail.get("next_step")})
        states = {n: [(p["rank"], p["state"]) for p in get(url, "/processes") if p.get("job") == key]
                  for n, url in urls.items()}
        run.check("nccl_stall", "each node says its rank is hung (the culprit's node too)",
                  all(st and all(x == "hung" for _, x in st) for st in states.values()), states)
        view = get(urls["node-a"], f"/jobs/{key}")
        run.check("nccl_stall", "the job view names the open incident and where each rank runs",
                  view.get("open_incidents") == [row["id"]] and view.get("rank_nodes") == {"0": "node-a", "1": "node-b"},
                  {k: view.get(k) for k in ("state", "open_incidents", "rank_nodes", "ranks")})

        nodes["node-b"].kill_tree(hangd_b)
        killed = time.time()
        view, took = wait(lambda: (j := get(urls["node-a"], f"/jobs/{key}")) and j.get("stopped_reporting") and j, 60)
        run.check("nccl_stall", "node-b's hangd killed: node-a says node-b stopped reporting",
                  bool(view) and view["stopped_reporting"][0].startswith("node-b: no report since "),
                  {"stopped_reporting": (view or {}).get("stopped_reporting"), "seconds_after_kill": round(took, 1)})

        def carried_on() -> dict[str, Any] | None:
            (r,) = db_hangs(db, key)
            return r if "node-b: no report since" in r["summary"] else None
        row2, took = wait(carried_on, 60)
        run.check("nccl_stall", "the incident stays one, open, and blames nobody on node-a's ranks",
                  bool(row2) and row2["status"] == "open" and not set(row2["culprit_ranks"] or []) & {0}
                  and len(db_hangs(db, key)) == 1,
                  {"row": row2, "seconds_after_kill": round(time.time() - killed, 1)})
    finally:
        for n, p in zip(nodes, jobs, strict=True):
            nodes[n].kill_tree(p)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fleet-gpu-out")
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out)
    tmp = Path(tempfile.mkdtemp(prefix="hangd-fleet-gpu-"))
    os.chmod(tmp, 0o755)
    pg = realpg.start(os.environ.get("HANGD_PG_ROOT"))
    user = unshare_prefix()
    nodes = {n: NodeNs(n, tmp, user, env=node_env(n, GPUS[i])) for i, n in enumerate(("node-a", "node-b"))}
    urls: dict[str, str] = {}
    hangds: dict[str, Any] = {}
    try:
        for n, node in nodes.items():
            port = realpg.free_port()
            hangds[n] = node.start(pg.url, port, {})[0]
            urls[n] = f"http://127.0.0.1:{port}"
        for n, url in urls.items():
            ok, took = wait(lambda url=url: httpx.get(url + "/healthz", timeout=2).status_code == 200, 120)
            run.check("start", f"{n}'s hangd serves", bool(ok), {"seconds": round(took, 1),
                                                                  "readyz": get(url, "/readyz") if ok else None})
        healthy(run, nodes, urls, pg.url)
        nccl_stall(run, nodes, urls, pg.url, hangds["node-b"])
    finally:
        for node in nodes.values():
            node.close()
        pg.stop()
        with tarfile.open(out / "fleet-gpu-logs.tar.gz", "w:gz") as tf:
            for f in sorted(tmp.glob("*.log")):
                tf.add(f, arcname=f.name)
    failed = [c for c in run.checks if not c["ok"]]
    (out / "fleet-gpu.json").write_text(json.dumps({
        "what": "two hangd serve as two nodes (PID namespaces), one GPU each, their ranks' collectives between them, "
                "one PostgreSQL", "gpus_of_nodes": GPUS, "backend": os.environ.get("GPU_JOB_BACKEND") or "nccl",
        "node_env": {n: node.env for n, node in nodes.items()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(run.t0)), "seconds": round(time.time() - run.t0, 1),
        "passed": len(run.checks) - len(failed), "failed": len(failed), "checks": run.checks}, indent=1, default=str))
    print(f"{len(run.checks) - len(failed)} of {len(run.checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
