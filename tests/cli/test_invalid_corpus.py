"""fixtures/invalid/<case>/: every one-defect case gives its exit code and finding codes."""
import json
import re

import pytest

from gptqfmt.resources import validator
from tests.support import FIXTURES

CASES = sorted(p.name for p in (FIXTURES / "invalid").iterdir())


def test_corpus_size():
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CASES)
def test_case(run_cli, case):
    d = FIXTURES / "invalid" / case
    expect = json.loads((d / "expect.json").read_text())
    r = run_cli("verify", d, "--format", "json", *expect["args"])
    assert r.exit_code == expect["exit_code"], r.stdout
    assert r.exit_code != 3 and "Traceback" not in r.stdout + r.stderr
    doc = json.loads(r.stdout)
    validator("report").validate(doc)
    assert sorted({f["code"] for f in doc["findings"]}) == expect["codes"]
    text = run_cli("verify", d, "-v", *expect["args"])
    assert text.exit_code == expect["exit_code"]
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout
    lines = text.stdout.splitlines()
    for code in expect["codes"]:  # one line per finding: `file::tensor: CODE message`
        assert any(re.match(rf"^(.*: )?{code} ", line) for line in lines), code
    assert re.match(r"^(OK|FAIL): ", lines[-1])
