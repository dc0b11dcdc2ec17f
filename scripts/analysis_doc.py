"""docs/analysis.md's tables, generated from the code's: the reading table (``rankstate.READING``),
the facts its rows name (``hangd/analysis/facts/``) and the state table (``rankstate.TABLE``).

  python scripts/analysis_doc.py           say whether docs/analysis.md holds the tables the code has
  python scripts/analysis_doc.py --write   write them into docs/analysis.md (between the markers)

Each table stands between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``;
tests/analysis/test_rankstate.py fails when a table there differs from the code's.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hangd.analysis import rankstate  # noqa: E402

DOC = ROOT / "docs" / "analysis.md"


def fact_name(f: Callable[..., bool]) -> str:
    """``family.name``: the fact's module under facts/ and its function."""
    return f"{f.__module__.rsplit('.', 1)[-1]}.{f.__name__}"


def _cell(facts: tuple[Callable[..., bool], ...]) -> str:
    return ", ".join(f"`{fact_name(f)}`" for f in facts) or "-"


def reading_table() -> str:
    out = ["| # | reading | all of | any of | none of |", "| --- | --- | --- | --- | --- |"]
    for i, row in enumerate(rankstate.READING, 1):
        out.append(f"| {i} | {row.local} | {_cell(row.all)} | {_cell(row.any)} | {_cell(row.none)} |")
    return "\n".join(out)


def _says(f: Callable[..., bool]) -> str:
    """The fact's docstring, as one line."""
    return " ".join((inspect.getdoc(f) or "").split()).replace("|", "\\|")


def facts_table() -> str:
    seen: dict[str, Callable[..., bool]] = {}
    for row in rankstate.READING:
        for f in (*row.all, *row.any, *row.none):
            seen.setdefault(fact_name(f), f)
    for srow in rankstate.TABLE:
        for f in (*srow.all, *srow.none):
            seen.setdefault(fact_name(f), f)
    out = ["| fact | says |", "| --- | --- |"]
    out += [f"| `{name}` | {_says(f)} |" for name, f in sorted(seen.items())]
    return "\n".join(out)


def state_table() -> str:
    out = ["| # | rule | all of | none of | state | when, in words |", "| --- | --- | --- | --- | --- | --- |"]
    out += [f"| {i} | {r.rule} | {_cell(r.all)} | {_cell(r.none)} | {r.state} | {r.when} |"
            for i, r in enumerate(rankstate.TABLE, 1)]
    return "\n".join(out)


TABLES: dict[str, Callable[[], str]] = {"reading": reading_table, "facts": facts_table, "state": state_table}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {name} -->)(.*?)(<!-- end generated: {name} -->)", re.S)


def documented(text: str) -> dict[str, str | None]:
    """Each table as docs/analysis.md has it between its markers (None: no markers)."""
    return {name: (m.group(2).strip("\n") if (m := _block(name).search(text)) else None) for name in TABLES}


def generated(text: str) -> str:
    """The document with every table between its markers made anew from the code."""
    for name, make in TABLES.items():
        m = _block(name).search(text)
        if m is not None:
            text = text[:m.start(2)] + "\n" + make() + "\n" + text[m.end(2):]
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write the tables into docs/analysis.md")
    a = ap.parse_args()
    text = DOC.read_text()
    missing = [n for n, t in documented(text).items() if t is None]
    if missing:
        print(f"docs/analysis.md has no markers for: {', '.join(missing)}", file=sys.stderr)
        return 2
    new = generated(text)
    if a.write:
        DOC.write_text(new)
        print("wrote docs/analysis.md" if new != text else "docs/analysis.md already holds the code's tables")
        return 0
    if new != text:
        print("docs/analysis.md differs from the code's tables: run `python scripts/analysis_doc.py --write`")
        return 1
    print("docs/analysis.md holds the code's tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
