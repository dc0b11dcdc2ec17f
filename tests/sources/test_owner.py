"""Whom to page: the owner of a process, its Slurm job, its Kubernetes pod (parsers and the /proc
source on real processes; the cgroup path and the kubelet's log folders are a temp tree)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

from hangd.analysis import owner
from hangd.analysis.nodeview import ProcHistory
from hangd.incidents import IncidentBook
from hangd.snapshot import ProcInfo, Snapshot
from hangd.sources.kube import PodResolver, cgroup_paths, parse_kube_cgroup, status_uid, user_name
from hangd.sources.procfs import ProcSource
from hangd.trace import TraceReader, TraceWriter

UID = "6b9f1f8e-3c5a-4b8e-9d1a-2f7e8c9a0b1c"
CID = "4f" * 32
CID2 = "a1" * 32


def test_kubelet_cgroup_paths_with_the_systemd_driver():
    under = UID.replace("-", "_")
    v2 = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice/cri-containerd-{CID}.scope\n"
    assert parse_kube_cgroup(v2) == {"uid": UID, "qos": "burstable", "container_id": CID}
    guaranteed = f"0::/kubepods.slice/kubepods-pod{under}.slice/crio-{CID}.scope\n"
    assert parse_kube_cgroup(guaranteed) == {"uid": UID, "qos": "guaranteed", "container_id": CID}
    besteffort = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{under}.slice/docker-{CID}.scope"
    assert parse_kube_cgroup(besteffort)["qos"] == "besteffort"
    # hangd in a pod of its own with hostPID and a private cgroup namespace sees the others' paths from its root
    seen_from_a_pod = f"0::/../../kubepods-burstable.slice/kubepods-burstable-pod{under}.slice/cri-containerd-{CID}.scope"
    assert parse_kube_cgroup(seen_from_a_pod) == {"uid": UID, "qos": "burstable", "container_id": CID}


def test_kubelet_cgroup_paths_with_the_cgroupfs_driver_v1():
    v1 = (f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n"
          "1:name=systemd:/kubepods/besteffort\n0::/\n")
    assert parse_kube_cgroup(v1) == {"uid": UID, "qos": "besteffort", "container_id": CID}
    assert parse_kube_cgroup(f"4:pids:/kubepods/pod{UID}/{CID}") == {"uid": UID, "qos": "guaranteed", "container_id": CID}
    # the pod's own cgroup (its sandbox, or a process the runtime put there): a uid, no container
    assert parse_kube_cgroup(f"0::/kubepods/burstable/pod{UID}") == {"uid": UID, "qos": "burstable"}


def test_cgroups_that_are_not_a_kubelet_s_give_no_pod():
    for text in ("0::/user.slice/user-1000.slice/session-3.scope", f"0::/system.slice/docker-{CID}.scope",
                 "0::/system.slice/slurmstepd.scope/job_4242/step_0", "0::/", "", "garbage"):
        assert parse_kube_cgroup(text) is None, text
    assert cgroup_paths("3:cpu:/a\n0::/b\n") == ["/b", "/a"]


def _pod_logs(tmp_path, containers=("trainer",), ids=(CID,)):
    pods = tmp_path / "log" / "pods"
    folder = pods / f"ml_train-llama-0_{UID}"
    for c in containers:
        (folder / c).mkdir(parents=True)
        (folder / c / "0.log").write_text("")
    (pods / f"other_train-llama-0_{UID[:-1]}0").mkdir()  # another pod of the same name elsewhere
    cdir = tmp_path / "log" / "containers"
    cdir.mkdir()
    for c, i in zip(containers, ids, strict=False):
        os.symlink(folder / c / "0.log", cdir / f"train-llama-0_ml_{c}-{i}.log")
    return str(pods)


def test_the_pod_is_named_from_its_log_folder_and_the_container_by_its_id(tmp_path):
    r = PodResolver(_pod_logs(tmp_path, containers=("trainer", "side-car"), ids=(CID, CID2)))
    got = r.resolve({"uid": UID, "container_id": CID2}, {})
    assert (got["name"], got["namespace"], got["container"]) == ("train-llama-0", "ml", "side-car")
    assert got["name_from"].endswith(f"ml_train-llama-0_{UID}")
    # two containers and no id to tell them apart: the pod, not the container
    got = PodResolver(r.log_dir).resolve({"uid": UID}, {})
    assert got["name"] == "train-llama-0" and "container" not in got


def test_the_downward_api_names_the_pod_before_the_log_folder(tmp_path):
    r = PodResolver(_pod_logs(tmp_path))
    got = r.resolve({"uid": UID}, {"POD_NAME": "from-env", "POD_NAMESPACE": "team-a"})
    assert (got["name"], got["namespace"], got["name_from"]) == ("from-env", "team-a", "environment POD_NAME")
    assert got["container"] == "trainer"  # the only container of the pod's folder


def test_a_pod_whose_name_cannot_be_known_says_why(tmp_path):
    got = PodResolver(str(tmp_path / "absent")).resolve({"uid": UID}, {})
    assert "name" not in got and "not readable here" in got["unresolved"]
    (tmp_path / "pods").mkdir()
    got = PodResolver(str(tmp_path / "pods")).resolve({"uid": UID}, {"HOSTNAME": "box"})
    assert f"no {tmp_path / 'pods'}/*_{UID} folder" in got["unresolved"]  # HOSTNAME outside Kubernetes is no pod name
    text = owner.describe({"pod": got})
    assert text.startswith(f"pod uid {UID}, name unknown: no ")
    got = PodResolver(str(tmp_path / "pods")).resolve({"uid": UID}, {"HOSTNAME": "train-0", "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert got["name"] == "train-0" and got["name_from"].startswith("environment HOSTNAME")


def test_owner_is_the_real_uid_by_name_and_the_uid_without_one():
    with open("/proc/self/status", "rb") as f:
        assert status_uid(f.read()) == os.getuid()
    assert user_name(os.getuid()) == pwd.getpwuid(os.getuid()).pw_name
    assert user_name(3_999_999) is None
    assert status_uid(b"Name:\tx\nUid:\t1001\t0\t0\t0\n") == 1001  # real, not effective (a setuid helper)
    h = [ProcHistory(pid=1, first_seen=0, info=ProcInfo(pid=1, uid=3_999_999))]
    assert owner.who(h)["user"] == "uid 3999999"
    assert owner.who([ProcHistory(pid=1, first_seen=0, info=ProcInfo(pid=1))]) == {}  # unknown, not guessed


def test_the_proc_source_reads_owner_slurm_and_pod_of_a_real_process(tmp_path):
    pods = _pod_logs(tmp_path)
    cg = tmp_path / "cgroup"
    cg.mkdir()
    env = dict(os.environ, SLURM_JOB_ID="1234", SLURM_JOB_NAME="train-llama", SLURM_JOB_ACCOUNT="ml",
               SLURM_JOB_PARTITION="gpu", SLURM_JOB_USER="alice", SLURM_JOB_PASSWORD="hunter22")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        (cg / str(p.pid)).write_text(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                                     f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n")
        src = ProcSource(cgroup_path=str(cg / "{pid}"), pod_log_dir=pods)
        info = src.read_info(p.pid)
        assert info is not None
        assert info.uid == os.getuid() and info.user == pwd.getpwuid(os.getuid()).pw_name
        assert info.pod == {"uid": UID, "qos": "burstable", "container_id": CID, "name": "train-llama-0",
                            "namespace": "ml", "container": "trainer", "name_from": f"{pods}/ml_train-llama-0_{UID}"}
        assert info.environ["SLURM_JOB_PASSWORD"] == "<redacted>"
        w = owner.who([ProcHistory(pid=p.pid, first_seen=0, info=info)])
        assert w["slurm"] == {"job_id": "1234", "user": "alice", "name": "train-llama", "account": "ml", "partition": "gpu"}
        user = info.user
        assert w["text"] == (f"owner {user}, Slurm job 1234 (train-llama, user alice, account ml, partition gpu), "
                             "pod ml/train-llama-0 (container trainer)")
        # without the test's path the real cgroup is read: this machine's is no kubelet's
        assert ProcSource(pod_log_dir=pods).read_info(p.pid).pod is None
    finally:
        p.kill()
        p.wait()


def test_traces_carry_owner_and_pod_and_old_ones_read_as_unknown(tmp_path):
    pod = {"uid": UID, "name": "train-llama-0", "namespace": "ml"}
    with TraceWriter(tmp_path / "t", {"scenario": "who"}) as w:
        w.write(Snapshot(t=1.0, infos=[ProcInfo(pid=7, ppid=1, uid=1001, user="alice", pod=pod)]))
    back = [i for s in TraceReader(tmp_path / "t").snapshots() for i in s.infos]
    assert [(i.uid, i.user, i.pod) for i in back] == [(1001, "alice", pod)]
    events = tmp_path / "t" / "trace.jsonl"
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    for ev in lines:
        for k in ("uid", "user", "pod"):
            ev.pop(k, None)
    events.write_text("".join(json.dumps(ev) + "\n" for ev in lines))
    back = [i for s in TraceReader(tmp_path / "t").snapshots() for i in s.infos]
    assert [(i.pid, i.uid, i.user, i.pod) for i in back] == [(7, None, None, None)]


def test_an_incident_names_whom_to_page_in_its_summary_evidence_and_labels():
    w = {"user": "alice", "uid": 1001, "slurm": {"job_id": "1234", "user": "alice", "name": "train-llama", "account": "ml",
                                                 "partition": "gpu"}}
    w["text"] = owner.describe(w)
    assert w["text"] == "owner alice, Slurm job 1234 (train-llama, account ml, partition gpu)"
    book = IncidentBook()
    book.who_of = {"slurm:1234": w}.get
    inc = book.open_incident("host_stall", "slurm:1234", 10.0)
    inc.summary = "rank 1 stopped."
    d = inc.to_dict()
    assert d["summary"] == "rank 1 stopped. Owner alice, Slurm job 1234 (train-llama, account ml, partition gpu)."
    assert d["evidence"]["who"] == w and d["who"] == w
    assert book.adopt(d).summary_with_who() == d["summary"]  # said once, also after a restart
    assert owner.labels(w) == ["alice", "1234", "", ""]
    assert owner.labels({"pod": {"uid": UID, "name": "x" * 300}})[3] == "x" * 128
