"""The pre-commit hook (.pre-commit-hooks.yaml -> gptqfmt-pre-commit): the manifest is one
pre-commit itself accepts, its pattern picks the files a checkpoint commit touches, and the
entry checks each checkpoint once, from its configs and headers, without reading tensor data."""
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gptqfmt.cli.precommit import UNCHECKED, checkpoints, precommit
from gptqfmt.safetensors_io import reader
from tests.support import CKPT, FIXTURES, ROOT

MANIFEST = ROOT / ".pre-commit-hooks.yaml"


def hook():
    clientlib = pytest.importorskip("pre_commit.clientlib", reason="pre-commit (in [test])")
    [h] = clientlib.load_manifest(str(MANIFEST))  # pre-commit's own schema check
    return h


def run(*args):
    return CliRunner().invoke(precommit, [str(a) for a in args])


def staged(repo):
    """The files of `repo` that pre-commit would pass to the hook, as paths in the repo."""
    pattern = re.compile(hook()["files"])
    files = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file())
    return [f for f in files if pattern.search(f)]


def test_the_manifest_is_valid_for_pre_commit_and_names_our_entry_point():
    h = hook()
    assert h["id"] == "gptqfmt-verify" and h["language"] == "python"
    assert h["entry"] == "gptqfmt-pre-commit" and h["require_serial"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'gptqfmt-pre-commit = "gptqfmt.cli.precommit:run"' in pyproject


def test_the_pattern_picks_configs_indexes_and_shards(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(CKPT / "b4-asym-act-gptq-sharded", repo / "models" / "a")
    (repo / "README.md").write_text("x")
    (repo / "models" / "a" / "tokenizer.json").write_text("{}")
    assert staged(repo) == [
        "models/a/config.json", "models/a/model-00001-of-00003.safetensors",
        "models/a/model-00002-of-00003.safetensors", "models/a/model-00003-of-00003.safetensors",
        "models/a/model.safetensors.index.json", "models/a/quantize_config.json"]


def test_each_checkpoint_is_checked_once_from_its_configs_and_headers(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    shutil.copytree(CKPT / "b4-asym-act-gptq-sharded", repo / "good")
    shutil.copytree(FIXTURES / "invalid" / "config-not-json", repo / "bad")
    (repo / "docs").mkdir()
    (repo / "docs" / "config.json").write_text("{}")  # no checkpoint there: not checked
    monkeypatch.chdir(repo)
    read = []
    view = reader.SafetensorsFile.view
    monkeypatch.setattr(reader.SafetensorsFile, "view",
                        lambda self, name, part=None: read.append(name) or view(self, name, part))
    files = staged(repo)
    assert checkpoints(files) == [Path("bad"), Path("good")]
    r = run(*files)
    lines = r.output.splitlines()
    assert r.exit_code == 1
    assert lines[-1] == "good: OK (configs, index and headers of 7 modules: 0 errors, " \
                        "0 warnings); zero-point convention not checked (no tensor data " \
                        "read): --full checks it"
    assert "bad/quantize_config.json: GQ201 not valid JSON" in r.output
    assert [ln for ln in lines if ln.startswith("bad: ") and "GQ" not in ln] == [
        "bad: FAIL (configs, index and headers of 2 modules: 1 error, 1 warning)"]
    # no tensor data but the g_idx the module model reads for act-order
    assert read and {n.rpartition(".")[2] for n in read} == {"g_idx"}


def test_a_passing_checkpoint_passes_and_full_reads_the_data(tmp_path, monkeypatch):
    d = tmp_path / "m"
    shutil.copytree(CKPT / "mislabelled-b4-sym-v2-as-gptq", d)
    monkeypatch.chdir(tmp_path)
    r = run("m/config.json")
    assert r.exit_code == 0, r.output  # the label's contradiction is in the data
    # which the OK says it did not look at, and names the flag that does
    assert r.output.splitlines() == [f"m: OK (configs, index and headers of 7 modules: "
                                     f"0 errors, 0 warnings); {UNCHECKED}"]
    assert "zero-point convention not checked" in UNCHECKED and "--full" in UNCHECKED
    r = run("m/config.json", "--full")
    assert r.exit_code == 1 and "GQ401" in r.output and "every tensor of 7 modules" in r.output
    assert UNCHECKED not in r.output


def test_full_says_nothing_was_left_unchecked(tmp_path, monkeypatch):
    shutil.copytree(CKPT / "b4-sym-noact-gptq_v2-single", tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    r = run("m/quantize_config.json", "--full")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["m: OK (every tensor of 7 modules: 0 errors, 0 warnings)"]


def test_a_path_that_does_not_exist_is_a_usage_error(tmp_path, monkeypatch):
    """A FILE that is not there (a typo in the hook's args, a path from another checkout) is
    exit 2 and one line naming it on stderr, before any checkpoint is checked: never a silent
    exit 0 that passes the commit."""
    shutil.copytree(CKPT / "b4-sym-noact-gptq_v2-single", tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    r = run("m/no-such-config.json")
    assert r.exit_code == 2
    assert r.stdout == ""
    assert r.stderr.splitlines() == ["gptqfmt: error: m/no-such-config.json: no such file or "
                                     "directory"]
    # beside a file that exists: still refused, and nothing is checked
    r = run("m/config.json", "missing/config.json")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["gptqfmt: error: missing/config.json: no such file or "
                                     "directory"]


def test_config_files_that_declare_different_conventions_fail_the_hook(tmp_path, monkeypatch):
    """optimum's layout (config.json format gptq_v2, quantize_config.json gptq) is a
    contradiction between config files, which a commit hook can see without any tensor."""
    shutil.copytree(CKPT / "optimum-b4-sym-gptq-sharded", tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    r = run("m/config.json")
    assert r.exit_code == 1
    assert "m/config.json:quantization_config: GQ212 the config files declare different " \
           "conventions" in r.output


def test_an_lfs_pointer_fails_with_its_hint(monkeypatch):
    monkeypatch.chdir(FIXTURES / "invalid")
    r = run("lfs-pointer/quantize_config.json")
    assert r.exit_code == 1
    assert "lfs-pointer/model.safetensors: GQ117" in r.output and "git lfs pull" in r.output


def test_no_checkpoint_among_the_files_passes():
    assert run(ROOT / "README.md").exit_code == 0 and run().exit_code == 0


def test_an_internal_error_is_one_line_and_exit_3(tmp_path, monkeypatch, capsys):
    """The hook goes through the one error boundary: an unexpected exception is exit 3 and one
    line naming it (the traceback only with --debug), never a traceback that CI reads as
    findings (exit 1)."""
    from gptqfmt.cli import precommit as hook
    from gptqfmt.ops import verify
    d = tmp_path / "m"
    shutil.copytree(CKPT / "b4-sym-noact-gptq_v2-single", d)

    def broken(path):
        raise RuntimeError("a bug")
    monkeypatch.setattr(verify, "check_configs", broken)   # the hook imports it when it runs
    for debug in ([], ["--debug"]):
        with pytest.raises(SystemExit) as e:
            hook.run([str(d / "config.json"), *debug])
        err = capsys.readouterr().err
        assert e.value.code == 3
        assert "internal error: RuntimeError: a bug" in err
        assert ("Traceback" in err) == bool(debug)
        if not debug:
            assert err.strip().count("\n") == 0
