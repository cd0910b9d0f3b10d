"""Sharded checkpoints: the index against the shards, one test per finding."""
import json
import os
import shutil

import numpy as np
import pytest

from gptqfmt.errors import FindingError, UsageError
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from gptqfmt.safetensors_io import save_file
from gptqfmt.safetensors_io.index import INDEX_NAME, open_store
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
