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


def _yaml_blocks():
    yaml = __import__("pytest").importorskip("yaml", reason="PyYAML (pre-commit's, in [test])")
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", README, re.S)]


def _parse(line: str) -> None:
    """A gptqfmt command line of the README is one the CLI accepts: every option exists and
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
