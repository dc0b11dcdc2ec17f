"""A restricted pickle decoder: plain containers and scalars only, nothing is imported or called.

Flight-recorder dumps are pickles, and ``pickle.load`` runs whatever a pickle asks for. hangd
often runs as root, so it decodes with a ``pickle.Unpickler`` whose ``find_class`` and
``persistent_load`` refuse everything: a pickle can then only build dicts, lists, tuples, sets,
strings, bytes, numbers, booleans and None.

One construct gets past ``find_class``: the EXT1/EXT2/EXT4 opcodes. The C unpickler looks an
extension code up in ``copyreg``'s cache *before* it calls ``find_class``, so once any code in the
process has loaded a registered extension, a hostile dump naming the same code gets the cached
callable without being asked about it (and REDUCE then calls it). So every opcode is first read by
``pickletools.genops`` (which reads, never builds), and a pickle holding any opcode that would import
or call (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT*, PERSID,
BINPERSID, out-of-band buffers) is refused whole before the unpickler sees a byte of it.

The decoded value is then walked once: nesting deeper than ``MAX_DEPTH`` or a container that
appears twice (shared or self-referencing, which the memo allows) is refused, so later code can
recurse over the value and copy it without running out of stack or memory.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any, NoReturn

MAX_BYTES = 64 * 1024 * 1024
# Real dumps nest five deep (dump -> entries -> entry -> input_sizes -> shape); 32 leaves room for
# schema growth and stays far below the interpreter's recursion limit.
MAX_DEPTH = 32

FORBIDDEN = frozenset({
    "GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX",
    "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "NEXT_BUFFER", "READONLY_BUFFER",
})


class UnsafePickle(ValueError):
    """The pickle asks to import or call something: refused, nothing was run."""


class BadPickle(ValueError):
    """Truncated, empty, malformed, too large or too deeply nested data."""


class _PlainUnpickler(pickle.Unpickler):
    """Second line of defence: the opcode scan already refused what reaches these."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise UnsafePickle(f"refused: the pickle asks for {module}.{name}; "
                           "a flight-recorder dump holds plain data only")

    def persistent_load(self, pid: Any) -> NoReturn:
        raise UnsafePickle("refused: the pickle asks for a persistent object; "
                           "a flight-recorder dump holds plain data only")


def _scan(data: bytes) -> None:
    """Refuse a forbidden opcode anywhere in ``data``; report broken opcode streams."""
    puts = 0
    try:
        for op, arg, pos in pickletools.genops(data):
            if op.name in FORBIDDEN:
                raise UnsafePickle(
                    f"refused: opcode {op.name} at byte {pos} would import or call code; "
                    "a flight-recorder dump holds plain data only"
                )
            if op.name in _PUTS:
                # The C unpickler grows its memo table to twice the index it is given and zeroes
                # it: LONG_BINPUT 2**31 alone would touch 32 GiB. A pickler numbers memo slots
                # 0, 1, 2, ... so an index beyond the slots used so far is refused.
                if op.name != "MEMOIZE" and (not isinstance(arg, int) or arg > puts):
                    raise BadPickle(f"memo index {arg} at byte {pos} is out of order")
                puts += 1
    except (UnsafePickle, BadPickle):
        raise
    except (ValueError, UnicodeDecodeError, IndexError) as e:
        # genops says "truncated", "at position N, opcode ... unknown", "no STOP"
        raise BadPickle(f"malformed or truncated pickle: {e}") from e


_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})
_CONTAINERS = (list, tuple, dict, set, frozenset)


def _kids(v: Any) -> list[Any]:
    return [x for kv in v.items() for x in kv] if isinstance(v, dict) else list(v)


def max_nodes_for(size: int) -> int:
    """How many values (counting a shared one once per place it appears) ``size`` bytes may
    decode to. Real dumps decode to under one value per byte, shared stack frames included."""
    return max(1_000_000, 4 * size)


def check_tree(value: Any, max_depth: int = MAX_DEPTH, max_nodes: int = 1_000_000) -> None:
    """Raise BadPickle if ``value`` nests deeper than ``max_depth``, contains itself, or would
    grow past ``max_nodes`` values when written out as a tree.

    Torch's pickler shares identical stack frames between entries, so a container may appear
    more than once; the memo also allows a list to contain itself and ``[x, x]`` nested 30 deep
    (a billion values from a few hundred bytes). Later code recurses over and copies parts of the
    value, so all three are refused here. Iterative, so the check cannot overflow the stack."""
    if not isinstance(value, _CONTAINERS) or not value:
        return
    done: dict[int, int] = {}  # id -> values in that subtree, written out
    on_path: set[int] = {id(value)}
    stack: list[list[Any]] = [[value, _kids(value), 0, 1]]  # node, children, next child, count
    while stack:
        top = stack[-1]
        node, kids, i, count = top
        if i == len(kids):
            stack.pop()
            on_path.discard(id(node))
            done[id(node)] = count
            if stack:
                stack[-1][3] += count
                if stack[-1][3] > max_nodes:
                    raise BadPickle(f"decodes to more than {max_nodes} values; refused")
            continue
        top[2] = i + 1
        k = kids[i]
        if not isinstance(k, _CONTAINERS) or not k:
            top[3] += 1  # a scalar, or an empty container (those are shared singletons)
        elif id(k) in on_path:
            raise BadPickle("a container contains itself; a flight-recorder dump is a plain tree")
        elif id(k) in done:
            top[3] += done[id(k)]
        elif len(stack) >= max_depth:
            raise BadPickle(f"nested more than {max_depth} deep; a flight-recorder dump is a shallow tree")
        else:
            on_path.add(id(k))
            stack.append([k, _kids(k), 0, 1])
            continue
        if top[3] > max_nodes:
            raise BadPickle(f"decodes to more than {max_nodes} values; refused")


def safe_loads(data: bytes, max_bytes: int = MAX_BYTES) -> Any:
    """Decode ``data`` like ``pickle.loads`` would for plain data; raise UnsafePickle for anything
    that imports or calls, BadPickle for broken, oversized or too deeply nested input."""
    if not data:
        raise BadPickle("empty file")
    if len(data) > max_bytes:
        raise BadPickle(f"{len(data)} bytes is over the {max_bytes}-byte cap")
    _scan(data)
    try:
        value = _PlainUnpickler(io.BytesIO(data), buffers=()).load()
    except UnsafePickle:
        raise
    except (pickle.UnpicklingError, ValueError, EOFError, IndexError, KeyError, TypeError,
            AttributeError, MemoryError, RecursionError, OverflowError, UnicodeDecodeError) as e:
        raise BadPickle(f"malformed pickle: {type(e).__name__}: {e}") from e
    check_tree(value, max_nodes=max_nodes_for(len(data)))
    return value
