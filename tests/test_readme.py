"""The README's finding catalogue and set-up commands match the code and .ci/run."""
import re
import subprocess
import sys

from gptqfmt.findings import CATALOGUE
from tests.support import ROOT

README = (ROOT / "README.md").read_text()


def test_catalogue_table_matches_findings_module():
    rows = re.findall(r"^\| (GQ\d{3}) \| (\w+) \| (.+?) \|$", README, re.M)
    assert [(c, s, t) for c, s, t in rows] == [(c.code, c.severity, c.title)
                                              for c in CATALOGUE.values()]


def _readme_command(which: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), which],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_ci_reads_both_set_up_commands_from_the_readme():
    main, test = _readme_command("main"), _readme_command("test")
    # the commands a user copies: torch's CPU build first, then the package, then the job
    assert main.startswith("python3 -m pip install torch==2.13.0 && python3 -m pip install . && "
                           "gptqfmt inspect fixtures/ckpt/")
    assert (ROOT / main.rsplit(" ", 1)[1]).is_dir()
    assert test == ("python3 -m pip install torch==2.13.0 && python3 -m pip install -e "
                    "'.[test]' && python3 -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text()
    # .ci/run runs what the README says (never a copy of it), each in a fresh venv
    assert "readme_commands.py main" in ci and "readme_commands.py test" in ci
    assert "python3 -m venv" in ci and "--system-site-packages" not in ci


def test_readme_command_extraction_refuses_a_changed_section(tmp_path):
    sys.path.insert(0, str(ROOT / ".ci"))
    try:
        import readme_commands
    finally:
        sys.path.pop(0)
    broken = README.replace("```sh\npython3 -m pip install torch==2.13.0 && python3 -m pip "
                            "install . &&", "```sh\npython3 -m pip install torch==2.13.0 &&\n"
                            "python3 -m pip install . &&", 1)
    assert broken != README
    try:
        readme_commands.commands(broken)
    except SystemExit as e:
        assert "expected two one-line sh blocks" in str(e)
    else:
        raise AssertionError("a two-line command block was accepted")
