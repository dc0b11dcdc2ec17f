"""Classify where a stack waits, from the catalog in ``catalog.toml`` (data, easy to extend)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from hangd.snapshot import Frame, StackSample, ThreadStack

# Threads that hangd itself or the runtime adds and that say nothing about what the job does:
# py-spy sees the import thread a flight-recorder dump request starts, and watchdog/heartbeat
# threads wait forever by design.
IGNORED_THREAD_FRAMES = re.compile(r"<frozen importlib|ProcessGroupNCCL::(ncclCommWatchdog|heartbeatMonitor|Watchdog)")


# Catalog kinds that show the process working, not waiting: such a verdict describes it while the
# work goes on, wherever in the kernel it is between two captures.
WORK_KINDS = frozenset({"compile_setup", "compiling", "loading", "graph_capture", "computing"})
# Kinds of a wait for something of its own job, not for a peer: an event, a lock, a condition or a
# queue; a worker, a pool or a thread of its job
OWN_WAIT_KINDS = frozenset({"lock_wait", "worker_wait"})
# Kinds that show it compiling: ``compile_setup`` is the torch.compile() call importing its compiler
COMPILE_KINDS = frozenset({"compile_setup", "compiling"})
# Waits a process sleeps in, burning no core: the rendezvous store, a lock, a queue, its workers, a
# sleep. Not a collective (CUDA's synchronize and a transport's busy poll spin a core), nor a
# server's poll loop (an idle SGLang scheduler polls its sockets on a whole core by default)
SLEEPING_KINDS = frozenset({"store", "lock_wait", "worker_wait", "sleeping"})
# The compiler's own modules: code their import runs (decorators registering polyfills, rule
# tables: DDP and torch.save import torch._dynamo lazily in plain training) is importing, not compiling
COMPILER_MODULES = re.compile(r"torch/_dynamo/|torch/_inductor/|torch/_functorch/|triton/")

@dataclass(frozen=True, slots=True)
class Rule:
    kind: str
    priority: int
    why: str
    patterns: tuple[re.Pattern[str], ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: str  # a catalog kind, or "unknown"
    why: str
    frame: str | None  # the frame that decided it, "file:function:line"
    thread: str | None
    priority: int = 0
    queue_fed: bool = False  # a queue read taken for a wait for requests (``_fed_from_outside``)

    @property
    def known(self) -> bool:
        return self.kind != "unknown"


UNKNOWN = Verdict("unknown", "no catalog rule matched", None, None, 0)

# Where Python's import machinery runs
IMPORT_FRAMES = re.compile(r"^<frozen importlib|(^|/)importlib/__init__\.py$")


def load_catalog(text: str | None = None) -> list[Rule]:
    if text is None:
        text = resources.files("hangd.analysis").joinpath("catalog.toml").read_text()
    data = tomllib.loads(text)
    rules = []
    for r in data.get("rule", []):
        rules.append(Rule(kind=r["kind"], priority=int(r.get("priority", 50)), why=r.get("why", r["kind"]),
                          patterns=tuple(re.compile(p) for p in r["patterns"])))
    return sorted(rules, key=lambda r: -r.priority)


@lru_cache(maxsize=1)
def default_catalog() -> tuple[Rule, ...]:
    return tuple(load_catalog())


def frame_key(f: Frame) -> str:
    return f"{f.filename}:{f.name}"


def frame_text(f: Frame) -> str:
    return f"{f.name} ({f.filename}:{f.line})" if f.line is not None else f"{f.name} ({f.filename})"


def main_thread(sample: StackSample) -> ThreadStack | None:
    """The thread that says what the process does: MainThread / tid == pid, else the first
    thread that is not one of the ignored helper threads."""
    for th in sample.threads:
        if th.name == "MainThread" or th.tid == sample.pid:
            return th
    for th in sample.threads:
        if th.frames and not any(IGNORED_THREAD_FRAMES.search(frame_key(f)) for f in th.frames):
            return th
    return sample.threads[0] if sample.threads else None


def classify_thread(th: ThreadStack, rules: tuple[Rule, ...] | list[Rule] | None = None) -> Verdict:
    rules = rules if rules is not None else default_catalog()
    keys = [frame_key(f) for f in th.frames]
    # a class body run by its module's import (py-spy names the frame after the class, its caller is
    # the file's <module>) is importing, whatever the file: importing torch._dynamo is not compiling
    at_import = [i + 1 < len(th.frames) and th.frames[i + 1].name == "<module>"
                 and th.frames[i + 1].filename == f.filename for i, f in enumerate(th.frames)]
    # frames run while one of the compiler's modules is imported (inner to its ``<module>`` frame)
    outer = [i for i, f in enumerate(th.frames) if f.name == "<module>" and COMPILER_MODULES.search(f.filename)]
    compiler_import = [bool(outer) and i < outer[-1] for i in range(len(th.frames))]
    for rule in rules:  # sorted by priority, highest first
        for f, key, imp, cimp in zip(th.frames, keys, at_import, compiler_import, strict=True):  # innermost first
            if imp or cimp and rule.kind in COMPILE_KINDS:
                continue
            if any(p.search(key) for p in rule.patterns):
                return Verdict(rule.kind, rule.why, frame_text(f), th.name or str(th.tid), rule.priority)
    return _lazy_import(th)


def _lazy_import(th: ThreadStack) -> Verdict:
    """An import that a library function runs when the job's own code calls it (DDP's constructor
    importing torch._dynamo, a first optimizer step importing its kernels): the job has set up and
    works; its start-up imports run from its script's top level or its own functions instead."""
    frames = [f for f in th.frames if not f.native]
    outer = [i for i, f in enumerate(frames) if IMPORT_FRAMES.search(f.filename)]
    if not outer:
        return UNKNOWN
    below = frames[outer[-1] + 1:]  # its callers, innermost first
    while below and below[0].name.endswith("__getattr__"):
        below = below[1:]  # a lazy module's attribute (``from transformers import X``) is an import statement
    lib = 0
    while lib < len(below) and below[lib].library and below[lib].name != "<module>":
        lib += 1
    if lib == 0 or lib == len(below) or below[lib].name == "<module>":
        return UNKNOWN
    return Verdict("lazy_import", "importing what a library call of its own code needs",
                   frame_text(below[lib - 1]), th.name or str(th.tid), 5)


def classify(samples: list[StackSample], rules: tuple[Rule, ...] | list[Rule] | None = None) -> Verdict:
    """The verdict for one process from its dumps taken at one moment (Python-only and native
    dumps of the same moment complement each other: the highest-priority verdict wins)."""
    best = UNKNOWN
    for s in samples:
        th = main_thread(s)
        if th is None:
            continue
        v = classify_thread(th, rules)
        v = _fed_from_outside(s, th, v, rules)
        if v.priority > best.priority:
            best = v
    return best


QUEUE_READ = re.compile(r"(^|/)queue\.py:(\w+\.)?get$")


def fed_from_outside(v: Verdict) -> bool:
    """The verdict is a queue read taken for a wait for requests (``_fed_from_outside``)."""
    return v.queue_fed


def _fed_from_outside(s: StackSample, main: ThreadStack, v: Verdict, rules: tuple[Rule, ...] | list[Rule] | None) -> Verdict:
    """A main thread reading a queue that a thread of its own fills from outside (a listener in
    accept() or recv(), a ZMQ poller: how servers hand requests to their scheduling loop) waits
    for requests, not on a lock of its own."""
    if v.kind != "lock_wait" or not any(QUEUE_READ.search(frame_key(f)) for f in main.frames):
        return v
    for th in s.threads:
        if th is main or not th.frames:
            continue
        tv = classify_thread(th, rules)
        if tv.kind == "request_wait":
            who = th.name or str(th.tid)
            return Verdict("request_wait", f"waiting for requests: its main thread reads a queue that its thread "
                           f"{who!r} fills ({tv.frame})", v.frame, v.thread, v.priority, queue_fed=True)
    return v


def signature(sample: StackSample) -> tuple[str, ...]:
    """The Python frames of the main thread, for telling a stuck stack from a moving one."""
    th = main_thread(sample)
    if th is None:
        return ()
    return tuple(f"{frame_key(f)}:{f.line}" for f in th.frames if not f.native)


def summarize(sample: StackSample, limit: int = 8) -> list[str]:
    th = main_thread(sample)
    if th is None:
        return []
    return [frame_text(f) for f in th.frames[:limit]]
