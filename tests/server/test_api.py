"""`hangd serve --replay` of the reference traces: the REST API, /metrics, redaction, auth."""

from __future__ import annotations

import shutil
import subprocess
import sys

import httpx
import pytest

from hangd.humanize import iso_field

from ..conftest import PLANTED_SECRET, TRACES
from ..served import serve

pytestmark = pytest.mark.slow  # every test starts a real hangd serve and waits on it

ENDPOINTS = ["/incidents", "/incidents/1", "/jobs", "/processes", "/gpus", "/gpus/history", "/timeline", "/metrics", "/healthz",
             "/readyz", "/openapi.json"]


@pytest.mark.prometheus  # promtool
def test_nccl_stall_shows_up_within_30s_and_metrics_lint(tmp_path, served):
    s = serve(tmp_path, "--replay", str(TRACES / "nccl_stall"), "--speed", "10")
    served.append(s)
    incs = s.wait_for(lambda s: [i for i in s.get("/incidents").json()["incidents"] if i["kind"] == "nccl_stall"],
                      30, "the nccl_stall incident")
    inc = incs[0]
    assert inc["culprit_ranks"] == [1]
    # the flight-recorder dumps arrive later in the trace and are attached to the open incident
    detail = s.wait_for(lambda s: (d := s.get(f"/incidents/{inc['id']}").json()) and "all_reduce #399" in d["summary"] and d,
                        30, "the flight-recorder finding")
    assert set(detail["evidence"]["stacks"]) == {"0", "1"}
    assert detail["evidence"]["environ"]["0"]["MASTER_PORT"] == "29601"
    text = s.get("/metrics").text
    assert 'hangd_incidents_open{kind="nccl_stall"}' in text or 'hangd_incidents_total{kind="nccl_stall"} 1.0' in text
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus) is installed by `make test`"
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_endpoint_redacts_the_planted_token(tmp_path, served):
    s = serve(tmp_path, "--replay", str(TRACES / "cpu_hang"), "--speed", "20")
    served.append(s)
    s.wait_for(lambda s: s.get("/incidents").json()["total"] >= 1, 30, "an incident")
    s.wait_for(lambda s: s.get("/readyz").json()["detail"].startswith("replay finished"), 30, "replay end")
    for ep in ENDPOINTS:
        r = s.get(ep)
        assert r.status_code == 200, (ep, r.status_code, r.text[:300])
        assert PLANTED_SECRET not in r.text, ep
    assert PLANTED_SECRET not in s.log.read_text()


def test_filters_paging_and_ack(tmp_path, served):
    s = serve(tmp_path, "--replay", str(TRACES / "cpu_hang"), "--speed", "20")
    served.append(s)
    s.wait_for(lambda s: s.get("/incidents", params={"kind": "host_stall"}).json()["total"] == 1, 30, "host_stall")
    assert s.get("/incidents", params={"kind": "nccl_stall"}).json()["total"] == 0
    assert s.get("/incidents", params={"status": "bogus"}).status_code == 422
    page = s.get("/incidents", params={"limit": 1, "offset": 0}).json()
    assert page["limit"] == 1 and len(page["incidents"]) == 1
    iid = page["incidents"][0]["id"]
    r = s.post(f"/incidents/{iid}/ack")
    assert r.status_code == 200 and r.json()["acked"] is True
    assert s.get(f"/incidents/{iid}").json()["acked"] is True
    assert s.post("/incidents/999999/ack").status_code == 404
    assert s.get("/incidents/999999").status_code == 404
    tl = s.get("/timeline", params={"pid": 1666}).json()
    assert tl and all(e["pid"] == 1666 for e in tl) and "hung" in {e["state"] for e in tl}
    # numbers for tools, and the same instants for a person reading the JSON
    assert all(isinstance(e["t"], float) and e["t_iso"] == iso_field(e["t"]) for e in tl)
    inc = s.get(f"/incidents/{iid}").json()
    assert inc["hang_started_at_iso"] == iso_field(inc["hang_started_at"]) and inc["opened_at_iso"]
    jobs = s.get("/jobs").json()
    assert jobs and all(j["last_progress_iso"] == iso_field(j["last_progress"]) for j in jobs)
    assert s.post("/snapshot").status_code == 409  # nothing live to capture in a replay
    assert s.post("/processes").status_code == 405
    big = s.post(f"/incidents/{iid}/ack", content=b"x" * 100_000)
    assert big.status_code == 413


def test_off_loopback_needs_a_token(tmp_path, served):
    out = subprocess.run([sys.executable, "-m", "hangd", "serve", "--listen", "0.0.0.0:19999", "--db",
                          f"sqlite:///{tmp_path / 'x.db'}"], capture_output=True, text=True, timeout=60,
                         cwd=str(TRACES.parent.parent.parent.parent))
    assert out.returncode == 2 and "needs a token" in out.stderr
    tok = tmp_path / "token"
    tok.write_text("s3cret-token\n")
    s = serve(tmp_path, "--replay", str(TRACES / "cpu_hang"), "--speed", "20", "--token-file", str(tok),
              listen_host="0.0.0.0")
    served.append(s)
    assert s.get("/healthz").status_code == 200
    assert s.get("/incidents").status_code == 401
    assert s.get("/metrics").status_code == 401
    assert s.get("/incidents", headers={"Authorization": "Bearer wrong"}).status_code == 401
    auth = {"Authorization": "Bearer s3cret-token"}
    s.wait_for(lambda s: s.get("/incidents", headers=auth).json()["total"] >= 1, 30, "incident with token")
    assert s.get("/metrics", headers=auth).status_code == 200


@pytest.mark.parametrize("path", ["/incidents?limit=0", "/incidents?since=-1", "/timeline?pid=abc", "/incidents/0"])
def test_bad_requests_are_4xx(tmp_path, served, path):
    if not served:
        served.append(serve(tmp_path, "--replay", str(TRACES / "idle_server"), "--speed", "50"))
    r = httpx.get(served[0].url + path, timeout=10)
    assert 400 <= r.status_code < 500
