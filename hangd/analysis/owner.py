"""Who to page about a job: the owner of its processes, its Slurm job and its Kubernetes pod.

Built from the ranks' static facts (``ProcInfo``: owner, environment, pod), which the /proc
source read once per process. What was not read is absent, never guessed: a trace recorded before
owners were read has no ``user``.
"""

from __future__ import annotations

from typing import Any

from hangd.analysis.nodeview import ProcHistory

# Slurm's variables of a job, as a job's ``slurm`` keys
SLURM_KEYS = {
    "SLURM_JOB_ID": "job_id", "SLURM_JOB_USER": "user", "SLURM_JOB_NAME": "name",
    "SLURM_JOB_ACCOUNT": "account", "SLURM_JOB_PARTITION": "partition",
    "SLURM_ARRAY_JOB_ID": "array_job_id", "SLURM_ARRAY_TASK_ID": "array_task_id", "SLURM_STEP_ID": "step_id",
}
POD_KEYS = ("uid", "name", "namespace", "container", "container_id", "qos", "name_from", "unresolved")


def who(ranks: list[ProcHistory]) -> dict[str, Any]:
    """``user`` (and ``uid``), ``slurm`` {job_id, user, name, account, partition, ...} and ``pod``
    {uid, name, namespace, container, name_from | unresolved} of a job's ranks (lowest rank first),
    each only where known; ``text`` says it in words."""
    out: dict[str, Any] = {}
    infos = [h.info for h in ranks if h.info is not None]
    users = sorted({i.user or f"uid {i.uid}" for i in infos if i.uid is not None})
    if users:
        out["user"] = ", ".join(users)
        uids = sorted({i.uid for i in infos if i.uid is not None})
        if len(uids) == 1:
            out["uid"] = uids[0]
    for i in infos:
        env = i.environ or {}
        if env.get("SLURM_JOB_ID"):
            out["slurm"] = {k: env[v] for v, k in SLURM_KEYS.items() if env.get(v)}
            break
    pod = next((i.pod for i in infos if i.pod), None)
    if pod:
        out["pod"] = {k: pod[k] for k in POD_KEYS if pod.get(k)}
    if out:
        out["text"] = describe(out)
    return out


def describe(w: dict[str, Any]) -> str:
    """``owner alice, Slurm job 1234 (train-llama, account ml, partition gpu), pod ml/train-0
    (container trainer)``; where the pod has no name, why."""
    parts = []
    if w.get("user"):
        parts.append(f"owner {w['user']}")
    s = w.get("slurm")
    if s:
        jid = s["job_id"] + (f".{s['step_id']}" if s.get("step_id") else "")
        extra = [s["name"]] if s.get("name") else []
        if s.get("array_job_id") and s.get("array_task_id"):
            extra.append(f"array {s['array_job_id']}_{s['array_task_id']}")
        extra += [f"{k} {s[k]}" for k in ("user", "account", "partition") if s.get(k) and not (k == "user" and s[k] == w.get("user"))]
        parts.append(f"Slurm job {jid}" + (f" ({', '.join(extra)})" if extra else ""))
    p = w.get("pod")
    if p:
        if p.get("name"):
            ns = f"{p['namespace']}/" if p.get("namespace") else ""
            parts.append(f"pod {ns}{p['name']}" + (f" (container {p['container']})" if p.get("container") else ""))
        else:
            parts.append(f"pod uid {p['uid']}, name unknown: {p.get('unresolved', 'not resolved')}")
    return ", ".join(parts)


LABELS = ("user", "slurm_job", "k8s_namespace", "k8s_pod")
INFO_LABELS = (*LABELS, "slurm_job_name", "slurm_account", "slurm_partition", "k8s_container", "k8s_pod_uid")


def labels(w: dict[str, Any] | None, names: tuple[str, ...] = LABELS) -> list[str]:
    """The values of the metric labels ``names`` (``LABELS``: user, slurm_job, k8s_namespace,
    k8s_pod) of a job's owner: empty where unknown, which Prometheus reads as absent. A job has one
    value of each for its life, so they add no series to the job's; each is capped at 128
    characters. ``k8s_`` because a PodMonitor sets ``namespace`` and ``pod`` to hangd's own."""
    w = w or {}
    s, p = w.get("slurm") or {}, w.get("pod") or {}
    v = {"user": w.get("user"), "slurm_job": s.get("job_id"), "k8s_namespace": p.get("namespace"),
         "k8s_pod": p.get("name"), "slurm_job_name": s.get("name"), "slurm_account": s.get("account"),
         "slurm_partition": s.get("partition"), "k8s_container": p.get("container"), "k8s_pod_uid": p.get("uid")}
    return [str(v.get(k) or "")[:128] for k in names]
