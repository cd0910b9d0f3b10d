import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CKPT = FIXTURES / "ckpt"


def load_generator(name: str = "make_fixtures"):
    """A fixture generator script under fixtures/, imported as a module."""
    if str(FIXTURES) not in sys.path:
        sys.path.insert(0, str(FIXTURES))  # the generators import each other
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


GEN = load_generator()
SPECS = {s.name: s for s in GEN.specs()}
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


@pytest.fixture
def run_cli():
    """Invoke the CLI in-process; stdout and stderr kept apart."""
    from gptqfmt.cli import main

    def run(*args):
        runner = CliRunner()
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run


def gpu_available() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    if os.environ.get("GPTQFMT_REQUIRE_GPU") == "1":
        return  # run them anyway: without a usable GPU they fail, they do not hide as skips
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="no CUDA device / CuPy"))
