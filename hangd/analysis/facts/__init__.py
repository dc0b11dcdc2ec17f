"""Facts: what one record of evidence says, as pure functions, one module per evidence family.

A fact answers one question about a rank (its GPU works, bytes move in, its stack waits in a
collective) from plain records alone: this tick's ``ProcSignals``, what the engine knows of the
rank besides (``Context``: its stack's verdict while it still describes it, whose is the other end
of what its main thread sleeps on) and ``Thresholds``. None reads /proc or NVML, none keeps state,
none encodes a rank count, a launcher or a topology. A signal that could not be read counts as not
moving: a missing reading never makes a rank look at work.

The reading of a rank is the first row of ``rankstate.READING`` whose facts hold; the families:

    gpu     its own kernels running, spinning, capturing in short bursts
    io      bytes through any counter, either way: loading, writing, a transport's bytes
    stack   the phase its stack names: computing, loading, compiling, graph capture, a wait
    waits   what it waits on by its descriptors and its kernel wait point
    cpu     its own code on the CPU: running, starved of cores, moving host memory
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hangd.analysis import otherend, stackcat
from hangd.analysis.signals import ProcSignals
from hangd.analysis.thresholds import Thresholds


@dataclass(frozen=True, slots=True)
class Context:
    """What the engine knows about a process besides this tick's signals."""

    verdict: stackcat.Verdict = stackcat.UNKNOWN  # its stack's verdict, only while it still describes it
    progressed_recently: bool = False  # strong progress within the window
    progress_why: str = ""
    # whose is the other end of the descriptors its main thread sleeps on (otherend.py); None: unknown
    other_end: otherend.OtherEnd | None = None
    # its newest stack, taken after it was last seen compiling, shows its main thread in its own
    # code outside the compiler: compilers still at work under it compile in the background
    out_of_compile: bool = False
    # an exception line came in its job's logs as the job went still (report.exception_as_it_stopped)
    exception_as_it_stopped: bool = False


@dataclass(frozen=True, slots=True)
class RankIn:
    """The plain record a rank's reading facts read: its signals, its context, the thresholds."""

    s: ProcSignals
    ctx: Context
    th: Thresholds


Fact = Callable[[RankIn], bool]
