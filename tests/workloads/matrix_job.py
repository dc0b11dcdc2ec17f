"""One cell of the job matrix (scripts/matrix.py): a real torch.distributed job of 2 ranks (or
``--world-size`` of them) on gloo (CPU) or NCCL (``MATRIX_DEVICE=cuda``), started by one of four
launchers, going through one phase, with one fault.

    matrix_job.py LAUNCHER PHASE FAULT WAIT JOBDIR [--world-size N]

LAUNCHER  torchrun  this file is run by torchrun (RANK, WORLD_SIZE, MASTER_* from its environment)
          spawn     torch.multiprocessing.spawn starts the ranks
          mpargv    a parent without torch.distributed starts one process per rank, the rank passed as
                    an argument (``--rank 1``) and the rendezvous as a tcp:// address, as SGLang and
                    vLLM start their schedulers and workers
          parent    the parent is rank 0 itself; it starts the other ranks as its children
PHASE     train (DDP with DataLoader workers), load_disk (reads from the disk), load_cache (reads from
          the page cache), load_slow (throttled reads: 8 MB, then 60 ms asleep), compile (torch.compile,
          cold cache), checkpoint (rank 0 writes torch.save chunks with fsync while the others wait in
          the next collective), serve_accept (rank 0 waits in accept(), the others in a broadcast from it),
          serve_poll (rank 0 polls an empty request queue and broadcasts an empty batch 20 times a
          second; the other ranks wait in that broadcast), finished (a short training, then a clean
          exit), warmup (a server's collective warm-up: a small model's forward and an all_reduce of
          its output, back to back, hundreds of times or more for about 10 s; then it serves with no
          request in, as serve_poll), graph_capture (GPU only: a stack of Linear layers with an
          all_reduce, captured with torch.cuda.graph for one batch size after another as SGLang does,
          for about 12 s: two warm-up forwards on a side stream, a barrier, the capture; then the
          graphs replay for a few seconds)
FAULT     none, dl_blocks (a DataLoader worker of the culprit blocks forever in __getitem__),
          thread_dies (a worker thread of the culprit dies on an exception; the main thread waits for
          its result forever), stuck (the culprit's main thread waits forever: in warmup and
          graph_capture halfway through), skip (the culprit skips one collective), exit_early (the
          culprit exits cleanly, too early), sigstop / sigkill (the driver stops or kills the culprit)
WAIT      how the one that never returns waits: event (threading Condition/Event), queue_get
          (queue.get with a timeout, in a loop), select_pipe, sleep_loop, spin, socket_recv,
          collective (a gloo/NCCL collective), store (a new process group's store handshake), none

The culprit is the last rank (rank 1 of 2), or rank 0 where rank 0 does the work that fails (a
server's request, the checkpoint's writing).

Every rank writes its own ground truth to JOBDIR/truth_<rank>.jsonl: {t, pid, rank, state, phase}, and
``"job_hung": true`` on the line where the job stops progressing for good (the driver then marks every
rank hung from then). Times of the driver's own actions (SIGSTOP, SIGKILL) are the driver's to write.
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any

T0 = time.time()
RANK = -1
A: Any = None  # the cell's arguments
CULPRIT = 1
PHASE_S = float(os.environ.get("MATRIX_PHASE_S", "7"))  # healthy work before the fault
WARMUP_S = float(os.environ.get("MATRIX_WARMUP_S", "10"))  # a server's collective warm-up
CAPTURE_S = float(os.environ.get("MATRIX_CAPTURE_S", "12"))  # CUDA-graph capture over the batch sizes


LAST_STATE = ""


def truth(state: str, phase: str, job_hung: bool = False, solo: bool = False) -> None:
    """A truth line; ``solo``: the rank works alone in it (reads, writes, compiles: no collective), so a
    peer that leaves meanwhile makes it hang only once it next needs that peer."""
    global LAST_STATE
    LAST_STATE = state
    line: dict[str, Any] = {"t": round(time.time(), 3), "pid": os.getpid(), "rank": RANK, "state": state,
                            "phase": phase}
    if job_hung:
        line["job_hung"] = True
    if solo:
        line["solo"] = True
    with open(os.path.join(A.jobdir, f"truth_{RANK}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def log(msg: str) -> None:
    print(f"[rank{RANK}] {time.strftime('%H:%M:%S')} {msg}", flush=True)


# ---- the ways to wait forever (or until something that never comes) ------------------------------

def wait_forever(how: str, what: str) -> None:
    """Block the calling thread forever, the way ``how`` says; nothing ever wakes it for good."""
    log(f"waiting for {what} ({how})")
    if how == "event":
        cond = threading.Condition()
        with cond:
            while True:
                cond.wait()
    elif how == "queue_get":
        q: queue.Queue[Any] = queue.Queue()
        while True:
            try:
                q.get(timeout=1.0)
            except queue.Empty:
                continue
    elif how == "select_pipe":
        r, w = os.pipe()
        while True:
            select.select([r], [], [], 5.0)
    elif how == "sleep_loop":
        while True:
            time.sleep(0.5)
    elif how == "spin":
        x = 0
        while True:
            x = (x + 1) % 1000003
    elif how == "socket_recv":
        a, b = socket.socketpair()
        while True:
            a.recv(1)
    elif how == "child_pipe":
        # select on the output of a child it started, which never writes: the stack shows only this
        # frame over select(), the same as a server's; the pipe's other end is its own child
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)"], stdout=subprocess.PIPE)
        with open(os.path.join(A.jobdir, f"worker_block_{RANK}.json"), "w") as f:
            json.dump({"t": round(time.time(), 3), "worker_pid": child.pid}, f)
        assert child.stdout is not None
        while True:
            select.select([child.stdout], [], [], 5.0)
    else:
        threading.Event().wait()


class Result:
    """A result handed from a worker thread to the main thread, through the channel ``how`` names."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.value: Any = None
        self.done = threading.Event()
        self.cond = threading.Condition()
        self.q: queue.Queue[Any] = queue.Queue()
        self.r, self.w = os.pipe()
        self.sa, self.sb = socket.socketpair()

    def put(self, v: Any) -> None:
        self.value = v
        with self.cond:
            self.done.set()
            self.cond.notify_all()
        self.q.put(v)
        os.write(self.w, b"x")
        self.sb.send(b"x")

    def get(self) -> Any:
        how = self.how
        if how == "event":
            with self.cond:
                while not self.done.is_set():
                    self.cond.wait()
        elif how == "queue_get":
            while True:
                try:
                    return self.q.get(timeout=1.0)
                except queue.Empty:
                    continue
        elif how == "select_pipe":
            while not select.select([self.r], [], [], 5.0)[0]:
                pass
            os.read(self.r, 1)
        elif how == "sleep_loop":
            while not self.done.is_set():
                time.sleep(0.2)
        elif how == "socket_recv":
            self.sa.recv(1)
        else:
            self.done.wait()
        return self.value


def in_thread(fn: Any, how: str, dies: bool) -> Any:
    """Run ``fn`` in a worker thread and wait for its result; when ``dies``, the thread first multiplies
    two tensors of mismatched shapes (a real RuntimeError, printed to the log by threading's hook)."""
    import torch

    res = Result(how)

    def work() -> None:
        if dies:
            torch.randn(4, 2048) @ torch.randn(4096, 16)  # RuntimeError: mat1 and mat2 shapes cannot be multiplied
        res.put(fn())

    threading.Thread(target=work, name="matrix-worker", daemon=True).start()
    return res.get()


# ---- the phases -----------------------------------------------------------------------------------

def device() -> Any:
    import torch

    if os.environ.get("MATRIX_DEVICE") == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", RANK)) % torch.cuda.device_count())
    return torch.device("cpu")


class Data:
    """A map-style dataset whose items cost a little CPU; one index makes its worker block forever."""

    def __init__(self, block_at: int, how: str) -> None:
        # what a worker needs travels with the dataset: a worker may be a fresh interpreter (spawn)
        self.block_at, self.how, self.jobdir, self.rank = block_at, how, A.jobdir, RANK

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> Any:
        import torch

        if i == self.block_at:
            global RANK
            RANK = self.rank
            truth_line = {"t": round(time.time(), 3), "worker_pid": os.getpid(), "index": i}
            with open(os.path.join(self.jobdir, f"worker_block_{RANK}.json"), "w") as f:
                json.dump(truth_line, f)
            wait_forever(self.how, f"nothing (DataLoader worker, item {i})")
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, generator=g)
        time.sleep(0.004)
        return x, x.sum().unsqueeze(0)


BATCH = 8


def train(seconds: float, fault: str = "none", how: str = "none", dl: bool = True) -> None:
    """DDP (or, with MATRIX_FSDP=1, FSDP2) training of a small model; the batches come from a
    DataLoader with 2 workers."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = device()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(dev)
    if os.environ.get("MATRIX_FSDP") == "1":  # FSDP2: parameters sharded, gathered per layer each step
        from torch.distributed.fsdp import fully_shard

        for layer in (net[0], net[2]):
            fully_shard(layer)
        model: Any = fully_shard(net)
    else:
        model = DDP(net, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = int(seconds / 0.08)  # the same count on every rank: the loop is bounded by steps, not by time
    block_step = steps // 2 if fault == "dl_blocks" and RANK == CULPRIT else -1
    skip_step = steps // 2 if fault == "skip" and RANK == CULPRIT else -1
    die_step = steps // 2 if fault in ("thread_dies", "stuck") and RANK == CULPRIT else -1
    data: Any = Data(block_step * BATCH if block_step >= 0 else -1, how)
    loader: Any = torch.utils.data.DataLoader(data, batch_size=BATCH, num_workers=2 if dl else 0,
                                         sampler=range(steps * BATCH + BATCH * 4), persistent_workers=False)
    it = iter(loader)
    for step in range(steps):
        if step == block_step:
            truth("hung", "hung:waiting_blocked_dataloader_worker", job_hung=True)
        x, y = next(it)
        if step == skip_step:
            log(f"step {step}: out of memory, skipping the batch")
            continue
        if step == die_step:
            if fault == "thread_dies":
                truth("hung", "hung:waiting_dead_worker_thread", job_hung=True)
                in_thread(lambda: None, how, dies=True)
            else:
                truth("hung", f"hung:stuck_{how}", job_hung=True)
                wait_forever(how, "nothing")
        x, y = x.to(dev), y.to(dev)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % 20 == 0:
            log(f"step {step + 1} loss {loss.item():.4f}")
        time.sleep(0.04)
    if fault == "skip" and RANK == CULPRIT:
        truth("hung", "hung:barrier_after_skipped_step", job_hung=True)
        log("training done, barrier")
    dist.barrier()


def make_shards(n: int, mb: int) -> list[str]:
    """This rank's shard files, written fresh (and fsync'd)."""
    d = os.path.join(A.jobdir, f"shards_{RANK}")
    os.makedirs(d, exist_ok=True)
    paths = []
    block = os.urandom(1 << 20)
    for i in range(n):
        p = os.path.join(d, f"shard_{i}.bin")
        with open(p, "wb") as f:
            for _ in range(mb):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        paths.append(p)
    return paths


def read_shards(paths: list[str], seconds: float, mode: str) -> int:
    """Read the shards for ``seconds``, one after the other: from the disk (each pass drops the file from
    the page cache first), from the page cache, or throttled (8 MB, then 60 ms asleep)."""
    import torchrun_job

    torchrun_job.RANK = RANK
    t0, total = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        for p in paths:
            left = seconds - (time.monotonic() - t0)
            if left <= 0:
                break
            total += torchrun_job.slow_read(p, min(left, seconds / len(paths)), 8 << 20,
                                            0.06 if mode == "load_slow" else 0.01, drop=mode == "load_disk")
    return total


def load(mode: str, fault: str, how: str) -> None:

    truth("busy", "busy:write_shards", solo=True)  # writing files is work too (and the shards are fresh)
    paths = make_shards(4, 32)
    if mode != "load_disk":
        read_shards(paths, 0.5, "load_cache")  # now in the page cache
    for p in paths if mode == "load_disk" else []:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    truth("loading", f"loading:{mode}", solo=True)
    seconds = PHASE_S if RANK == CULPRIT else PHASE_S * 0.6
    culprit = RANK == CULPRIT
    if culprit and fault == "thread_dies":
        read_shards(paths, seconds * 0.5, mode)
        truth("hung", "hung:waiting_dead_loader_thread", job_hung=True)
        in_thread(lambda: read_shards(paths, seconds * 0.5, mode), how, dies=True)
    elif culprit and fault == "stuck":
        read_shards(paths, seconds * 0.5, mode)
        truth("hung", f"hung:loader_stuck_{how}", job_hung=True)
        wait_forever(how, "a shard that never comes")
    else:
        n = read_shards(paths, seconds, mode)
        log(f"read {n >> 20} MB")
    if RANK == 0:
        truth("waiting_peer", "waiting_peer:barrier_for_slower_loader")
    sync_point(fault, how)
    truth("busy", "busy:train")
    train(4.0, dl=False)


def compile_phase(fault: str, how: str) -> None:
    import torch
    import torch.distributed as dist

    dev = device()
    truth("compiling", "compiling:torch.compile", solo=True)
    m = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).to(dev)
    f = torch.compile(m)
    with torch.no_grad():
        y = f(torch.randn(16, 128, device=dev))
    log("compiled")
    truth("waiting_peer", "waiting_peer:barrier_after_compile")
    dist.barrier()
    truth("busy", "busy:compiled_steps")
    t0 = time.monotonic()
    n = 0
    with torch.no_grad():
        while time.monotonic() - t0 < 4.0:
            y = f(torch.randn(16, 128, device=dev))
            dist.all_reduce(y)
            n += 1
            time.sleep(0.05)
    log(f"{n} compiled steps")
    if RANK == CULPRIT and fault == "stuck":
        truth("hung", f"hung:stuck_{how}", job_hung=True)
        wait_forever(how, "nothing")
    sync_point(fault, how)
    train(4.0, dl=False)


def write_checkpoint(path: str, mb: int) -> None:
    import torch

    with open(path, "wb") as f:
        for i in range(mb // 16):
            torch.save({f"w{i}": torch.randn(4 << 20)}, f)  # 16 MB a chunk
            f.flush()
            os.fsync(f.fileno())


def checkpoint(fault: str, how: str) -> None:

    truth("busy", "busy:train")
    train(PHASE_S * 0.5, dl=False)
    writer = RANK == 0
    if writer:
        truth("busy", "busy:checkpoint_save", solo=True)
        path = os.path.join(A.jobdir, "ckpt.pt")
        mb = int(os.environ.get("MATRIX_CKPT_MB", "480"))
        if fault == "thread_dies":
            truth("hung", "hung:waiting_dead_checkpoint_thread", job_hung=True)
            in_thread(lambda: write_checkpoint(path, mb), how, dies=True)
        elif fault == "stuck":
            write_checkpoint(path, mb // 2)
            truth("hung", f"hung:checkpoint_stuck_{how}", job_hung=True)
            wait_forever(how, "nothing")
        else:
            write_checkpoint(path, mb)
        log("checkpoint written")
    else:
        truth("waiting_peer", "waiting_peer:checkpoint_of_rank0")
    sync_point(fault, how)
    truth("busy", "busy:train")
    train(PHASE_S * 0.5, dl=False)


def sync_point(fault: str, how: str) -> None:
    """Where the ranks meet after a phase: a collective, or, where the cell waits in a store, the
    handshake of a new process group (it waits for every rank to register)."""
    import torch.distributed as dist

    if fault in ("exit_early",) and RANK == CULPRIT:
        log("done early: exiting")
        truth("gone", "exited_early")
        dist.destroy_process_group()
        sys.exit(0)
    if LAST_STATE != "waiting_peer":
        truth("waiting_peer", f"waiting_peer:{'new_group' if how == 'store' else 'barrier'}")
    if how == "store":
        dist.new_group(backend="gloo")
    else:
        dist.barrier()


def serve(mode: str, fault: str, how: str, warm: bool = True) -> None:
    """Rank 0 takes requests (accept() on a socket, or a queue fed by a listener thread) and broadcasts
    each batch to the other ranks; a request arrives only when the driver sends one (a fault cell).
    ``warm``: a short training first (the warmup phase has warmed up already)."""
    import torch

    if warm:
        truth("busy", "busy:warmup")
        train(2.0, dl=False)
    lst = None
    if RANK == 0:
        lst = socket.socket()
        lst.bind(("127.0.0.1", 0))
        lst.listen(8)
        with open(os.path.join(A.jobdir, "port.tmp"), "w") as f:
            f.write(str(lst.getsockname()[1]))
        os.replace(os.path.join(A.jobdir, "port.tmp"), os.path.join(A.jobdir, "port"))
    requests: queue.Queue[bytes] = queue.Queue()
    if RANK == 0 and mode == "serve_poll":
        def listener() -> None:
            while True:
                c, _ = lst.accept()  # type: ignore[union-attr]
                requests.put(c.recv(1024))
                c.close()

        threading.Thread(target=listener, name="listener", daemon=True).start()
    truth("idle", "idle:no_requests" if RANK == 0 else "idle:waiting_rank0_batches")
    log("ready")

    def handle(req: bytes) -> Any:
        culprit = RANK == CULPRIT
        if culprit and fault == "thread_dies":
            truth("hung", "hung:waiting_dead_worker_thread", job_hung=True)
            return in_thread(lambda: torch.ones(1), how, dies=True)
        if culprit and fault == "stuck":
            truth("hung", f"hung:request_stuck_{how}", job_hung=True)
            wait_forever(how, "nothing")
        return torch.ones(1)

    while True:
        if RANK == 0:
            if mode == "serve_accept":
                c, _ = lst.accept()  # type: ignore[union-attr]
                req = c.recv(1024)
                c.close()
                batch = [req]
            else:
                try:
                    batch = [requests.get(timeout=0.05)]
                except queue.Empty:
                    batch = []
        else:
            batch = []
        for req in broadcast_batch(batch):
            log(f"request {req[:20]!r}")
            truth("busy", "busy:request")
            handle(req)


def broadcast_batch(batch: list[bytes]) -> list[bytes]:
    """Rank 0's batch of requests to every rank (a fixed-size byte tensor: length, then the bytes)."""
    import torch
    import torch.distributed as dist

    t = torch.zeros(1028, dtype=torch.uint8)
    if RANK == 0:
        raw = json.dumps([b.decode(errors="replace") for b in batch]).encode()[:1024]
        t[:4] = torch.tensor(list(len(raw).to_bytes(4, "little")), dtype=torch.uint8)
        t[4:4 + len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    t = t.to(device())
    dist.broadcast(t, src=0)
    vals = t.cpu().tolist()
    n = int.from_bytes(bytes(vals[:4]), "little")
    return [x.encode() for x in json.loads(bytes(vals[4:4 + n]).decode())]


def finished() -> None:
    truth("busy", "busy:train")
    train(PHASE_S * 0.6)
    import torch.distributed as dist

    log("done")
    truth("gone", "exited")
    dist.destroy_process_group()


def sync_device() -> None:
    import torch

    if device().type == "cuda":
        torch.cuda.synchronize()


def agreed_count(step: Any, seconds: float, probe: int, lo: int, hi: int) -> int:
    """How many more runs of ``step`` make about ``seconds``, the same on every rank: ``probe`` runs
    timed, the slowest rank's pace taken (an all_reduce of it). A loop with a collective in it must run
    as often on every rank, else the rank that stops first leaves the others waiting."""
    import torch
    import torch.distributed as dist

    t0 = time.monotonic()
    for _ in range(probe):
        step()
    sync_device()
    pace = torch.tensor([(time.monotonic() - t0) / probe], dtype=torch.float64, device=device())
    dist.all_reduce(pace, op=dist.ReduceOp.MAX)
    return max(lo, min(hi, int(seconds / max(float(pace.item()), 1e-6))))


def small_model(layers: int) -> tuple[Any, int, Any]:
    """A stack of Linear layers, as one tensor-parallel shard of a model (bf16 on a GPU), its width and
    dtype."""
    import torch

    dev = device()
    gpu = dev.type == "cuda"
    width = 2048 if gpu else 512
    dtype = torch.bfloat16 if gpu else torch.float32
    torch.manual_seed(0)
    stack = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                  for _ in range(layers)]).to(dev, dtype)
    return stack, width, dtype


def warmup(fault: str, how: str) -> None:
    """A server's collective warm-up before it serves: a small model's forward and an all_reduce of its
    output (a row-parallel layer's), back to back, for about WARMUP_S (hundreds of all_reduces or more,
    as many on every rank); then it serves with no request in (serve_poll). The culprit's fault
    (stuck, thread_dies) comes halfway through the warm-up; the driver's (sigstop, sigkill) a few
    seconds into it."""
    import torch
    import torch.distributed as dist

    truth("busy", "busy:warmup_all_reduce")
    model, width, dtype = small_model(4)
    x = torch.randn(64, width, device=device(), dtype=dtype)

    def step() -> None:
        with torch.no_grad():
            y = model(x)
            dist.all_reduce(y)

    n = agreed_count(step, WARMUP_S, 20, 200, 20000)
    log(f"warm-up: {n} all_reduces")
    cut = n // 2 if RANK == CULPRIT and fault in ("stuck", "thread_dies") else -1
    for i in range(n):
        if i == cut:
            if fault == "thread_dies":
                truth("hung", "hung:waiting_dead_warmup_thread", job_hung=True)
                in_thread(step, how, dies=True)
            else:
                truth("hung", f"hung:warmup_stuck_{how}", job_hung=True)
                wait_forever(how, "nothing")
        step()
    sync_device()
    log("warm-up done")
    sync_point(fault, how)
    serve("serve_poll", "none", "none", warm=False)


def capture_sizes() -> list[int]:
    """The batch sizes a server captures a graph for, smallest first: 1, 2, 4, then every 8."""
    return [1, 2, 4] + list(range(8, 2048 + 1, 8))


def graph_capture(fault: str, how: str) -> None:
    """CUDA-graph capture as SGLang's cuda_graph_runner does it: for one batch size after another, two
    warm-up forwards on a side stream, a barrier, then torch.cuda.graph over the forward (Linear layers
    and an all_reduce) into one shared memory pool; as many sizes on every rank as make about
    CAPTURE_S. Rank 0 logs its progress as SGLang does. Then the graphs replay (the server's decode
    steps). The culprit's fault (stuck) comes halfway through the sizes; the driver's (sigstop,
    sigkill) a few seconds into the capture."""
    import torch
    import torch.distributed as dist

    dev = device()
    model, width, dtype = small_model(16)
    sizes = capture_sizes()
    static_in = torch.randn(sizes[-1], width, device=dev, dtype=dtype)
    side = torch.cuda.Stream()
    graphs: list[tuple[Any, Any]] = []  # each graph and its output (a graph replays on the very tensors it captured)
    pool = None

    def forward(bs: int) -> Any:
        y = model(static_in[:bs])
        dist.all_reduce(y)
        return y

    def capture_one(bs: int) -> None:
        nonlocal pool
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(2):
                forward(bs)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        dist.barrier()
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g, pool=pool, stream=side):
            out = forward(bs)
        pool = g.pool()
        graphs.append((g, out))
        if RANK == 0:
            free, _ = torch.cuda.mem_get_info()
            log(f"Capturing batches (bs={bs} avail_mem={free / 2**30:.2f} GB): {len(graphs)}")

    truth("graph_capture", "graph_capture:cuda_graph_runner")
    if RANK == 0:
        log("Capture cuda graph begin. This can take up to several minutes.")
    t0 = time.monotonic()
    probe = iter(sizes)
    n = 4 + agreed_count(lambda: capture_one(next(probe)), CAPTURE_S, 4, 20, len(sizes) - 4)
    cut = n // 2 if RANK == CULPRIT and fault == "stuck" else -1
    for i in range(4, n):
        if i == cut:
            truth("hung", f"hung:capture_stuck_{how}", job_hung=True)
            wait_forever(how, "nothing")
        capture_one(sizes[i])
    torch.cuda.synchronize()
    log(f"Capture cuda graph end. Time elapsed: {time.monotonic() - t0:.2f} s. {n} graphs")
    truth("busy", "busy:graph_replay")
    k = 0

    def replay() -> None:
        nonlocal k
        graphs[(k * 7) % len(graphs)][0].replay()  # the same order on every rank: each holds an all_reduce
        k += 1

    for _ in range(agreed_count(replay, PHASE_S, 50, 100, 1000000)):
        replay()
    torch.cuda.synchronize()
    log(f"{k} replays")
    sync_point(fault, how)


def rank_main(rank: int | None = None, world: int = 2, init: str | None = None) -> None:
    global RANK
    if rank is None:
        rank = int(os.environ["RANK"])
    RANK = rank
    truth("starting", "starting")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend = "nccl" if os.environ.get("MATRIX_DEVICE") == "cuda" else "gloo"
    if os.environ.get("MATRIX_DEVICE") == "cuda":
        if torch.cuda.device_count() < world:
            os.environ["NCCL_HOSTID"] = f"matrix-rank{rank}"  # ranks sharing a GPU, each as if on a host of its own
        torch.cuda.set_device(device())
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    log(f"rank {rank} pid {os.getpid()} ready, {A.phase} {A.fault} {A.wait}")
    p, fault, how = A.phase, A.fault, A.wait
    if p in ("train",):
        truth("busy", "busy:train")
        train(PHASE_S * 2.2, fault, how)
        sync_point(fault, how)
        train(2.0, dl=False)
    elif p.startswith("load_"):
        load(p, fault, how)
    elif p == "compile":
        compile_phase(fault, how)
    elif p == "checkpoint":
        checkpoint(fault, how)
    elif p.startswith("serve_"):
        serve(p, fault, how)
    elif p == "warmup":
        warmup(fault, how)
    elif p == "graph_capture":
        graph_capture(fault, how)
    elif p == "finished":
        finished()
        return
    log("done")
    truth("busy", "busy:done")
    dist.destroy_process_group()


def _spawned(rank: int, args: Any, port: int, culprit: int) -> None:
    global A, CULPRIT
    A, CULPRIT = args, culprit
    rank_main(rank, args.world_size, f"tcp://127.0.0.1:{port}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    global A
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("launcher", choices=["torchrun", "spawn", "mpargv", "parent", "rank"])
    ap.add_argument("phase")
    ap.add_argument("fault")
    ap.add_argument("wait")
    ap.add_argument("jobdir")
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--world-size", type=int, default=None, help="ranks (default: torchrun's WORLD_SIZE, else 2)")
    ap.add_argument("--dist-init", default=None)
    A = ap.parse_args()
    if A.world_size is None:
        A.world_size = int(os.environ.get("WORLD_SIZE", "2")) if A.launcher == "torchrun" else 2
    global CULPRIT
    CULPRIT = A.world_size - 1
    # rank 0 does the work in a server and writes the checkpoint: there it is the one that fails
    if A.fault in ("thread_dies", "stuck") and (A.phase.startswith("serve_") or A.phase == "checkpoint"):
        CULPRIT = 0
    if A.phase == "compile":
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(A.jobdir, f"inductor_{os.getpid()}"))
    if A.launcher in ("torchrun", "rank"):
        rank_main(A.rank, A.world_size, A.dist_init)
    elif A.launcher == "spawn":
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(A, free_port(), CULPRIT), nprocs=A.world_size, join=True)
    else:
        port = free_port()
        cmd = [sys.executable, os.path.abspath(__file__), "rank", A.phase, A.fault, A.wait, A.jobdir,
               "--world-size", str(A.world_size), "--dist-init", f"tcp://127.0.0.1:{port}"]
        if A.launcher == "mpargv":
            procs = [subprocess.Popen([*cmd, "--rank", str(r)]) for r in range(A.world_size)]
            rc = 0
            for pr in procs:
                rc = pr.wait() or rc
            sys.exit(rc)
        # parent: rank 0 is this process, the others its children
        children = [subprocess.Popen([*cmd, "--rank", str(r)]) for r in range(1, A.world_size)]
        rank_main(0, A.world_size, f"tcp://127.0.0.1:{port}")
        for child in children:
            child.wait()


if __name__ == "__main__":
    main()
