"""Record real scenarios on a GPU host with `hangd record`, each with exact ground truth.

For each scenario: start `hangd record`, start the job through a torchrun-like launcher, do to the
job what the scenario says (SIGKILL the launcher, SIGSTOP or SIGKILL a rank) at a known time,
then tear everything down. The trace gets the driver's actions as `action` events and the ranks'
own truth lines as truth.jsonl. Usage: python scripts/gpu_scenarios.py OUTDIR [SCENARIO...]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hangd.sources.ras import DEFAULT_ADDR, query  # noqa: E402
from tests.teardown import kill_all  # noqa: E402 - scripts/matrix.py imports it from here too

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "tests" / "workloads"
# (seconds recorded, action, at seconds)
SCENARIOS = {
    "nccl_stall": (36, None, None),
    # nccl_stall with gloo between two ranks on CUDA tensors (runs on one GPU): rank 0 waits in a CUDA sync
    "gloo_cuda_stall": (36, None, None),
    "straggler": (34, None, None),
    "orphan": (32, "sigkill_launcher", 14),
    "compile": (50, None, None),
    "mismatch": (30, None, None),
    "sigstop": (34, "sigstop_rank", 14),
    "kill": (34, "sigkill_rank", 14),
}
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ras_query(timeout: float = 12.0) -> str:
    """NCCL's RAS thread answers plain-text queries on localhost:28028."""
    return query(DEFAULT_ADDR, timeout) or "RAS query: no answer"


def run(name: str, out: Path, hangd: list[str]) -> dict:
    seconds, action, at = SCENARIOS[name]
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    job = d / "job"
    job.mkdir(exist_ok=True)
    rec = subprocess.Popen([*hangd, "record", "--out", str(d), "--seconds", str(seconds), "--hz", "4",
                            "--stacks-every", "10", "--fr-every", "10"], cwd=ROOT)
    time.sleep(1.0)
    env = dict(os.environ, **MULTICAST_OFF, TORCH_FR_BUFFER_SIZE="2000",
               TORCH_FR_DUMP_TEMP_FILE=str(job / "fr_rank_"), TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(job / "frpipe_"),
               TORCH_NCCL_DUMP_ON_TIMEOUT="1", HF_TOKEN="hf_FAKEplantedTOKENforREDACTION")
    if name == "gloo_cuda_stall":
        env["GPU_JOB_BACKEND"] = "gloo"
    scenario = {"gloo_cuda_stall": "nccl_stall"}.get(name, name)
    launcher = subprocess.Popen([sys.executable, str(WORK / "launch.py"), "2", str(job), str(WORK / "gpu_job.py"), scenario, str(job)],
                                cwd=ROOT, env=env, start_new_session=True)
    actions = []
    t0 = time.time()
    ras = ""
    ranks: list[int] = []
    while time.time() - t0 < seconds - 2:
        time.sleep(0.5)
        if not ranks:
            try:
                ranks = [int(x) for x in Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()]
            except OSError:
                pass
        el = time.time() - t0
        if action and at is not None and el >= at:
            if action == "sigkill_launcher":
                os.kill(launcher.pid, signal.SIGKILL)
                actions.append({"t": round(time.time(), 3), "kind": "action", "what": action, "pid": launcher.pid})
            elif ranks:
                pid = ranks[1]
                os.kill(pid, signal.SIGSTOP if action == "sigstop_rank" else signal.SIGKILL)
                actions.append({"t": round(time.time(), 3), "kind": "action", "what": action, "pid": pid})
            action = None
        if name in ("nccl_stall", "sigstop") and not ras and el >= seconds - 10:
            ras = ras_query()
    actions.append({"t": round(time.time(), 3), "kind": "action", "what": "sigkill_all", "pid": None})
    rec.wait(timeout=60)
    kill_all(ranks, launcher)
    # merge: the driver's actions into the trace, the ranks' truth into truth.jsonl
    events = [json.loads(x) for x in (d / "trace.jsonl").read_text().splitlines() if x.strip()]
    events = sorted(events + actions, key=lambda e: e["t"])
    (d / "trace.jsonl").write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    truth = []
    for f in sorted(job.glob("truth_*.jsonl")):
        truth += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    for a in actions:
        if a["what"] == "sigkill_rank":
            r = next((x["rank"] for x in truth if x["pid"] == a["pid"]), 1)
            truth.append({"t": a["t"], "pid": a["pid"], "rank": r, "state": "gone", "phase": "killed"})
            truth += [{"t": a["t"], "pid": x, "rank": 0, "state": "hung", "phase": "hung:peer_gone"} for x in ranks if x != a["pid"]][:1]
        if a["what"] == "sigstop_rank":
            truth += [{"t": a["t"], "pid": x, "rank": i, "state": "hung", "phase": "hung:stopped" if x == a["pid"] else "hung:nccl_wait"}
                      for i, x in enumerate(ranks)]
        if a["what"] == "sigkill_launcher":
            truth += [{"t": a["t"], "pid": x, "rank": i, "state": "orphaned", "phase": "orphaned"} for i, x in enumerate(ranks)]
    truth.sort(key=lambda x: x["t"])
    (d / "truth.jsonl").write_text("".join(json.dumps(x) + "\n" for x in truth))
    meta = json.loads((d / "meta.json").read_text())
    meta.update({"scenario": name, "t_end": actions[-1]["t"],
                 "ranks": {str(i): p for i, p in enumerate(ranks)} or meta.get("ranks"), "world_size": 2})
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    if ras:
        (d / "files" / "nccl_ras.txt").write_text(ras)
    shutil.rmtree(job, ignore_errors=True)  # logs and dumps are in files/ already
    return {"scenario": name, "ranks": ranks, "actions": actions, "ras": ras[:4000]}


def main() -> None:
    out = Path(sys.argv[1])
    names = sys.argv[2:] or list(SCENARIOS)
    hangd = [sys.executable, "-m", "hangd"]
    res = [run(n, out, hangd) for n in names]
    (out / "scenarios.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
