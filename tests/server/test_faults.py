"""Faults an operator meets, on a real `hangd serve`: a second instance on the same database, the
database file deleted under it, a store that cannot write (the API must still agree with itself),
a busy port, a replay next to the live store, and the API docs on an air-gapped, token-guarded host."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from ..conftest import ROOT, TRACES, hangd_cmd
from ..realpg import free_port
from ..served import serve

pytestmark = pytest.mark.slow  # starts a real server per fault and waits for it to recover

LIVE = TRACES.parent / "h200x2-live"


def _one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    return out.stderr.strip()


def _serve_once(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*hangd_cmd(), "serve", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def test_second_instance_on_one_sqlite_file_is_refused(tmp_path, served):
    s = serve(tmp_path, "--replay", str(LIVE / "orphan"), "--speed", "10")
    served.append(s)
    out = _serve_once("--listen", f"127.0.0.1:{free_port()}", "--db", s.db, "--replay", str(LIVE / "orphan"))
    assert out.returncode == 3, out.stderr
    line = _one_line(out)
    assert "already in use by another hangd" in line and f"pid {s.proc.pid}" in line, line
    # the first one goes on, alone
    assert s.get("/healthz").status_code == 200
    s.stop()
    # and once it is gone, the database is free again
    s2 = serve(tmp_path, "--replay", str(LIVE / "orphan"), "--speed", "10", db=s.db)
    served.append(s2)


def test_second_instance_on_one_postgres_database_is_refused(tmp_path, served, postgres_url):
    s = serve(tmp_path, "--replay", str(LIVE / "orphan"), "--speed", "10", db=postgres_url)
    served.append(s)
    out = _serve_once("--listen", f"127.0.0.1:{free_port()}", "--db", postgres_url, "--replay", str(LIVE / "orphan"))
    assert out.returncode == 3, out.stderr
    line = _one_line(out)
    assert "already in use by another hangd" in line and f"pid {s.proc.pid}" in line, line
    s.stop()


def test_deleted_database_is_recreated_with_the_open_incidents(tmp_path, served):
    db = tmp_path / "gone.db"
    s = serve(tmp_path, "--replay", str(LIVE / "orphan"), "--speed", "5", db=f"sqlite:///{db}")
    served.append(s)
    inc = s.wait_for(lambda s: s.get("/incidents", params={"status": "open"}).json()["incidents"], 40,
                     "the orphaned_gpu_memory incident")[0]
    s.wait_for(lambda s: s.get("/readyz").json()["detail"].startswith("replay finished"), 40, "replay end")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    s.wait_for(lambda s: "recreated" in s.get("/readyz").json()["detail"], 20, "readiness to say so")
    assert db.exists()  # a new file (the filesystem may give it the old inode number again)
    assert "was removed while hangd ran" in s.log.read_text()
    # the new file holds the open incident, as hangd still knows it
    s.wait_for(lambda s: s.get("/incidents").json()["total"] == 1, 20, "the incident in the new file")
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT id, kind, status FROM incidents").fetchall()
        assert rows == [(inc["id"], "orphaned_gpu_memory", "open")], rows
        assert c.execute("SELECT version_num FROM alembic_version").fetchall(), "the new file is migrated"
    assert s.get(f"/incidents/{inc['id']}").json()["kind"] == "orphaned_gpu_memory"


def test_degraded_store_reads_agree_with_each_other(tmp_path, served):
    db = tmp_path / "locked.db"
    s = serve(tmp_path, "--replay", str(TRACES / "cpu_hang"), "--speed", "4", db=f"sqlite:///{db}")
    served.append(s)
    s.wait_for(lambda s: s.get("/processes").json(), 30, "processes")
    lock = sqlite3.connect(db, timeout=1)
    lock.execute("BEGIN EXCLUSIVE")  # nothing can be written from now on
    try:
        jobs = s.wait_for(lambda s: [j for j in s.get("/jobs").json() if j["open_incidents"]], 40,
                          "the open incident, queued")
        iid = jobs[0]["open_incidents"][0]
        s.wait_for(lambda s: "store degraded" in s.get("/readyz").json()["detail"], 20, "degraded readiness")
        listed = s.get("/incidents").json()
        assert listed["total"] >= 1 and iid in [i["id"] for i in listed["incidents"]], listed
        assert iid in [i["id"] for i in s.get("/incidents", params={"status": "open"}).json()["incidents"]]
        assert s.get(f"/incidents/{iid}").status_code == 200
        r = s.post(f"/incidents/{iid}/ack")
        assert r.status_code == 200 and r.json()["acked"] is True, r.text
        assert s.get(f"/incidents/{iid}").json()["acked"] is True
        assert s.post("/incidents/999999/ack").status_code == 404
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as ro:
            assert ro.execute("SELECT count(*) FROM incidents").fetchone() == (0,), "nothing written yet"
    finally:
        lock.rollback()
        lock.close()
    s.wait_for(lambda s: "degraded" not in s.get("/readyz").json()["detail"], 30, "the store catching up")

    def written(_: object) -> bool:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as ro:
            return ro.execute("SELECT acked FROM incidents WHERE id = ?", (iid,)).fetchone() == (1,)
    s.wait_for(written, 20, "the incident and its acknowledgement written")


def test_busy_port_is_one_line_exit_3(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _serve_once("--listen", f"127.0.0.1:{port}", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert out.returncode == 3, out.stderr
    assert "address already in use" in _one_line(out).lower()
    assert "serving on" not in out.stderr


def test_replay_leaves_the_default_store_untouched(tmp_path, served):
    home = tmp_path / "home"
    live = tmp_path / "live.db"
    env = {"HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "HANGD_DB": f"sqlite:///{live}"}
    default_root = Path("/var/lib/hangd/hangd.db")
    before = default_root.stat().st_mtime_ns if default_root.exists() else None
    port = free_port()
    log = tmp_path / "replay.log"
    proc = subprocess.Popen([*hangd_cmd(), "serve", "--listen", f"127.0.0.1:{port}", "--replay",
                             str(TRACES / "cpu_hang"), "--speed", "20"], cwd=ROOT, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, env=dict(os.environ, **env))
    try:
        url = f"http://127.0.0.1:{port}"
        t_end = time.time() + 60
        while time.time() < t_end:
            try:
                if httpx.get(url + "/incidents", timeout=5).json()["total"] >= 1:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        else:
            raise AssertionError(log.read_text())
        tmp_db = re.search(r"db sqlite:///(\S+?\.db)", log.read_text())
        assert tmp_db and "temporary" in log.read_text(), log.read_text()
    finally:
        proc.terminate()
        proc.wait(20)
    assert not live.exists() and not (home / "data").exists()
    after = default_root.stat().st_mtime_ns if default_root.exists() else None
    assert before == after
    assert not Path(tmp_db.group(1)).exists(), "the temporary database is removed at exit"


def test_docs_need_the_token_and_load_nothing_from_outside(tmp_path, served):
    tok = tmp_path / "token"
    tok.write_text("docs-token\n")
    s = serve(tmp_path, "--replay", str(TRACES / "idle_server"), "--speed", "50", "--token-file", str(tok),
              listen_host="0.0.0.0")
    served.append(s)
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert s.get(path).status_code == 401, path
    auth = {"Authorization": "Bearer docs-token"}
    assert s.get("/openapi.json", headers=auth).json()["info"]["title"] == "hangd"
    for page in ("/docs", "/redoc"):
        html = s.get(page, headers=auth).text
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url:\s*["']([^"']+)["']|spec-url=["']([^"']+)["']""", html)
        urls = [u for group in urls for u in group if u]
        assert urls, html
        assert "http://" not in html and "https://" not in html, html
        for u in urls:
            assert u.startswith("/"), u
            r = s.get(u, headers=auth)
            assert r.status_code == 200 and len(r.content) > 0, (page, u, r.status_code)


def test_a_node_without_py_spy_says_hangs_on_the_host_go_unseen_and_heals_once_it_is_installed(tmp_path):
    """Without py-spy no rank is ever seen blocked in a collective, so a host-side hang is never
    declared (seen on a GPU host where py-spy was installed off PATH). hangd says so from the first
    tick, as a failing source, and finds py-spy once it is installed, without a restart."""
    import sys

    from ..served import Served

    venv_py = Path(sys.executable)
    real_py = Path(os.path.realpath(venv_py))  # the interpreter outside the virtualenv that holds py-spy
    site = [p for p in sys.path if p.endswith("site-packages")]
    later = tmp_path / "later"  # on sys.path; its bin/ gets py-spy while hangd runs
    later.mkdir()
    port = free_port()
    log = tmp_path / "serve.log"
    env = dict(os.environ, PATH="/usr/bin:/bin", PYTHONPATH=os.pathsep.join([str(ROOT), *site, str(later)]))
    proc = subprocess.Popen([str(real_py), "-m", "hangd", "serve", "--listen", f"127.0.0.1:{port}", "--db",
                             f"sqlite:///{tmp_path / 'h.db'}", "--interval", "0.5"], cwd=ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    s = Served(proc, f"http://127.0.0.1:{port}", "", log)
    try:
        detail = s.wait_for(lambda s: (d := s.get("/readyz").json()["detail"]) != "no tick yet" and d, 60, "a tick")
        assert "source stacks unavailable: py-spy not found" in detail and "host-side hangs go unseen" in detail, detail
        assert 'hangd_collector_success{collector="stacks"} 0.0' in s.get("/metrics").text
        (later / "bin").mkdir()  # as `pip install --target later py-spy` leaves it
        (later / "py_spy-0.4.3.dist-info").mkdir()
        (later / "bin" / "py-spy").symlink_to(venv_py.parent / "py-spy")
        s.wait_for(lambda s: "stacks" not in s.get("/readyz").json()["detail"], 40, "py-spy found")
        assert 'hangd_collector_success{collector="stacks"} 1.0' in s.get("/metrics").text
        assert "source stacks reads again" in log.read_text()
    finally:
        s.stop()
