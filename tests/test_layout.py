"""The tests and the product stay apart: tests share code only through tests/support.py (never by
importing another test module or conftest.py), and nothing under gptqfmt/ imports from tests/.

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
    """A test module or conftest.py, as tests.X or bare X (pytest puts tests/ on sys.path)."""
    parts = name.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    return bool(parts) and (parts[0] == "conftest" or parts[0].startswith("test_"))


@pytest.mark.parametrize(("source", "bad"), [
    ("from tests.conftest import CKPT", True),
    ("import tests.test_packing", True),
    ("def f():\n    from tests import test_convert_faults", True),
    ("from conftest import ROOT", True),
    ("from .test_packing import slow_pack_column", True),
    ("from tests.support import CKPT, build", False),
    ("import testfixtures, tests.support", False),
])
def test_the_check_sees_test_module_imports(source, bad):
    assert any(map(is_test_module, imported_modules(source, "tests"))) == bad


def test_tests_import_no_other_test_module_nor_conftest():
    files = sorted((ROOT / "tests").glob("*.py"))
    assert {"conftest.py", "support.py", "test_layout.py"} <= {p.name for p in files}
    bad = {p.name: sorted(filter(is_test_module, imported_modules(p.read_text(), "tests")))
           for p in files}
    assert {k: v for k, v in bad.items() if v} == {}


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
