"""Output growth: the size of the regular files a watched process writes on fd 1/2 (its log).

A growing log is evidence of progress; a silent one is a hint of a stall. When a file grows, the
newest bytes (up to ``tail_bytes``) come along so incidents can quote the last log lines.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from hangd.safefile import read_tail
from hangd.snapshot import FileSample, Snapshot


@dataclass
class OutputSource:
    name: str = "output"
    tail_bytes: int = 4096
    proc_root: str = "/proc"
    _paths: dict[int, set[str]] = field(default_factory=dict)
    _sizes: dict[str, int] = field(default_factory=dict)
    _own_root: dict[int, bool] = field(default_factory=dict)  # pid -> it sees the filesystem hangd sees

    def _resolve(self, pid: int, path: str) -> str:
        # Read through the process's own root so paths inside containers resolve. Whether its
        # root is hangd's is asked once per process: a path walk through /proc/<pid>/root for
        # every log every tick cost more than the stat of the log itself.
        own = self._own_root.get(pid)
        if own is None:
            try:
                theirs, ours = os.stat(os.path.join(self.proc_root, str(pid), "root")), os.stat("/")
                own = (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)
            except OSError:  # not ours to look into (or a recorded tree): look for the path inside each time
                own = False
            self._own_root[pid] = own
        if own:
            return path
        inside = os.path.join(self.proc_root, str(pid), "root") + path
        return inside if os.path.exists(inside) else path

    def collect(self, snap: Snapshot) -> None:
        for info in snap.infos:
            for target in info.log_files():
                self._paths.setdefault(info.pid, set()).add(target)
        gone = [p.pid for p in snap.procs if p.gone]
        for pid in gone:
            self._paths.pop(pid, None)
            self._own_root.pop(pid, None)
        if gone:  # a log nobody watched writes any more: its last size goes with its writers
            still = set().union(*self._paths.values())
            for path in [p for p in self._sizes if p not in still]:
                del self._sizes[path]
        live = {p.pid for p in snap.procs if not p.gone}
        seen: set[str] = set()
        for pid, paths in self._paths.items():
            if pid not in live:
                continue
            for path in paths:
                if path in seen:
                    continue
                seen.add(path)
                real = self._resolve(pid, path)
                try:
                    st = os.stat(real)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                size = st.st_size
                tail = None
                if size != self._sizes.get(path):
                    try:
                        # by descriptor: a FIFO swapped in after the stat above must not block the tick
                        tail = read_tail(real, self.tail_bytes)[0].decode("utf-8", "replace")
                    except OSError:
                        tail = None
                self._sizes[path] = size
                snap.files.append(FileSample(path=path, size=size, tail=tail))
