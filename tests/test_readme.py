"""The README's finding catalogue and commands match the code and .ci/run."""
import re

from gptqfmt.findings import CATALOGUE
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_catalogue_table_matches_findings_module():
    rows = re.findall(r"^\| (GQ\d{3}) \| (\w+) \| (.+?) \|$", README, re.M)
    assert [(c, s, t) for c, s, t in rows] == [(c.code, c.severity, c.title)
                                              for c in CATALOGUE.values()]


def test_ci_runs_the_readme_test_command():
    cmd = "python3 -m pip install torch==2.13.0 && python3 -m pip install -e '.[test]' && " \
          "python3 -m pytest -q"
    assert cmd in README
    assert cmd in (ROOT / ".ci" / "run").read_text()
