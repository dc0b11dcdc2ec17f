"""The analysis' shape, checked on its source: no import circle among its modules (imports for type
checking and inside functions count: a circle hidden in a function is still a circle), no function
outside the engine takes the Analyzer (helpers take plain records: the Env, the job's view, the
signals), and no function longer than 60 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import hangd.analysis

ROOT = Path(hangd.analysis.__file__).parent
MAX_LINES = 60


def modules(root: Path = ROOT, package: str = "hangd.analysis") -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        name = ".".join((package, *parts))
        out[name.removesuffix(".__init__")] = p
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of ``mods`` it imports, anywhere in it."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, p in mods.items():
        here = mod.split(".") if p.name == "__init__.py" else mod.split(".")[:-1]
        for n in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    base = ".".join(here[:len(here) - (n.level - 1)] + ([n.module] if n.module else []))
                for a in n.names:
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                    if target in mods and target != mod:
                        graph[mod].add(target)
            elif isinstance(n, ast.Import):
                graph[mod] |= {a.name for a in n.names if a.name in mods and a.name != mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def functions(mods: dict[str, Path]) -> list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    return [(p, n) for p in mods.values() for n in ast.walk(ast.parse(p.read_text(), str(p)))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def takes_analyzer(mods: dict[str, Path]) -> list[str]:
    out = []
    for p, f in functions(mods):
        if p.name == "engine.py":
            continue
        args = f.args.posonlyargs + f.args.args + f.args.kwonlyargs
        if any(a.annotation is not None and "Analyzer" in ast.unparse(a.annotation) for a in args):
            out.append(f"{p.relative_to(p.parents[2])}:{f.lineno} {f.name}")
    return out


def too_long(mods: dict[str, Path]) -> list[str]:
    return [f"{p.relative_to(p.parents[2])}:{f.lineno} {f.name}: {f.end_lineno - f.lineno + 1} lines"  # type: ignore[operator]
            for p, f in functions(mods) if f.end_lineno - f.lineno + 1 > MAX_LINES]  # type: ignore[operator]


def test_the_analysis_has_no_import_circle():
    mods = modules()
    assert len(mods) >= 20 and "hangd.analysis.engine" in mods
    assert circles(imports(mods)) == []


def test_no_function_outside_the_engine_takes_the_analyzer():
    assert takes_analyzer(modules()) == []


def test_no_function_of_the_analysis_is_longer_than_60_lines():
    assert too_long(modules()) == []


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    root = tmp_path / "pkg"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return modules(root, "pkg")


def test_the_checks_see_a_circle_an_analyzer_and_a_long_function(tmp_path):
    long_body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    mods = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "b.py": "def f():\n    from pkg import a\n    return a\n",
        "c.py": "from pkg.d import g\n",
        "d.py": "import pkg.c\n\ndef g(an: 'Analyzer') -> None:\n    pass\n",
        "e.py": f"def long():\n{long_body}",
        "engine.py": "def ok(an: 'Analyzer') -> None:\n    pass\n",
    })
    assert circles(imports(mods)) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    assert [x.split(" ")[1] for x in takes_analyzer(mods)] == ["g"]
    assert [x.split(" ")[1] for x in too_long(mods)] == ["long:"]


# What the facts of setting up read from earlier ticks: written by the history stage alone
SETUP_MARKS = {"quiet_since", "working_since", "gpu_mem_mark", "pg_up_mem", "pg_mem_grew"}


def mark_writers(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the setting-up marks it assigns (``x.quiet_since = ...``, augmented or not)."""
    out: dict[str, set[str]] = {}
    for mod, p in mods.items():
        for n in ast.walk(ast.parse(p.read_text(), str(p))):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign | ast.AnnAssign) else []
            for tg in targets:
                for t in ast.walk(tg):
                    if isinstance(t, ast.Attribute) and t.attr in SETUP_MARKS:
                        out.setdefault(mod, set()).add(t.attr)
    return out


def test_only_the_history_stage_writes_the_marks_of_setting_up():
    assert set(mark_writers(modules())) == {"hangd.analysis.history"}, mark_writers(modules())


def test_the_history_check_sees_a_write_elsewhere(tmp_path):
    (tmp_path / "a.py").write_text("def f(p):\n    p.quiet_since, p.x = 1.0, 2\n")
    (tmp_path / "b.py").write_text("def g(p):\n    return p.quiet_since\n")
    assert mark_writers(modules(tmp_path, "pkg")) == {"pkg.a": {"quiet_since"}}
