"""The shipped systemd unit and Kubernetes manifests, checked by the real tools."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

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
    files = [str(K8S / "daemonset.yaml"), str(K8S / "service.yaml")]
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
