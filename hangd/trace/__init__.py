"""The ``hangd-trace/1`` format: snapshots to events and back.

A trace directory holds ``meta.json``, ``trace.jsonl`` or ``trace.jsonl.gz`` (events sorted by
``t``), optionally ``truth.jsonl``, and ``files/`` with the stack dumps, flight-recorder dumps and
logs the events point to (tests/data/traces/FORMAT.md). A reader ignores event kinds and fields
it does not know.

    schema      the events' types, checked with pydantic; TraceError
    reader      TraceReader: a directory -> snapshots, every file opened as untrusted
    writer      TraceWriter: snapshots -> a directory
    redaction   what a trace shares is redacted (dump strings, log lines of the same size)
"""

from hangd.trace.reader import (
           LOG_TAIL_BYTES,
           MAX_FILE_BYTES,
           MAX_LINE_BYTES,
           TraceReader,
           events_file,
           open_regular,
)
from hangd.trace.redaction import copy_redacted, redact_line_same_size
from hangd.trace.schema import FORMAT, MAX_INT, TraceError, loads
from hangd.trace.writer import TraceWriter

__all__ = ["FORMAT", "LOG_TAIL_BYTES", "MAX_FILE_BYTES", "MAX_INT", "MAX_LINE_BYTES", "TraceError", "TraceReader",
           "TraceWriter", "copy_redacted", "events_file", "loads", "open_regular", "redact_line_same_size"]
