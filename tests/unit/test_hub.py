"""Hugging Face repo ids and caches (gptqfmt/hub.py): resolution against a cache laid out as
huggingface_hub lays one out (its own scan_cache_dir is the oracle that the layout is right),
offline, and verify --checksums against the hashes the cache records."""
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from gptqfmt.safetensors_io import hub
from tests.support import CKPT, FIXTURES, hf_cache_entry

hh = pytest.importorskip("huggingface_hub", reason="the [hub] extra (in [test])")
# loaded lazily by huggingface_hub: imported here so that the test does not depend on another
# test having imported it first in the same process
pytest.importorskip("huggingface_hub.constants")

SRC = CKPT / "b4-sym-noact-gptq-single"
OTHER = CKPT / "b4-asym-act-gptq-sharded"
MAIN, V1 = "a" * 40, "b" * 40


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An offline Hugging Face cache holding org/model at main and at tag v1."""
    root = tmp_path / "hub"
    hf_cache_entry(root, "org/model", SRC, MAIN)
    hf_cache_entry(root, "org/model", OTHER, V1, refs=("v1",))
    monkeypatch.setattr(hh.constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(hh.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    return root


def test_the_test_cache_is_what_huggingface_hub_reads(cache):
    info = hh.scan_cache_dir(cache)
    [repo] = info.repos
    assert (repo.repo_id, repo.repo_type) == ("org/model", "model")
    revs = {r.commit_hash: (set(r.refs), {f.file_name for f in r.files}) for r in repo.revisions}
    assert revs[MAIN] == ({"main"}, {p.name for p in SRC.iterdir()})
    assert revs[V1][0] == {"v1"}
    # huggingface_hub's own lookup follows refs/<rev> and the links to the right content
    for rev, src in (("main", SRC), ("v1", OTHER), (V1, OTHER)):
        for f in src.iterdir():
            got = hh.try_to_load_from_cache("org/model", f.name, cache_dir=cache, revision=rev)
            assert isinstance(got, str) and Path(got).read_bytes() == f.read_bytes(), (rev, f)


@pytest.mark.parametrize("arg,commit", [("org/model", MAIN), ("org/model@main", MAIN),
                                        ("org/model@v1", V1), (f"org/model@{V1}", V1)])
def test_a_repo_id_resolves_to_its_cached_snapshot(cache, arg, commit):
    r = hub.resolve(arg)
    assert (r.repo_id, r.commit) == ("org/model", commit)
    assert os.path.samefile(r.path, cache / "models--org--model" / "snapshots" / commit)


def test_a_cache_entry_given_as_a_path_resolves_to_main(cache):
    r = hub.resolve(str(cache / "models--org--model"))
    assert r.commit == MAIN and r.repo_id == "org/model"


def test_an_existing_path_wins_over_a_repo_id(cache, tmp_path):
    shutil.copytree(SRC, tmp_path / "org" / "model")
    assert hub.resolve("org/model") == hub.Resolved("org/model")
    assert hub.resolve("model.safetensors") == hub.Resolved("model.safetensors")  # no slash


def test_inspect_by_repo_id_reports_the_snapshot(cache, run_cli):
    r = run_cli("inspect", "org/model", "--format", "json")
    direct = run_cli("inspect", SRC, "--format", "json")
    assert r.exit_code == 0
    got, want = json.loads(r.stdout), json.loads(direct.stdout)
    assert got["path"].endswith(f"models--org--model/snapshots/{MAIN}")
    got.pop("path"), want.pop("path")
    assert got == want
    assert f"org/model@main: snapshot {MAIN}" in r.stderr
    assert "snapshot" not in run_cli("inspect", "org/model", "-q").stderr  # quiet: no note


@pytest.mark.parametrize("arg,fetch", [
    ("org/other", "hf download org/other (or pass --download)"),
    ("org/model@v2", "hf download org/model --revision v2 (or pass --download)")])
def test_not_cached_says_how_to_download_and_downloads_nothing(cache, run_cli, arg, fetch,
                                                               monkeypatch):
    calls = []
    real = hh.snapshot_download
    monkeypatch.setattr(hh, "snapshot_download",
                        lambda *a, **k: calls.append(k) or real(*a, **k))
    r = run_cli("inspect", arg)
    assert r.exit_code == 2
    assert "not in the Hugging Face cache" in r.stderr and fetch in r.stderr
    assert calls and all(k["local_files_only"] for k in calls)


def test_download_asks_huggingface_hub_to_fetch(cache, run_cli, monkeypatch):
    calls = []

    def fake(repo_id, **k):  # the Hub, offline: put the files where a download would
        calls.append((repo_id, k["revision"], k["local_files_only"]))
        assert k["allow_patterns"] == ["*.json", "*.safetensors"]  # not *.bin, original/...
        return str(hf_cache_entry(cache, repo_id, SRC, "c" * 40))

    monkeypatch.setattr(hh, "snapshot_download", fake)
    r = run_cli("verify", "org/new@dev", "--download", "-q")
    assert r.exit_code == 0, r.output
    assert calls == [("org/new", "dev", False)]


def test_download_failures_and_misuse_are_one_line(cache, run_cli, monkeypatch):
    def offline(repo_id, **k):
        raise hh.errors.LocalEntryNotFoundError("Cannot find an appropriate cached snapshot "
                                                "folder\nsecond line")
    monkeypatch.setattr(hh, "snapshot_download", offline)
    r = run_cli("inspect", "org/new", "--download")
    assert r.exit_code == 2 and "cannot download org/new@main: Cannot find" in r.stderr
    assert "second line" not in r.stderr
    r = run_cli("inspect", SRC, "--download")
    assert r.exit_code == 2 and "names none (a path that exists is read as a path)" in r.stderr


def test_download_applies_to_the_hub_name_among_the_paths(cache, run_cli, monkeypatch):
    calls = []
    real = hh.snapshot_download
    monkeypatch.setattr(hh, "snapshot_download",
                        lambda repo_id, **k: calls.append(repo_id) or real(repo_id, **{
                            **k, "local_files_only": True}))
    r = run_cli("verify", SRC, "--against", "org/model", "--download")
    assert r.exit_code == 0, r.output
    assert calls == ["org/model"]  # PATH, a local path, is not looked up


def test_an_incomplete_snapshot_says_so(cache, run_cli, monkeypatch):
    incomplete = pytest.importorskip("huggingface_hub.errors").__dict__.get(
        "IncompleteSnapshotError")
    if incomplete is None:
        pytest.skip("this huggingface_hub has no IncompleteSnapshotError")

    def partial(repo_id, **k):
        raise incomplete("some files are missing", snapshot_path="/cache/snap")
    monkeypatch.setattr(hh, "snapshot_download", partial)
    r = run_cli("inspect", "org/model")
    assert r.exit_code == 2
    assert "/cache/snap is incomplete" in r.stderr and "hf download org/model" in r.stderr


def test_without_the_hub_extra_says_which_to_install(cache, run_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    r = run_cli("inspect", "org/model")
    assert r.exit_code == 2 and "pip install 'gptqfmt[hub]'" in r.stderr
    r = run_cli("inspect", "fixtures/nothing/here/at/all")
    assert r.exit_code == 2 and "[hub]" not in r.stderr  # a path, plainly missing


def test_convert_reads_a_repo_id_and_writes_a_path(cache, run_cli, tmp_path):
    r = run_cli("convert", "org/model", tmp_path / "out", "-q")
    assert r.exit_code == 0, r.output
    assert run_cli("verify", tmp_path / "out", "--against", "org/model").exit_code == 0


# ---- verify --checksums ------------------------------------------------------------------

def snapshot(cache, commit=MAIN):
    return cache / "models--org--model" / "snapshots" / commit


def checksums_doc(run_cli, arg):
    r = run_cli("verify", arg, "--checksums", "--format", "json")
    doc = json.loads(r.stdout)
    return r.exit_code, doc, [f for f in doc["findings"] if f["code"] == "GQ129"]


def test_checksums_of_an_intact_snapshot(cache, run_cli):
    code, doc, bad = checksums_doc(run_cli, "org/model")
    files = list(SRC.iterdir())
    assert code == 0 and not bad
    assert doc["checksums"] == {"source": "cache", "files": len(files), "mismatched": 0,
                                "bytes": sum(f.stat().st_size for f in files),
                                "unrecorded": []}
    text = run_cli("verify", "org/model", "--checksums").stdout
    assert f"checksums    {len(files)} files" in text and "every one matches" in text


@pytest.mark.parametrize("name,algorithm", [("model.safetensors", "sha256"),
                                            ("config.json", "git-sha1")])
def test_a_damaged_blob_is_gq129_with_both_hashes(cache, run_cli, name, algorithm):
    _, clean, _ = checksums_doc(run_cli, "org/model")
    blob = Path(os.path.realpath(snapshot(cache) / name))
    data = bytearray(blob.read_bytes())
    if name.endswith(".json"):
        data[-1:-1] = b" "  # a space before the final newline: the same JSON
    else:
        data[-2] ^= 0x01  # one bit of the last tensor's data: still parses
    blob.write_bytes(data)
    code, doc, [f] = checksums_doc(run_cli, "org/model")
    assert code == 1 and f["file"] == name
    # only the hash can tell: every other finding is as before
    assert [g for g in doc["findings"] if g["code"] != "GQ129"] == clean["findings"]
    assert f["details"] == {"algorithm": algorithm, "expected": os.path.basename(blob),
                            "got": (hashlib.sha256(data).hexdigest() if algorithm == "sha256"
                                    else hashlib.sha1(b"blob %d\0" % len(data) + data)
                                    .hexdigest())}
    assert f"hf download org/model {name} --revision {MAIN} --force-download" in f["hint"]
    assert doc["checksums"]["mismatched"] == 1


def test_a_replaced_file_and_a_missing_blob_are_gq129(cache, run_cli):
    snap = snapshot(cache)
    cfg = snap / "quantize_config.json"
    text = cfg.read_text()
    cfg.unlink()
    cfg.write_text(text)  # same bytes, but no longer the cache's: no hash vouches for it
    os.unlink(os.path.realpath(snap / "generation_config.json"))
    code, doc, bad = checksums_doc(run_cli, "org/model")
    assert code == 1
    assert {f["file"]: f["message"].split(":")[0] for f in bad} == {
        "quantize_config.json": "not a link into the cache's blobs/",
        "generation_config.json": "the blob it links to "
        f"({os.path.basename(os.readlink(snap / 'generation_config.json'))}) is missing"}


def test_checksums_of_a_local_dir_download(tmp_path, run_cli):
    """`hf download --local-dir` records each file's ETag (its hash) in .cache metadata."""
    d = tmp_path / "local"
    shutil.copytree(SRC, d)
    meta = d / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    for f in SRC.iterdir():
        data = f.read_bytes()
        etag = (hashlib.sha256(data).hexdigest() if f.suffix == ".safetensors"
                else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        (meta / f"{f.name}.metadata").write_text(f"{MAIN}\n{etag}\n1700000000.0\n")
    (d / "notes.txt").write_text("added by hand")
    code, doc, bad = checksums_doc(run_cli, d)
    assert code == 0 and not bad
    assert doc["checksums"]["source"] == "local-dir"
    assert doc["checksums"]["unrecorded"] == ["notes.txt"]
    (d / "config.json").write_text("{}")
    code, doc, [f] = checksums_doc(run_cli, d)
    assert f["file"] == "config.json" and "download metadata records" in f["message"]


def test_checksums_without_any_record_is_a_usage_error(run_cli):
    r = run_cli("verify", SRC, "--checksums")
    assert r.exit_code == 2 and "no recorded hash to compare with" in r.stderr


def test_checksums_is_refused_with_against(cache, run_cli):
    r = run_cli("verify", "org/model", "--against", SRC, "--checksums")
    assert r.exit_code == 2 and "--checksums does not apply" in r.stderr


def test_content_hash_reads_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "CHUNK", 7)
    f = tmp_path / "f"
    f.write_bytes(bytes(range(100)))
    seen = []
    assert hub.content_hash(f, "sha256", seen.append) == hashlib.sha256(f.read_bytes()) \
        .hexdigest()
    assert seen == [7] * 14 + [2]


def test_repo_ids_as_the_hub_spells_them():
    assert hub.REPO_ID.match("TheBloke/Llama-2-7B-GPTQ@gptq-4bit-32g-actorder_True")
    assert hub.REPO_ID.match("org/model@refs/pr/1")["rev"] == "refs/pr/1"
    for not_one in ("model", "./org/model", "/abs/path", "org/model/extra", "-x/y"):
        assert not hub.REPO_ID.match(not_one), not_one
    missing = str(FIXTURES / "no" / "such" / "dir")
    assert hub.resolve(missing, download=True) == hub.Resolved(missing)  # the reader says why
