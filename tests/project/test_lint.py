"""The linter and the type checker, as the test extra installs them: ruff over the repository
(pycodestyle, pyflakes and import sorting, configured in pyproject.toml) and mypy over the
package (every function body checked; strict on the bit core and the public entry points)."""
import subprocess
import sys
from fnmatch import fnmatch

import pytest

import gptqfmt
from tests.support import ROOT


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True)


def test_ruff_finds_nothing():
    r = run("ruff", "check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_finds_nothing(tmp_path):
    r = run("mypy", "--cache-dir", str(tmp_path))
    assert r.returncode == 0 and "no issues found" in r.stdout, r.stdout + r.stderr


def test_the_bit_core_and_the_public_api_are_checked_strictly():
    tomllib = pytest.importorskip("tomllib")   # Python 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["files"] == ["gptqfmt"] and config["check_untyped_defs"]
    strict = next(o for o in config["overrides"] if "gptqfmt.bits.*" in o["module"])
    # every module that defines something gptqfmt/__init__.py exports (the public API)
    public = {getattr(gptqfmt, n).__module__ for n in gptqfmt.__all__
              if hasattr(getattr(gptqfmt, n), "__module__")}
    assert public >= {"gptqfmt.ops.inspect", "gptqfmt.conversion.run"}   # the derivation works
    assert {"gptqfmt", "gptqfmt.bits.*"} <= set(strict["module"])
    loose = [m for m in sorted(public) if not any(fnmatch(m, p) for p in strict["module"])]
    assert not loose, loose
    assert strict["disallow_untyped_defs"] and strict["disallow_any_generics"]


def test_the_checks_see_a_defect(tmp_path):
    """The same tools, on a file with an unused import and a wrong type: both fail."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f() -> int:\n    return 'x'\n")
    assert run("ruff", "check", "--no-cache", "--isolated", str(bad)).returncode == 1
    assert run("mypy", "--cache-dir", str(tmp_path / "c"), "--config-file", "/dev/null",
               str(bad)).returncode == 1
