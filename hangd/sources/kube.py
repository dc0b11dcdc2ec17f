"""Who a process belongs to: its owner, and the Kubernetes pod its cgroup places it in.

Read once per process, when the /proc source first reads its static facts (``ProcInfo``).

The pod comes from the cgroup path the kubelet gives a container, with either cgroup driver:

- systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope``
  (the pod uid's dashes written as underscores; ``crio-<id>.scope``, ``docker-<id>.scope``)
- cgroupfs: ``/kubepods/besteffort/pod<uid>/<id>`` (a guaranteed pod sits right under ``/kubepods``)

in cgroup v2 (``0::<path>``) or v1 (``N:controller:<path>``). The cgroup gives the pod's uid and
the container's id, not names. The names are resolved, in order, from:

1. the process's environment, where the pod spec sets them through the downward API
   (``POD_NAME``, ``POD_NAMESPACE``, ``CONTAINER_NAME``);
2. the kubelet's log folders, which hangd reads when ``/var/log/pods`` is mounted into it:
   ``/var/log/pods/<namespace>_<name>_<uid>/<container>/`` names the pod by its uid, and
   ``/var/log/containers/<name>_<namespace>_<container>-<container id>.log`` names the container by
   its id;
3. ``HOSTNAME`` of a process in a pod (Kubernetes sets it to the pod's name unless the spec sets a
   hostname): the name only.

Where none gives the name, the pod says so (``unresolved``), with what would have. The kubelet's
pod-resources socket (which dcgm-exporter uses) is not read: it answers in gRPC, and it lists pods by
the devices they hold, not by uid.
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from functools import lru_cache

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# a path segment: "kubepods-burstable-pod<uid>.slice" or "pod<uid>"
_POD_SEG = re.compile(rf"^(?:kubepods(?:-(?P<qos1>burstable|besteffort))?-)?pod(?P<uid>{_UID})(?:\.slice)?$")
_QOS_SEG = re.compile(r"^(?:kubepods-)?(?P<qos>burstable|besteffort)(?:\.slice)?$")
_CONTAINER_SEG = re.compile(r"^(?:(?P<rt>cri-containerd|crio|docker|containerd)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")
_LOG_NAME = re.compile(r"^(?P<pod>[^_]+)_(?P<ns>[^_]+)_(?P<container>.+)-(?P<id>[0-9a-f]{64})\.log$")


def cgroup_paths(text: str) -> list[str]:
    """The paths of /proc/PID/cgroup, the v2 one (``0::``) first."""
    v2: list[str] = []
    v1: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2]:
            (v2 if parts[0] == "0" else v1).append(parts[2])
    return v2 + v1


def parse_kube_cgroup(text: str) -> dict[str, str] | None:
    """``{"uid", "qos", "container_id"}`` of the pod a /proc/PID/cgroup places its process in (the
    keys it shows), or None outside a kubelet's cgroup."""
    for path in cgroup_paths(text):
        segs = [s for s in path.split("/") if s]
        if not any(s == "kubepods" or s.startswith("kubepods") for s in segs):
            continue
        out: dict[str, str] = {}
        for i, seg in enumerate(segs):
            if m := _POD_SEG.match(seg):
                out["uid"] = m.group("uid").replace("_", "-")
                qos = m.group("qos1") or next((q.group("qos") for s in segs[:i] if (q := _QOS_SEG.match(s))), None)
                out["qos"] = qos or "guaranteed"
                for rest in segs[i + 1:]:
                    if c := _CONTAINER_SEG.match(rest):
                        out["container_id"] = c.group("id")
                        break
                return out
    return None


@lru_cache(maxsize=4096)
def user_name(uid: int) -> str | None:
    """The name of ``uid`` in this host's user database (None when it has none: hangd in a
    container reads its own /etc/passwd, not the node's)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def status_uid(status: bytes) -> int | None:
    """The real uid in /proc/PID/status (``Uid:\\treal\\teffective\\tsaved\\tfs``)."""
    i = status.find(b"\nUid:")
    if i < 0:
        return None
    v = status[i + 5: status.find(b"\n", i + 5)].split()
    return int(v[0]) if v and v[0].isdigit() else None


@dataclass
class PodResolver:
    """Names the pod (and container) of a pod uid from the kubelet's log folders and a process's
    environment. ``log_dir`` is injectable for tests; ``/var/log/containers`` is its sibling."""

    log_dir: str = "/var/log/pods"

    def _pod_folder(self, uid: str) -> tuple[str, str, str] | None:
        """(namespace, name, folder) of the pod's log folder, found by its uid."""
        try:
            names = os.listdir(self.log_dir)
        except OSError:
            return None
        for n in names:
            ns, sep, rest = n.partition("_")
            name, sep2, folder_uid = rest.rpartition("_")
            if sep and sep2 and folder_uid == uid:
                return ns, name, os.path.join(self.log_dir, n)
        return None

    def _container(self, folder: str, container_id: str | None) -> str | None:
        """The container's name: by its id from /var/log/containers, or the pod's only container."""
        if container_id:
            cdir = os.path.join(os.path.dirname(self.log_dir.rstrip("/")) or "/", "containers")
            try:
                for n in os.listdir(cdir):
                    m = _LOG_NAME.match(n)
                    if m and m.group("id") == container_id:
                        return m.group("container")
            except OSError:
                pass
        try:
            subs = [d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d))]
        except OSError:
            return None
        return subs[0] if len(subs) == 1 else None

    def resolve(self, pod: dict[str, str], env: dict[str, str] | None) -> dict[str, str]:
        """``pod`` (from ``parse_kube_cgroup``) with its name, namespace and container where they can
        be known, and ``name_from``; else ``unresolved``: why not."""
        out = dict(pod)
        env = env or {}
        if env.get("POD_NAME"):
            out["name"] = env["POD_NAME"]
            out["name_from"] = "environment POD_NAME"
            if env.get("POD_NAMESPACE"):
                out["namespace"] = env["POD_NAMESPACE"]
            if env.get("CONTAINER_NAME"):
                out["container"] = env["CONTAINER_NAME"]
        found = self._pod_folder(pod["uid"])
        if found is not None:
            ns, name, folder = found
            if "name" not in out:
                out["name_from"] = f"{self.log_dir}/{os.path.basename(folder)}"
            out.setdefault("name", name)
            out.setdefault("namespace", ns)
            if "container" not in out and (c := self._container(folder, pod.get("container_id"))):
                out["container"] = c
        if "name" not in out and env.get("HOSTNAME") and any(k.startswith("KUBERNETES_") for k in env):
            out["name"] = env["HOSTNAME"]
            out["name_from"] = "environment HOSTNAME (the pod's name unless its spec sets a hostname)"
        if "name" not in out:
            why = f"no {self.log_dir}/*_{pod['uid']} folder" if os.path.isdir(self.log_dir) else \
                f"{self.log_dir} is not readable here (mount it into hangd's container)"
            out["unresolved"] = f"{why}, and no POD_NAME in the process's environment"
        return out
