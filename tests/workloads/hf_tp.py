"""Hugging Face transformers tensor parallelism, one process per rank, under plain torchrun.

    torchrun --nproc-per-node 2 --master-port P tests/workloads/hf_tp.py SCENARIO OUTDIR CKPT
    python tests/workloads/hf_tp.py make_ckpt CKPT          (once, before: a random-weight checkpoint)

A Llama-style checkpoint with random weights, saved as several safetensors shards, is loaded with
``from_pretrained(..., distributed_config=DistributedConfig(tp_size=WORLD_SIZE))`` and served the way
a small TP inference server does it: rank 0 broadcasts each request (a control tensor), every rank
hands it to its generation worker thread through a ``queue.Queue`` and waits for the result.

Each rank appends its true state to ``OUTDIR/truth_<rank>.jsonl`` when it changes phase
({"t", "pid", "rank", "state", "phase"}), like the reference traces.

Scenarios:
  healthy         generate for --seconds (default 25 s), log progress, exit cleanly
  short           the same, 6 s
  worker_died     rank 1's draft head has the wrong hidden size: when speculative requests start, its
                  worker thread dies on a shape mismatch and its main thread blocks in Queue.get();
                  rank 0 goes on into the next TP forward and blocks in NCCL
  gloo_handshake  after loading, rank 0 creates a gloo group for request broadcast; rank 1 never
                  reaches it (it waits on an event that is never set): rank 0 blocks in the handshake
  slow_load       rank 1 first reads its shards from a throttled "slow disk" (page cache dropped
                  for them), rank 0 waits for it at a barrier; then both load and generate briefly
CPU (gloo) with a tiny config when there is no GPU: a dry run of the same code.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", str(RANK)))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
SLOW_RANK = 1
SECONDS = {"healthy": 25.0, "short": 6.0, "slow_load": 5.0, "worker_died": 10.0, "gloo_handshake": 3.0}
OUT = ""


def log(msg: str) -> None:
    print(f"[rank{RANK}] {time.strftime('%H:%M:%S')} {msg}", flush=True)


def truth(state: str, phase: str) -> None:
    t = round(time.time(), 3)
    with open(os.path.join(OUT, f"truth_{RANK}.jsonl"), "a") as f:
        f.write(json.dumps({"t": t, "pid": os.getpid(), "rank": RANK, "state": state, "phase": phase}) + "\n")
    log(f"phase {phase} (t={t})")


def model_config(small: bool) -> Any:
    from transformers import LlamaConfig

    if small:  # CPU dry run
        return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                           num_key_value_heads=4, vocab_size=1024, max_position_embeddings=512,
                           bos_token_id=None, eos_token_id=None, pad_token_id=0)
    # about 3.1 B parameters: 6.2 GB in bf16, so each of 2 GPUs holds about 3 GB of weights
    return LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096,
                       bos_token_id=None, eos_token_id=None, pad_token_id=0)


def make_ckpt(path: str) -> None:
    import torch
    from transformers import LlamaForCausalLM

    cuda = torch.cuda.is_available()
    cfg = model_config(small=not cuda)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16 if cuda else torch.float32)
    with torch.device("cuda:0" if cuda else "cpu"):
        model = LlamaForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path, max_shard_size="1GB" if cuda else "2MB")
    shards = sorted(p.name for p in Path(path).glob("*.safetensors"))
    print(f"checkpoint: {n / 1e9:.2f} B parameters, {len(shards)} shards, "
          f"{sum((Path(path) / s).stat().st_size for s in shards) / 1e9:.2f} GB, {time.time() - t0:.1f} s", flush=True)


def slow_read(ckpt: str, rate_mb_s: float, max_s: float) -> None:
    """Read the shards the way a throttled network disk delivers them; drop them from the page cache
    first so the bytes really come from the device (read_bytes moves)."""
    files = sorted(Path(ckpt).glob("*.safetensors"))
    chunk = 4 << 20
    t0 = time.time()
    done = 0
    for i, f in enumerate(files):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while time.time() - t0 < max_s:
                b = os.read(fd, chunk)
                if not b:
                    break
                done += len(b)
                ahead = done / (rate_mb_s * 1e6) - (time.time() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        finally:
            os.close(fd)
        log(f"slow disk: shard {i + 1}/{len(files)} {f.name} read, {done / 1e6:.0f} MB in {time.time() - t0:.1f} s "
            f"({done / 1e6 / max(time.time() - t0, 1e-3):.0f} MB/s)")
        if time.time() - t0 >= max_s:
            break


def main() -> None:
    global OUT
    scen, OUT, ckpt = sys.argv[1], sys.argv[2], sys.argv[3]
    seconds = float(os.environ.get("HF_TP_SECONDS", SECONDS.get(scen, 10.0)))
    truth("starting", "init")
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, DistributedConfig

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", LOCAL_RANK % max(torch.cuda.device_count(), 1)) if cuda else torch.device("cpu")
    if cuda:
        if torch.cuda.device_count() < WORLD:
            # ranks sharing one GPU, as if on two hosts; transformers' TP sets the device LOCAL_RANK names
            os.environ["NCCL_HOSTID"] = f"hf-tp-rank{RANK}"
            os.environ["LOCAL_RANK"] = str(dev.index)
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    log(f"process group up: world {WORLD}, backend {dist.get_backend()}")

    if scen == "slow_load":
        if RANK == SLOW_RANK:
            truth("loading", "loading:slow_disk")
            slow_read(ckpt, float(os.environ.get("HF_TP_SLOW_MB_S", "120")), float(os.environ.get("HF_TP_SLOW_S", "32")))
        else:
            truth("waiting_peer", "waiting_peer:barrier")
            log("waiting at the barrier for the peer's shards")
        dist.barrier()

    truth("loading", "loading:from_pretrained")
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16 if cuda else torch.float32,
                                                 distributed_config=DistributedConfig(tp_size=WORLD))
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    w = model.model.layers[0].mlp.gate_proj.weight
    log(f"tensor parallel: tp_size {getattr(model, 'tp_size', None)}, gate_proj weight {type(w).__name__} "
        f"local shape {tuple(getattr(w, '_local_tensor', w).shape)} of intermediate {model.config.intermediate_size}")
    if cuda:
        torch.cuda.synchronize()
        log(f"model loaded in {time.time() - t0:.1f} s: {torch.cuda.memory_allocated() / 2**30:.2f} GiB on this GPU")
    else:
        log(f"model loaded in {time.time() - t0:.1f} s")

    draft = None
    if scen == "worker_died":
        # an EAGLE-style draft head; rank 1's was built from a stale config with half the hidden size
        dh = hidden if RANK != SLOW_RANK else hidden // 2
        draft = torch.nn.Linear(dh, vocab, bias=False, device=dev, dtype=model.dtype)
        log(f"draft head loaded (hidden_size={dh})")

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, vocab, (4, 64), generator=g).to(dev)  # the same on every rank
    mask = torch.ones_like(prompt)
    new_tokens = 32
    reqs: queue.Queue[dict[str, Any] | None] = queue.Queue()
    results: queue.Queue[dict[str, Any]] = queue.Queue()

    def serve(req: dict[str, Any]) -> dict[str, Any]:
        with torch.no_grad():
            ids = model.generate(prompt, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
            if req["speculative"] and draft is not None:
                # draft proposes from the last hidden state, the target model verifies (a TP forward)
                h = model(ids, output_hidden_states=True).hidden_states[-1][:, -1]
                try:
                    proposal = draft(h).argmax(-1)
                except RuntimeError:
                    truth("hung", "hung:worker_died")
                    raise
                truth("hung", "hung:nccl_wait")  # the verify forward's all_reduce: the peer never joins
                logits = model(torch.cat([ids, proposal[:, None]], 1)).logits[:, -2]
                accepted = (logits.argmax(-1) == proposal).tolist()
                return {"tokens": int(ids.shape[1] - prompt.shape[1]), "accepted": accepted}
        return {"tokens": int(ids.shape[1] - prompt.shape[1])}

    def worker() -> None:
        while True:
            req = reqs.get()
            if req is None:
                return
            results.put(serve(req))  # an exception ends this thread: the traceback goes to stderr

    th = threading.Thread(target=worker, name="generation-worker", daemon=True)
    th.start()

    if scen == "gloo_handshake":
        run_requests(dist, torch, dev, reqs, results, seconds, speculative_after=None)
        if RANK == SLOW_RANK:
            truth("hung", "hung:never_joined")
            log("waiting for the request router to come up before joining the broadcast group")
            threading.Event().wait()
        truth("hung", "hung:gloo_handshake")
        log("creating the gloo group for request broadcast")
        dist.new_group(backend="gloo")
        log("gloo group up")  # never printed
    elif scen == "worker_died":
        run_requests(dist, torch, dev, reqs, results, 10**9, speculative_after=seconds)
    else:
        run_requests(dist, torch, dev, reqs, results, seconds, speculative_after=None)

    truth("idle", "shutdown")
    reqs.put(None)
    th.join()
    dist.destroy_process_group()
    log("exit")


def run_requests(dist: Any, torch: Any, dev: Any, reqs: queue.Queue[Any], results: queue.Queue[Any], seconds: float,
                 speculative_after: float | None) -> None:
    truth("busy", "generate")
    t0 = time.time()
    i = 0
    toks = 0
    spec_on = False
    while True:
        # rank 0 decides and broadcasts: [go on, speculative]
        ctl = torch.zeros(2, dtype=torch.int64, device=dev)
        if RANK == 0:
            el = time.time() - t0
            ctl[0] = int(el < seconds)
            ctl[1] = int(speculative_after is not None and el >= speculative_after)
        dist.broadcast(ctl, 0)
        go, spec = (int(x) for x in ctl.tolist())
        if not go:
            break
        if spec and not spec_on:
            spec_on = True
            log("speculative decoding on: requests go through the draft head")
        reqs.put({"i": i, "speculative": bool(spec)})
        res = results.get()  # blocks for good if the worker thread died
        i += 1
        toks += res["tokens"] * 4
        if i % 5 == 0:
            log(f"request {i}: {toks} tokens generated, {toks / (time.time() - t0):.0f} tok/s")
    log(f"done: {i} requests, {toks} tokens in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    if sys.argv[1] == "make_ckpt":
        make_ckpt(sys.argv[2])
    else:
        main()
