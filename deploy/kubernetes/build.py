"""Writes the Kubernetes objects made from files kept elsewhere in the repo, so that there is one
copy of each: prometheusrule.yaml (deploy/prometheus/hangd-rules.yml as a PrometheusRule of the
Prometheus Operator) and grafana-dashboards.yaml (dashboards/*.json as ConfigMaps for Grafana's
dashboard sidecar). Run it after changing either; tests/deploy checks the output is current."""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RULES = ROOT / "deploy" / "prometheus" / "hangd-rules.yml"
DASHBOARDS = ROOT / "dashboards"
LABELS = {"app.kubernetes.io/name": "hangd"}
GENERATED = "# Made by deploy/kubernetes/build.py from {}: edit that and run it again.\n"


class _Literal(str):
    """A string written as a YAML block (|), as a dashboard reads best in a ConfigMap."""


def _dumper() -> type[yaml.SafeDumper]:
    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(_Literal, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", str(s), style="|"))
    return Dumper


def prometheus_rule() -> str:
    rules = yaml.safe_load(RULES.read_text())
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "hangd", "namespace": "hangd", "labels": LABELS}, "spec": {"groups": rules["groups"]}}
    return GENERATED.format("deploy/prometheus/hangd-rules.yml") + yaml.dump(doc, Dumper=_dumper(), sort_keys=False, width=120)


def dashboards() -> str:
    docs = []
    for p in sorted(DASHBOARDS.glob("*.json")):
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     # grafana_dashboard: the label the sidecar of Grafana's Helm chart looks for by default
                     "metadata": {"name": p.stem, "namespace": "hangd", "labels": {**LABELS, "grafana_dashboard": "1"}},
                     "data": {p.name: _Literal(p.read_text())}})
    body = "---\n".join(yaml.dump(d, Dumper=_dumper(), sort_keys=False, width=120) for d in docs)
    return GENERATED.format("dashboards/*.json") + body


OUTPUTS = {"prometheusrule.yaml": prometheus_rule, "grafana-dashboards.yaml": dashboards}

if __name__ == "__main__":
    for name, make in OUTPUTS.items():
        (HERE / name).write_text(make())
