"""The ``hangd-trace/1`` schema, checked with pydantic.

A trace is untrusted input (attached to a bug, fetched from another host): every value is checked
against the type its record declares before it reaches the analysis, so a malformed trace fails
here, in one place, as a one-line ``TraceError``, never later as a TypeError deep in a detector.

The events of kind ``gpu``, ``proc`` and ``proc_info`` are the snapshot records
(``hangd.snapshot``): their schema is derived from those dataclasses' type hints, so a field
added there is checked here. The other kinds are as tests/data/traces/FORMAT.md defines them.
Checks are strict (``"5"`` is no int, ``true`` no number), numbers are finite, integers fit a
64-bit column; a field the schema does not name is ignored, as a reader ignores what it does not
know. Only the check is pydantic's: the reader goes on with the event's own dict.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from typing import Annotated, Any, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
)

from hangd.snapshot import FdWait, GpuProc, GpuSample, ProcInfo, ProcSample, RemoteRank

FORMAT = "hangd-trace/1"
MAX_INT = 2**63 - 1  # what a database column holds


class TraceError(Exception):
    """A trace that cannot be read (missing, malformed, mistyped): says which file, line and why."""


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number a trace may hold")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN and Infinity. A number that overflows (``1e999``) still
    parses to infinity: the schema refuses it wherever it lands."""
    return _DECODER.decode(text.decode("utf-8") if isinstance(text, bytes) else text)


def kind_of(v: Any) -> str:
    return "null" if v is None else type(v).__name__


# ---------------------------------------------------------------- the value types


def _finite_json(v: Any, depth: int = 0) -> bool:
    if type(v) is float:
        return math.isfinite(v)
    if type(v) is list:
        return depth < 64 and all(_finite_json(x, depth + 1) for x in v)
    if type(v) is dict:
        return depth < 64 and all(_finite_json(x, depth + 1) for x in v.values())
    return True


def _json(v: Any) -> Any:
    if not _finite_json(v):
        raise ValueError("holds a number that is not finite, or is nested more than 64 deep")
    return v


def is_shape(v: Any, depth: int = 0) -> bool:
    """A tensor shape as the flight-recorder reader normalizes it: nested lists of numbers a
    64-bit counter holds (or names), so that it can be printed and compared."""
    if type(v) is list:
        if depth >= 16:
            return False
        for x in v:  # a loop, not all(): a dump has thousands of shapes, mostly of ints
            if type(x) is int:
                if not -MAX_INT <= x <= MAX_INT:
                    return False
            elif not is_shape(x, depth + 1):
                return False
        return True
    return v is None or type(v) in (str, bool) or (type(v) is int and -MAX_INT <= v <= MAX_INT) \
        or (type(v) is float and math.isfinite(v))


def _shapes(v: Any) -> Any:
    if v is not None and (type(v) is not list or not is_shape(v)):
        raise ValueError("not a list of shapes of 64-bit sizes")
    return v


Int64 = Annotated[int, Field(ge=-MAX_INT, le=MAX_INT)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Json = Annotated[Any, AfterValidator(_json)]  # any JSON value, its numbers finite
Shapes = Annotated[Any, AfterValidator(_shapes)]

STRICT = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


def _typed(hint: Any) -> Any:
    """A record's type hint as the schema checks it: ints of 64 bits, finite floats, JSON."""
    if hint is Any:
        return Json
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return Union[tuple(_typed(a) for a in typing.get_args(hint))]  # noqa: UP007 - built from parts
    if hint is int:
        return Int64
    if hint is float:
        return Finite
    if origin is list:
        return list[_typed((typing.get_args(hint) or (Any,))[0])]  # type: ignore[misc]
    if origin is dict:
        k, v = typing.get_args(hint) or (Any, Any)
        return dict[_typed(k), _typed(v)]  # type: ignore[misc]
    return hint  # bool, str, None


def _not_none(hint: Any) -> Any:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return Union[tuple(rest)] if len(rest) > 1 else rest[0]  # noqa: UP007
    return hint


def model(name: str, hints: dict[str, Any], required: set[str] = frozenset(),  # type: ignore[assignment]
          **given: Any) -> type[BaseModel]:
    """A strict model of ``hints`` (plain type hints) and ``given`` (types the schema already
    gives, e.g. other models): a required field must be there and not null; the others may be
    absent (null only where the hint says so; a given one may always be null)."""
    fields: dict[str, Any] = {}
    for k, h in hints.items():
        fields[k] = (_typed(_not_none(h)), ...) if k in required else (_typed(h), None)
    for k, h in given.items():
        fields[k] = (h, ...) if k in required else (h | None, None)
    return create_model(name, __config__=STRICT, **fields)


def hints_of(cls: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in skip}


def required_of(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


# ---------------------------------------------------------------- the records

GPU_FIELDS = hints_of(GpuSample, skip=("procs",))
PROC_FIELDS = hints_of(ProcSample, skip=("fd_waits",))
INFO_FIELDS = hints_of(ProcInfo)
REMOTE_FIELDS = hints_of(RemoteRank)
FDWAIT_FIELDS = hints_of(FdWait)

_ENVELOPE = {"t": (Annotated[float, Field(ge=0, allow_inf_nan=False)], ...), "kind": (str, ...)}


def _event(kind: str, hints: dict[str, Any], required: set[str], **given: Any) -> type[BaseModel]:
    m = model(f"{kind}_event", hints, required, **given)
    return create_model(f"{kind}_event", __base__=m, **_ENVELOPE)  # type: ignore[call-overload]


GpuProcRecord = model("gpu_proc", hints_of(GpuProc), {"pid"})
FdWaitRecord = model("fd_wait", FDWAIT_FIELDS, {"fd", "kind"})
RemoteRankRecord = model("remote_rank", REMOTE_FIELDS,
                         required_of(RemoteRank) - {"rank", "state", "reason", "waits", "last_progress"})
# one item of a remote_dumps event: the file it names holds a dump in the rows a shared store
# keeps (hangd.flightrec.rows), checked against the types hangd.flightrec.reader.normalize gives
RemoteDumpItem = model("remote_dump", {"job": str, "node": str, "rank": int, "read_at": float, "reported_at": float,
                                       "file": str}, {"job", "node", "rank", "read_at", "reported_at", "file"})

EVENTS: dict[str, type[BaseModel]] = {
    "gpu": _event("gpu", GPU_FIELDS, required_of(GpuSample), procs=list[GpuProcRecord]),  # type: ignore[valid-type]
    "proc": _event("proc", PROC_FIELDS, required_of(ProcSample), fd_waits=list[FdWaitRecord]),  # type: ignore[valid-type]
    "proc_info": _event("proc_info", INFO_FIELDS, required_of(ProcInfo)),
    "file": _event("file", {"path": str, "size": int | None}, {"path"}),
    "stack": _event("stack", {"pid": int, "tool": str, "native": bool | None, "format": str, "seconds": float | None,
                              "file": str | None, "error": str | None}, {"pid"}),
    "fr_dump": _event("fr_dump", {"pid": int | None, "rank": int | None, "format": str, "file": str | None,
                                  "source": str}, set()),
    "nccl_ras": _event("nccl_ras", {"format": str, "file": str | None}, set()),
    "action": _event("action", {"what": str, "pid": int | None}, {"what"}),
    "unavailable": _event("unavailable", {"source": str, "why": str}, {"source", "why"}),
    "remote": _event("remote", {"node": str | None}, {"ranks"}, ranks=list[RemoteRankRecord]),  # type: ignore[valid-type]
    "remote_dumps": _event("remote_dumps", {}, {"dumps"}, dumps=list[RemoteDumpItem]),  # type: ignore[valid-type]
}
ANY_EVENT = create_model("event", __config__=STRICT, **_ENVELOPE)  # type: ignore[call-overload]

Meta = model("meta", {"format": str, "t_start": float | None, "t_end": float | None, "log_files": dict[str, str] | None,
                      "ranks": dict[str, int] | None, "world_size": int | None, "gpus": list[dict[str, Any]] | None,
                      "sample_hz": float | None})

_PgConfig = model("pg_config", {"pg_id": str | int | None, "desc": str | None, "ranks": list[int] | None})
DumpHead = model("remote_dump_head", {"version": str | None, "pg_status": dict[str, dict[str, int | None]] | None,
                                      "entries": int | None}, pg_config=dict[str, _PgConfig])  # type: ignore[valid-type]
ROW_FIELDS: dict[str, Any] = {
    "pg": str, "pg_id": int | None, "seq": int | None, "p2p_seq": int | None, "op": str, "state": str,
    "completed": bool, "is_p2p": bool, "input_sizes": Shapes, "input_dtypes": list[str] | None,
    "output_sizes": Shapes, "time_created_ns": int | None,
}
_DumpRow = model("remote_dump_row", {k: h for k, h in ROW_FIELDS.items() if h is not Shapes},
                 {"pg", "op", "state", "completed", "is_p2p"}, input_sizes=Shapes, output_sizes=Shapes)
DumpRows: TypeAdapter[Any] = TypeAdapter(list[_DumpRow])  # type: ignore[valid-type]


# ---------------------------------------------------------------- checking


def check(schema: type[BaseModel] | TypeAdapter[Any], value: Any, where: str) -> None:
    """Raise a one-line TraceError naming the first field of ``value`` that does not fit."""
    try:
        if isinstance(schema, TypeAdapter):
            schema.validate_python(value)
        else:
            schema.model_validate(value)
    except ValidationError as e:
        raise TraceError(f"{where}: {_first(e)}") from None


def _first(e: ValidationError) -> str:
    err = e.errors(include_url=False)[0]
    loc = [str(x) for x in err.get("loc", ())]
    if len(loc) > 1 and loc[0].isdigit():  # an item of a list of records: "entry 3"
        return f"entry {loc[0]}: {_field(loc[1:], err)}"
    return _field(loc, err)


def _field(loc: list[str], err: Any) -> str:
    name = ".".join(loc) or "value"
    got = err.get("input")
    if err.get("type") == "missing":
        return f"missing field {name!r}"
    if got is None and str(err.get("type", "")).endswith("_type"):
        return f"missing field {name!r} (it is null)"
    if loc == ["t"]:
        return f"'t' must be a finite number of seconds, not {kind_of(got)} {str(got)[:40]}"
    if loc == ["kind"]:
        return f"'kind' must be a string, not {kind_of(got)}"
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ").replace("\n", " ")
    return f"field {name!r} is {kind_of(got)}: {msg[:200]}"


def check_event(ev: Any, where: str) -> None:
    """One event: an object with a finite ``t`` >= 0, a string ``kind``, and, for a kind the
    format defines, fields of the types it gives."""
    if not isinstance(ev, dict):
        raise TraceError(f"{where}: an event is a JSON object, not {kind_of(ev)}")
    kind = ev.get("kind")
    schema = EVENTS.get(kind) if isinstance(kind, str) else None
    check(schema or ANY_EVENT, ev, where if schema is None else f"{where} ({kind})")
