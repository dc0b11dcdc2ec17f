"""Two credentials and HTTPS on a real `hangd serve`: the read token scrapes and reads, only the
write token changes anything; an incident's signed link opens that incident alone; `hangd status`
asks the daemon with the token files serve has; a self-signed certificate made here serves HTTPS."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess

import httpx
import pytest

from ..conftest import ROOT, TRACES, hangd_cmd
from ..realpg import free_port
from ..served import serve

READ = "read-" + "r" * 40
WRITE = "write-" + "w" * 40


def _tokens(tmp_path) -> tuple[str, str]:
    (tmp_path / "token").write_text(WRITE + "\n")
    (tmp_path / "read-token").write_text(READ + "\n")
    return str(tmp_path / "token"), str(tmp_path / "read-token")


def _bearer(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


def _status(port: int, env: dict[str, str]) -> dict:
    """`hangd status --json` as `kubectl exec ds/hangd -- hangd status` runs it: the same environment
    as serve, no token on the command line."""
    out = subprocess.run([*hangd_cmd(), "status", "--json", "--seconds", "1"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env={**os.environ, "HANGD_LISTEN": f"0.0.0.0:{port}", **env})
    return json.loads(out.stdout)["daemon"]


def test_the_read_token_reads_and_never_writes(tmp_path, served):
    write, read = _tokens(tmp_path)
    port = free_port()
    s = serve(tmp_path, "--replay", str(TRACES / "cpu_hang"), "--speed", "4", "--token-file", write,
              "--read-token-file", read, "--node-name", "gpu-node-07", listen_host="0.0.0.0", port=port)
    served.append(s)
    # the incident's link, from /metrics while it is open
    m = s.wait_for(lambda s: re.search(r'^hangd_incident_info\{[^}]*incident="(\d+)"[^}]*url="([^"]+)"',
                                       s.get("/metrics", headers=_bearer(READ)).text, re.M), 90, "an open incident")
    iid, link = m.group(1), m.group(2)
    for path in ("/incidents", f"/incidents/{iid}", "/jobs", "/processes", "/gpus", "/timeline", "/metrics", "/openapi.json"):
        assert s.get(path, headers=_bearer(READ)).status_code == 200, path
        assert s.get(path).status_code == 401, path
    for path in (f"/incidents/{iid}/ack", "/snapshot"):
        r = s.post(path, headers=_bearer(READ))
        assert r.status_code == 403 and "write token" in r.json()["detail"], (path, r.text)
        assert s.post(path, headers=_bearer("wrong")).status_code == 401
    assert s.get(f"/incidents/{iid}", headers=_bearer(READ)).json()["acked"] is False
    assert s.post(f"/incidents/{iid}/ack", headers=_bearer(WRITE)).status_code == 200
    assert s.post("/snapshot", headers=_bearer(WRITE)).status_code == 409  # a replay: nothing live to capture
    # off loopback the link opens the page as a token reads it, stacks and all
    sig = link.split("?sig=")[1]
    assert link.startswith(f"http://gpu-node-07:{port}/incidents/{iid}?sig=")  # no external_url: the node's name
    by_link = s.get(f"/incidents/{iid}?sig={sig}")
    assert by_link.status_code == 200 and by_link.json()["evidence"].get("stacks")
    # the same page as a token reads (the replay goes on meanwhile: its readings move, not what is shown)
    by_token = s.get(f"/incidents/{iid}", headers=_bearer(READ)).json()
    assert set(by_link.json()["evidence"]) == set(by_token["evidence"])
    assert set(by_link.json()["evidence"]["stacks"]) == set(by_token["evidence"]["stacks"])
    assert s.post(f"/incidents/{iid}/ack?sig={sig}").status_code == 401
    assert s.get(f"/jobs?sig={sig}").status_code == 401
    # hangd status reads the token files serve reads, from the environment
    assert _status(port, {"HANGD_READ_TOKEN_FILE": read})["answered"] is True
    assert _status(port, {"HANGD_TOKEN_FILE": write})["answered"] is True
    got = _status(port, {})
    assert got["answered"] is False and "HTTP 401" in got["error"] and "HANGD_READ_TOKEN_FILE" in got["error"] \
        and "HANGD_TOKEN" in got["error"]


@pytest.mark.parametrize("case", ["same", "missing"])
def test_serve_refuses_tokens_it_cannot_tell_apart_or_find(tmp_path, case):
    write, read = _tokens(tmp_path)
    if case == "same":
        args = ["--token-file", write, "--read-token-file", write]
        want = "the read token is the write token"
    else:
        args = ["--token-file", str(tmp_path / "absent")]
        want = "not found. HINT: write a long random token there"
    out = subprocess.run([*hangd_cmd(), "serve", "--listen", f"0.0.0.0:{free_port()}", "--db",
                          f"sqlite:///{tmp_path / 'x.db'}", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert want in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert WRITE not in out.stderr


def test_serves_https_with_a_certificate_and_status_asks_it_over_https(tmp_path, served):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                           "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    write, read = _tokens(tmp_path)
    port = free_port()
    s = serve(tmp_path, "--replay", str(TRACES / "idle_server"), "--speed", "50", "--token-file", write,
              "--read-token-file", read, "--tls-cert", str(cert), "--tls-key", str(key), listen_host="0.0.0.0",
              port=port, wait=False)
    served.append(s)
    base = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=str(cert))
    s.wait_for(lambda s: httpx.get(base + "/healthz", verify=trust, timeout=5).status_code == 200, 60, "https healthz")
    assert httpx.get(base + "/metrics", verify=trust, headers=_bearer(READ), timeout=10).status_code == 200
    with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    text = httpx.get(base + "/metrics", verify=trust, headers=_bearer(READ), timeout=10).text
    assert re.search(rf'^hangd_runbook_info\{{url="https://[^"]+:{port}/docs/runbook"\}} 1\.0$', text, re.M)
    assert _status(port, {"HANGD_READ_TOKEN_FILE": read, "HANGD_TLS_CERTFILE": str(cert),
                          "HANGD_TLS_KEYFILE": str(key)})["answered"] is True
