"""The shipped systemd unit and Kubernetes manifests, checked by the real tools."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import jsonschema
import yaml

from ..conftest import ROOT

UNIT = ROOT / "deploy" / "systemd" / "hangd.service"
K8S = ROOT / "deploy" / "kubernetes"


def test_systemd_unit_verifies_and_is_locked_down():
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze (Debian's systemd) is installed by `make test`"
    out = subprocess.run([tool, "verify", str(UNIT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    sec = subprocess.run([tool, "security", "--offline=true", str(UNIT)], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", sec.stdout + sec.stderr)
    assert m, sec.stdout[-2000:] + sec.stderr[-2000:]
    print(f"systemd-analyze security exposure: {m.group(1)}")
    assert float(m.group(1)) <= 4.0
    text = UNIT.read_text()
    for must in ("CapabilityBoundingSet=CAP_SYS_PTRACE", "ProtectSystem=strict", "StateDirectory=hangd",
                 "NoNewPrivileges=yes", "PrivateTmp=yes", "Restart=on-failure", "MemoryMax=", "CPUQuota="):
        assert must in text, must
    assert "KillMode" not in text and "ExecStop" not in text  # it stops itself, never a job


def test_kubernetes_manifests_validate_against_the_schema():
    files = [str(K8S / "daemonset.yaml"), str(K8S / "service.yaml"), str(K8S / "grafana-dashboards.yaml")]
    out = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k", "1.31.0", *files],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    docs = [d for f in files for d in yaml.safe_load_all(open(f)) if d]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert spec["hostPID"] is True
    assert set(c["securityContext"]["capabilities"]["add"]) <= {"SYS_PTRACE", "DAC_READ_SEARCH", "DAC_OVERRIDE"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["nodeSelector"]
    env = {e["name"]: e for e in c["env"]}
    # the shared database's URL (it holds a password) comes from a Secret, never from the manifest
    assert env["HANGD_DB"]["valueFrom"]["secretKeyRef"] == {"name": "hangd-db", "key": "url", "optional": True}
    assert env["HANGD_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def _daemonset() -> tuple[list[dict], dict]:
    docs = [d for d in yaml.safe_load_all((K8S / "daemonset.yaml").read_text()) if d]
    return docs, next(d for d in docs if d["kind"] == "DaemonSet")


def test_no_token_ships_and_the_namespace_allows_what_hangd_needs():
    docs, ds = _daemonset()
    # no live Secret: each cluster makes its own tokens (the file says how)
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert "change-me" not in (K8S / "daemonset.yaml").read_text()
    assert "openssl rand -hex 32" in (K8S / "daemonset.yaml").read_text()
    # hostPID and SYS_PTRACE are refused below the privileged Pod Security level
    ns = next(d for d in docs if d["kind"] == "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    c = ds["spec"]["template"]["spec"]["containers"][0]
    assert not any("token" in a.lower() for a in c.get("args", [])), c["args"]  # kubectl exec's hangd status sees the env
    vol = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "token")
    assert vol["secret"]["secretName"] == "hangd-token" and vol["secret"]["optional"] is True
    for monitor in ("podmonitor.yaml", "servicemonitor.yaml"):
        doc = yaml.safe_load((K8S / monitor).read_text())
        ep = (doc["spec"].get("podMetricsEndpoints") or doc["spec"]["endpoints"])[0]
        assert ep["authorization"]["credentials"] == {"name": "hangd-token", "key": "read-token"}, monitor


def test_the_daemonsets_hangd_serves_and_its_hangd_status_answers(tmp_path):
    """The container as the manifest runs it (its args and environment; the Secret's two keys as
    files; another port), then `hangd status` with that environment alone, as
    `kubectl exec ds/hangd -- hangd status` runs it: it gets the daemon's answer, not a 401.
    Without the Secret the same container exits at once, saying to create it."""
    import httpx

    from ..conftest import TRACES, hangd_cmd
    from ..realpg import free_port

    _, ds = _daemonset()
    c = ds["spec"]["template"]["spec"]["containers"][0]
    mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "token")
    port = free_port()
    env = {e["name"]: e["value"].replace(mount, str(tmp_path / "secret")) for e in c["env"] if "value" in e}
    env.update({"HANGD_LISTEN": env["HANGD_LISTEN"].replace(":9877", f":{port}"), "HANGD_NODE_NAME": "gpu-node-07",
                "HANGD_DB": f"sqlite:///{tmp_path / 'hangd.db'}"})
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("HANGD_")}, **env}
    missing = subprocess.run([*hangd_cmd(), *c["args"]], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert missing.returncode == 2 and "create the Secret hangd-token" in missing.stderr, missing.stderr
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "token").write_text("w" * 64)
    (tmp_path / "secret" / "read-token").write_text("r" * 64)
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([*hangd_cmd(), *c["args"], "--replay", str(TRACES / "idle_server"), "--speed", "10"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        t_end = time.time() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < t_end and proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            time.sleep(0.3)
        out = subprocess.run([*hangd_cmd(), "status", "--json", "--seconds", "1"], env=env, capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
        daemon = json.loads(out.stdout)["daemon"]
        assert daemon["answered"] is True and daemon["error"] is None, daemon
        assert daemon["url"] == f"http://127.0.0.1:{port}"
        links = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer " + "r" * 64}).text
        assert 'hangd_runbook_info{url="http://gpu-node-07:9877/docs/runbook"}' in links  # the node, not a pod IP
    finally:
        proc.terminate()
        proc.wait(20)


def test_generated_objects_are_current_and_listed_for_kustomize():
    """prometheusrule.yaml and grafana-dashboards.yaml are what build.py makes of the rules and the
    dashboards (one copy of each), and the kustomization lists them."""
    before = {n: (K8S / n).read_text() for n in ("prometheusrule.yaml", "grafana-dashboards.yaml")}
    subprocess.run([sys.executable, str(K8S / "build.py")], check=True)
    assert {n: (K8S / n).read_text() for n in before} == before, "run deploy/kubernetes/build.py"
    rule = yaml.safe_load(before["prometheusrule.yaml"])
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "hangd-rules.yml").read_text())["groups"]
    maps = [d for d in yaml.safe_load_all(before["grafana-dashboards.yaml"]) if d]
    boards = sorted((ROOT / "dashboards").glob("*.json"))
    assert [m["metadata"]["name"] for m in maps] == [p.stem for p in boards]
    for m, p in zip(maps, boards, strict=True):
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(m["data"][p.name]) == json.loads(p.read_text())
    # kubectl apply -k: the kustomization names every object file but the alternative ServiceMonitor
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in K8S.glob("*.yaml")
                                               if p.name not in ("kustomization.yaml", "servicemonitor.yaml"))


# The part of the Prometheus Operator's PodMonitor CRD schema (monitoring.coreos.com/v1) that we use.
PODMONITOR_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {"type": "object", "required": ["selector", "podMetricsEndpoints"], "additionalProperties": False,
                 "properties": {
                     "jobLabel": {"type": "string"},
                     "selector": {"type": "object", "properties": {"matchLabels": {"type": "object"}}},
                     "podMetricsEndpoints": {"type": "array", "items": {
                         "type": "object", "additionalProperties": False,
                         "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                        "interval": {"type": "string", "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?)$"},
                                        "honorLabels": {"type": "boolean"},
                                        "authorization": {"type": "object", "properties": {
                                            "type": {"type": "string"},
                                            "credentials": {"type": "object", "required": ["key"],
                                                            "properties": {"name": {"type": "string"},
                                                                           "key": {"type": "string"}}}}}}}}}},
    },
}


def test_podmonitor_matches_the_crd():
    doc = yaml.safe_load((K8S / "podmonitor.yaml").read_text())
    jsonschema.validate(doc, PODMONITOR_SCHEMA)
    # hangd_job does not clash with the scrape's job label; the job is "hangd" as the rules expect
    assert "honorLabels" not in doc["spec"]["podMetricsEndpoints"][0]
    ds = next(d for d in yaml.safe_load_all((K8S / "daemonset.yaml").read_text()) if d and d["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["metadata"]["labels"][doc["spec"]["jobLabel"]] == "hangd"
