"""A restricted pickle decoder: plain containers and scalars only, nothing is imported or called.

Flight-recorder dumps are pickles, and ``pickle.load`` runs whatever a pickle asks for. hangd
often runs as root, so it never unpickles: this module reads the opcodes itself and builds
dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None. Any opcode that would
import or call (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT*, PERSID,
BINPERSID, out-of-band buffers) makes it refuse the whole file before anything is built from it.
"""

from __future__ import annotations

import ast
import struct
from typing import Any

FORBIDDEN = {
    ord("c"): "GLOBAL", 0x93: "STACK_GLOBAL", ord("R"): "REDUCE", ord("b"): "BUILD", ord("i"): "INST",
    ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4",
    ord("P"): "PERSID", ord("Q"): "BINPERSID", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}
MAX_STACK = 10_000_000


class UnsafePickle(ValueError):
    """The pickle asks to import or call something: refused, nothing was run."""


class BadPickle(ValueError):
    """Truncated, empty or malformed data."""


class _Mark:
    __slots__ = ()


_MARK = _Mark()
_I4 = struct.Struct("<i")
_U4 = struct.Struct("<I")
_U8 = struct.Struct("<Q")
_F8 = struct.Struct(">d")


def _hashable(k: Any) -> Any:
    if isinstance(k, list):
        return tuple(_hashable(x) for x in k)
    if isinstance(k, dict | set):
        raise BadPickle("unhashable dict key")
    return k


def safe_loads(data: bytes) -> Any:  # noqa: C901 - one flat dispatch loop
    """Decode ``data`` like ``pickle.loads`` would for plain data; raise UnsafePickle for anything
    that imports or calls, BadPickle for broken input."""
    if not data:
        raise BadPickle("empty file")
    mv = memoryview(data)
    n = len(data)
    pos = 0
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}

    def take(k: int) -> bytes:
        nonlocal pos
        if pos + k > n:
            raise BadPickle(f"truncated pickle at byte {pos}")
        b = bytes(mv[pos : pos + k])
        pos += k
        return b

    def line() -> bytes:
        nonlocal pos
        end = data.find(b"\n", pos)
        if end < 0:
            raise BadPickle(f"truncated pickle at byte {pos}")
        b = data[pos:end]
        pos = end + 1
        return b

    def pop_mark() -> list[Any]:
        if not marks:
            raise BadPickle("MARK missing")
        i = marks.pop()
        items = stack[i:]
        del stack[i:]
        return items

    append = stack.append
    try:
        while True:
            if pos >= n:
                raise BadPickle("truncated pickle: no STOP opcode")
            op = data[pos]
            at = pos
            pos += 1
            # the opcodes flight-recorder dumps are made of, first and inline (decoding speed)
            if op == 0x68:  # BINGET
                append(memo[data[pos]])
                pos += 1
                continue
            if op == 0x94:  # MEMOIZE
                memo[len(memo)] = stack[-1]
                continue
            if op == 0x4B:  # BININT1
                append(data[pos])
                pos += 1
                continue
            if op == 0x8C:  # SHORT_BINUNICODE
                k = data[pos]
                b = data[pos + 1 : pos + 1 + k]
                if len(b) != k:
                    raise BadPickle(f"truncated pickle at byte {pos}")
                append(b.decode("utf-8", "surrogatepass"))
                pos += 1 + k
                continue
            if op == 0x5D:  # EMPTY_LIST
                append([])
                continue
            if op == 0x7D:  # EMPTY_DICT
                append({})
                continue
            if op == 0x28:  # MARK
                marks.append(len(stack))
                continue
            if op in FORBIDDEN:
                raise UnsafePickle(
                    f"refused: opcode {FORBIDDEN[op]} at byte {at} would import or call code; "
                    "a flight-recorder dump holds plain data only"
                )
            if op == 0x80:  # PROTO
                pos += 1
            elif op == 0x95:  # FRAME
                pos += 8
            elif op == 0x2E:  # STOP
                if len(stack) != 1 or marks:
                    raise BadPickle("malformed pickle: stack not balanced at STOP")
                return stack[0]
            elif op == 0x28:  # MARK
                marks.append(len(stack))
            elif op == 0x30:  # POP
                if marks and marks[-1] == len(stack):
                    marks.pop()
                else:
                    stack.pop()
            elif op == 0x31:  # POP_MARK
                pop_mark()
            elif op == 0x32:  # DUP
                stack.append(stack[-1])
            elif op == 0x4E:  # NONE
                stack.append(None)
            elif op == 0x88:
                stack.append(True)
            elif op == 0x89:
                stack.append(False)
            elif op == 0x4B:  # BININT1
                stack.append(take(1)[0])
            elif op == 0x4D:  # BININT2
                stack.append(int.from_bytes(take(2), "little"))
            elif op == 0x4A:  # BININT
                stack.append(_I4.unpack(take(4))[0])
            elif op == 0x8A:  # LONG1
                k = take(1)[0]
                stack.append(int.from_bytes(take(k), "little", signed=True))
            elif op == 0x8B:  # LONG4
                k = _I4.unpack(take(4))[0]
                if k < 0:
                    raise BadPickle("negative LONG4 length")
                stack.append(int.from_bytes(take(k), "little", signed=True))
            elif op == 0x47:  # BINFLOAT
                stack.append(_F8.unpack(take(8))[0])
            elif op == 0x8C:  # SHORT_BINUNICODE
                k = take(1)[0]
                stack.append(take(k).decode("utf-8", "surrogatepass"))
            elif op == 0x58:  # BINUNICODE
                k = _U4.unpack(take(4))[0]
                stack.append(take(k).decode("utf-8", "surrogatepass"))
            elif op == 0x8D:  # BINUNICODE8
                k = _U8.unpack(take(8))[0]
                stack.append(take(k).decode("utf-8", "surrogatepass"))
            elif op == 0x43:  # SHORT_BINBYTES
                k = take(1)[0]
                stack.append(take(k))
            elif op == 0x42:  # BINBYTES
                stack.append(take(_U4.unpack(take(4))[0]))
            elif op in (0x8E, 0x96):  # BINBYTES8, BYTEARRAY8
                stack.append(take(_U8.unpack(take(8))[0]))
            elif op == 0x55:  # SHORT_BINSTRING
                k = take(1)[0]
                stack.append(take(k).decode("latin-1"))
            elif op == 0x54:  # BINSTRING
                k = _I4.unpack(take(4))[0]
                stack.append(take(k).decode("latin-1"))
            elif op == 0x49:  # INT (text)
                s = line().strip()
                stack.append(True if s == b"01" else False if s == b"00" else int(s))
            elif op == 0x4C:  # LONG (text)
                stack.append(int(line().strip().rstrip(b"L")))
            elif op == 0x46:  # FLOAT (text)
                stack.append(float(line()))
            elif op == 0x53:  # STRING (text, a Python literal)
                v = ast.literal_eval(line().decode("latin-1"))
                if not isinstance(v, str | bytes):
                    raise BadPickle("STRING is not a string literal")
                stack.append(v)
            elif op == 0x56:  # UNICODE (text)
                stack.append(line().decode("raw-unicode-escape"))
            elif op == 0x5D:  # EMPTY_LIST
                stack.append([])
            elif op == 0x29:  # EMPTY_TUPLE
                stack.append(())
            elif op == 0x7D:  # EMPTY_DICT
                stack.append({})
            elif op == 0x8F:  # EMPTY_SET
                stack.append(set())
            elif op == 0x61:  # APPEND
                v = stack.pop()
                lst = stack[-1]
                if not isinstance(lst, list):
                    raise BadPickle("APPEND to a non-list")
                lst.append(v)
            elif op == 0x65:  # APPENDS
                items = pop_mark()
                lst = stack[-1]
                if not isinstance(lst, list):
                    raise BadPickle("APPENDS to a non-list")
                lst.extend(items)
            elif op == 0x6C:  # LIST
                stack.append(pop_mark())
            elif op == 0x74:  # TUPLE
                stack.append(tuple(pop_mark()))
            elif op == 0x85:
                stack[-1:] = [(stack[-1],)]
            elif op == 0x86:
                if len(stack) < 2:
                    raise BadPickle("stack underflow")
                stack[-2:] = [(stack[-2], stack[-1])]
            elif op == 0x87:
                if len(stack) < 3:
                    raise BadPickle("stack underflow")
                stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
            elif op == 0x64:  # DICT
                items = pop_mark()
                stack.append({_hashable(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)})
            elif op == 0x73:  # SETITEM
                v = stack.pop()
                k = stack.pop()
                d = stack[-1]
                if not isinstance(d, dict):
                    raise BadPickle("SETITEM on a non-dict")
                d[_hashable(k)] = v
            elif op == 0x75:  # SETITEMS
                items = pop_mark()
                d = stack[-1]
                if not isinstance(d, dict):
                    raise BadPickle("SETITEMS on a non-dict")
                for i in range(0, len(items) - 1, 2):
                    d[_hashable(items[i])] = items[i + 1]
            elif op == 0x90:  # ADDITEMS
                items = pop_mark()
                st = stack[-1]
                if not isinstance(st, set):
                    raise BadPickle("ADDITEMS on a non-set")
                st.update(_hashable(x) for x in items)
            elif op == 0x91:  # FROZENSET
                stack.append(frozenset(_hashable(x) for x in pop_mark()))
            elif op == 0x94:  # MEMOIZE
                memo[len(memo)] = stack[-1]
            elif op == 0x71:  # BINPUT
                memo[take(1)[0]] = stack[-1]
            elif op == 0x72:  # LONG_BINPUT
                memo[_U4.unpack(take(4))[0]] = stack[-1]
            elif op == 0x70:  # PUT
                memo[int(line())] = stack[-1]
            elif op == 0x68:  # BINGET
                stack.append(memo[take(1)[0]])
            elif op == 0x6A:  # LONG_BINGET
                stack.append(memo[_U4.unpack(take(4))[0]])
            elif op == 0x67:  # GET
                stack.append(memo[int(line())])
            else:
                raise UnsafePickle(f"refused: unknown opcode 0x{op:02x} at byte {at}")
            if len(stack) > MAX_STACK:
                raise BadPickle("stack too deep")
    except (UnsafePickle, BadPickle):
        raise
    except (ValueError, IndexError, KeyError, TypeError, AttributeError, SyntaxError, MemoryError,
            RecursionError, struct.error, UnicodeDecodeError) as e:
        raise BadPickle(f"malformed or truncated pickle: {type(e).__name__}: {e}") from e
