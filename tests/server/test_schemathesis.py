"""Property-based requests over the OpenAPI of a real `hangd serve`: no 5xx, responses match."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..conftest import ROOT, TRACES
from ..served import serve

pytestmark = pytest.mark.slow  # property-based requests against a real server


def test_no_server_errors_over_the_openapi(tmp_path, served):
    s = serve(tmp_path, "--replay", str(TRACES / "cpu_hang"), "--speed", "20")
    served.append(s)
    s.wait_for(lambda s: s.get("/incidents").json()["total"] >= 1, 30, "an incident")
    # schemathesis keeps a cache of crashes under ./.schemathesis by default: keep it out of the tree
    config = tmp_path / "schemathesis.toml"
    config.write_text(f'[cache]\ndirectory = "{tmp_path / "schemathesis-cache"}"\n')
    out = subprocess.run([sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
                          f"{s.url}/openapi.json",
                          "--checks", "not_a_server_error,response_schema_conformance,status_code_conformance",
                          "--max-examples", "40", "--exclude-method", "POST"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert not (ROOT / ".schemathesis").exists(), "schemathesis wrote its cache into the source tree"
