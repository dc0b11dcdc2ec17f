"""Where a `hangd serve`'s memory is, once a minute: for the soak, not for production.

    PYTHONPATH=benchmarks/memprobe:. HANGD_PROBE_OUT=probe.jsonl \\
        unshare --pid --fork --mount-proc python -m benchmarks.soak --minutes 14 --every 1

Python imports ``sitecustomize`` at start-up; this one does nothing unless HANGD_PROBE_OUT is set
and the process is ``hangd serve``. Then a thread appends one JSON line a minute: RSS split into
the brk heap and other anonymous mappings (pymalloc's arenas, other threads' malloc arenas),
glibc's mallinfo2 (bytes in use and free but kept), SQLite's own memory (page caches and prepared
statements, from sqlite3_status64), the open SQLite connections, and the objects the garbage
collector tracks with the types whose count changed most. HANGD_PROBE_TRACEMALLOC_AT=SECONDS also
starts tracemalloc then (1 frame; it costs CPU and memory of its own, reported as tm_self) and
writes the allocation sites that grew most since then to ``<out>.tm.txt`` every 3 minutes.
"""

from __future__ import annotations

import os


def _is_serve() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return b"hangd\0serve" in f.read()
    except OSError:
        return False


def _start() -> None:
    import collections
    import ctypes
    import gc
    import json
    import threading
    import time
    import tracemalloc

    out = os.environ["HANGD_PROBE_OUT"]
    tm_at = float(os.environ.get("HANGD_PROBE_TRACEMALLOC_AT", "inf"))
    libc = ctypes.CDLL("libc.so.6")

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc.mallinfo2.restype = MallInfo2
    try:
        sqlite = ctypes.CDLL("libsqlite3.so.0")  # the library the sqlite3 module links
    except OSError:
        sqlite = None

    def sqlite_memory() -> int | None:
        if sqlite is None:
            return None
        cur, high = ctypes.c_int64(), ctypes.c_int64()
        sqlite.sqlite3_status64(0, ctypes.byref(cur), ctypes.byref(high), 0)  # SQLITE_STATUS_MEMORY_USED
        return cur.value

    def rss_kib() -> dict[str, int]:
        d: dict[str, int] = {}
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                    d[k] = int(v.split()[0])
        heap = other = 0
        name = ""
        with open("/proc/self/smaps") as f:
            for line in f:
                parts = line.split()
                if parts and "-" in parts[0] and not line[0].isupper():
                    name = parts[5] if len(parts) > 5 else ""
                elif parts and parts[0] == "Rss:":
                    if name == "[heap]":
                        heap += int(parts[1])
                    elif name == "":
                        other += int(parts[1])
        d.update(heap_kib=heap, other_anon_kib=other)
        return d

    def run() -> None:
        t0 = time.time()
        first = None
        prev: collections.Counter[str] = collections.Counter()
        n = 0
        while True:
            time.sleep(60)
            n += 1
            el = time.time() - t0
            if not tracemalloc.is_tracing() and el >= tm_at:
                tracemalloc.start(1)
                first = tracemalloc.take_snapshot()
            mi = libc.mallinfo2()
            objs = gc.get_objects()
            types = collections.Counter(type(o).__name__ for o in objs)
            conns = sum(1 for o in objs if type(o).__module__ == "sqlite3" and type(o).__name__ == "Connection")
            del objs
            diff = {k: v - prev.get(k, 0) for k, v in types.items() if v != prev.get(k, 0)} if prev else {}
            prev = types
            rec = {"t": round(el), **rss_kib(), "malloc_system": mi.arena + mi.hblkhd, "malloc_in_use": mi.uordblks + mi.hblkhd,
                   "malloc_free_kept": mi.fordblks, "sqlite_memory": sqlite_memory(), "sqlite_connections": conns,
                   "gc_objects": sum(types.values()),
                   "type_changes": dict(sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:10])}
            if tracemalloc.is_tracing() and first is not None:
                rec.update(tm_traced=tracemalloc.get_traced_memory()[0], tm_self=tracemalloc.get_tracemalloc_memory())
                if n % 3 == 0:
                    with open(out + ".tm.txt", "a") as f:
                        f.write(f"==== t={round(el)}\n")
                        for st in tracemalloc.take_snapshot().compare_to(first, "lineno")[:15]:
                            f.write(f"{st}\n")
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")

    threading.Thread(target=run, name="hangd-memprobe", daemon=True).start()


if os.environ.get("HANGD_PROBE_OUT") and _is_serve():
    _start()
