"""What a trace shares is redacted: dump strings, log lines (each keeping its byte size).

Sources redact where data enters; a recording is attached to bug reports and fetched from other
hosts, so the reader and the writer redact again what they read and write."""

from __future__ import annotations

import os
from typing import Any

from hangd.redact import redact_text


def redact_strings(v: Any, memo: dict[str, str]) -> Any:
    """Every string of a JSON value through ``redact_text``, dict keys included: a dump's group
    names are keys of its pg_config and values of its entries, and must stay equal. Unlike
    ``redact_obj`` no value is replaced by its key's name: a group called "auth" keeps its shape.
    ``memo``: a dump repeats the same few names thousands of times."""
    if isinstance(v, str):
        out = memo.get(v)
        if out is None:
            out = memo[v] = redact_text(v)
        return out
    if isinstance(v, dict):
        return {redact_strings(k, memo): redact_strings(x, memo) for k, x in v.items()}
    if isinstance(v, list):
        return [redact_strings(x, memo) for x in v]
    return v


def _has_text(v: Any) -> bool:
    if type(v) is list:
        return any(type(x) is not int and _has_text(x) for x in v)
    return isinstance(v, str)


def redact_dump(head: dict[str, Any], rows: list[dict[str, Any]], memo: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A dump's rows (``hangd.flightrec.rows``) with every string through ``redact_text``: the
    same as ``redact_strings`` over all of it, walking only the fields that hold text (a dump
    has up to a thousand rows, each mostly numbers)."""
    out = []
    for r in rows:
        r = dict(r)
        for k in ("pg", "op", "state"):
            if isinstance(r.get(k), str):
                r[k] = redact_strings(r[k], memo)
        dtypes = r.get("input_dtypes")
        if type(dtypes) is list:
            r["input_dtypes"] = [redact_strings(x, memo) for x in dtypes]
        for k in ("input_sizes", "output_sizes"):
            if _has_text(r.get(k)):
                r[k] = redact_strings(r[k], memo)
        out.append(r)
    return redact_strings(head, memo), out


def redact_line_same_size(line: bytes) -> bytes:
    """One log line through ``redact_text``, padded with spaces or cut to its original length.
    ``file`` events give log sizes as byte offsets into the copy, so every line keeps its size;
    text that is not UTF-8 passes through as it was (surrogateescape)."""
    body = line.rstrip(b"\r\n")
    end = line[len(body):]
    out = redact_text(body.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
    if out == body:
        return line
    return out[: len(body)].ljust(len(body), b" ") + end


def copy_redacted(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copy a log for a recording, every line redacted, every byte offset kept."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        for line in fi:
            fo.write(redact_line_same_size(line))
