"""A real Prometheus with the shipped rules, and the dashboards' queries, for the tests of
tests/deploy."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from ..conftest import ROOT
from ..realpg import free_port

RULES = ROOT / "deploy" / "prometheus" / "hangd-rules.yml"
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
# the board of jobs across nodes reads series only nodes sharing a database export: its queries are
# proven against two of them (test_fleet_dashboard.py), the others' against one node
FLEET = ROOT / "dashboards" / "hangd-fleet.json"


def exprs(boards: list[Path]) -> list[tuple[str, str]]:
    """(board: panel title, query) of every panel target."""
    out = []
    for p in boards:
        for pan in json.loads(p.read_text())["panels"]:
            for t in pan["targets"]:
                out.append((f"{p.stem}: {pan['title']}", t["expr"]))
    return out


def subst(expr: str, job: str = ".+") -> str:
    """The query as Grafana sends it with every node, ``job`` as the job, and a 1 m rate interval."""
    return (expr.replace("$node", ".+").replace("$job", job).replace("$__rate_interval", "1m")
            .replace("${__range}", "5m"))


def query_range(base: str, expr: str, start: float) -> list[dict[str, Any]]:
    r = httpx.get(base + "/api/v1/query_range", timeout=20,
                  params={"query": expr, "start": start, "end": time.time(), "step": "1"}).json()
    assert r["status"] == "success", r
    return r["data"]["result"]


def query(base: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(base + "/api/v1/query", timeout=20, params={"query": expr}).json()
    assert r["status"] == "success", r
    return r["data"]["result"]


@contextmanager
def prometheus(tmp: Path, targets: list[str], bearer: str | None = None) -> Iterator[str]:
    """A real Prometheus scraping ``targets`` (hangd URLs) every second as the scrape job ``hangd``
    (with ``bearer``, sent as the scrape's token), with the shipped rules evaluated every second
    (the shipped file says 15 s). Yields its URL once it is ready."""
    port = free_port()
    rules = tmp / "rules.yml"
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        g["interval"] = "1s"
    rules.write_text(yaml.safe_dump(doc))
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "hangd",
                            **({"authorization": {"credentials": bearer}} if bearer else {}),
                            "static_configs": [{"targets": [t.removeprefix("http://") for t in targets]}]}],
    }))
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=open(tmp / "prom.log", "w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        t_end = time.time() + 60
        while True:  # it answers 503 in plain text while it starts
            try:
                if httpx.get(base + "/-/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < t_end and prom.poll() is None, (tmp / "prom.log").read_text()[-2000:]
            time.sleep(0.2)
        yield base
    finally:
        prom.terminate()
        prom.wait(20)
