"""An SGLang-like server on CPU: a launcher (no rank in its environment) starts 2 workers with
``multiprocessing``'s spawn context and passes each its rank as an argument; the workers form a gloo
group over ``tcp://`` with no torch.distributed environment (no RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR or MASTER_PORT), as tensor-parallel server workers do.

    python server_job.py MODE --port P

Every worker prints ``worker R pid P ready`` once its group is up, then:

  idle   rank 0 waits for a request in ``accept()`` on a listening socket and broadcasts what
         came; rank 1 waits for it in ``broadcast_object_list`` (an idle server: fine for days)
  poll   rank 0 polls an empty request queue and broadcasts the (empty) batch 20 times a second
         the way SGLang's ``broadcast_pyobj`` does (a size, then the pickled bytes if any); rank 1
         receives them (a busy-polling idle server)
  hang   rank 0 "loads weights", prints ``Load weight end`` and then waits on an Event forever;
         rank 1 waits for it in ``broadcast_object_list`` (a server hung at start-up)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import socket
import threading
import time

# rank 1 of ``idle``/``hang`` only ever waits in the size broadcast of broadcast_object_list: receiving
# an object would need numpy, which the CPU test environment lacks; ``poll`` sends tensors only.
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def broadcast_pyobj(data: list[object], rank: int) -> list[object]:
    """Rank 0's list to every rank: its pickled size, then the bytes unless it is empty."""
    import pickle

    import torch
    import torch.distributed as dist

    if rank == 0:
        payload = pickle.dumps(data) if data else b""
        dist.broadcast(torch.tensor([len(payload)], dtype=torch.long), src=0)
        if payload:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=0)
        return data
    size = torch.tensor([0], dtype=torch.long)
    dist.broadcast(size, src=0)
    if not int(size.item()):
        return []
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(buf, src=0)
    return list(pickle.loads(bytes(buf.tolist())))


def worker(rank: int, mode: str, port: int) -> None:
    import torch.distributed as dist

    def log(msg: str) -> None:
        print(f"[worker {rank}] {time.strftime('%H:%M:%S')} {msg}", flush=True)

    leaked = [k for k in DIST_ENV if k in os.environ]
    if leaked:
        raise SystemExit(f"worker {rank} has a torch.distributed environment: {leaked}")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    log(f"worker {rank} pid {os.getpid()} ready (no torch.distributed environment)")
    if mode == "idle":
        if rank == 0:
            srv = socket.socket()
            srv.bind(("127.0.0.1", 0))
            srv.listen()
            log(f"serving requests on port {srv.getsockname()[1]}")
            while True:
                conn, _ = srv.accept()
                req = conn.recv(65536)
                conn.close()
                dist.broadcast_object_list([req], src=0)
        else:
            while True:
                box: list[object] = [None]
                dist.broadcast_object_list(box, src=0)
                log(f"got request {box[0]!r}")
    elif mode == "poll":
        requests: queue.Queue[bytes] = queue.Queue()
        rounds = 0
        while True:
            batch: list[object] = []
            if rank == 0:
                try:
                    while True:
                        batch.append(requests.get_nowait())
                except queue.Empty:
                    pass
            batch = broadcast_pyobj(batch, rank)
            rounds += 1
            if rounds == 20:
                log("polling: 20 empty batches broadcast")
            time.sleep(0.05)
    elif mode == "hang":
        if rank == 0:
            log("Load weight begin")
            time.sleep(1.0)
            log(f"Load weight end (t={time.time():.3f})")
            threading.Event().wait()
        else:
            log("waiting for rank 0's first batch")
            dist.broadcast_object_list([None], src=0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["idle", "poll", "hang"])
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    import torch  # noqa: F401  (the launcher of a real server imports torch too)

    for k in DIST_ENV:  # the workers must find their rank in their arguments only
        os.environ.pop(k, None)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, a.mode, a.port)) for r in range(2)]
    for pr in procs:
        pr.start()
    print(f"launcher pid {os.getpid()} started workers {[pr.pid for pr in procs]}", flush=True)
    for pr in procs:
        pr.join()


if __name__ == "__main__":
    main()
