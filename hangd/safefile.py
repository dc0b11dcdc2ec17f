"""Reading a file hangd does not control (a dump a job wrote, a job's log, a settings or token file).

One way, by file descriptor: open with ``O_NONBLOCK`` (a FIFO swapped in for the file does not block
the open) and, unless asked to follow, ``O_NOFOLLOW`` (a symlink planted in a job's dump directory
is not followed); then ``fstat`` the descriptor, not the path, so what is checked is what is read.
"""

from __future__ import annotations

import os
import stat


class NotRegularFile(OSError):
    """A FIFO, device, socket or directory where a regular file was expected."""


class TooLarge(OSError):
    """A file over the size it may have."""

    def __init__(self, size: int, cap: int) -> None:
        super().__init__(f"{size} bytes is over the {cap}-byte cap")
        self.size, self.cap = size, cap


def open_regular(path: str, *, follow: bool = False) -> tuple[int, os.stat_result]:
    """(fd, its fstat) of a regular file opened for reading; the caller closes the fd. Raises
    ``NotRegularFile``, or the open's ``OSError`` (ELOOP: a symlink, when ``follow`` is off)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile("not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_fd(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from ``fd``'s position (fewer at the end of the file)."""
    chunks, total = [], 0
    while total < limit:
        b = os.read(fd, min(1 << 20, limit - total))
        if not b:
            break
        chunks.append(b)
        total += len(b)
    return b"".join(chunks)


def read_regular(path: str, cap: int, *, follow: bool = False) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file of at most ``cap`` bytes, and its fstat. Raises ``TooLarge``
    (by its size, or because it grew while read), ``NotRegularFile``, or the open's ``OSError``."""
    fd, st = open_regular(path, follow=follow)
    try:
        if st.st_size > cap:
            raise TooLarge(st.st_size, cap)
        data = read_fd(fd, cap + 1)  # one byte more than allowed says it grew past the cap
    finally:
        os.close(fd)
    if len(data) > cap:
        raise TooLarge(len(data), cap)
    return data, st


def read_tail(path: str, nbytes: int, *, follow: bool = True) -> tuple[bytes, os.stat_result]:
    """The last ``nbytes`` of a regular file (a log that keeps growing), and its fstat."""
    fd, st = open_regular(path, follow=follow)
    try:
        os.lseek(fd, max(0, st.st_size - nbytes), os.SEEK_SET)
        return read_fd(fd, nbytes), st
    finally:
        os.close(fd)
