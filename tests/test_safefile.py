"""The one way hangd opens a file it does not control: by descriptor, never blocking on a FIFO,
never following a planted symlink unless asked, never reading past a cap."""

from __future__ import annotations

import errno
import os

import pytest

from hangd.safefile import NotRegularFile, TooLarge, open_regular, read_regular, read_tail


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fr_rank_0"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    with pytest.raises(NotRegularFile):
        read_regular(str(fifo), 1024)
    with pytest.raises(NotRegularFile):
        read_tail(str(fifo), 1024)


def test_a_symlink_is_followed_only_when_asked(tmp_path):
    (tmp_path / "real").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError) as e:
        read_regular(str(tmp_path / "link"), 1024)
    assert e.value.errno == errno.ELOOP
    assert read_regular(str(tmp_path / "link"), 1024, follow=True)[0] == b"data"


def test_a_file_over_the_cap_is_refused_and_one_at_the_cap_is_read(tmp_path):
    p = tmp_path / "dump"
    p.write_bytes(b"x" * 100)
    with pytest.raises(TooLarge, match="100 bytes is over the 99-byte cap"):
        read_regular(str(p), 99)
    data, st = read_regular(str(p), 100)
    assert data == b"x" * 100 and st.st_size == 100


def test_the_tail_of_a_log_and_a_directory_refused(tmp_path):
    p = tmp_path / "log"
    p.write_bytes(b"first line\nlast line\n")
    assert read_tail(str(p), 10)[0] == b"last line\n"
    assert read_tail(str(p), 1 << 20)[0] == b"first line\nlast line\n"
    with pytest.raises(NotRegularFile):
        open_regular(str(tmp_path))
