"""The package's plan (issue 28): a library below that knows no notebook, one room per notebook above, imports at
the top of each module, no cycles. Read from the code alone (ast), so it runs in a second."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "course_utils"
MAX_MODULE_LINES = 480  # issue 28 target: 480
MAX_IMPORTS_IN_FUNCTIONS = 25  # issue 28 target: 25 (only where they keep `import course_utils` cheap)
MAX_IMPORT_CHAIN = 8  # the review's target (2026-12-03: 17, then 9, then 8; see README)


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if path.name == "__init__.py" else parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], collections.Counter]:
    """{module: own modules it imports (anywhere in it)}, and how many own imports sit inside functions per module."""
    edges, inside = collections.defaultdict(set), collections.Counter()
    for m, p in mods.items():
        def visit(node, in_fn: bool) -> None:
            for ch in ast.iter_child_nodes(node):
                fn = in_fn or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef))
                if isinstance(ch, ast.ImportFrom) and ch.level:
                    raise AssertionError(f"{p.relative_to(ROOT)}:{ch.lineno}: a relative import; write course_utils.…")
                if isinstance(ch, ast.ImportFrom) and (ch.module or "").split(".")[0] == "course_utils":
                    inside[m] += fn
                    for a in ch.names:
                        target = f"{ch.module}.{a.name}" if f"{ch.module}.{a.name}" in mods else ch.module
                        if target in mods and target != m:
                            edges[m].add(target)
                visit(ch, fn)
        visit(ast.parse(p.read_text()), False)
    return edges, inside


def _cycles_and_depth(mods, edges) -> tuple[list[list[str]], int]:
    index, low, stack, on, comp = {}, {}, [], set(), {}

    def scc(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                scc(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            while True:
                w = stack.pop()
                on.discard(w)
                comp[w] = v
                if w == v:
                    break

    for v in mods:
        if v not in index:
            scc(v)
    groups = collections.defaultdict(list)
    for v, c in comp.items():
        groups[c].append(v)
    depth: dict[str, int] = {}

    def d(c):
        if c not in depth:
            depth[c] = 1 + max((d(comp[w]) for v in groups[c] for w in edges[v] if comp[w] != c), default=0)
        return depth[c]

    return [sorted(g) for g in groups.values() if len(g) > 1], max(d(c) for c in groups)


def longest_chain(mods=None, edges=None) -> list[str]:
    """One longest chain of own imports, from the module that starts it down to a module importing none
    (cycles aside: the test keeps them at 0). `python tests/test_layout.py` prints it."""
    mods = mods or _modules()
    edges = edges or _imports(mods)[0]
    memo: dict[str, list[str]] = {}

    def down(v: str) -> list[str]:
        if v not in memo:
            memo[v] = [v] + max((down(w) for w in sorted(edges[v])), key=len, default=[])
        return memo[v]

    return max((down(v) for v in sorted(mods)), key=len)


def test_the_library_never_imports_the_chapter():
    mods = _modules()
    edges, _ = _imports(mods)
    up = sorted((a, b) for a in mods if not a.startswith("course_utils.chapter") for b in edges[a]
                if b.startswith("course_utils.chapter"))
    assert not up, f"library modules that import the chapter floor: {up}"


def test_no_import_cycles_and_a_short_chain():
    mods = _modules()
    edges, _ = _imports(mods)
    cycles, depth = _cycles_and_depth(mods, edges)
    assert cycles == []
    assert depth <= MAX_IMPORT_CHAIN, " -> ".join(longest_chain(mods, edges))


def test_imports_sit_at_the_top_and_modules_stay_small():
    mods = _modules()
    _, inside = _imports(mods)
    assert sum(inside.values()) <= MAX_IMPORTS_IN_FUNCTIONS, inside.most_common(8)
    big = {m: n for m, p in mods.items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, big


def test_every_notebook_has_its_room_and_its_quiz_bank():
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        slug = nb.stem[3:]
        room = PKG / "chapter" / f"{slug}.py"
        assert room.exists(), f"{nb.name} has no room: {room.relative_to(ROOT)}"
        assert (ROOT / "quizzes" / f"{nb.stem}.yaml").exists(), f"{nb.name} has no quiz bank"
        doc = ast.get_docstring(ast.parse(room.read_text())) or ""
        assert doc.startswith(f"Notebook {nb.stem[:2]} (notebooks/{nb.name}"), f"{room.name} does not name its notebook"


def test_the_census_catches_a_cycle_and_an_upward_import():
    mods = {"course_utils.a": None, "course_utils.b": None, "course_utils.chapter.c": None}
    edges = collections.defaultdict(set, {"course_utils.a": {"course_utils.b"}, "course_utils.b": {"course_utils.a"}})
    cycles, depth = _cycles_and_depth(mods, edges)
    assert cycles == [["course_utils.a", "course_utils.b"]] and depth == 1


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments, imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}  # lazily defined ones
    return names


def test_every_course_name_a_script_uses_exists():
    """Scripts run where no test runs them (the GPU and device scripts only on a lent machine), so every course_utils
    name they import (anywhere in them) or name in a string must exist: issue 28's codemod moved modules, and a stale
    name surfaced only there (2026-12-07: peer_unsloth.py read check_sane from a module that no longer had it, which
    stopped every peer run; here: run_notebook_code.py --skip-quiz looked for "course_utils.quiz")."""
    mods = _modules()
    missing = []
    for script in sorted(p for p in (ROOT / "scripts").rglob("*.py") if "logs" not in p.parts):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_utils") and not node.level:
                if node.module not in mods:
                    missing.append(f"{script.name}: {node.module}")
                    continue
                for a in node.names:
                    if a.name != "*" and a.name not in _defined(mods[node.module]) \
                            and f"{node.module}.{a.name}" not in mods:
                        missing.append(f"{script.name}: {node.module}.{a.name}")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" and len(node.args) > 1 \
                    and isinstance(node.args[0], ast.Subscript) and isinstance(node.args[0].slice, ast.Constant) \
                    and isinstance(node.args[1], ast.Constant):  # getattr(sys.modules["course_utils.x"], "name")
                module, name = node.args[0].slice.value, node.args[1].value
                if str(module).startswith("course_utils") and name not in _defined(mods.get(module, script)):
                    missing.append(f"{script.name}: {module}.{name}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("course_utils.") and not node.value.endswith(".") \
                    and node.value.replace(".", "").replace("_", "").isalnum():
                parent, _, last = node.value.rpartition(".")
                if node.value not in mods and not (parent in mods and last in _defined(mods[parent])):
                    missing.append(f"{script.name}: {node.value!r}")
    assert not missing, missing


if __name__ == "__main__":
    chain = longest_chain()
    print(f"{len(chain)} modules (MAX_IMPORT_CHAIN {MAX_IMPORT_CHAIN}):",
          " -> ".join(m.removeprefix("course_utils.") for m in chain))
