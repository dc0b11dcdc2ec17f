"""The command-line contract: exit statuses, stdout vs stderr, one-line errors, help texts, and
what a person sees on a node whose GPUs cannot be seen.

A blind node is made real, not mocked: a file that is not a library named ``libnvidia-ml.so.1``
first on ``LD_LIBRARY_PATH`` makes NVML fail to load exactly as on a host without a driver (or
with a broken one), on this machine and on a GPU host alike."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hangd.cli import build_parser
from hangd.humanize import ago, command_line, iso_local

from .conftest import ROOT, TRACES, hangd_cmd
from .realpg import free_port
from .served import serve

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"
NCCL_DUMPS = TRACES / "nccl_stall" / "files"


@pytest.fixture
def blind_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a node where NVML cannot load, and where no distributed job of another
    test on this machine can be mistaken for one (a job is what has this run's own variable)."""
    lib = tmp_path / "fake-driver"
    lib.mkdir()
    (lib / "libnvidia-ml.so.1").write_text("not a shared library\n")
    # status asks the node's daemon (the listen setting) for its open incidents: a port nothing
    # listens on, so a hangd serve on this machine cannot change what these tests see
    return dict(os.environ, LD_LIBRARY_PATH=str(lib), HANGD_JOB_ENV=f"HANGD_TEST_JOB_{uuid.uuid4().hex[:8]}",
                HANGD_CONFIG=os.devnull, HANGD_LISTEN=f"127.0.0.1:{free_port()}")


def hangd(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*hangd_cmd(), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hangd: ") and "Traceback" not in out.stderr, out.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------- blind


def test_status_on_a_blind_node_says_so_on_stderr_and_stdout_and_exits_3(blind_env):
    out = hangd("status", "--seconds", "1", env=blind_env)
    assert out.returncode == 3, out.stderr
    err = out.stderr.splitlines()
    assert err[0].startswith("hangd: GPUs cannot be seen: NVML cannot start: libnvidia-ml.so.1"), out.stderr
    assert "HINT:" in err[0]
    assert "nothing to watch" in out.stderr and "Traceback" not in out.stderr
    assert "GPUs cannot be seen" in out.stdout and "HINT:" in out.stdout
    assert re.match(rf"hangd status at {ISO}$", out.stdout.splitlines()[0]), out.stdout
    doc = json.loads(hangd("status", "--seconds", "1", "--json", env=blind_env).stdout)
    assert doc["gpus"] == [] and doc["gpus_unseen"].startswith("GPUs cannot be seen") and doc["t_iso"]


def test_nvml_turned_off_is_named_as_the_reason(blind_env):
    out = hangd("status", "--seconds", "1", env={**blind_env, "HANGD_NVML": "0"})
    assert out.returncode == 3
    assert "GPUs cannot be seen: turned off by the setting nvml = false (HANGD_NVML=0)" in out.stderr


def test_blind_node_with_a_job_still_reports_it_and_shows_its_command(blind_env, tmp_path):
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.2)\n")
    job = subprocess.Popen([sys.executable, "-u", str(script), "--lr", "1"], stdout=subprocess.DEVNULL,
                           env={**blind_env, blind_env["HANGD_JOB_ENV"]: "1", "RANK": "0", "WORLD_SIZE": "1"})
    try:
        time.sleep(0.5)
        out = hangd("status", "--seconds", "2", env=blind_env)
        doc = json.loads(hangd("status", "--seconds", "1", "--json", env=blind_env).stdout)
    finally:
        job.kill()
        job.wait()
    assert out.returncode == 4, out.stdout + out.stderr  # a job, nothing found, and no hangd serve asked
    assert out.stderr.startswith("hangd: GPUs cannot be seen"), "still loud about the GPUs"
    proc = next(p for p in doc["processes"] if p["pid"] == job.pid)
    assert proc["command"] == "proj/train.py --lr 1"  # not the interpreter's path cut short
    assert proc["gpu_mem_bytes"] is None  # unknown while the GPUs cannot be seen, not 0 B
    assert isinstance(proc["since"], float) and proc["since_iso"].startswith(iso_local(proc["since"])[:19])
    row = next(line for line in out.stdout.splitlines() if f" {job.pid} " in line)
    assert "proj/train.py --lr 1" in row and sys.executable not in row
    # the state was there when status first looked: how long it has held is at least the 2 s watched,
    # not "2s" next to a reason that says the process started earlier
    assert proc["for_at_least"] is True
    assert re.search(r" ≥\d+s ", row), row
    assert f" {proc['job']} " in row, "the job key is shown whole, as /jobs knows it"


@pytest.mark.slow  # a real serve, watch or replay of a whole trace
def test_status_shows_the_open_incidents_of_the_nodes_daemon_and_exits_1(blind_env, tmp_path):
    """A look of 2 s cannot see a hang (that takes 10 s without progress); hangd serve on the node has
    watched all along, so status shows its open incidents, and exits 1, as at 3 a.m. it must."""
    s = serve(tmp_path, "--replay", str(TRACES.parent / "h200x2-live" / "mismatch"), "--speed", "0",
              env={"HANGD_TOKEN": "status-token"})
    try:
        s.wait_for(lambda s: s.get("/incidents", params={"status": "open"},
                                   headers={"Authorization": "Bearer status-token"}).json()["total"] >= 1, 60, "an open incident")
        env = {**blind_env, "HANGD_LISTEN": s.url.removeprefix("http://"), "HANGD_TOKEN": "status-token"}
        out = hangd("status", "--seconds", "1", env=env)
        doc = json.loads(hangd("status", "--seconds", "1", "--json", env=env).stdout)
        no_token = hangd("status", "--seconds", "1", env={**env, "HANGD_TOKEN": ""})
    finally:
        s.stop()
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("INCIDENT #1 collective_mismatch (critical, open)"))
    assert f"(from hangd serve at {s.url}/incidents/1)" in lines[i + 1]
    assert lines[i + 2].startswith("    next step: ")
    assert doc["daemon"]["answered"] is True
    assert [(x["id"], x["kind"], x["source"]) for x in doc["incidents"]] == [(1, "collective_mismatch", "hangd serve")]
    # a daemon that refuses status is said, with what to do; status then knows of no incident
    assert no_token.returncode == 3
    assert "answered HTTP 401 (its open incidents are not shown) HINT: set HANGD_TOKEN" in no_token.stderr


def test_status_with_a_job_and_no_daemon_answering_says_so_on_stderr_and_exits_4(blind_env, tmp_path):
    """A look of 2 s finds no hang by itself; only hangd serve, which has watched all along, knows
    the open incidents. When it does not answer, "no incident" must not read as all clear."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={
        **blind_env, blind_env["HANGD_JOB_ENV"]: "1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    try:
        time.sleep(0.5)
        out = hangd("status", "--seconds", "1", env=blind_env)
        doc = json.loads((js := hangd("status", "--seconds", "1", "--json", env=blind_env)).stdout)
        s = serve(tmp_path, env=blind_env)  # now a daemon answers, at the address status asks
        try:
            answered = hangd("status", "--seconds", "1", env={**blind_env, "HANGD_LISTEN": s.url.removeprefix("http://")})
        finally:
            s.stop()
    finally:
        job.kill()
        job.wait()
    url = f"http://{blind_env['HANGD_LISTEN']}"
    assert out.returncode == 4 and js.returncode == 4, out.stdout + out.stderr
    assert any(p["pid"] == job.pid for p in doc["processes"]), "the job is seen"
    line = next(x for x in out.stderr.splitlines() if "hangd serve" in x)
    assert line == (f"hangd: hangd serve at {url} did not answer: connection refused (its open incidents are not "
                    "shown) HINT: start it (systemctl start hangd, or hangd serve), or set listen (HANGD_LISTEN) to "
                    "where it listens"), out.stderr
    assert sum("hangd serve" in x for x in out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert doc["daemon"] == {"url": url, "answered": False, "error": doc["daemon"]["error"]}
    assert doc["daemon"]["error"].startswith(f"hangd serve at {url} did not answer: connection refused")
    # with the daemon answering, the same look is all clear (1 only if that daemon, watching the whole
    # machine, had opened an incident on another job running here)
    assert answered.returncode in (0, 1), answered.stdout + answered.stderr
    assert "hangd serve" not in answered.stderr, answered.stderr


def test_watch_on_a_blind_node_says_so_once_then_exits_3(blind_env):
    out = hangd("watch", "--seconds", "2.5", "--interval", "0.5", env=blind_env)
    assert out.returncode == 3, out.stderr
    assert out.stderr.count("GPUs cannot be seen") == 1, out.stderr  # once, not every tick
    first = out.stdout.splitlines()[0]
    assert re.match(rf"{ISO} GPUs cannot be seen: .*HINT:", first), out.stdout
    js = hangd("watch", "--seconds", "1.5", "--interval", "0.5", "--json", env=blind_env)
    docs = [json.loads(line) for line in js.stdout.splitlines()]
    assert docs[0]["type"] == "gpus_unseen" and "HINT:" in docs[0]["why"] and docs[0]["t_iso"]
    assert sum(d["type"] == "gpus_unseen" for d in docs) == 1


@pytest.mark.slow  # a real serve, watch or replay of a whole trace
def test_serve_on_a_blind_node_warns_once_and_readyz_says_degraded(blind_env, tmp_path):
    s = serve(tmp_path, "--interval", "0.2", env=blind_env)
    try:
        r = s.wait_for(lambda s: (x := s.get("/readyz")).json()["status"] != "not ready" and x, 30, "ready")
        assert r.status_code == 200  # still serving: what /proc shows is worth having
        ready = r.json()
        assert ready["status"] == "degraded" and "GPUs cannot be seen" in ready["detail"] and "HINT:" in ready["detail"]
        g = s.get("/gpus")
        assert g.status_code == 200 and g.json() == []
        assert g.headers["Hangd-Gpus-Unseen"].startswith("GPUs cannot be seen: NVML cannot start")
        time.sleep(1.5)  # several more ticks: the warning must not repeat
    finally:
        s.stop()
    log = s.log.read_text()
    warnings = [line for line in log.splitlines() if "WARNING" in line and "source nvml unavailable" in line]
    assert len(warnings) == 1, log[-3000:]
    assert "HINT:" in warnings[0]


@pytest.mark.slow  # a real serve, watch or replay of a whole trace
def test_another_failing_source_is_said_on_stderr_in_watch_and_in_readyz(blind_env, tmp_path):
    """Not only the GPUs: a node whose /proc hangd cannot list says so everywhere, with its HINT."""
    env = {**blind_env, "HANGD_PROC_ROOT": str(tmp_path / "no-proc")}
    st = hangd("status", "--seconds", "1", env=env)
    assert st.returncode == 3
    assert "hangd: source proc unavailable: cannot list" in st.stderr and "HINT: is /proc mounted?" in st.stderr
    w = hangd("watch", "--seconds", "2", "--interval", "0.5", "--json", env=env)
    assert w.stderr.count("source proc unavailable") == 1, w.stderr  # once, not every tick
    docs = [json.loads(line) for line in w.stdout.splitlines()]
    assert [d["source"] for d in docs if d["type"] == "source_unavailable"] == ["proc"]
    s = serve(tmp_path, "--interval", "0.2", env=env)
    try:
        ready = s.wait_for(lambda s: (x := s.get("/readyz").json())["status"] != "not ready" and x, 30, "ready")
        time.sleep(1)
    finally:
        s.stop()
    assert ready["status"] == "degraded" and "source proc unavailable: cannot list" in ready["detail"], ready
    assert s.log.read_text().count("source proc unavailable") == 1


# ----------------------------------------------------------------------------- exit statuses


@pytest.mark.slow  # a real serve, watch or replay of a whole trace
def test_replay_exit_status_is_1_when_the_trace_holds_an_incident_0_when_not():
    hung = hangd("replay", str(TRACES / "nccl_stall"))
    assert hung.returncode == 1 and hung.stderr == ""
    fine = hangd("replay", str(TRACES / "idle_server"))
    assert fine.returncode == 0, fine.stdout[-2000:]
    assert "No incident and no finding in this trace." in fine.stdout


@pytest.mark.slow  # a real serve, watch or replay of a whole trace
def test_replay_text_shows_local_times_and_the_next_step_under_each_incident():
    out = hangd("replay", str(TRACES / "nccl_stall")).stdout
    lines = out.splitlines()
    assert all(re.match(rf"{ISO} +[+-]\d+\.\ds  ", line) for line in lines[1:] if not line.startswith(" ")), out
    i = next(n for n, line in enumerate(lines) if "INCIDENT #1 nccl_stall" in line and "opened" in line)
    assert lines[i + 1].strip().startswith("Flight recorder: rank 1 never entered all_reduce #399")
    assert lines[i + 2].strip().startswith("next step: Look at what the culprit rank is doing")
    doc = json.loads(hangd("replay", str(TRACES / "nccl_stall"), "--json").stdout)
    inc = doc["incidents"][0]
    assert inc["opened_at_iso"].startswith(iso_local(inc["opened_at"])[:19])
    assert inc["hang_started_at_iso"].startswith(iso_local(inc["hang_started_at"])[:19])
    assert isinstance(inc["opened_at"], float)


def test_replay_text_says_every_finding_in_words():
    """An NCCL RAS answer is numbers in the JSON; the readable replay says them (it printed
    "FINDING nccl_ras: " and nothing else)."""
    out = hangd("replay", str(TRACES.parent / "h200x2-hf" / "worker_died"))
    assert out.returncode == 1, out.stderr
    findings = [line for line in out.stdout.splitlines() if " FINDING " in line]
    assert findings and all(not line.rstrip().endswith(":") for line in findings), findings
    assert any(line.endswith("FINDING nccl_ras: NCCL RAS: rank 0 (pid 926) launched up to AllReduce #8225; "
                             "rank 1 (pid 927) launched up to AllReduce #8224; behind: rank 1") for line in findings), findings


@pytest.mark.slow  # a real serve, watch or replay of a whole trace
def test_fr_analyze_exit_statuses(tmp_path):
    found = hangd("fr", "analyze", str(NCCL_DUMPS))
    assert found.returncode == 1 and "MISSING_RANK" in found.stdout
    missing = hangd("fr", "analyze", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such file or directory" in one_line_error(missing)
    empty = hangd("fr", "analyze", str(tmp_path))
    assert empty.returncode == 2 and "no flight-recorder dump found" in one_line_error(empty)
    # files that are there but cannot be read: the report on stdout, and one line on stderr that it failed
    (tmp_path / "fr_rank_0").write_bytes(b"garbage")
    unread = hangd("fr", "analyze", str(tmp_path / "fr_rank_0"), "/dev/null")
    assert unread.returncode == 2 and "UNREADABLE" in unread.stdout
    assert "no flight-recorder dump could be read" in one_line_error(unread) and "2 file(s)" in unread.stderr


@pytest.mark.parametrize("args", [["status", "--bogus"], ["nosuchcommand"], ["status", "--seconds", "0"],
                                  ["replay", "/nonexistent/trace"], ["replay", str(TRACES / "nccl_stall"), "--speed", "-1"],
                                  ["watch", "--interval", "-1"], ["record", "--out", "/tmp/x", "--hz", "0"],
                                  ["serve", "--listen", "nonsense"], ["fr"]])
def test_usage_and_input_errors_are_one_line_on_stderr_exit_2(args):
    out = hangd(*args)
    assert out.returncode == 2, (args, out.returncode, out.stderr)
    one_line_error(out)
    assert out.stdout == ""


def test_serve_on_a_busy_port_is_one_line_exit_3(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = hangd("serve", "--listen", f"127.0.0.1:{port}", "--db", f"sqlite:///{tmp_path / 'h.db'}", timeout=60)
    assert out.returncode == 3
    line = one_line_error(out)
    assert "address already in use" in line and "HINT:" in line


@pytest.mark.slow  # a real serve, watch or replay of a whole trace
def test_record_and_db_speak_json(tmp_path, blind_env):
    rec = hangd("record", "--out", str(tmp_path / "t"), "--seconds", "1", "--hz", "4", "--json", env=blind_env)
    assert rec.returncode == 0, rec.stderr
    doc = json.loads(rec.stdout)
    assert doc["snapshots"] >= 3 and doc["out"] == str(tmp_path / "t") and doc["gpus_unseen"]
    assert "GPUs cannot be seen" in rec.stderr  # a trace without GPU readings is said to be one
    db = hangd("db", "upgrade", "--db", f"sqlite:///{tmp_path / 'h.db'}", "--json")
    assert db.returncode == 0, db.stderr
    assert json.loads(db.stdout) == {"action": "upgrade", "db": f"sqlite:///{tmp_path / 'h.db'}", "revision": "head"}


def test_db_downgrade_without_a_revision_is_a_usage_error_and_drops_nothing(tmp_path):
    """``hangd db downgrade`` typed to see what it does would drop every table (base) if base were the default."""
    import sqlite3

    url = f"sqlite:///{tmp_path / 'h.db'}"
    assert hangd("db", "upgrade", "--db", url).returncode == 0
    out = hangd("db", "downgrade", "--db", url)
    assert out.returncode == 2 and "revision" in one_line_error(out) and out.stdout == ""
    with sqlite3.connect(tmp_path / "h.db") as c:
        assert "incidents" in {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    back = hangd("db", "downgrade", "-1", "--db", url, "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["revision"] == "-1"


# ------------------------------------------------------------------------------------- help


def _subparsers(p):
    for a in p._actions:
        if a.__class__.__name__ == "_SubParsersAction":
            for name, sp in a.choices.items():
                yield name, sp
                yield from ((f"{name} {n}", s) for n, s in _subparsers(sp))


def test_every_command_has_examples_and_exit_codes_and_every_option_a_help_with_an_example():
    parser = build_parser()
    subs = dict(_subparsers(parser))
    assert {"status", "watch", "record", "replay", "fr analyze", "serve", "db upgrade", "db downgrade"} <= set(subs)
    for name, sp in [("hangd", parser), *subs.items()]:
        text = sp.format_help()
        assert "examples:" in text and "exit status:" in text, name
        assert "3  cannot run here" in text and "1  an incident or a finding is open" in text, name
        for a in sp._actions:
            if a.option_strings and a.dest not in ("help", "version"):
                assert a.help, f"{name} {a.option_strings}: no help"
                assert "e.g." in a.help, f"{name} {a.option_strings}: no example in {a.help!r}"
    out = hangd("status", "--help")
    assert out.returncode == 0 and "hangd status --json" in out.stdout


# ------------------------------------------------------------------------------ words, times


@pytest.mark.parametrize("cmdline,shown", [
    (["/root/.pyenv/versions/3.11.7/bin/python", "-m", "sglang.launch_server", "--tp", "2"],
     "-m sglang.launch_server --tp 2"),
    (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node", "2", "train.py", "--lr", "1"],
     "torchrun --nproc-per-node 2 train.py --lr 1"),
    (["/opt/venv/bin/python3.11", "-u", "-X", "dev", "/home/u/proj/examples/train.py", "--lr", "1"],
     "examples/train.py --lr 1"),
    (["torchrun", "train.py"], "torchrun train.py"),
    (["/usr/bin/python3"], "python3"),
    ([], ""),
])
def test_command_shows_the_script_or_module_not_the_interpreter(cmdline, shown):
    assert command_line(cmdline) == shown


def test_ago_reads_well():
    assert [ago(100 - d, 100) for d in (0, 41, 150, 7300)] == ["0 s ago", "41 s ago", "2 min ago", "2 h 1 min ago"]
    assert ago(None, 1) == "-"


def test_a_job_s_flight_recorder_table_says_retired_for_gloo_and_none_without_dumps():
    from hangd.status import render_job_fr

    gloo = {"node": "node-b", "pg": "0", "read_at": 95.0, "seq": 7, "op": "gloo:all_reduce", "sizes": [[4]],
            "dtypes": ["Float"], "state": "scheduled", "completed": True, "completed_seq": 7, "behind": 0, "p2p": None}
    stuck = {**gloo, "seq": 8, "completed": False, "completed_seq": 7}
    (head, done), (_, waiting) = render_job_fr({"1": [gloo]}, [], 100.0), render_job_fr({"1": [stuck]}, [], 100.0)
    assert head.split() == ["RANK", "NODE", "PG", "LAST-SEQ", "OP", "STATE", "READ", "SIZES"]
    assert done.split()[:6] == ["1", "node-b", "0", "7", "gloo:all_reduce", "retired"] and "5 s ago" in done
    assert waiting.split()[3:6] == ["8", "gloo:all_reduce", "scheduled"] and waiting.endswith("completed #7")
    assert render_job_fr({}, [], 100.0) == ["no flight-recorder dumps written for this job"]


# ------------------------------------------------------------------------------------- README


def _readme_block(after: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    i = text.index(after)
    start = text.index("```\n", i) + 4
    return text[start: text.index("```", start)].splitlines()


@pytest.mark.parametrize("intro,args", [
    ("`hangd replay tests/data/traces/h200x2/nccl_stall` (", ["replay", str(TRACES / "nccl_stall")]),
    ("`hangd fr analyze tests/data/traces/h200x2/nccl_stall/files` (", ["fr", "analyze", str(NCCL_DUMPS)]),
])
def test_readme_excerpts_are_what_the_commands_print(intro, args):
    """The README shows real output: every line of its excerpt (up to a "[...]") is printed so."""
    out = hangd(*args, env=dict(os.environ, TZ="UTC")).stdout.replace(str(ROOT) + "/", "")
    for line in _readme_block(intro):
        assert line.split("[...]")[0].rstrip() in out, line


def test_the_operator_guide_incident_is_what_replay_prints():
    """The guide's "Reading an incident" shows real output: every piece between its "[...]" is printed so."""
    text = (ROOT / "docs" / "operator-guide.md").read_text()
    i = text.index("## Reading an incident")
    start = text.index("```\n2026", i) + 4
    out = hangd("replay", str(TRACES / "nccl_stall"), env=dict(os.environ, TZ="UTC")).stdout
    for line in text[start: text.index("```", start)].splitlines():
        for piece in line.split("[...]"):
            assert piece.strip() in out, piece


def test_readme_shows_output_of_every_command():
    """A newcomer sees, for each command ``hangd --help`` lists, what it prints: an intro naming
    the command, then a block of its output."""
    text = (ROOT / "README.md").read_text()
    seen = text[text.index("## What you will see"):]
    seen = seen[: seen.index("\n## ", 5)]
    top = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name in top.choices:
        m = re.search(rf"^`hangd {name}\b[^\n]*(?:\n(?!```)[^\n]*)*\n\n```\n(.+?)```", seen, re.M | re.S)
        assert m and m.group(1).strip(), f"README: no output excerpt for hangd {name}"


def test_watch_lines_for_a_replayed_hang_show_times_and_the_next_step():
    import io

    from hangd.analysis.engine import Analyzer
    from hangd.trace import TraceReader
    from hangd.watch import Watcher

    for as_json in (False, True):
        out, warned = io.StringIO(), []
        w = Watcher(json_lines=as_json, out=out, warn=warned.append)
        an = Analyzer()
        for snap in TraceReader(TRACES / "nccl_stall").snapshots():
            changes = an.step(snap)
            an.take_requests()
            w.emit(snap, changes, an.drain())
        text = out.getvalue()
        assert not warned, "the recorded node saw its GPUs"
        if as_json:
            docs = [json.loads(line) for line in text.splitlines()]
            inc = next(d for d in docs if d["type"] == "incident")
            assert isinstance(inc["opened_at"], float) and inc["opened_at_iso"].startswith(iso_local(inc["opened_at"])[:19])
            assert inc["hang_started_at_iso"].startswith(iso_local(inc["hang_started_at"])[:19])
            assert all("t_iso" in d for d in docs if d["type"] == "state")
            continue
        lines = text.splitlines()
        i = next(n for n, line in enumerate(lines) if "INCIDENT #1 nccl_stall open" in line)
        assert re.match(rf"{ISO} INCIDENT #1 nccl_stall open job rdzv:127.0.0.1:29601@1409: opened {ISO} \(\d+ s ago\), "
                        r"culprit ranks \[1\]", lines[i]), lines[i]
        assert lines[i + 2].startswith("    next step: Look at what the culprit rank is doing")
        assert re.match(rf"{ISO} pid 1411 rank 0 job rdzv:127.0.0.1:29601@1409 -> hung: ", next(x for x in lines if "-> hung" in x))
