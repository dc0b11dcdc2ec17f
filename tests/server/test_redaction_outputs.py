"""Redaction where text leaves hangd: start-up errors for a bad --db, the store, API responses
and the daemon's own logs (uvicorn's tracebacks included)."""

from __future__ import annotations

import json
import logging
import sys
import time

import pytest

from hangd.redact import REDACTED
from hangd.server.app import PrettyJSON
from hangd.server.cli import _setup_logging
from hangd.store.db import Batch, Store

from ..conftest import run_hangd

SERVE = ["serve", "--listen", "127.0.0.1:1"]


@pytest.mark.slow  # each case starts a command that tries the database and gives up
@pytest.mark.parametrize(("command", "url", "secret", "says"), [
    (["db", "upgrade"], "postgres://u:p@ss@db.example.invalid/hangd", "p@ss", "write it as %40"),
    (SERVE, "postgres://u:p@ss@db.example.invalid/hangd", "p@ss", "write it as %40"),
    (["db", "upgrade"], "postgresql://u:s3cr3tpw@127.0.0.1:1/hangd", "s3cr3tpw", "OperationalError"),
    (SERVE, "postgresql://u:s3cr3tpw@127.0.0.1:1/hangd", "s3cr3tpw", "OperationalError"),
    (["db", "downgrade", "base"], "nope://u:s3cr3tpw@h/db", "s3cr3tpw", "NoSuchModuleError"),
])
def test_a_bad_db_url_is_one_line_without_the_password(command, url, secret, says):
    r = run_hangd(*command, "--db", url, check=False, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hangd: db "), r.stderr
    assert says in lines[0]
    assert f"u:{REDACTED}@" in lines[0]
    assert secret not in r.stderr + r.stdout
    assert "ss@" not in r.stderr  # the piece of a misparsed password a driver would quote


def test_an_encoded_at_sign_is_accepted():
    r = run_hangd("db", "upgrade", "--db", "postgresql://u:p%40ss@127.0.0.1:1/hangd", check=False, timeout=60)
    assert "write it as %40" not in r.stderr and "p%40ss" not in r.stderr and "OperationalError" in r.stderr


def test_the_store_keeps_no_secret(tmp_path):
    st = Store(f"sqlite:///{tmp_path / 's.db'}")
    t = time.time()
    inc = {"id": 1, "kind": "host_stall", "severity": "critical", "job": "j", "opened_at": t, "updated_at": t,
           "resolved_at": None, "summary": "rank 0 stuck; log says HF_TOKEN=hf_storesecret1",
           "next_step": "retry with --hf-token hf_x2", "pids": [1], "ranks": [0], "culprit_pids": [1],
           "culprit_ranks": [0], "findings": [{"message": "Authorization: Bearer storesecret3"}], "timeline": [],
           "evidence": {"environ": {"0": {"WANDB_API_KEY": "storesecret4", "RANK": "0"}},
                        "logs": {"0": ["password = storesecret5", "step 3"]}}}
    st.submit(Batch(t=t, incidents=[inc], changes=[{"t": t, "pid": 1, "rank": 0, "job": "j", "state": "hung",
                                                     "reason": "stuck after api_key=storesecret6"}]))
    stored = json.dumps([st.get_incident(1), st.timeline(pid=1)])
    for s in ("storesecret1", "hf_x2", "storesecret3", "storesecret4", "storesecret5", "storesecret6"):
        assert s not in stored, s
    got = st.get_incident(1)
    assert got["evidence"]["environ"]["0"]["RANK"] == "0" and got["evidence"]["logs"]["0"][1] == "step 3"


def test_api_responses_are_redacted_whatever_produced_them():
    body = json.loads(PrettyJSON({"detail": "db postgresql://u:apisecret1@h/x failed", "key": "job-1",
                                  "environ": {"TORCH_API_TOKEN": "apisecret2"}}).body)
    assert "apisecret" not in json.dumps(body)
    assert body["key"] == "job-1"


@pytest.mark.parametrize("json_logs", [False, True])
def test_daemon_logs_and_uvicorn_tracebacks_are_redacted(capfd, json_logs):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        _setup_logging(json_logs, "info")
        logging.getLogger("hangd.store").error("store write failed: postgresql://u:logsecret1@h/db refused")
        try:
            raise RuntimeError("request with Authorization: Bearer logsecret2")
        except RuntimeError:
            # what uvicorn logs for a 500 (hangd runs uvicorn with log_config=None so it reaches here)
            logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
        sys.stderr.flush()
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    err = capfd.readouterr().err
    assert "logsecret" not in err
    assert "Exception in ASGI application" in err and "RuntimeError" in err
    if json_logs:
        assert all(json.loads(line) for line in err.strip().splitlines())
