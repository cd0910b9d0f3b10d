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


def pytest_configure(config):
    """A test run started in the background (`pytest &` in a script, nohup) inherits SIGINT
    ignored, and so would every gptqfmt process the tests start, which keeps a signal its
    parent ignores ignored (as it should). The signal tests need Ctrl-C delivered: give the
    run (each xdist worker too) Python's own handler, which exec resets to the default."""
    import signal
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    if os.environ.get("GPTQFMT_REQUIRE_GPU") == "1":
        return  # run them anyway: without a usable GPU they fail, they do not hide as skips
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="no CUDA device / CuPy"))
