"""NCCL RAS: the parser on the answer a real NCCL 2.28.9 gave during a stall on 2 H200s, and the
query against a real TCP server speaking its plain-text protocol on loopback."""

from __future__ import annotations

import socket
import threading

from hangd.incidents import Incident
from hangd.replay import run_replay
from hangd.snapshot import RasReport, Snapshot
from hangd.sources.ras import parse_ras_text, query

from ..conftest import DATA

TEXT = (DATA / "ras" / "nccl-2.28.9-stall.txt").read_text()


def test_parse_real_answer():
    st = parse_ras_text(TEXT)
    assert st.version == "2.28.9" and st.op == "AllReduce"
    assert st.groups == [{"group": 0, "status": "RUNNING", "errors": "MISMATCH"}]
    assert [(x["rank"], x["op"], x["pid"]) for x in st.launched] == [(0, 749, 607), (1, 748, 608)]
    assert [x["rank"] for x in st.behind()] == [1]


def test_missing_rank_line():
    st = parse_ras_text("INCOMPLETE ... Missing communicator data from 1 rank -- GPU 1 managed by process 695 on node x")
    assert st.missing == [{"ranks": 1, "gpu": 1, "pid": 695}]


def test_query_speaks_the_protocol_over_loopback():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = []

    def serve() -> None:
        c, _ = srv.accept()
        got.append(c.recv(4096))
        c.sendall(TEXT.encode())
        c.close()

    th = threading.Thread(target=serve)
    th.start()
    out = query(srv.getsockname(), deadline_s=5)
    th.join(5)
    srv.close()
    assert got[0].startswith(b"CLIENT PROTOCOL 2\n") and b"VERBOSE STATUS" in got[0]
    assert out == TEXT
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    assert query(("127.0.0.1", port), deadline_s=2) is None


def _attached(text: str) -> Incident:
    """The replayed NCCL stall's incident, open, after a RAS answer with ``text`` arrived."""
    an, _ = run_replay(str(DATA / "traces" / "h200x2-live" / "nccl_stall"))
    inc = next(i for i in an.book.all if i.kind == "nccl_stall")
    inc.resolved_at = None
    an.book.open[(inc.job, "hang")] = inc
    inc.pids = [607, 608]
    an.step(Snapshot(t=an.view.t + 1, ras=[RasReport(format="text", text=text)]))
    return inc


def test_ras_view_is_attached_to_the_open_hang_incident():
    inc = _attached(TEXT)
    assert inc.evidence["nccl_ras"]["behind"][0]["rank"] == 1
    assert inc.evidence["nccl_ras"]["kind"] == "nccl_ras" and inc.evidence["nccl_ras"]["source"] == "nccl_ras"
    note = "NCCL RAS: rank 0 (pid 607) launched up to AllReduce #749; rank 1 (pid 608) launched up to AllReduce #748"
    assert inc.findings[-1] == {"kind": "ras_behind", "source": "nccl_ras", "ranks": [1], "pids": [608], "message": note}


def test_a_ras_answer_that_does_not_name_the_operation_says_operation():
    note = _attached(TEXT.replace("different AllReduce operation counts", "different counts")).findings[-1]["message"]
    assert note == "NCCL RAS: rank 0 (pid 607) launched up to operation #749; rank 1 (pid 608) launched up to operation #748"


TWO_BLOCKS = """#0-0 (32e308ccb1e360b9) MISMATCH
  Communicator ranks have different AllGather operation counts
  Rank 0 has launched up to operation 769 -- GPU 0 managed by process 716 on node 192.0.2.2
  Rank 1 has launched up to operation 768 -- GPU 1 managed by process 717 on node 192.0.2.2

  Communicator ranks have different AllReduce operation counts
  Rank 0 has launched up to operation 12304 -- GPU 0 managed by process 716 on node 192.0.2.2
  Rank 1 has launched up to operation 12288 -- GPU 1 managed by process 717 on node 192.0.2.2
"""


def test_counts_of_several_collectives_are_compared_each_with_its_own():
    # seen on 2 H200s (h200x2-more/hf_draft_thread): rank 1 behind in both its AllGather and its
    # AllReduce counts. Compared across the two, rank 0's 769 AllGathers were "behind" its 12304
    # AllReduces and both ranks were blamed
    st = parse_ras_text(TWO_BLOCKS)
    assert [x["rank"] for x in st.behind()] == [1]
    assert st.words() == ("NCCL RAS: rank 0 (pid 716) launched up to AllGather #769; rank 1 (pid 717) launched up to "
                          "AllGather #768; rank 0 (pid 716) launched up to AllReduce #12304; rank 1 (pid 717) launched "
                          "up to AllReduce #12288")
    ahead = TWO_BLOCKS.replace("operation 12288", "operation 12305")  # rank 0 behind in the second
    assert [x["rank"] for x in parse_ras_text(ahead).behind()] == [1, 0]


def test_the_rank_ras_counts_behind_is_the_culprit_where_the_stacks_cannot_tell():
    # a rank that skipped a step's all_reduce on NCCL: the collectives are queued on the GPU, so both
    # ranks' stacks wait at the same barrier after the loop; RAS's counts say which one launched fewer
    d = DATA / "traces" / "matrix-gpu" / "parent-train-skip-collective"
    an, _ = run_replay(str(d))
    (inc,) = [i for i in an.book.all if i.kind == "nccl_stall"]
    assert inc.culprit_ranks == [1], inc.summary
    assert "rank 1 (pid" in inc.summary and "is behind the others (NCCL RAS: " in inc.summary


def _mismatch(*lines: str) -> str:
    return ("#0-0 (a47557d5b3a9046e) MISMATCH\n  Communicator ranks have different AllReduce operation counts\n"
            + "".join(f"  {x}\n" for x in lines))


def _row(rank: int, op: int | None, pid: int) -> str:
    launched = f" has launched up to operation {op}" if op is not None else ""
    return f"Rank {rank}{launched} -- GPU 0 managed by process {pid} on node 127.0.0.1"


def test_a_rank_far_behind_a_count_several_ranks_share_is_behind():
    # NCCL prints "N ranks have launched up to operation X" for a count several ranks share, and a
    # rank of a count of its own on its line: eight ranks on one GPU (matrix-gpu
    # mpargv-warmup-stuck-socket_recv-w8), rank 7 stuck in its own code 95 all-reduces back while
    # the others' launches queue up
    st = parse_ras_text(_mismatch("4 ranks have launched up to operation 215", "3 ranks have launched up to operation 216",
                                  _row(0, None, 1910), _row(1, None, 1911), _row(6, None, 1916), _row(7, 121, 1917)))
    assert [(x["rank"], x["pid"]) for x in st.behind()] == [(7, 1917)]
    assert st.shared == [{"ranks": 4, "op": 215}, {"ranks": 3, "op": 216}]
    # four ranks, seven: the same however many share the count
    st = parse_ras_text(_mismatch("7 ranks have launched up to operation 167", _row(7, 121, 1269)))
    assert [x["rank"] for x in st.behind()] == [7]


def test_a_spread_of_one_operation_against_a_shared_count_names_no_one():
    # RAS samples ranks that launch as it asks: a healthy eight-rank warm-up shows two ranks one
    # broadcast behind six (matrix-gpu mpargv-warmup-none-w8), and a rank one ahead is no culprit
    healthy = _mismatch("6 ranks have launched up to operation 175", "2 ranks have launched up to operation 174",
                        _row(0, None, 890), _row(7, None, 897))
    assert parse_ras_text(healthy).behind() == []
    assert parse_ras_text(_mismatch("3 ranks have launched up to operation 97", _row(3, 96, 1744))).behind() == []
    assert parse_ras_text(_mismatch("7 ranks have launched up to operation 192", _row(7, 193, 2177))).behind() == []
