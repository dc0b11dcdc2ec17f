"""py-spy against a real Python child, and the parsers on recorded dumps."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from hangd.analysis import stackcat
from hangd.sources.base import Unavailable
from hangd.sources.stacks import StackSource, parse_pyspy_json, parse_pyspy_text

from ..conftest import TRACES

CHILD = """
import threading, time
def wait_here():
    threading.Event().wait()
wait_here()
"""


def test_pyspy_dumps_a_real_child_without_stopping_it():
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    try:
        time.sleep(1.0)
        src = StackSource()
        s = src.dump(child.pid)
        assert s.error is None, s.error
        assert s.seconds is not None and s.seconds < 5
        main = stackcat.main_thread(s)
        assert main is not None
        names = [f.name for f in main.frames]
        assert "wait_here" in names
        assert stackcat.classify([s]).kind == "lock_wait"
        assert child.poll() is None, "the child must keep running"
    finally:
        child.kill()
        child.wait()


def test_pyspy_missing_is_unavailable_with_hint(monkeypatch):
    # where none can be found (a live hangd without it: tests/server/test_faults.py)
    import hangd.sources.stacks as stacks

    monkeypatch.setattr(stacks, "find_pyspy", lambda: None)
    src = StackSource(pyspy="/nonexistent/py-spy")
    src.pyspy = None
    with pytest.raises(Unavailable) as e:
        src.check()
    assert "HINT" in str(e.value) and "host-side hangs go unseen" in str(e.value)


def test_pyspy_on_a_vanished_pid_reports_error():
    s = StackSource().dump(2**22 - 3)
    assert s.error and not s.threads


def test_parsers_on_recorded_dumps():
    js = parse_pyspy_json((TRACES / "cpu_hang/files/stack_1666_50_json.json").read_text())
    assert js[0].name == "MainThread" and js[0].frames[0].name == "broadcast"
    assert js[0].frames[0].filename == "torch/distributed/distributed_c10d.py"
    tx = parse_pyspy_text((TRACES / "nccl_stall/files/stack_1412_50_native.txt").read_text())
    assert tx[0].tid == 1412 and tx[0].active is False
    assert [f.name for f in tx[0].frames if not f.native] == ["forever", "<module>"]
    assert tx[0].frames[0].native and tx[0].frames[0].name == "clock_nanosleep"


def test_a_frame_is_a_librarys_by_its_full_path_which_the_short_name_hides():
    raw = json.dumps([{"thread_id": 1, "os_thread_id": 7, "thread_name": "MainThread", "frames": [
        {"name": "_find_and_load", "filename": "<frozen importlib._bootstrap>", "line": 1360},
        {"name": "__getattr__", "filename": "/opt/venv/lib/python3.12/site-packages/torch/__init__.py",
         "short_filename": "torch/__init__.py", "line": 2879},
        {"name": "import_module", "filename": "/usr/lib/python3.11/importlib/__init__.py",
         "short_filename": "importlib/__init__.py", "line": 90},
        {"name": "Dist.__init__", "filename": "/usr/lib/python3/dist-packages/dist/x.py", "short_filename": "dist/x.py"},
        {"name": "train", "filename": "/home/u/job/train.py", "short_filename": "train.py", "line": 228},
        {"name": "main", "filename": "/opt/venv/src/mylib/main.py", "short_filename": "mylib/main.py", "line": 3}]}])
    frames = parse_pyspy_json(raw)[0].frames
    assert [f.library for f in frames] == [True, True, True, True, False, False]
    assert frames[1].filename == "torch/__init__.py"


@pytest.mark.parametrize("frames,kind", [
    ([("socket.py", "socket.accept")], "request_wait"),
    ([("torch/distributed/distributed_c10d.py", "all_reduce")], "collective"),
    ([("safetensors/torch.py", "load_file")], "loading"),
    ([("torch/_inductor/compile_fx.py", "compile_fx")], "compiling"),
    ([("torch/cuda/graphs.py", "capture_begin")], "graph_capture"),
    ([("sglang/srt/model_executor/cuda_graph_runner.py", "capture")], "graph_capture"),
    ([("sglang/srt/managers/scheduler.py", "event_loop_normal")], "request_wait"),
    ([("vllm/v1/engine/core.py", "run_busy_loop")], "request_wait"),
    ([("megatron/core/tensor_parallel/mappings.py", "_reduce")], "collective"),
    ([("threading.py", "Event.wait"), ("torch/distributed/distributed_c10d.py", "barrier")], "collective"),
    ([("workload.py", "forever")], "unknown"),
    # DDP's constructor imports torch._dynamo: a class body of it running at import is not compiling
    ([("torch/_dynamo/variables/constant.py", "ConstantVariable"), ("torch/_dynamo/variables/constant.py", "<module>"),
      ("<frozen importlib._bootstrap>", "_call_with_frames_removed"),
      ("torch/nn/parallel/distributed.py", "DistributedDataParallel.__init__")], "unknown"),
    # the same file's function called by code, not by its import, still is
    ([("torch/_dynamo/variables/constant.py", "ConstantVariable.create"), ("torch/_dynamo/symbolic_convert.py", "step")],
     "compiling"),
])
def test_catalog(frames, kind):
    from hangd.snapshot import Frame, ThreadStack

    th = ThreadStack(tid=1, name="MainThread", active=False, owns_gil=False,
                     frames=[Frame(name=n, filename=f, line=1) for f, n in frames])
    assert stackcat.classify_thread(th).kind == kind


def test_catalog_is_data():
    rules = stackcat.load_catalog('[[rule]]\nkind = "custom"\npriority = 99\npatterns = ["my_wait"]\n')
    from hangd.snapshot import Frame, ThreadStack

    th = ThreadStack(tid=1, name="MainThread", active=False, owns_gil=False, frames=[Frame("my_wait", "x.py", 1)])
    assert stackcat.classify_thread(th, rules).kind == "custom"


def test_py_spy_is_taken_from_a_sys_path_folder_only_where_pip_installed_it(tmp_path, monkeypatch):
    """`pip install --target DIR` leaves DIR/bin/py-spy and DIR/py_spy-*.dist-info. A bin/py-spy in
    any other folder on sys.path (the working directory under `python -m`) is never run as root."""
    import shutil
    from pathlib import Path

    import hangd.sources.stacks as stacks

    real = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    planted, target = tmp_path / "cwd", tmp_path / "site"
    for d in (planted, target):
        (d / "bin").mkdir(parents=True)
        (d / "bin" / "py-spy").symlink_to(real)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "path", [str(planted), "", str(target)])
    assert stacks.find_pyspy() is None
    (target / "py_spy-0.4.3.dist-info").mkdir()
    assert stacks.find_pyspy() == str(target / "bin" / "py-spy")


def test_captures_refused_by_ptrace_keep_the_stacks_source_failing_until_one_works():
    from hangd.snapshot import Snapshot
    from hangd.sources.stacks import PTRACE_HINT

    src = StackSource()
    src.collect(Snapshot(t=0.0))  # py-spy is there: nothing to say
    src.last_error = f"Permission denied (os error 13); {PTRACE_HINT}"
    with pytest.raises(Unavailable) as e:
        src.collect(Snapshot(t=1.0))
    assert "the last stack capture failed" in str(e.value) and "CAP_SYS_PTRACE" in str(e.value)
    src.last_error = None
    src.collect(Snapshot(t=2.0))
