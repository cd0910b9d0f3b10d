"""The CLI contract a user meets first: next steps in text mode, paths printed as typed, what
was passed named when it is not a checkpoint, options that do not apply refused, plurals, help
and units. One test per defect found by trying the tool as a new user."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from gptqfmt.cli.output import finding_line, human_bytes, plural
from gptqfmt.findings import Finding
from tests.support import CKPT

V2 = CKPT / "b4-sym-noact-gptq_v2-sharded"
MISLABELLED = CKPT / "mislabelled-b4-sym-v2-as-gptq"


def gptqfmt(*args):
    return subprocess.run([sys.executable, "-m", "gptqfmt", *map(str, args)],
                          capture_output=True, text=True)


def test_text_mode_prints_the_hint_on_the_finding_line():
    f = Finding("GQ401", "declares gptq but the data are gptq_v2", file="config.json",
                hint="run `gptqfmt convert --from gptq_v2`")
    assert finding_line(f) == ("config.json: GQ401 declares gptq but the data are gptq_v2 "
                               "(hint: run `gptqfmt convert --from gptq_v2`)")
    assert finding_line(Finding("GQ401", "m")) == "GQ401 m"


def test_a_refusal_in_text_mode_says_what_to_do_next(tmp_path):
    r = gptqfmt("convert", MISLABELLED, tmp_path / "out")
    assert r.returncode == 1 and not (tmp_path / "out").exists()
    line = next(x for x in r.stdout.splitlines()[1:] if "GQ408" in x)
    assert f"(hint: the label is wrong: `gptqfmt fix-label {MISLABELLED}` sets it to gptq_v2 " \
        "(then convert again), or run again with --from gptq_v2)" in line
    assert r.stdout.splitlines()[-1] == "FAIL: 1 error, 0 warnings, 0 infos; stopped"
    doc = json.loads(gptqfmt("convert", MISLABELLED, tmp_path / "out", "--format", "json").stdout)
    assert doc["findings"][0]["hint"] in line  # the same next step in both modes


def test_verify_text_shows_hints_too():
    r = gptqfmt("verify", MISLABELLED)
    doc = json.loads(gptqfmt("verify", MISLABELLED, "--format", "json").stdout)
    hinted = [f for f in doc["findings"] if f.get("hint")]
    assert hinted and all(f"(hint: {f['hint']})" in r.stdout for f in hinted)


def test_a_path_with_a_backslash_prints_as_typed(tmp_path):
    d = tmp_path / "back\\slash"
    d.mkdir()
    r = gptqfmt("inspect", d)
    assert r.returncode == 1
    assert f"{d}: GQ128" in r.stdout and "back\\\\slash" not in r.stdout
    r = gptqfmt("inspect", d / "missing")
    assert r.returncode == 2 and f"{d}/missing" in r.stderr and "\\\\" not in r.stderr


def test_control_characters_in_an_error_message_are_escaped_once(tmp_path):
    d = tmp_path / "a\x1bb"
    r = gptqfmt("inspect", d)
    assert r.returncode == 2 and "a\\x1bb" in r.stderr and "\\\\x1b" not in r.stderr
    assert "\x1b" not in r.stderr


@pytest.mark.parametrize("name", ["config.json", "quantize_config.json",
                                  "model.safetensors.index.json"])
def test_a_json_file_is_named_as_such(name):
    path = CKPT / "b4-asym-act-gptq-sharded" / name
    r = gptqfmt("inspect", path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (f"gptqfmt: error: {path}: a JSON file, not safetensors; pass the "
                                f"checkpoint directory that holds it ({path.parent})")
    r = gptqfmt("verify", path, "--format", "json")
    assert r.returncode == 2 and "a JSON file, not safetensors" in json.loads(r.stdout)["error"]


def _cache_root(tmp_path, revs=("0123abcd", "4567ef01"), main="0123abcd"):
    root = tmp_path / "models--org--model"
    for rev in revs:
        shutil.copytree(V2, root / "snapshots" / rev)
    (root / "refs").mkdir()
    (root / "blobs").mkdir()
    if main:
        (root / "refs" / "main").write_text(main)
    return root


def test_a_hugging_face_cache_root_points_to_its_snapshot(tmp_path, run_cli, monkeypatch):
    """Without huggingface_hub a cache root stays a path: GQ128 names the snapshot to pass
    and the extra that would take the root itself (with it, tests/unit/test_hub.py)."""
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    root = _cache_root(tmp_path)
    r = run_cli("inspect", root)
    assert r.exit_code == 1
    assert (f"{root}: GQ128 no *.safetensors file and no model.safetensors.index.json in this "
            f"directory; it is a Hugging Face cache root with 2 snapshots under snapshots/ "
            f"(hint: pass a snapshot, e.g. {root}/snapshots/0123abcd (refs/main); or install "
            "the hub extra (pip install 'gptqfmt[hub]') and pass the cache root or "
            "org/model)") in r.stdout
    doc = json.loads(run_cli("verify", root, "--format", "json").stdout)
    assert "snapshots/0123abcd (refs/main)" in doc["findings"][0]["hint"]
    assert run_cli("inspect", root / "snapshots" / "0123abcd").exit_code == 0


def test_a_cache_root_without_refs_main_points_to_the_newest_snapshot(tmp_path):
    root = _cache_root(tmp_path, main=None)
    os.utime(root / "snapshots" / "4567ef01", (2e9, 2e9))
    doc = json.loads(gptqfmt("inspect", root, "--format", "json").stdout)
    assert doc["findings"][0]["code"] == "GQ128"
    assert "snapshots/4567ef01 (the newest)" in doc["findings"][0]["hint"]


def test_a_plain_empty_directory_gets_no_cache_hint(tmp_path):
    doc = json.loads(gptqfmt("inspect", tmp_path, "--format", "json").stdout)
    assert doc["findings"][0]["code"] == "GQ128" and "hint" not in doc["findings"][0]
    assert "cache" not in doc["findings"][0]["message"]


def test_convert_of_a_file_names_the_directory_to_pass(tmp_path):
    src = CKPT / "b4-sym-noact-gptq_v2-single" / "model.safetensors"
    r = gptqfmt("convert", src, tmp_path / "out")
    assert r.returncode == 2 and not (tmp_path / "out").exists()
    assert "is a file" not in r.stderr  # click's message is gone
    assert f"pass its directory ({src.parent})" in r.stderr
    doc = json.loads(gptqfmt("convert", src, tmp_path / "out", "--format", "json").stdout)
    assert doc["exit_code"] == 2 and "convert reads a checkpoint directory" in doc["error"]


def test_cupy_unavailable_gives_the_install_command(monkeypatch):
    from gptqfmt.errors import UsageError
    from gptqfmt.numerics import get_backend

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "gptqfmt.numerics.cupy_backend", raising=False)
    with pytest.raises(UsageError) as e:
        get_backend("cupy")
    assert "pip install 'gptqfmt[cuda12]'" in str(e.value) and "--backend cpu" in str(e.value)
    assert "ModuleNotFoundError" not in str(e.value)
    assert get_backend("auto").name == "cpu"


@pytest.mark.parametrize("args,named", [
    (["--against", V2, "--strict"], "--strict does not apply to --against"),
    (["--against", V2, "--jobs", "2"], "--jobs does not apply to --against"),
    (["--reference", "fp32", "--strict"], "--strict does not apply to --reference"),
    (["--backend", "cpu"], "--backend does not apply to a plain verify"),
    (["--backend", "auto"], "--backend does not apply to a plain verify"),
])
def test_verify_refuses_options_that_do_not_apply(args, named):
    r = gptqfmt("verify", V2, *args)
    assert r.returncode == 2 and r.stdout == "" and named in r.stderr
    doc = json.loads(gptqfmt("verify", V2, *args, "--format", "json").stdout)
    assert doc["exit_code"] == 2 and named in doc["error"]


def test_verify_modes_still_accept_their_options():
    assert gptqfmt("verify", V2, "--against", V2, "--backend", "cpu").returncode == 0
    assert gptqfmt("verify", V2, "--strict", "--jobs", "2").returncode == 0


def test_plurals():
    assert [plural(n, "error") for n in (0, 1, 2)] == ["0 errors", "1 error", "2 errors"]
    r = gptqfmt("verify", MISLABELLED)
    assert r.stdout.splitlines()[-1].startswith("FAIL: 7 modules, 1 error, 0 warnings, 0 infos;")
    last = gptqfmt("inspect", CKPT / "lmhead-b4-sym-gptq_v2").stdout.splitlines()[-1]
    assert ", 1 info (-v lists them)" in last and "1 infos" not in last


def test_sizes_are_decimal_and_labelled_so():
    assert [human_bytes(n) for n in (999, 1000, 37_400, 1_500_000, 2_220_000_000)] == \
        ["999 B", "1.0 kB", "37.4 kB", "1.5 MB", "2.2 GB"]


def test_help_shows_whole_summaries_and_the_debug_option():
    r = gptqfmt("--help")
    commands = r.stdout.split("Commands:")[1]
    assert r.returncode == 0 and "..." not in commands  # click's truncation mark
    assert "two checkpoints compute the same." in " ".join(commands.split())
    for cmd in ("convert", "inspect", "verify"):
        assert f"  {cmd} " in r.stdout
    assert "130/143/129" in r.stdout  # exit codes in the top-level help
    for cmd in ("inspect", "verify", "convert"):
        assert "--debug" in gptqfmt(cmd, "--help").stdout
