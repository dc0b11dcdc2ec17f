"""hangd's exit statuses, one meaning each, the same for every command (see ``hangd --help``)."""

from __future__ import annotations

OK = 0  # healthy, nothing found
FOUND = 1  # an incident or a finding is open (status, watch), or was found (replay, fr analyze)
USAGE = 2  # a bad flag, value, file or trace: one line on stderr says which
CANNOT_RUN = 3  # hangd cannot do its job here: no GPU visible and nothing else to watch, port busy
NO_DAEMON = 4  # status: this node's hangd serve did not answer, so its incidents are unknown (one line on stderr)

EPILOG = """exit status:
  0  healthy / nothing found
  1  an incident or a finding is open (or was found in a trace or dump)
  2  usage or input error (one line on stderr)
  3  cannot run here (GPUs cannot be seen and nothing else to watch, port busy,
     the database driver not installed, a schema newer than this hangd runs on)
  4  status: nothing found, but the node's hangd serve did not answer (its incidents are unknown)"""


class CannotRun(Exception):
    """hangd cannot work on this node as asked; the message says why and what to do (HINT)."""
