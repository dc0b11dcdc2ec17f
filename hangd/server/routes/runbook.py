"""The operator guide at /docs/runbook: what each alert's runbook_url opens. No token: it is the
shipped documentation, with nothing of the node in it."""

from __future__ import annotations

import html
import importlib.resources
import re
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from hangd.server.links import RUNBOOK_PATH

router = APIRouter(tags=["docs"])
GUIDE = "operator-guide.md"


def guide() -> Path:
    """The guide shipped in the package (hangd/docs is the repo's docs/, copied into the wheel)."""
    return Path(str(importlib.resources.files("hangd") / "docs" / GUIDE))


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading (the runbook_url of each alert ends with one)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def render(markdown: str) -> str:
    """The guide as HTML a browser can jump in: headings with their anchors, the rest as written."""
    out = ['<!doctype html><meta charset="utf-8"><title>hangd operator guide</title>'
           '<style>body{max-width:60em;margin:auto;font-family:sans-serif}pre{white-space:pre-wrap}</style>']
    block: list[str] = []

    def flush() -> None:
        if any(line.strip() for line in block):
            out.append("<pre>" + html.escape("\n".join(block).strip("\n")) + "</pre>")
        block.clear()

    for line in markdown.splitlines():
        m = re.match(r"^(#{1,6}) (.+)$", line)
        if m:
            flush()
            n = len(m.group(1))
            out.append(f'<h{n} id="{html.escape(anchor(m.group(2)))}">{html.escape(m.group(2))}</h{n}>')
        else:
            block.append(line)
    flush()
    return "\n".join(out) + "\n"


@lru_cache(maxsize=1)
def _page() -> str | None:
    p = guide()
    return render(p.read_text(encoding="utf-8")) if p.is_file() else None


@router.get(RUNBOOK_PATH, response_class=HTMLResponse, summary="The operator guide: the runbook of every alert",
            responses={404: {"description": "the guide is not installed beside hangd"}})
def runbook() -> HTMLResponse:
    page = _page()
    if page is None:
        return HTMLResponse("the operator guide is not installed beside hangd: reinstall it with pip install hangd\n",
                            status_code=404)
    return HTMLResponse(page)
