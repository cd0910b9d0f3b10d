"""The tests and the product stay apart, and a newcomer finds the tests: tests share code only
through tests/support.py (never by importing another test module or conftest.py), nothing under
gptqfmt/ imports from tests/, and every test module sits in unit/ (named after the module it
tests), cli/ (a command and its contract) or project/ (the repository: README, wheel, fixtures,
scripts, the package's shape).

Imports are read with ast, wherever they stand (module level or inside a function)."""
import ast

import pytest

from tests.support import ROOT


def imported_modules(source: str, package: str) -> set[str]:
    """Every module that `source` (a module of `package`) imports: `import a.b` gives a.b,
    `from a import b` gives a and a.b (b may be a module), relative imports resolved."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                if node.level > len(parts):
                    continue  # beyond the top: fails at import anyway
                base = ".".join(filter(None, [*parts[:len(parts) - node.level + 1], base]))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if a.name != "*"}
    return found


def is_test_module(name: str) -> bool:
    """A test module or conftest.py, as tests.X, tests.unit.X or bare X."""
    parts = name.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    return any(p == "conftest" or p.startswith("test_") for p in parts)


@pytest.mark.parametrize(("source", "bad"), [
    ("from tests.conftest import CKPT", True),
    ("import tests.test_packing", True),
    ("from tests.unit.test_packing import slow", True),
    ("from tests.unit import test_packing", True),
    ("def f():\n    from tests import test_convert_faults", True),
    ("from conftest import ROOT", True),
    ("from .test_packing import slow_pack_column", True),
    ("from tests.support import CKPT, build", False),
    ("import testfixtures, tests.support", False),
])
def test_the_check_sees_test_module_imports(source, bad):
    assert any(map(is_test_module, imported_modules(source, "tests"))) == bad


def test_tests_import_no_other_test_module_nor_conftest():
    files = sorted((ROOT / "tests").rglob("*.py"))
    assert {"conftest.py", "support.py", "test_tests.py"} <= {p.name for p in files}
    bad = {}
    for p in files:
        package = ".".join(p.relative_to(ROOT).parent.parts)
        hits = sorted(filter(is_test_module, imported_modules(p.read_text(), package)))
        if hits:
            bad[str(p.relative_to(ROOT))] = hits
    assert bad == {}


def test_every_test_module_has_its_place():
    places = {p.parent.name for p in (ROOT / "tests").rglob("test_*.py")}
    assert places == {"unit", "cli", "project"}


def test_unit_tests_are_named_after_what_they_test():
    """tests/unit/test_<name>[_<more>].py: <name> a module of gptqfmt or a kernels/ file."""
    names = {p.stem for p in (ROOT / "gptqfmt").rglob("*.py")} | \
        {p.stem for p in (ROOT / "kernels").iterdir()}
    unnamed = [p.name for p in sorted((ROOT / "tests" / "unit").glob("test_*.py"))
               if not any(p.stem[len("test_"):] == n or p.stem[len("test_"):].startswith(n + "_")
                          for n in names)]
    assert unnamed == []


def test_the_package_imports_nothing_from_tests():
    seen, bad = set(), {}
    for p in sorted((ROOT / "gptqfmt").rglob("*.py")):
        package = ".".join(p.relative_to(ROOT).parent.parts)
        names = imported_modules(p.read_text(), package)
        seen |= names
        hits = sorted(n for n in names if n.split(".")[0] in ("tests", "conftest"))
        if hits:
            bad[str(p.relative_to(ROOT))] = hits
    assert {"gptqfmt.errors", "numpy"} <= seen  # the walk sees relative and plain imports
    assert bad == {}
