import os

import pytest
from click.testing import CliRunner

from tests.support import gpu_available


@pytest.fixture
def run_cli():
    """Invoke the CLI in-process; stdout and stderr kept apart."""
    from gptqfmt.cli import main

    def run(*args):
        runner = CliRunner()
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    if os.environ.get("GPTQFMT_REQUIRE_GPU") == "1":
        return  # run them anyway: without a usable GPU they fail, they do not hide as skips
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="no CUDA device / CuPy"))
