"""The job matrix: real multi-rank jobs crossing five axes, each recorded with `hangd record` and its truth.

Axes (tests/workloads/matrix_job.py runs a cell):
  launcher  torchrun (default port and run id), spawn (torch.multiprocessing.spawn), mpargv (a parent
            without torch.distributed starts one process per rank, the rank as an argument), parent
            (the parent is rank 0 itself)
  phase     train, load_disk, load_cache, load_slow, compile, checkpoint, serve_accept, serve_poll, finished;
            and, in wide_cells() only, warmup (a server's back-to-back all_reduces, then idle serving) and
            graph_capture (CUDA graphs captured over many batch sizes, then replayed; GPU only)
  fault     none, dl_blocks, thread_dies, stuck, skip, exit_early, sigstop, sigkill
  wait      how the one that never returns waits: event, queue_get, select_pipe, sleep_loop, spin,
            socket_recv, collective, store (none for a healthy cell); child_pipe (select on a child's
            pipe) only in EXTRA_CELLS, drawn after the cover
  world     2 ranks; 4 and 8 in wide_cells() (4 only on the CPU), a cover of their own drawn after it
Invalid combinations are filtered out (`valid`); the cells are a covering subset of the rest chosen with a
seed: every pair of axis values that some valid cell has is in at least one chosen cell (greedy,
seeded ties), topped up with seeded picks to the count asked. A cell is named by its axes,
`LAUNCHER-PHASE-FAULT[-WAIT][-wN]` (`-wN` for N ranks, none for 2). A quarter of the cells is the
check set (`is_check`): tune on the rest.

  python scripts/matrix.py --list                      the cells, tune/check
  python scripts/matrix.py --out DIR [--only A,B]      record them (DIR/<cell>/: trace.jsonl.gz, truth, expect)
  python scripts/matrix.py --score [DIR]               replay and score every cell, tune and check apart
Env: MATRIX_DEVICE=cuda records on a GPU host (NCCL; ranks may share one GPU, each its own NCCL_HOSTID).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gzip
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from gpu_scenarios import MULTICAST_OFF, kill_all  # noqa: E402
from hf_live import neutralize, read_truth  # noqa: E402

from hangd.evaluate import is_check_cell as is_check  # noqa: E402

WORKLOAD = ROOT / "tests" / "workloads" / "matrix_job.py"
DEFAULT_OUT = ROOT / "tests" / "data" / "traces" / "matrix-cpu"
SEED = 22
LAUNCHERS = ("torchrun", "spawn", "mpargv", "parent")
PHASES = ("train", "load_disk", "load_cache", "load_slow", "compile", "checkpoint", "serve_accept", "serve_poll",
          "finished")
FAULTS = ("none", "dl_blocks", "thread_dies", "stuck", "skip", "exit_early", "sigstop", "sigkill")
WAITS = ("event", "queue_get", "select_pipe", "sleep_loop", "spin", "socket_recv", "collective", "store", "none")
THREAD_WAITS = ("event", "queue_get", "select_pipe", "sleep_loop", "socket_recv")  # main waits for a thread
STUCK_WAITS = (*THREAD_WAITS, "spin")
AXES = {"launcher": LAUNCHERS, "phase": PHASES, "fault": FAULTS, "wait": WAITS}
# phases and world sizes added after the cover was drawn (its cells keep their names): wide_cells()
NEW_PHASES = ("warmup", "graph_capture")
WORLDS = (2, 4, 8)
# pairs of axes the cover need not hold every value pair of (phase x wait alone would take 80 cells);
# the seeded top-up still crosses them
UNPAIRED = {("phase", "wait")}


def on_gpu() -> bool:
    return os.environ.get("MATRIX_DEVICE") == "cuda"


def valid(launcher: str, phase: str, fault: str, wait: str, *, gpu: bool | None = None) -> bool:
    """Whether a combination is a job that can exist (a DataLoader fault needs the DataLoader phase, a
    CUDA graph a GPU: ``gpu``, by default whether this host records on one)."""
    if phase == "graph_capture" and not (on_gpu() if gpu is None else gpu):
        return False
    if fault == "none":
        return wait == "none"
    if wait == "none" or phase == "finished":
        return False
    serve = phase.startswith("serve_")
    if fault == "dl_blocks":
        return phase == "train" and wait in STUCK_WAITS
    if fault == "thread_dies":
        return phase not in ("compile", "graph_capture") and wait in THREAD_WAITS
    if fault == "stuck":
        return wait in STUCK_WAITS
    if fault == "skip":
        return phase == "train" and wait == "collective"
    if fault == "exit_early":
        return not serve and wait in ("collective", "store")
    if fault == "sigstop":
        return phase != "serve_accept" and wait == "collective"
    if fault == "sigkill":
        # the peer waits in its next collective (gloo sees the closed connection) or in a store handshake
        # (not in a warm-up or a capture: the peers meet in collectives all through it)
        return phase != "serve_accept" and (wait == "collective" or (wait == "store" and not serve
                                                                      and phase not in NEW_PHASES))
    return False


def world(c: dict[str, str]) -> int:
    """How many ranks the cell's job has (2 unless it says)."""
    return int(c.get("world", "2"))


def cell_of(name: str) -> dict[str, str] | None:
    """The cell a full name (``launcher-phase-fault[-wait][-wN]``) stands for, if it is a valid one."""
    parts = name.split("-")
    size = "2"
    if len(parts) > 3 and re.fullmatch(r"w[0-9]+", parts[-1]):
        size = parts.pop()[1:]
    if len(parts) not in (3, 4) or int(size) not in WORLDS:
        return None
    c = {"launcher": parts[0], "phase": parts[1], "fault": parts[2], "wait": parts[3] if len(parts) == 4 else "none"}
    known = all(c[k] in AXES[k] or (k == "phase" and c[k] in NEW_PHASES) for k in AXES)
    if size != "2":
        c["world"] = size
    return c if known and valid(c["launcher"], c["phase"], c["fault"], c["wait"]) else None


def name_of(c: dict[str, str]) -> str:
    parts = [c["launcher"], c["phase"], c["fault"]] + ([c["wait"]] if c["wait"] != "none" else [])
    return "-".join(parts) + (f"-w{world(c)}" if world(c) != 2 else "")


def gpu_cells(n: int = 16, seed: int = SEED) -> list[dict[str, str]]:
    """The GPU host's cells: a quarter healthy (seeded picks of the valid healthy cells), the rest the
    faulty cells of the CPU matrix that cover the most pairs of axis values."""
    keys = list(AXES)
    rng = random.Random(seed + 1)
    healthy = [dict(zip(keys, v, strict=True)) for v in itertools.product(*AXES.values())
               if valid(*v) and v[2] == "none" and v[1] != "finished"]
    rng.shuffle(healthy)
    pool = [c for c in cells(seed=seed) if c["fault"] != "none"]
    rng.shuffle(pool)
    chosen = healthy[: n // 4]
    todo = {(a, c[a], b, c[b]) for c in pool for a, b in itertools.combinations(keys, 2) if (a, b) not in UNPAIRED}
    while pool and len(chosen) < n:
        best = max(pool, key=lambda c: len({(a, c[a], b, c[b]) for a, b in itertools.combinations(keys, 2)} & todo))
        chosen.append(best)
        pool.remove(best)
        todo -= {(a, best[a], b, best[b]) for a, b in itertools.combinations(keys, 2)}
    return sorted(chosen, key=name_of)


# Cells beyond the cover, for ways of waiting added after it was drawn (the cover's cells keep their
# names): a rank that selects on the pipe of a child it started, which never writes.
EXTRA_CELLS = tuple(dict(zip(AXES, v, strict=True)) for v in (
    ("torchrun", "train", "stuck", "child_pipe"), ("spawn", "load_cache", "stuck", "child_pipe"),
    ("mpargv", "checkpoint", "stuck", "child_pipe"), ("parent", "serve_poll", "stuck", "child_pipe"),
))
# and on the GPU host: the same wait, and a server whose rank 0 waits on its listening socket
EXTRA_GPU_CELLS = tuple(dict(zip(AXES, v, strict=True)) for v in (
    ("torchrun", "train", "stuck", "child_pipe"), ("spawn", "serve_accept", "none", "none"),
))


def wide_cells(gpu: bool, seed: int = SEED) -> list[dict[str, str]]:
    """The cells of more than two ranks, in the phases added with them: 4 and 8 ranks on a GPU host
    (warmup, graph_capture), 4 on the CPU (two cores; warmup). Every pair of values of launcher,
    phase, fault and world size that a valid cell has (but launcher x fault, which the 2-rank matrix
    crosses) is in at least one chosen cell: greedy, ties broken by the seed, how the culprit waits
    drawn with the cell."""
    keys = ("launcher", "phase", "fault", "world")
    worlds = (4, 8) if gpu else (4,)
    phases = NEW_PHASES if gpu else tuple(p for p in NEW_PHASES if p != "graph_capture")
    allc = [{"launcher": la, "phase": ph, "fault": f, "wait": w, "world": str(n)}
            for la, ph, f, w, n in itertools.product(LAUNCHERS, phases, FAULTS, WAITS, worlds)
            if valid(la, ph, f, w, gpu=gpu)]
    rng = random.Random(seed + 2)
    rng.shuffle(allc)

    return sorted(cover(allc, keys, {("launcher", "fault")}), key=name_of)


def cover(allc: list[dict[str, str]], keys: tuple[str, ...] | list[str],
          unpaired: set[tuple[str, str]]) -> list[dict[str, str]]:
    """Greedy: the cell of ``allc`` holding the most pairs of axis values not yet covered, until every
    pair some cell holds is (pairs of the axes in ``unpaired`` aside); the cells chosen leave ``allc``."""

    def pairs(c: dict[str, str]) -> set[tuple[str, str, str, str]]:
        return {(a, c[a], b, c[b]) for a, b in itertools.combinations(keys, 2) if (a, b) not in unpaired}

    todo = set().union(*(pairs(c) for c in allc))
    chosen: list[dict[str, str]] = []
    while todo:
        best = max(allc, key=lambda c: len(pairs(c) & todo))
        chosen.append(best)
        todo -= pairs(best)
        allc.remove(best)
    return chosen


def cells(n: int = 64, seed: int = SEED) -> list[dict[str, str]]:
    """A covering subset of the valid cells: all pairs of axis values that occur in a valid cell are
    covered (greedy, ties broken by the seed), then seeded picks up to ``n``."""
    keys = list(AXES)
    allc = [dict(zip(keys, v, strict=True)) for v in itertools.product(*AXES.values()) if valid(*v)]
    rng = random.Random(seed)
    rng.shuffle(allc)

    chosen = cover(allc, keys, UNPAIRED)
    rest = [c for c in allc]
    rng.shuffle(rest)
    chosen += rest[: max(0, n - len(chosen))]
    return sorted(chosen, key=name_of)


# ---- recording --------------------------------------------------------------------------------

HOLD_S = 22.0  # recorded after the hang begins (a rank stopped, blocked for good, or left the job)
HEALTHY_S = 16.0  # recorded of an idle server after it is ready
MAX_S = 120.0  # the most a cell runs, from its launch (twice that for a cold torch.compile)


def estimate_s(c: dict[str, str]) -> int:
    """About how long a cell takes on two idle cores (the driver ends a cell on what it sees)."""
    return 60 if c["phase"] in ("compile", "warmup", "graph_capture") else 40


def culprit(c: dict[str, str]) -> int:
    """The rank to blame: the last one (matrix_job.CULPRIT), except where rank 0 is the one doing the
    work that fails (a server's request, the checkpoint's writing)."""
    if c["fault"] in ("thread_dies", "stuck") and (c["phase"].startswith("serve_") or c["phase"] == "checkpoint"):
        return 0
    return world(c) - 1


def tree(root: int, seen: set[int]) -> None:
    """Add ``root``'s descendants to ``seen`` (once seen, a pid stays: an orphan is still the job's)."""
    try:
        for ch in psutil.Process(root).children(recursive=True):
            seen.add(ch.pid)
    except psutil.Error:
        pass


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def first_line(truth: list[dict[str, Any]], rank: int, states: tuple[str, ...]) -> dict[str, Any] | None:
    return next((x for x in truth if x["rank"] == rank and x["state"] in states), None)


def send_request(job: Path) -> bool:
    import socket

    try:
        port = int((job / "port").read_text())
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"generate: hello")
        return True
    except (OSError, ValueError):
        return False


def job_env(c: dict[str, str], job: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCH_FR_BUFFER_SIZE="2000",
               TORCH_FR_DUMP_TEMP_FILE=str(job / "fr_rank_"), HF_TOKEN="hf_FAKEplantedTOKENforREDACTION")
    env.pop("PYTHONPATH", None)
    env["OMP_NUM_THREADS"] = "1"
    if c["phase"] == "compile":
        env["TORCHINDUCTOR_CACHE_DIR"] = str(job / "inductor")  # cold: fresh for every cell
    if os.environ.get("MATRIX_DEVICE") == "cuda":
        # the ranks share one GPU when the host has one: each rank then takes a host id of its own
        # (matrix_job.py), and NCCL talks between them over its socket transport on loopback
        env.update(MULTICAST_OFF, NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1", TORCH_NCCL_DUMP_ON_TIMEOUT="1",
                   TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(job / "frpipe_"))
    return env


def launch(c: dict[str, str], job: Path, log: Any) -> subprocess.Popen[bytes]:
    n = world(c)
    args = [c["phase"], c["fault"], c["wait"], str(job)] + (["--world-size", str(n)] if n != 2 else [])
    py = sys.executable
    if c["launcher"] == "torchrun":
        torchrun = Path(py).parent / "torchrun"
        cmd = [str(torchrun)] if torchrun.exists() else [py, "-m", "torch.distributed.run"]
        # its default master port (29500) and run id, as users run it
        cmd += ["--nproc-per-node", str(n), str(WORKLOAD), "torchrun", *args]
    else:
        cmd = [py, str(WORKLOAD), c["launcher"], *args]
    return subprocess.Popen(cmd, cwd=job, env=job_env(c, job), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def record(c: dict[str, str], out: Path) -> dict[str, Any]:
    """Record one cell into out/<name>: the trace (gzipped), truth.jsonl, expect.json, meta.json."""
    name = name_of(c)
    d = out / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    job = Path(os.environ.get("MATRIX_TMP", "/tmp")) / f"hangd-matrix-{name}"
    shutil.rmtree(job, ignore_errors=True)
    job.mkdir(parents=True)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    # no periodic flight-recorder dumps of a CUDA-graph capture: torch 2.11's dump queries the entries'
    # CUDA events from its own thread, which a capture in the default (global) mode forbids, so the
    # capture fails (cudaErrorStreamCaptureInvalidated) and the rank dies; hangd's own asking stays
    fr_every = "0" if c["phase"] == "graph_capture" else "10"
    rec = subprocess.Popen([sys.executable, "-m", "hangd", "record", "--out", str(d), "--seconds", str(MAX_S + 30),
                            "--hz", "4", "--stacks-every", "10", "--fr-every", fr_every], cwd=ROOT, env=env,
                           stdout=open(job / "record.log", "w"), stderr=subprocess.STDOUT,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # it stops on SIGINT
    time.sleep(1.0)
    t0 = time.time()
    launcher = launch(c, job, open(job / "launcher.log", "w"))
    pids: set[int] = {launcher.pid}
    actions: list[dict[str, Any]] = []
    gone: dict[int, float] = {}
    cul = culprit(c)
    size = world(c)
    todo = c["fault"] if c["fault"] in ("sigstop", "sigkill") else ("request" if c["phase"].startswith("serve_")
                                                                   and c["fault"] != "none" else None)
    end = t0 + MAX_S * (2 if c["phase"] == "compile" else 1)
    while time.time() < end:
        time.sleep(0.25)
        tree(launcher.pid, pids)
        truth = read_truth(job)
        ranks = {x["pid"] for x in truth}
        pids |= ranks
        for pid in ranks:
            if pid not in gone and not alive(pid):
                gone[pid] = round(time.time(), 3)
        # when to stop: some seconds into the hang, after the job ended, or into an idle server's idling
        hung = [x["t"] for x in truth if x.get("job_hung")] + [a["t"] for a in actions if a["what"] != "request_sent"]
        left = [t for p, t in gone.items() if len(ranks) == size and any(q not in gone for q in ranks)]
        if hung or left:
            end = min(end, min(hung + left) + HOLD_S)
        if len(ranks) == size and all(p in gone for p in ranks):
            end = min(end, max(gone.values()) + 3.0)
        idle = first_line(truth, 0, ("idle",))
        if c["fault"] == "none" and idle is not None:
            end = min(end, idle["t"] + HEALTHY_S)
        if todo is None:
            continue
        # the driver's fault: some seconds into the culprit's phase (after its first phase line); into a
        # warm-up or a capture, some seconds before its middle (4 ranks capture every size in about 4 s
        # on an H100, 8 in about 10: 4 s in was already the replay)
        ref = first_line(truth, cul, ("idle",) if c["phase"].startswith("serve_") else
                         ("graph_capture",) if c["phase"] == "graph_capture" else ("busy", "loading", "compiling"))
        delay = 6.0 if todo == "request" else {"compile": 12.0, "warmup": 4.0, "graph_capture": 1.5}.get(c["phase"], 6.0)
        if ref is None or time.time() < ref["t"] + delay:
            continue
        if todo == "request":
            if send_request(job):
                actions.append({"t": round(time.time(), 3), "kind": "action", "what": "request_sent", "pid": None})
                todo = None
            continue
        pid = ref["pid"]
        os.kill(pid, signal.SIGSTOP if todo == "sigstop" else signal.SIGKILL)
        actions.append({"t": round(time.time(), 3), "kind": "action",
                        "what": "sigstop_rank" if todo == "sigstop" else "sigkill_rank", "pid": pid})
        todo = None
    truth = read_truth(job)
    t_end = round(time.time(), 3)
    actions.append({"t": t_end, "kind": "action", "what": "sigkill_all", "pid": None})
    time.sleep(1.0)
    stop_recorder(rec)
    kill_all(pids, launcher)
    worker_pid = None
    wb = job / f"worker_block_{cul}.json"
    if wb.exists():
        worker_pid = json.loads(wb.read_text())["worker_pid"]
    final = finish_truth(truth, actions, gone, t_end)
    merge_actions(d, actions)
    keep_only(d, pids, job)
    neutralize_cell(d, host_paths(job))
    meta = json.loads((d / "meta.json").read_text())
    rank_pids = {str(x["rank"]): x["pid"] for x in final if x["state"] == "starting"}
    meta.update({"scenario": name, "axes": c, "world_size": size, "ranks": rank_pids, "t_end": t_end,
                 "driver": "scripts/matrix.py", "device": os.environ.get("MATRIX_DEVICE", "cpu"),
                 "launch": f"{c['launcher']} tests/workloads/matrix_job.py {c['launcher']} {c['phase']} {c['fault']} "
                           f"{c['wait']} JOBDIR" + (f" --world-size {size}" if size != 2 else "")})
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (d / "truth.jsonl").write_text("".join(json.dumps(x) + "\n" for x in final))
    exp = expect(c, final, worker_pid, gpus_idle=gpus_idle_while_hung(d, final))
    (d / "expect.json").write_text(json.dumps(exp, indent=1) + "\n")
    gzip_trace(d)
    launcher_log = (job / "launcher.log").read_text(errors="replace")[-3000:]
    shutil.rmtree(job, ignore_errors=True)
    return {"cell": name, "truth": final, "expect": exp, "actions": actions, "log_tail": launcher_log}


def stop_recorder(rec: subprocess.Popen[Any]) -> None:
    """Stop `hangd record` as a user would (SIGINT: it writes its bundle), killed after 60 s."""
    rec.send_signal(signal.SIGINT)
    try:
        rec.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rec.kill()
        rec.wait()


def gzip_trace(d: Path) -> None:
    """The bundle's trace.jsonl, gzipped in its place."""
    raw = d / "trace.jsonl"
    with open(raw, "rb") as f, gzip.open(d / "trace.jsonl.gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    raw.unlink()


def host_paths(job: Path | None = None) -> list[tuple[str, str]]:
    """This host's paths -> neutral ones (the job's folder, the checkout, the venv, Python's own)."""
    subs = [(str(ROOT), "/opt/job"), (str(Path(sys.executable).parent.parent), "/opt/venv"),
            (sys.base_prefix, "/usr/local")] + ([(str(job), "/var/tmp/job")] if job else [])
    return sorted(subs, key=lambda x: -len(x[0]))


def _replace_all(text: str, subs: list[tuple[str, str]]) -> str:
    for a, r in subs:
        text = text.replace(a, r)
    return text


def neutralize_cell(d: Path, subs: list[tuple[str, str]]) -> None:
    """neutralize() over a finished cell, its gzipped trace too. A path in a job's log changes the
    log's length, so the sizes the trace recorded of it (the replay reads the log up to each) are
    mapped to the same place in the neutral log: else a replay reads a line early, or never reads
    the last one (the exception a hang must quote)."""
    gz = d / "trace.jsonl.gz"
    if gz.exists():
        with gzip.open(gz, "rt") as f:
            lines = f.read().splitlines()
        meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").exists() else {}
        logs: dict[str, bytes | None] = {}
        out = []
        for line in lines:
            ev = json.loads(line)
            if ev.get("kind") == "file" and isinstance(ev.get("size"), int):
                path = ev["path"]
                if path not in logs:
                    rel = (meta.get("log_files") or {}).get(path)
                    logs[path] = (d / rel).read_bytes() if rel and (d / rel).is_file() else None
                raw = logs[path]
                if raw is not None:
                    ev["size"] = len(_replace_all(raw[:ev["size"]].decode("utf-8", "replace"), subs).encode())
                    line = json.dumps(ev)
            out.append(_replace_all(line, subs))
        with gzip.open(gz, "wt", compresslevel=9) as f:
            f.write("\n".join(out) + "\n")
    neutralize(d, subs)


def finish_truth(truth: list[dict[str, Any]], actions: list[dict[str, Any]], gone: dict[int, float],
                 t_end: float) -> list[dict[str, Any]]:
    """The ranks' own lines, made whole: once the job is hung (a rank's job_hung line, or the driver's
    SIGSTOP) every rank is hung; a rank whose peer is gone is hung from when it waits for it; a process
    that vanished (or became a zombie) is gone from then."""
    truth = sorted(truth, key=lambda x: x["t"])
    pid_rank = {x["pid"]: x["rank"] for x in truth}
    # a rank that said it leaves but whose process lives on never left: blocked in its teardown (seen:
    # NCCL's destroy_process_group never returning after a graph capture); the job hangs from then
    truth = [dict(x, state="hung", phase="hung:exit_blocked_in_teardown", job_hung=True)
             if x["phase"] == "exited_early" and x["pid"] not in gone else x for x in truth]
    hung_at: float | None = None
    why = ""
    for x in truth:
        if x.get("job_hung"):
            hung_at, why = x["t"], x["phase"]
            break
    for a in actions:
        if a["what"] == "sigstop_rank" and (hung_at is None or a["t"] < hung_at):
            hung_at, why = a["t"], "stopped"
    dead_at = None  # a rank that left the job (killed, or exited too early) while the others live on
    for a in actions:
        if a["what"] == "sigkill_rank":
            dead_at = a["t"]
            gone[a["pid"]] = min(gone.get(a["pid"], a["t"]), a["t"])
    early = [x for x in truth if x["phase"] == "exited_early"]
    if early and dead_at is None:
        dead_at = gone.get(early[0]["pid"], early[0]["t"])
    out: list[dict[str, Any]] = []
    for x in truth:
        x = {k: x[k] for k in ("t", "pid", "rank", "state", "phase")}
        if x["state"] == "gone":
            continue  # the driver's observation of the exit below is the truth
        if hung_at is not None and x["t"] >= hung_at:
            continue
        out.append(x)
    if hung_at is not None:
        for pid, rank in pid_rank.items():
            if gone.get(pid, 1e18) > hung_at:
                mine = [x for x in truth if x["pid"] == pid and x.get("job_hung")]
                out.append({"t": hung_at, "pid": pid, "rank": rank, "state": "hung",
                            "phase": mine[0]["phase"] if mine else ("hung:stopped" if why == "stopped" and any(
                                a["pid"] == pid for a in actions if a["what"] == "sigstop_rank") else "hung:waiting_peer")})
    elif dead_at is not None:
        for pid, rank in pid_rank.items():
            if gone.get(pid, 1e18) <= dead_at + 0.5:
                continue  # the one that left
            died = gone.get(pid)
            if died is not None and died < dead_at + 5.0:
                continue  # it saw its peer leave (gloo: connection closed) and crashed: gone below
            # hung from when it needs the one that left: at once, unless it was working alone (reading,
            # writing, compiling), then from its next line that is not such work
            lines = [x for x in truth if x["pid"] == pid]
            cur = [x for x in lines if x["t"] <= dead_at]
            later = [x for x in lines if x["t"] > dead_at and not x.get("solo")]
            at = dead_at if cur and not cur[-1].get("solo") else (later[0]["t"] if later else None)
            if at is not None:
                out = [x for x in out if not (x["pid"] == pid and x["t"] >= at)]
                out.append({"t": at, "pid": pid, "rank": rank, "state": "hung", "phase": "hung:peer_gone"})
    for pid, t in gone.items():
        if pid in pid_rank:
            out.append({"t": t, "pid": pid, "rank": pid_rank[pid], "state": "gone",
                        "phase": "killed" if any(a["pid"] == pid for a in actions) else "exited"})
    out.sort(key=lambda x: (x["t"], x["rank"]))
    return out


def gpus_idle_while_hung(d: Path, truth: list[dict[str, Any]]) -> bool:
    """Every GPU reading the cell recorded from the first rank hung on shows no kernel (utilization
    under the 10% a kernel resident for a tenth of the sampling period gives): the collective the
    ranks block in never reached a GPU (a communicator still being set up, waiting in its bootstrap
    for the rank that never came). By docs/operator-guide.md's definitions that hang is host-side."""
    hung = [x["t"] for x in truth if x["state"] == "hung"]
    if not hung:
        return False
    path = d / "trace.jsonl"
    f: Any = open(path) if path.exists() else gzip.open(d / "trace.jsonl.gz", "rt")
    seen = False
    with f:
        for line in f:
            if '"kind":"gpu"' not in line.replace(" ", ""):
                continue
            ev = json.loads(line)
            if ev.get("kind") != "gpu" or ev["t"] < min(hung):
                continue
            seen = True
            if (ev.get("util_gpu") or 0) >= 10:
                return False
    return seen


def expect(c: dict[str, str], truth: list[dict[str, Any]], worker_pid: int | None,
           gpus_idle: bool = False, gpu: bool | None = None) -> dict[str, Any]:
    """What a good diagnosis of the cell must contain (the keys of h200x2-more/README.md)."""
    hung = [x for x in truth if x["state"] == "hung"]
    last = {x["pid"]: x["state"] for x in truth}
    e: dict[str, Any] = {"hang": bool(hung) and "hung" in last.values()}
    gpu = os.environ.get("MATRIX_DEVICE") == "cuda" if gpu is None else gpu
    left = any(x["phase"] in ("hung:peer_gone",) for x in truth)
    if hung and not e["hang"] and not left:
        # a rank stalled for seconds, then crashed: the job failed, it does not hang
        e["must_not_open"] = ["straggler"]
        return e
    if not hung:
        e["must_not_open"] = ["nccl_stall", "host_stall", "io_stall", "rank_exited", "straggler"]
        return e
    if left:
        # a peer left, and the others waited for it (until they crashed too): the one that left first
        e["hang"] = True
        e["incident_kind"] = "rank_exited"
    elif gpu and not gpus_idle:
        e["incident_kind"] = "nccl_stall"  # a peer spins in an NCCL collective
    else:
        e["incident_kind"] = "host_stall"
    e["culprit_rank"] = culprit(c)
    if c["fault"] == "thread_dies":
        e["summary_quotes"] = "mat1 and mat2 shapes cannot be multiplied"
    if worker_pid is not None:
        e["summary_names_pid"] = worker_pid  # what the culprit waits on: its DataLoader worker
    e["must_not_open"] = ["straggler"] + ([] if left else ["rank_exited"])
    return e


def keep_only(d: Path, pids: set[int], job: Path) -> None:
    """The trace of this job only: the recorder watches the whole host, where other jobs may run."""
    src = d / "trace.jsonl"
    keep, used = [], set()
    for line in src.read_text().splitlines():
        if not line.strip():
            continue
        ev = json.loads(line)
        if ev.get("pid") is not None and ev["kind"] != "action" and ev["pid"] not in pids:
            continue
        if ev["kind"] == "file" and not str(ev.get("path", "")).startswith(str(job)):
            continue
        if ev["kind"] == "gpu":
            for k in ("procs", "proc_util"):
                if ev.get(k):
                    ev[k] = [p for p in ev[k] if p.get("pid") in pids]
            line = json.dumps(ev, separators=(",", ":"))
        if ev.get("file"):
            used.add(ev["file"])
        keep.append(line)
    src.write_text("".join(x + "\n" for x in keep))
    meta = json.loads((d / "meta.json").read_text())
    logs = {k: v for k, v in (meta.get("log_files") or {}).items() if k.startswith(str(job))}
    meta["log_files"] = logs
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    used |= set(logs.values())
    for f in sorted((d / "files").rglob("*")) if (d / "files").exists() else []:
        if f.is_file() and str(f.relative_to(d)) not in used:
            f.unlink()


def merge_actions(d: Path, actions: list[dict[str, Any]]) -> None:
    src = d / "trace.jsonl"
    events = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    events = sorted(events + actions, key=lambda e: e["t"])
    src.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))


# ---- scoring ----------------------------------------------------------------------------------

def judge(d: Path) -> dict[str, Any]:
    """Replay one cell and score it: per-second accuracy, and its expect.json."""
    from hangd.evaluate import expect_problems, score
    from hangd.incidents import HANG_KINDS
    from hangd.replay import replay_result, run_replay

    an, _ = run_replay(str(d))
    r = replay_result(an)
    sc = score(str(d), r["states"])
    incs = r["incidents"]
    e = json.loads((d / "expect.json").read_text())
    return {"cell": d.name, "check": is_check(d.name), "accuracy": sc["accuracy"], "per_pid": sc["per_pid"],
            "incidents": [(i["kind"], i.get("culprit_ranks"), i.get("summary", "")) for i in incs],
            "problems": expect_problems(e, incs, HANG_KINDS)}


def report(dirs: list[Path], md: Path | None = None) -> list[dict[str, Any]]:
    res = [judge(d) for d in dirs]
    lines: list[str] = []

    def say(*a: Any) -> None:
        """The report goes to stdout and, with --md, to a file."""
        print(*a)
        lines.append(" ".join(str(x) for x in a))

    for label, check in (("tune", False), ("check", True)):
        part = [r for r in res if r["check"] == check]
        if not part:
            continue
        say(f"== {label} set: {len(part)} cells")
        for r in part:
            flag = "ok " if r["accuracy"] >= 0.95 and not r["problems"] else "BAD"
            say(f"{flag} {r['cell']:48s} {r['accuracy']:.3f} {'; '.join(r['problems'])}")
            if flag == "BAD":
                for pid, v in r["per_pid"].items():
                    if v["accuracy"] < 0.999:
                        say(f"      pid {pid}: {v['accuracy']:.2f} wrong (s, truth, said): {v['wrong'][:8]}")
        # the mistakes by kind: truth -> what was said, seconds and cells
        conf: dict[tuple[str, str], list[Any]] = {}
        for r in part:
            for v in r["per_pid"].values():
                for pair, n in v["confusion"].items():
                    k = tuple(pair.split("->"))
                    conf.setdefault(k, [0, set()])
                    conf[k][0] += n
                    conf[k][1].add(r["cell"])
        for (want, got), (n, cs) in sorted(conf.items(), key=lambda kv: -kv[1][0]):
            say(f"   truth {want:12s} said {got:12s} {n:4d} s in {len(cs)} cells: {', '.join(sorted(cs))}")
        good = sum(r["accuracy"] >= 0.95 for r in part)
        inc_ok = sum(not r["problems"] for r in part)
        mean = sum(r["accuracy"] for r in part) / len(part)
        say(f"-- {label}: mean accuracy {mean:.3f}; {good}/{len(part)} cells >= 0.95; "
              f"{inc_ok}/{len(part)} right about incidents")
    if md is not None:
        md.write_text("```\n" + "\n".join(lines) + "\n```\n")
    return res


GAPS_FILE = ROOT / "tests" / "analysis" / "matrix_gaps.json"


def write_gaps() -> None:
    """What the classifier still gets wrong in each cell, measured now: its per-second accuracy and
    the expectations its incidents miss. tests/analysis/test_matrix.py holds every cell to the bar or,
    for a cell listed here, to no worse than this; a cell that improves is written again by this."""
    from hangd.evaluate import gap_key

    gaps: dict[str, Any] = {}
    for d in sorted(p.parent for p in (ROOT / "tests" / "data" / "traces").glob("matrix-*/*/expect.json")):
        j = judge(d)
        acc, problems = j["accuracy"], sorted({gap_key(p) for p in j["problems"]})
        if acc < 0.95 or problems:
            gaps[f"{d.parent.name}/{d.name}"] = {"accuracy": math.floor(acc * 100) / 100, "problems": problems}
    GAPS_FILE.write_text(json.dumps(gaps, indent=1, sort_keys=True) + "\n")
    print(f"{len(gaps)} cells below the bar or missing an expectation: {GAPS_FILE}")


def rekind(root: Path) -> None:
    """Each recorded cell's expect.json made anew by ``expect`` from its axes, its truth and its
    GPU readings (the worker pid it names is kept): the cells recorded before a rule of ``expect``."""
    for d in sorted(p.parent for p in root.glob("*/expect.json")):
        meta = json.loads((d / "meta.json").read_text())
        if meta.get("driver") != "scripts/matrix.py":
            continue
        old = json.loads((d / "expect.json").read_text())
        truth = [json.loads(x) for x in (d / "truth.jsonl").read_text().splitlines() if x.strip()]
        new = expect(meta["axes"], truth, old.get("summary_names_pid"), gpus_idle=gpus_idle_while_hung(d, truth),
                     gpu=meta.get("device") == "cuda")
        if new != old:
            (d / "expect.json").write_text(json.dumps(new, indent=1) + "\n")
            print(f"{d.name}: {old.get('incident_kind')} -> {new.get('incident_kind')}"
                  + ("" if {**old, "incident_kind": None} == {**new, "incident_kind": None} else f" ({old} -> {new})"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--score", nargs="?", const=str(DEFAULT_OUT), default=None, metavar="DIR")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--only", default="", help="comma list of cell names (or substrings)")
    ap.add_argument("-n", type=int, default=64, help="how many cells (at least the pairwise cover)")
    ap.add_argument("--skip-existing", action="store_true")
    ap.add_argument("--jobs", type=int, default=2, help="cells recorded at the same time")
    ap.add_argument("--md", default="", help="with --score: also write the report to this file")
    ap.add_argument("--gaps", action="store_true",
                    help=f"write {GAPS_FILE.relative_to(ROOT)}: each cell's accuracy and missed expectations now")
    ap.add_argument("--rekind", metavar="DIR", default=None,
                    help="rewrite the expect.json of the recorded cells under DIR from their truth and GPU readings")
    a = ap.parse_args()
    if a.rekind:
        rekind(Path(a.rekind))
        return
    if a.gaps:
        write_gaps()
        return
    if a.score is not None:
        report(sorted(p.parent for p in Path(a.score).glob("*/expect.json")), Path(a.md) if a.md else None)
        return
    chosen = gpu_cells() + list(EXTRA_GPU_CELLS) + wide_cells(True) if on_gpu() \
        else cells(a.n) + list(EXTRA_CELLS) + wide_cells(False)
    if a.only:
        want = a.only.split(",")
        picked = [c for c in chosen if any(w == name_of(c) or w in name_of(c) for w in want)]
        # a cell the generator did not pick, named in full, is recorded too (a cell nobody tuned on)
        chosen = picked + [c for w in want if (c := cell_of(w)) is not None and name_of(c) not in map(name_of, picked)]
    if a.list:
        for c in chosen:
            print(f"{'check' if is_check(name_of(c)) else 'tune '} {name_of(c)}")
        print(f"{len(chosen)} cells, {sum(estimate_s(c) for c in chosen) / 60:.0f} min")
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [c for c in chosen if not (a.skip_existing and (out / name_of(c) / "trace.jsonl.gz").exists())]
    torchrun = threading.Lock()  # torchrun cells use its default port: one at a time

    def one(c: dict[str, str]) -> None:
        with torchrun if c["launcher"] == "torchrun" else contextlib.nullcontext():
            t = time.time()
            r = record(c, out)
        print(f"== {name_of(c)} {time.strftime('%H:%M:%S')} ({time.time() - t:.0f} s)\n   truth: "
              f"{[(round(x['t'] % 1000, 1), x['rank'], x['state'], x['phase']) for x in r['truth']]}\n"
              f"   expect: {json.dumps(r['expect'])}", flush=True)

    # cells run side by side (--jobs): each trace keeps only its own job's processes
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
        for f in [ex.submit(one, c) for c in todo]:
            f.result()


if __name__ == "__main__":
    main()
