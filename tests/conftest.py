import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.support import ROOT, gpu_available

# Text lines are not wrapped in the tests (in process and in the gptqfmt processes they
# start), so that an assertion reads what a line says, not where a 100-column wrap broke it;
# the recorded outputs (scripts/record_outputs.py) set the width a person sees and check it.
os.environ["GPTQFMT_WIDTH"] = "0"


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


# Runs the CLI in forked children of one interpreter that has imported gptqfmt: 22 kills cost
# one start-up instead of 22 (about 0.8 s of CPU each). A child sets GPTQFMT_FAULT and reloads
# the hook, which reads the variable at import; it writes its output to trial["log"].
FORK_DRIVER = r"""
import importlib, json, os, sys
from gptqfmt import faults
from gptqfmt.cli import run
for line in sys.stdin:
    trial = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.environ["GPTQFMT_FAULT"] = trial["fault"]
            importlib.reload(faults)
            log = os.open(trial["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            run(trial["argv"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture
def forked_cli(tmp_path_factory):
    """run(fault, *args) -> (exit code, output) of `gptqfmt *args` with GPTQFMT_FAULT=fault;
    the code is negative when a signal ended the process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # no threads in a process that forks
    env.pop("GPTQFMT_FAULT", None)
    log = tmp_path_factory.mktemp("forked") / "output"
    driver = subprocess.Popen([sys.executable, "-c", FORK_DRIVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)

    def run(fault, *args):
        driver.stdin.write(json.dumps({"fault": fault, "log": str(log),
                                       "argv": [str(a) for a in args]}) + "\n")
        driver.stdin.flush()
        line = driver.stdout.readline()
        assert line, "the fork driver died"
        return int(line), log.read_text()
    try:
        yield run
    finally:
        driver.stdin.close()
        driver.wait()
        driver.stdout.close()
    assert driver.returncode == 0
