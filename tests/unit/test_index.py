"""Sharded checkpoints: the index against the shards, one test per finding."""
import json
import os
import shutil
import struct

import numpy as np
import pytest

from gptqfmt.errors import FindingError, UsageError
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from gptqfmt.safetensors_io import save_file
from gptqfmt.safetensors_io.index import INDEX_NAME, _read_index, open_store
from tests.support import CKPT

SRC = CKPT / "b4-sym-noact-gptq_v2-sharded"


@pytest.fixture
def ckpt(tmp_path):
    dst = tmp_path / "ck"
    shutil.copytree(SRC, dst)
    return dst


def edit_index(d, fn):
    p = d / INDEX_NAME
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc))


def codes(d):
    return sorted({f.code for f in open_store(d).findings})


def test_clean_sharded_checkpoint_has_no_findings(ckpt):
    store = open_store(ckpt)
    assert store.findings == [] and len(store.files) == 3
    index = json.loads((ckpt / INDEX_NAME).read_text())
    assert store.locations == index["weight_map"]


@pytest.mark.parametrize("bad", ["../model-00001-of-00003.safetensors", "/etc/passwd",
                                 "sub/model.safetensors", "..", "a\\b.safetensors"])
def test_unsafe_shard_names(ckpt, bad):
    edit_index(ckpt, lambda d: d["weight_map"].__setitem__("model.norm.weight", bad))
    store = open_store(ckpt)
    f = [x for x in store.findings if x.code == "GQ121"]
    assert len(f) == 1 and repr(bad) in f[0].message


def test_missing_shard(ckpt):
    (ckpt / "model-00002-of-00003.safetensors").unlink()
    assert "GQ122" in codes(ckpt)


def test_tensor_mapped_to_wrong_shard(ckpt):
    def move(d):
        wm = d["weight_map"]
        t = next(k for k, v in wm.items() if v.startswith("model-00001"))
        wm[t] = "model-00002-of-00003.safetensors"
    edit_index(ckpt, move)
    f = [x for x in open_store(ckpt).findings if x.code == "GQ123"]
    assert len(f) == 1 and "model-00001-of-00003.safetensors" in f[0].message


def test_tensor_missing_from_index(ckpt):
    edit_index(ckpt, lambda d: d["weight_map"].pop("model.norm.weight"))
    f = [x for x in open_store(ckpt).findings if x.code == "GQ124"]
    assert [x.tensor for x in f] == ["model.norm.weight"]


def test_orphan_shard(ckpt):
    shutil.copy(ckpt / "model-00001-of-00003.safetensors", ckpt / "extra.safetensors")
    f = [x for x in open_store(ckpt).findings if x.code == "GQ125"]
    assert [x.file for x in f] == ["extra.safetensors"]


def test_tensor_in_two_shards_without_index(tmp_path):
    d = tmp_path / "two"
    d.mkdir()
    single = CKPT / "b4-sym-noact-gptq_v2-single" / "model.safetensors"
    shutil.copy(single, d / "a.safetensors")
    shutil.copy(single, d / "b.safetensors")
    assert "GQ126" in codes(d)


def test_total_size_mismatch(ckpt):
    edit_index(ckpt, lambda d: d["metadata"].__setitem__("total_size", 1))
    assert codes(ckpt) == ["GQ127"]


def test_empty_directory(tmp_path):
    with pytest.raises(FindingError) as e:
        open_store(tmp_path)
    assert e.value.finding.code == "GQ128"


TORCH_ZIP = b"PK\x03\x04" + bytes(22) + struct.pack("<HH", 16, 0) + b"archive/data.pkl"
GGUF = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)
LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 9\n"
NO_SAFETENSORS = "no *.safetensors file and no model.safetensors.index.json in this directory"


def no_safetensors(d, files):
    """GQ128 of directory `d` holding `files` (name: bytes) beside a config."""
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text("{}")
    for name, data in files.items():
        (d / name).write_bytes(data)
    with pytest.raises(FindingError) as e:
        open_store(d)
    assert len(e.value.findings) == 1 and e.value.finding.code == "GQ128"
    assert e.value.finding.file == str(d) and e.value.finding.message.startswith(NO_SAFETENSORS)
    return e.value.finding


def test_a_directory_of_pytorch_weights_names_them_and_the_conversion(tmp_path):
    d = tmp_path / "ck"
    f = no_safetensors(d, {"pytorch_model.bin": TORCH_ZIP, "training_args.bin": TORCH_ZIP})
    assert f.message == f"{NO_SAFETENSORS}; it holds pytorch_model.bin, a PyTorch checkpoint " \
        "(torch.save's ZIP format, entry archive/data.pkl)"
    assert f.hint.startswith("convert the weights to safetensors first: `python -c ")
    assert f'torch.load("{d}/pytorch_model.bin"' in f.hint
    assert f'"{d}/model.safetensors")' in f.hint and f.hint.endswith(f", then pass {d}")


def test_a_directory_of_pytorch_shards_counts_the_others(tmp_path):
    d = tmp_path / "ck"
    f = no_safetensors(d, {f"pytorch_model-0000{i}-of-00003.bin": TORCH_ZIP for i in (1, 2, 3)}
                       | {"model.gguf": GGUF})
    assert f.message.endswith("; it holds model.gguf, a GGUF file (version 3), llama.cpp's "
                              "format, and 3 more files in another format; gptqfmt checks GPTQ "
                              "checkpoints in safetensors, so there is nothing here for it to "
                              "check")
    f = no_safetensors(tmp_path / "shards",
                       {f"pytorch_model-0000{i}-of-00003.bin": TORCH_ZIP for i in (1, 2, 3)})
    assert "it holds pytorch_model-00001-of-00003.bin, a PyTorch checkpoint" in f.message
    assert "and 2 more files in another format" in f.message
    assert "first (likewise for the 2 other files): " in f.hint
    assert "model-00001-of-00003.safetensors" in f.hint


def test_a_directory_of_gguf_says_there_is_nothing_to_check(tmp_path):
    d = tmp_path / "ck"
    f = no_safetensors(d, {"model-q4_0.gguf": GGUF})
    assert f.message == f"{NO_SAFETENSORS}; it holds model-q4_0.gguf, a GGUF file (version 3), " \
        "llama.cpp's format; gptqfmt checks GPTQ checkpoints in safetensors, so there is " \
        "nothing here for it to check"
    assert f.hint == f"to see what it holds: `gguf-dump {d}/model-q4_0.gguf` (pip install gguf)"


def test_a_directory_of_lfs_pointers_says_to_pull(tmp_path):
    d = tmp_path / "ck"
    f = no_safetensors(d, {"pytorch_model.bin": LFS})
    assert f.message.endswith("; it holds pytorch_model.bin, a git-LFS pointer file")
    assert f"`cd {d} && git lfs pull`" in f.hint


@pytest.mark.parametrize("files", [
    {"training_args.bin": TORCH_ZIP, "optimizer.pt": TORCH_ZIP, "rng_state_0.pth": TORCH_ZIP},
    {"pytorch_model.bin": b"\x00" * 64},          # unrecognised content: nothing to name
    {"notes.txt": GGUF},                           # not named like weights
])
def test_a_directory_without_weights_in_another_format_keeps_the_plain_message(tmp_path,
                                                                                files):
    f = no_safetensors(tmp_path / "ck", files)
    assert f.message == NO_SAFETENSORS and f.hint is None


def test_missing_path_is_usage_error(tmp_path):
    with pytest.raises(UsageError):
        open_store(tmp_path / "nope")


@pytest.mark.parametrize(("text", "code"), [("{", "GQ120"), ('{"weight_map": []}', "GQ120"),
                                            ("[]", "GQ120"), ('{"metadata": {}}', "GQ120")])
def test_invalid_index(ckpt, text, code):
    (ckpt / INDEX_NAME).write_text(text)
    with pytest.raises(FindingError) as e:
        open_store(ckpt)
    assert e.value.finding.code == code


@pytest.mark.parametrize("doc,where", [
    ({"weight_map": {}}, None), ({"weight_map": {"a": "s.safetensors"}, "metadata": [1]}, None),
    ({"weight_map": {"a": 1}}, "weight_map.a"), ({"weight_map": {"a": None}}, "weight_map.a"),
    ({"weight_map": {"b": "s", "a": ["s"]}}, "weight_map.a"), ({"weight_map": "s"}, "weight_map"),
    ({"weight_map": None}, "weight_map"), ({"metadata": {}}, "(top level)"),
    ([], "(top level)"), ("x", "(top level)"), (3, "(top level)"), (None, "(top level)")])
def test_the_index_is_accepted_exactly_when_its_schema_is(tmp_path, doc, where):
    """The reader's quick check of a valid index accepts exactly what the schema does (the
    schema's verdict is the parameter's own), and where it fails the schema names the place."""
    from gptqfmt.resources import validator

    assert validator("index").is_valid(doc) == (where is None)
    path = tmp_path / INDEX_NAME
    path.write_text(json.dumps(doc))
    if where is None:
        assert _read_index(path)[0] == doc["weight_map"]
    else:
        with pytest.raises(FindingError) as e:
            _read_index(path)
        assert e.value.finding.code == "GQ120"
        assert e.value.finding.message.startswith(f"{where}: ")


def test_corrupt_shard_is_a_finding_and_others_still_read(ckpt):
    p = ckpt / "model-00003-of-00003.safetensors"
    p.write_bytes(p.read_bytes()[:100])
    store = open_store(ckpt)
    assert "GQ103" in {f.code for f in store.findings} or "GQ114" in {f.code for f in
                                                                      store.findings}
    assert len(store.files) == 2


def test_reads_through_symbolic_links_like_the_hf_cache(tmp_path):
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(SRC.iterdir())):
        shutil.copy(f, blobs / f"blob{i}")
        os.symlink(os.path.relpath(blobs / f"blob{i}", snap), snap / f.name)
    ck = open_checkpoint(snap)
    assert ck.findings == [] and len(ck.modules) == 7


def test_without_index_only_model_safetensors_is_loaded(tmp_path):
    single = CKPT / "b4-sym-noact-gptq_v2-single" / "model.safetensors"
    shutil.copy(single, tmp_path / "model.safetensors")
    save_file({"x": np.zeros(2, np.float16)}, tmp_path / "consolidated.safetensors")
    store = open_store(tmp_path)
    assert list(store.files) == ["model.safetensors"] and "x" not in store.locations
    assert [(f.code, f.file) for f in store.findings] == [("GQ125", "consolidated.safetensors")]


def test_shard_that_is_a_directory(ckpt):
    p = ckpt / "model-00002-of-00003.safetensors"
    p.unlink()
    p.mkdir()
    f = [x for x in open_store(ckpt).findings if x.code == "GQ122"]
    assert len(f) == 1 and "not a regular file" in f[0].message


@pytest.mark.parametrize("meta", [None, {"total_size": "12"}, []])
def test_odd_metadata_is_a_warning_and_reading_goes_on(ckpt, meta):
    edit_index(ckpt, lambda d: d.__setitem__("metadata", meta))
    store = open_store(ckpt)
    assert len(store.files) == 3
    assert [f.code for f in store.findings] == (["GQ127"] if meta == {"total_size": "12"} else [])


def test_a_tensor_in_two_shards_is_where_the_index_says_when_in_either(tmp_path):
    """A tensor stored in two shards (GQ126) is found first in one; the index mapping it to the
    other is right (no GQ123), and to a third is wrong, saying where it was found."""
    from safetensors.numpy import save_file
    d = tmp_path / "dup"
    d.mkdir()
    x = np.arange(4, dtype=np.float32)
    save_file({"a": x, "t": x}, d / "s1.safetensors")
    save_file({"b": x, "t": x}, d / "s2.safetensors")
    save_file({"c": x}, d / "s3.safetensors")
    for where, wrong in (("s2.safetensors", []), ("s1.safetensors", []),
                         ("s3.safetensors", ["index maps it to s3.safetensors, which does not "
                                             "contain it; it is in s1.safetensors"])):
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "a": "s1.safetensors", "b": "s2.safetensors", "c": "s3.safetensors", "t": where}}))
        store = open_store(d)
        found = store.findings
        assert [f.message for f in found if f.code == "GQ123"] == wrong
        assert [f.tensor for f in found if f.code == "GQ126"] == ["t"]
        # a tensor's entry is the one of the file it is located in, and only its tensors have one
        assert store.infos == {t: store.files[s].tensors[t] for t, s in store.locations.items()}
        assert store.info("t") is store.files["s1.safetensors"].tensors["t"]


def recorded_releases(monkeypatch) -> list:
    """Each SafetensorsFile.release from now on, as (start, stop)."""
    from gptqfmt.safetensors_io.reader import SafetensorsFile

    dropped = []
    real = SafetensorsFile.release

    def release(self, start=0, stop=None):
        dropped.append((start, stop))
        return real(self, start, stop)
    monkeypatch.setattr(SafetensorsFile, "release", release)
    return dropped


@pytest.mark.parametrize("band_rows", [1, 3, 7, 100])
def test_columns_are_the_view_columns_taken_a_band_at_a_time(tmp_path, monkeypatch, band_rows):
    """TensorStore.columns: tensor[:, idx] whatever the band (a row at a time, bands that do
    not divide the rows, one band), each band's pages dropped once taken: one release per band,
    over that band's bytes of the file."""
    from gptqfmt.safetensors_io import index

    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**31, (13, 40), dtype=np.int64).astype(np.int32)
    save_file({"pad": np.zeros(3, np.int8), "t": a}, tmp_path / "model.safetensors")
    store = open_store(tmp_path)
    monkeypatch.setattr(index, "BAND", band_rows * 40 * 4)
    dropped = recorded_releases(monkeypatch)
    idx = np.array([0, 5, 6, 39])
    assert np.array_equal(store.columns("t", idx), a[:, idx])
    f = store.files["model.safetensors"]
    at = f.header.data_start + f.tensors["t"].begin
    bands = list(range(0, 13, band_rows)) + [13]
    assert dropped == [(at + r0 * 160, at + r1 * 160) for r0, r1 in zip(bands, bands[1:])]


def test_release_ranges_drops_exactly_those_tensors_whatever_the_flag(tmp_path, monkeypatch):
    """A thread that reads tensors while another releases whole files drops its own pages by
    their ranges: one release per tensor, over its bytes, even when the file's flag was
    cleared by a whole-file release after it viewed them."""
    save_file({"a": np.arange(10, dtype=np.int32), "b": np.arange(7, dtype=np.int16)},
              tmp_path / "model.safetensors")
    store = open_store(tmp_path)
    f = store.files["model.safetensors"]
    store.view("a")
    store.release(["a"])           # the other thread's whole-file release: the flag is clear
    assert not f.viewed
    dropped = recorded_releases(monkeypatch)
    store.release_ranges(["a", "b"])
    at = f.header.data_start
    assert dropped == [(at + f.tensors["a"].begin, at + f.tensors["a"].end),
                       (at + f.tensors["b"].begin, at + f.tensors["b"].end)]
