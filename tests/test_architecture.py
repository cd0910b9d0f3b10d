"""The package's shape (issue 11): no import cycle between its modules (lazy imports inside
functions count too) and no module reaching into another's private names. Read with ast."""
import ast
from pathlib import Path

from tests.support import ROOT



def modules(root: Path) -> dict[str, Path]:
    """gptqfmt's modules under `root` (the repository), by dotted name."""
    out = {}
    for p in (root / "gptqfmt").rglob("*.py"):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, str]]:
    """(module imported, name taken from it or '') for every gptqfmt import in `path`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.startswith("gptqfmt")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(filter(None, [*parts, base]))
            if base.startswith("gptqfmt"):
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    out.append((sub, "") if sub in known else (base, a.name))
    return out


def cycles(root: Path) -> list[str]:
    mods = modules(root)
    graph = {m: {t for t, _ in imports(m, p, set(mods)) if t in mods and t != m}
             for m, p in mods.items()}
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(m, stack):
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                found.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def private_reaches(root: Path) -> list[str]:
    mods = modules(root)
    bad = []
    for m, p in mods.items():
        bad += [f"{m} imports {t}.{n}" for t, n in imports(m, p, set(mods))
                if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                    not node.attr.startswith("__") and \
                    not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                bad.append(f"{m}:{node.lineno} {ast.unparse(node)}")
    return bad


def test_no_import_cycle():
    assert cycles(ROOT) == []


def test_no_module_takes_a_private_name_of_another():
    assert private_reaches(ROOT) == []


def test_the_checks_see_a_cycle_and_a_private_reach(tmp_path):
    """The two checks on a made-up package: they can fail."""
    pkg = tmp_path / "gptqfmt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import thing\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a._secret\nthing = 1\n")
    assert cycles(tmp_path) == ["gptqfmt.a -> gptqfmt.b -> gptqfmt.a"]
    assert private_reaches(tmp_path) == ["gptqfmt.b:3 a._secret"]
