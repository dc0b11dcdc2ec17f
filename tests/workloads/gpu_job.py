"""A real torch job for recording traces with ground truth, one process per rank.

NCCL on GPUs (gloo on CPU for a dry run). Each rank appends its true state to
``<dir>/truth_<rank>.jsonl`` as it changes phase, like the reference traces:
{"t", "pid", "rank", "state", "phase"}.

Scenarios:
  nccl_stall  train, then rank 1 stops calling collectives; rank 0 blocks in all_reduce (with
              GPU_JOB_BACKEND=gloo on CUDA tensors: in torch.cuda.synchronize, its GPU idle)
  straggler   train while rank 1 sleeps --sleep s every step
  orphan      train (the driver SIGKILLs the launcher; the ranks keep going)
  compile     torch.compile warm-up (compiling), then train
  mismatch    train; at one step the ranks all_reduce different sizes (completes silently)
  sigstop     train (the driver SIGSTOPs rank 1)
  kill        train (the driver SIGKILLs rank 1)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
OUT = sys.argv[2]
SCEN = sys.argv[1]


def truth(state: str, phase: str) -> None:
    with open(os.path.join(OUT, f"truth_{RANK}.jsonl"), "a") as f:
        f.write(json.dumps({"t": round(time.time(), 3), "pid": os.getpid(), "rank": RANK, "state": state,
                            "phase": phase}) + "\n")
    print(f"[rank{RANK}] {time.strftime('%H:%M:%S')} phase {phase}", flush=True)


def main() -> None:
    truth("starting", "init")
    cuda = torch.cuda.is_available()
    # ranks share the GPUs there are (two ranks on a host with one GPU: GPU_JOB_BACKEND=gloo)
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", RANK)) % torch.cuda.device_count()) if cuda \
        else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    # GPU_JOB_BACKEND=gloo: gloo between ranks that share one GPU (NCCL refuses two ranks on one device)
    backend = os.environ.get("GPU_JOB_BACKEND") or ("nccl" if cuda else "gloo")
    dist.init_process_group(backend, device_id=dev if cuda and backend == "nccl" else None)
    n = 4096 if cuda else 256
    w = torch.randn(n, n, device=dev, dtype=torch.bfloat16 if cuda else torch.float32)
    grad = torch.zeros(64 * 1024 * 1024 if cuda else 1 << 16, device=dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step(i: int) -> None:
        x = w
        for _ in range(20):
            x = torch.tanh(x @ w)
        grad.fill_(float(x[0, 0]))
        dist.all_reduce(grad)
        sync()
        if i % 5 == 0:
            print(f"[rank{RANK}] {time.strftime('%H:%M:%S')} step {i} loss {float(grad[0]):.4f}", flush=True)

    if SCEN == "load":
        # safetensors-like shards written by rank 0's peer before, read back to the GPU one by one
        shards = sorted(p for p in os.listdir(OUT) if p.startswith(f"shard_{RANK}_"))
        truth("loading", "loading")
        held = []
        for i, name in enumerate(shards):
            with open(os.path.join(OUT, name), "rb") as f:
                data = f.read()
            held.append(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev))
            print(f"[rank{RANK}] {time.strftime('%H:%M:%S')} Loading safetensors checkpoint shards: {i + 1}/{len(shards)}",
                  flush=True)
        sync()
        truth("idle", "done")
        threading.Event().wait()

    if SCEN == "graph_capture":
        layers = [torch.nn.Linear(4096, 4096, device=dev, dtype=torch.bfloat16) for _ in range(48)]
        pool = None
        graphs = []
        statics = []  # a graph replays on the very tensors it captured: keep them alive
        truth("graph_capture", "graph_capture")
        s = torch.cuda.Stream()
        for bs in range(64, 4096 + 1, 64):
            x = torch.randn(bs, 4096, device=dev, dtype=torch.bfloat16)
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm up outside the graph, as capture requires
                for _ in range(3):
                    y = x
                    for layer in layers:
                        y = layer(y)
                    dist.all_reduce(y)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                y = x
                for layer in layers:
                    y = layer(y)
                dist.all_reduce(y)
            pool = g.pool()
            graphs.append(g)
            statics.append((x, y))
            print(f"[rank{RANK}] {time.strftime('%H:%M:%S')} Capturing batches (bs={bs})", flush=True)
        sync()
        truth("busy", "serve_graphs")
        t_end = time.time() + 8
        while time.time() < t_end:
            for g in graphs:
                g.replay()
            sync()
        truth("idle", "done")
        threading.Event().wait()

    if SCEN == "compile":
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(24)]).to(dev)
        cmodel = torch.compile(model)
        truth("compiling", "compile")
        inp = torch.randn(64, 2048, device=dev)
        cmodel(inp).sum().backward()
        sync()
        truth("busy", "train_compiled")
        t_end = time.time() + 12
        while time.time() < t_end:
            cmodel(inp).sum().backward()
            dist.all_reduce(grad)
            sync()
        truth("idle", "done")
        threading.Event().wait()

    truth("straggler" if SCEN == "straggler" and RANK == 1 else "waiting_peer" if SCEN == "straggler" else "busy",
          "train")
    i = 0
    t0 = time.time()
    while True:
        i += 1
        if SCEN == "nccl_stall" and time.time() - t0 > 10:
            if RANK == 1:
                truth("hung", "hung:left_schedule")
                threading.Event().wait()
            truth("hung", "hung:nccl_wait")
            step(i)  # blocks: rank 1 never joins
        if SCEN == "straggler" and RANK == 1:
            time.sleep(float(os.environ.get("STRAGGLER_SLEEP", "3")))
        if SCEN == "mismatch" and i == 50:
            other = torch.ones((1 << 20) if RANK == 0 else (1 << 24), device=dev)
            dist.all_reduce(other)  # different sizes: NCCL completes it, silently wrong
            sync()
            print(f"[rank{RANK}] mismatched all_reduce done", flush=True)
        step(i)


if __name__ == "__main__":
    main()
