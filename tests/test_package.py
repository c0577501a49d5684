"""The package's shape: no import cycles between its modules, and no module over 600 lines."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "qwen38gen"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports, at module level or inside functions (a lazy import
    still makes a cycle, just a later one)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                up = up[:len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            # `from . import x` / `from .plan import table`: x may be a module of its own
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def test_the_import_graph_is_acyclic():
    mods = _modules()
    graph = {n: _imports(n, p, set(mods)) for n, p in mods.items()}
    assert "qwen38gen.plan.builder" in graph and graph["qwen38gen.emit"], graph
    state: dict[str, int] = {}   # 1: on the path, 2: done

    def visit(n, path):
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycle = path[path.index(m):] + [m]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if not state.get(m):
                visit(m, path + [m])
        state[n] = 2

    for n in sorted(graph):
        if not state.get(n):
            visit(n, [n])


def test_the_cycle_check_finds_a_cycle(tmp_path):
    """The checker itself: two modules importing each other (one lazily) are a cycle."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from .b import f\n")
    b.write_text("def g():\n    from . import a\n")
    known = {"pkg.a", "pkg.b"}
    assert _imports("pkg.a", a, known) == {"pkg.b"} and _imports("pkg.b", b, known) == {"pkg.a"}


def test_no_module_over_600_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    assert {n: k for n, k in long.items() if k > MAX_LINES} == {}
