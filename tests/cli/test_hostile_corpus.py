"""fixtures/hostile/<case>/: hostile input ends in its finding codes, in bounded time and memory,
never a traceback or exit 3; names from files are escaped in every output."""
import json
import os
import resource
import subprocess
import sys

import pytest

from tests.support import FIXTURES, ROOT

CASES = sorted(p.name for p in (FIXTURES / "hostile").iterdir())
MEMORY_LIMIT = 3 << 30   # address space of one gptqfmt process: a 1 TB claim must not allocate
TIME_LIMIT = 60


def limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run(*args):
    return subprocess.run([sys.executable, "-m", "gptqfmt", *map(str, args)], capture_output=True,
                          text=True, timeout=TIME_LIMIT, preexec_fn=limited,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_corpus_size():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES)
def test_hostile_case(case):
    d = FIXTURES / "hostile" / case
    expect = json.loads((d / "expect.json").read_text())
    target = d / expect.get("path", ".")
    r = run("verify", target, "--format", "json", *expect["args"])
    assert "Traceback" not in r.stdout + r.stderr and r.returncode != 3, r.stderr
    assert r.returncode == expect["exit_code"], r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert sorted({f["code"] for f in doc["findings"]}) == expect["codes"]
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout  # JSON escapes them


@pytest.mark.parametrize("case", [c for c in CASES if "escape" in c])
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_terminal_output_is_escaped(run_cli, case, command):
    r = run_cli(command, FIXTURES / "hostile" / case)
    for out in (r.stdout, r.stderr):
        assert not any(ch in out for ch in "\x1b\x07\x9b"), out
    assert "\\x1b" in r.stdout
