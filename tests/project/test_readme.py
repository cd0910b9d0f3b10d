"""The README and the reference under docs/ match the code: the finding catalogue
(docs/findings.md), the set-up commands .ci/run reads, the example outputs (each what its command
prints), and the CI examples (docs/ci.md) name real options and the shipped hook."""
import re
import subprocess
import sys

import pytest

from gptqfmt.findings import CATALOGUE
from tests.support import ROOT

README = (ROOT / "README.md").read_text()
CI_PAGE = (ROOT / "docs" / "ci.md").read_text()
FINDINGS_PAGE = (ROOT / "docs" / "findings.md").read_text()


def test_catalogue_table_matches_findings_module():
    rows = re.findall(r"^\| (GQ\d{3}) \| (\w+) \| (.+?) \|$", FINDINGS_PAGE, re.M)
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


def _yaml_blocks():
    yaml = __import__("pytest").importorskip("yaml", reason="PyYAML (pre-commit's, in [test])")
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", CI_PAGE, re.S)]


def _parse(line: str) -> None:
    """A gptqfmt command line of the docs is one the CLI accepts: every option exists and
    every value is one it takes (click parses it; nothing runs)."""
    import shlex

    from gptqfmt.cli import main

    args = shlex.split(line)
    assert args[0] == "gptqfmt", line
    cmd = main.commands[args[1]]
    cmd.make_context(args[1], args[2:], resilient_parsing=False)


def test_the_github_actions_example_runs_real_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --output files land here (their directory must exist)
    [workflow] = [b for b in _yaml_blocks() if isinstance(b, dict) and "jobs" in b]
    steps = workflow["jobs"]["gptqfmt"]["steps"]
    runs = [s["run"] for s in steps if "run" in s and s["run"].startswith("gptqfmt ")]
    assert runs
    for r in runs:
        _parse(r)  # raises click's error for an option or value the CLI does not take
    assert any("--format github" in r and "--output sarif=" in r for r in runs)
    upload = [s for s in steps if s.get("uses", "").startswith("github/codeql-action/upload-sarif")]
    assert upload and upload[0]["if"] == "always()"
    sarif = re.search(r"--output sarif=(\S+)", runs[0])[1]
    assert upload[0]["with"]["sarif_file"] == sarif


def test_the_pre_commit_example_names_the_shipped_hook():
    shipped = __import__("yaml").safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    [config] = [b for b in _yaml_blocks() if isinstance(b, dict) and "repos" in b]
    ids = {h["id"] for r in config["repos"] for h in r["hooks"]}
    assert ids == {h["id"] for h in shipped}


@pytest.mark.slow
def test_every_example_shows_what_its_command_prints():
    """Each example block of the README and docs/*.md holds the output of the command written
    above it, run now (scripts/readme_examples.py --write rewrites them)."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_examples.py"), "--check"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr + "\nrun: python3 scripts/readme_examples.py --write"
    assert re.search(r"([1-9]\d*) of \1 examples", r.stderr), r.stderr


def test_the_readme_shows_each_command_once():
    """The README's examples: inspect, verify, convert (to a relative DST) and doctor, each a
    command the CLI accepts."""
    blocks = re.findall(r"^<!-- example:(\w+):begin -->\n<!-- \$ (.+?) -->$", README, re.M)
    assert [name for name, _ in blocks] == ["inspect", "verify", "convert", "doctor"]
    for name, line in blocks:
        assert line.split()[1] == name, line
        _parse(line)
    assert " ./model-v2 " in dict(blocks)["convert"]
