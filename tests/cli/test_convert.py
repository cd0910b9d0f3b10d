"""convert: every fixture, both directions, against a slow independent reference."""
import json
import os
import shutil
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gptqfmt
from gptqfmt.bits.packing import pack
from gptqfmt.conversion import NotRepresentable, convert, convert_qzeros
from gptqfmt.errors import FindingError, UsageError
from gptqfmt.safetensors_io import SafetensorsFile
from tests.support import (
    CKPT,
    MANIFEST,
    SPECS,
    slow_pack_column,
    slow_unpack_column,
    staging_dirs,
)


# ---------------------------------------------------------------- the slow reference
def ref_fields(words_row, bits, word_bits):
    return slow_unpack_column([int(w) & ((1 << word_bits) - 1) for w in words_row], bits,
                              word_bits)


def ref_convert_field(s, bits, src, dst):
    """None where the target cannot hold it exactly."""
    maxq = 2**bits - 1
    if src == dst:
        return s
    if src == "gptq":
        return None if s == maxq else s + 1
    return None if s == 0 else s - 1


def ref_lossy_field(s, bits, src, dst):
    maxq = 2**bits - 1
    if src == "gptq" and s == maxq:
        return 0
    if src == "gptq_v2" and s == 0:
        return 0
    return ref_convert_field(s, bits, src, dst)


def read_all(path):
    f = SafetensorsFile(path)
    return f, {k: np.array(f.view(k)) for k in f.tensors}


# ---------------------------------------------------------------- convert_qzeros
def test_golden_words_both_ways_numpy_and_torch():
    v2 = pack(np.array([[1, 3, 15, 8, 8, 8, 8, 8]]), 4, 32, axis=1)
    v1 = convert_qzeros(v2, 4, "gptq_v2", "gptq")
    assert isinstance(v1, np.ndarray) and v1.dtype == np.int32
    assert int(v1.view(np.uint32)[0, 0]) == 0x77777E20
    back = convert_qzeros(torch.from_numpy(v1), 4, "gptq", "gptq_v2")
    assert isinstance(back, torch.Tensor) and back.dtype == torch.int32
    assert int(back.numpy().view(np.uint32)[0, 0]) == 0x88888F31


def test_refusals_name_counts():
    v2 = pack(np.array([[0, 3, 15, 8, 8, 8, 8, 0]]), 4, 32, axis=1)
    with pytest.raises(NotRepresentable) as e:
        convert_qzeros(v2, 4, "gptq_v2", "gptq")
    assert e.value.count == 2
    v1 = pack(np.array([[15, 2, 14, 7, 7, 7, 7, 7]]), 4, 32, axis=1)
    with pytest.raises(NotRepresentable) as e:
        convert_qzeros(v1, 4, "gptq", "gptq_v2")
    assert e.value.count == 1
    lossy = convert_qzeros(v1, 4, "gptq", "gptq_v2", allow_lossy=True)
    assert int(lossy.view(np.uint32)[0, 0]) == 0x88888F30  # doc: true zeros [0,3,15,8,...]


@pytest.mark.parametrize(("bits", "word_bits"), [(b, w) for b in (2, 3, 4, 8)
                                                 for w in (8, 16, 32, 64) if b != 3 or w == 32])
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_per_field_against_reference(bits, word_bits, data):
    vpw = 32 if bits == 3 else word_bits // bits
    n = vpw * data.draw(st.integers(1, 3))
    rows = data.draw(st.integers(1, 3))
    maxq = 2**bits - 1
    fields = np.array(data.draw(st.lists(st.integers(0, maxq), min_size=n * rows,
                                         max_size=n * rows))).reshape(rows, n)
    words = pack(fields, bits, word_bits, axis=1)
    for src, dst in (("gptq", "gptq_v2"), ("gptq_v2", "gptq")):
        expect = [[ref_convert_field(int(s), bits, src, dst) for s in r] for r in fields]
        if any(v is None for r in expect for v in r):
            with pytest.raises(NotRepresentable):
                convert_qzeros(words, bits, src, dst)
            expect = [[ref_lossy_field(int(s), bits, src, dst) for s in r] for r in fields]
            got = convert_qzeros(words, bits, src, dst, allow_lossy=True)
        else:
            got = convert_qzeros(words, bits, src, dst)
            # round trip is the identity where representable
            assert np.array_equal(convert_qzeros(got, bits, dst, src), words)
        assert got.dtype == words.dtype and got.shape == words.shape
        for r in range(rows):
            want = slow_pack_column(expect[r], bits, word_bits)
            assert [int(w) & ((1 << word_bits) - 1) for w in got[r]] == want


# ---------------------------------------------------------------- every fixture
def expected_outcome(name, to):
    """(refused, per-module problem counts) from the generator's truth and the raw bytes."""
    spec, truth = SPECS[name], MANIFEST[name]
    src = spec.convention
    counts = {}
    for mod, t in truth["modules"].items():
        if src == to:
            counts[mod] = 0
        elif src == "gptq_v2":
            counts[mod] = t["zero_fields"]                     # Z = 0 has no gptq encoding
        else:  # gptq -> gptq_v2: stored maxq fields, read from the bytes by the slow reference
            counts[mod] = None
    return src, counts


def stored_maxq_count(path, tensor, bits):
    f = SafetensorsFile(path)
    words = np.array(f.view(tensor))
    w = words.dtype.itemsize * 8
    return sum(v == 2**bits - 1 for row in words for v in ref_fields(row, bits, w))


# writer bugs the detector finds (tests/unit/test_read.py): convert refuses them (GQ405, and GQ403
# for sym files whose constants were corrupted) before it plans anything
CORRUPTED = {"autogptq-b2-asym-gptq", "autogptq-b3-asym-act-gptq", "autogptq-b4-asym-gptq",
             "gptqmodel-b4-asym-gptq", "gptqmodel603-b3-asym-gptq",
             "gptqmodel603-b3-sym-gptq"}


@pytest.mark.parametrize("to", ["gptq_v2", "gptq"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_fixture_converts_or_is_refused_exactly(tmp_path, name, to):
    spec = SPECS[name]
    if name in CORRUPTED:
        with pytest.raises(FindingError) as e:
            convert(CKPT / name, tmp_path / "out", to=to, src_convention=spec.convention)
        assert {f.code for f in e.value.findings} <= {"GQ405", "GQ403"}
        assert "GQ405" in {f.code for f in e.value.findings}
        assert not list(tmp_path.iterdir())
        return
    src_conv, counts = expected_outcome(name, to)
    src_dir = CKPT / name
    index = src_dir / "model.safetensors.index.json"
    where = (json.loads(index.read_text())["weight_map"] if index.exists() else None)

    single = None if where else next(src_dir.glob("*.safetensors")).name  # AutoGPTQ: gptq_model-*

    def file_of(t):
        return src_dir / (where[t] if where else single)
    for mod, c in counts.items():
        if c is None:
            counts[mod] = stored_maxq_count(file_of(f"{mod}.qzeros"), f"{mod}.qzeros",
                                            MANIFEST[name]["modules"][mod]["bits"])
    dst = tmp_path / "out"
    if any(counts.values()):
        with pytest.raises(FindingError) as e:
            convert(src_dir, dst, to=to, src_convention=src_conv)
        got = {f.tensor.removesuffix(".qzeros"): f.details["fields"] for f in e.value.findings}
        assert got == {m: c for m, c in counts.items() if c}
        assert not dst.exists() and not list(tmp_path.iterdir())
        return
    rep = convert(src_dir, dst, to=to, src_convention=src_conv)
    assert rep.written and rep.gate.ok
    check_output(src_dir, dst, spec, src_conv, to)


def holds_config(src_dir) -> bool:
    """Whether a file of src_dir holds a quantization config (else convert writes one)."""
    if (src_dir / "quantize_config.json").exists() or (src_dir / "quant_config.json").exists():
        return True
    cfg = src_dir / "config.json"
    return cfg.exists() and "quantization_config" in json.loads(cfg.read_text())


def check_output(src_dir, dst, spec, src_conv, to):
    # a source without any config file gets a quantize_config.json naming the target
    # (tests/cli/test_convert_configs.py checks its values)
    added = [] if holds_config(src_dir) else ["quantize_config.json"]
    assert sorted(p.name for p in dst.iterdir()) == sorted(
        [p.name for p in src_dir.iterdir()] + added)
    if added:
        new = json.loads((dst / "quantize_config.json").read_text())
        assert new["checkpoint_format"] == new["format"] == to
        assert (new["bits"], new["group_size"], new["desc_act"], new["sym"]) == \
            (spec.bits, spec.group_size, spec.act_order, spec.sym)
    for p in src_dir.glob("*.safetensors"):
        fs, ts = read_all(p)
        fd, td = read_all(dst / p.name)
        a, b = p.read_bytes(), (dst / p.name).read_bytes()
        assert a[:fs.header.data_start] == b[:fd.header.data_start]  # header unchanged
        for name, arr in ts.items():
            if not name.endswith(".qzeros"):
                assert arr.tobytes() == td[name].tobytes(), name
                continue
            bits = MANIFEST[spec.name]["modules"][name.removesuffix(".qzeros")]["bits"]
            w = arr.dtype.itemsize * 8
            for r in range(arr.shape[0]):
                expect = [ref_convert_field(s, bits, src_conv, to)
                          for s in ref_fields(arr[r], bits, w)]
                assert [int(x) & ((1 << w) - 1) for x in td[name][r]] == \
                    slow_pack_column(expect, bits, w)
    for cfg in ("quantize_config.json", "config.json"):
        if not (src_dir / cfg).exists():
            continue
        old, new = (json.loads((d / cfg).read_text()) for d in (src_dir, dst))
        if cfg == "config.json":
            assert {k: v for k, v in old.items() if k != "quantization_config"} == \
                {k: v for k, v in new.items() if k != "quantization_config"}
            old, new = old["quantization_config"], new["quantization_config"]
        if old.get("quant_method") == "auto-round":
            # auto-round's own config is written as GPTQ's: quant_method in its place, its
            # packing_format dropped, desc_act (which it never writes) false
            assert new["quant_method"] == "gptq" and "packing_format" not in new
            assert new["desc_act"] is False and "desc_act" not in old
            old = {k: "gptq" if k == "quant_method" else v for k, v in old.items()
                   if k != "packing_format"}
        if old.get("is_marlin_format") is False:
            # AutoGPTQ's legacy key, which GPTQModel refuses by name: dropped, and recorded
            assert "is_marlin_format" not in new
            assert new["meta"]["gptqfmt"]["removed"]["is_marlin_format"] is False
            old = {k: v for k, v in old.items() if k != "is_marlin_format"}
        assert new["checkpoint_format"] == new["format"] == to
        assert list(new)[:len(old)] == list(old)  # order kept, new keys at the end
        for k, v in old.items():
            if k not in ("checkpoint_format", "format", "meta"):
                assert new[k] == v
        meta = new["meta"]
        assert {k: v for k, v in meta.items() if k != "gptqfmt"} == old.get("meta", {})
        assert meta["gptqfmt"]["from"] == src_conv and meta["gptqfmt"]["to"] == to


def test_dequantized_weights_equal_by_an_independent_dequant(tmp_path):
    name = "b3-sym-act-gptq-sharded"
    dst = tmp_path / "o"
    convert(CKPT / name, dst)
    src, out = gptqfmt.open_checkpoint(CKPT / name), gptqfmt.open_checkpoint(dst)
    for m in src.modules:
        def w(ck, conv):
            q = gptqfmt.unpack(ck.view(m.tensors["qweight"]), m.bits, 0).astype(np.int64)
            z = gptqfmt.unpack(ck.view(m.tensors["qzeros"]), m.bits, 1).astype(np.int64)
            z = z + (1 if conv == "gptq" else 0)
            g = np.asarray(ck.view(m.tensors["g_idx"]))
            s = ck.view(m.tensors["scales"]).astype(np.float32)
            return s[g] * (q - z[g]).astype(np.float32)
        assert np.array_equal(w(src, "gptq"), w(out, "gptq_v2"))


# ---------------------------------------------------------------- behaviour
def test_auto_refuses_a_contradicted_label(tmp_path):
    with pytest.raises(FindingError) as e:
        convert(CKPT / "mislabelled-b4-sym-gptq-as-v2", tmp_path / "o", to="gptq")
    assert e.value.finding.code == "GQ408" and not (tmp_path / "o").exists()
    rep = convert(CKPT / "mislabelled-b4-sym-gptq-as-v2", tmp_path / "o", src_convention="gptq")
    assert rep.totals["changed"] == rep.totals["fields"]
    assert gptqfmt.validate(tmp_path / "o").findings == []


def test_already_in_target_is_a_verified_normalised_copy(tmp_path):
    # only `format` says gptq_v2: runtimes read gptq, so auto refuses; the user names the source
    with pytest.raises(FindingError) as e:
        convert(CKPT / "formatonly-b4-asym-gptq_v2", tmp_path / "o")
    assert e.value.finding.code == "GQ408"
    rep = convert(CKPT / "formatonly-b4-asym-gptq_v2", tmp_path / "o", src_convention="gptq_v2")
    assert rep.totals["changed"] == 0 and rep.gate.ok
    assert gptqfmt.validate(tmp_path / "o").findings == [
        f for f in gptqfmt.validate(tmp_path / "o").findings if f.code == "GQ407"]


def test_lossy_counts_and_report(tmp_path):
    name = "b4-asym-noact-gptq_v2-single"
    rep = convert(CKPT / name, tmp_path / "o", to="gptq", allow_lossy=True)
    want = {m: t["zero_fields"] for m, t in MANIFEST[name]["modules"].items()}
    assert {m.name: m.lossy for m in rep.modules} == want
    assert {f.code for f in rep.findings} == {"GQ411"}
    lossy_checks = [c for c in rep.gate.modules if c.lossy_cells]
    assert lossy_checks and all(c.zeros_equal and c.rel_err > 0 for c in lossy_checks)


def test_dry_run_writes_nothing(tmp_path):
    rep = convert(CKPT / "b4-sym-noact-gptq-single", tmp_path / "o", dry_run=True)
    assert not rep.written and not (tmp_path / "o").exists() and rep.gate is None


def test_existing_dst_needs_force(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "old.txt").write_text("x")
    with pytest.raises(UsageError):
        convert(CKPT / "b4-sym-noact-gptq-single", tmp_path / "o")
    convert(CKPT / "b4-sym-noact-gptq-single", tmp_path / "o", force=True)
    assert not (tmp_path / "o" / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_jobs_give_identical_bytes(tmp_path):
    name = "b2-asym-act-gptq_v2-sharded"
    convert(CKPT / name, tmp_path / "a", to="gptq_v2")
    convert(CKPT / name, tmp_path / "b", to="gptq_v2", jobs=3)
    for p in (tmp_path / "a").iterdir():
        assert p.read_bytes() == (tmp_path / "b" / p.name).read_bytes()


def test_source_untouched(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(CKPT / "b8-asym-act-gptq-sharded", src)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    with pytest.raises(FindingError):
        convert(src, tmp_path / "o")
    convert(src, tmp_path / "o2", allow_lossy=True)
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_invalid_input_refused(tmp_path):
    with pytest.raises(FindingError) as e:
        convert(CKPT.parent / "invalid" / "scales-wrong-shape", tmp_path / "o")
    assert e.value.finding.code == "GQ303" and not (tmp_path / "o").exists()


def test_cli_text_and_json(run_cli, tmp_path):
    r = run_cli("convert", CKPT / "b4-sym-act-gptq-sharded", tmp_path / "o")
    assert r.exit_code == 0
    assert "converted " in r.stdout and "verified (cpu)" in r.stdout
    r = run_cli("convert", CKPT / "b4-sym-act-gptq-sharded", tmp_path / "o")
    assert r.exit_code == 2 and "already exists" in r.stderr
    r = run_cli("convert", CKPT / "b4-asym-act-gptq-single", tmp_path / "p", "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and {f["code"] for f in doc["findings"]} == {"GQ409"}
    assert not (tmp_path / "p").exists()
    r = run_cli("convert", CKPT / "b4-sym-act-gptq-sharded", tmp_path / "q", "--backend", "cupy")
    assert r.exit_code == 2


def test_header_length_prefix_is_preserved(tmp_path):
    convert(CKPT / "b4-sym-noact-gptq-single", tmp_path / "o")
    a = (CKPT / "b4-sym-noact-gptq-single" / "model.safetensors").read_bytes()
    b = (tmp_path / "o" / "model.safetensors").read_bytes()
    assert struct.unpack("<Q", a[:8]) == struct.unpack("<Q", b[:8]) and len(a) == len(b)


def test_force_never_deletes_the_source(tmp_path):
    parent = tmp_path / "parent"
    src = parent / "src"
    shutil.copytree(CKPT / "b4-sym-noact-gptq-single", src)
    (parent / "sibling.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    for dst in (parent, src, tmp_path / "link"):
        if dst.name == "link":
            os.symlink(src, dst)
        with pytest.raises(UsageError):
            convert(src, dst, force=True)
    # an HF-cache layout: DST is the blobs folder the snapshot links into
    blobs, snap = tmp_path / "blobs", tmp_path / "snap"
    blobs.mkdir()
    snap.mkdir()
    for p in src.iterdir():
        shutil.copy(p, blobs / p.name)
        os.symlink(blobs / p.name, snap / p.name)
    with pytest.raises(UsageError):
        convert(snap, blobs, force=True)
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    assert (parent / "sibling.txt").read_text() == "mine"
    assert len(list(blobs.iterdir())) == len(before)


def test_config_json_without_quantization_config_is_kept(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(CKPT / "b4-sym-noact-gptq-single", src)
    (src / "config.json").write_text('{"model_type": "llama"}\n')
    (src / "original").mkdir()
    (src / "original" / "params.json").write_text("{}")
    convert(src, tmp_path / "o")
    assert (tmp_path / "o" / "config.json").read_text() == '{"model_type": "llama"}\n'
    assert (tmp_path / "o" / "original" / "params.json").read_text() == "{}"


def test_bad_values_are_refused_before_writing(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(CKPT / "b4-sym-noact-gptq-single", src)
    f = SafetensorsFile(src / "model.safetensors")
    t = {k: np.array(f.view(k)) for k in f.tensors}
    key = "model.layers.0.self_attn.q_proj.scales"
    t[key][0, 0] = np.nan
    from gptqfmt.safetensors_io import save_file
    save_file(t, src / "model.safetensors", f.metadata)
    with pytest.raises(FindingError) as e:
        convert(src, tmp_path / "o")
    assert [x.code for x in e.value.findings] == ["GQ501"] and not (tmp_path / "o").exists()


def test_lossy_totals_count_resolved_ambiguous_fields(tmp_path):
    name = "b4-asym-noact-gptq-single"
    rep = convert(CKPT / name, tmp_path / "o", allow_lossy=True)
    truth = MANIFEST[name]["modules"]
    assert rep.totals["ambiguous"] == rep.totals["lossy"] == sum(t["zero_fields"]
                                                                 for t in truth.values())
    meta = json.loads((tmp_path / "o" / "quantize_config.json").read_text())["meta"]["gptqfmt"]
    assert meta["command"] == "convert" and meta["totals"] == rep.totals
    assert meta["totals"]["lossy"] > 0


def test_exceptions_cross_process_boundaries():
    import pickle

    from gptqfmt.findings import Finding
    e = FindingError(Finding("GQ118", "gone", file="a"), Finding("GQ122", "x"))
    back = pickle.loads(pickle.dumps(e))
    assert [f.code for f in back.findings] == ["GQ118", "GQ122"]
    n = pickle.loads(pickle.dumps(NotRepresentable("3 fields", 3)))
    assert n.count == 3 and str(n) == "3 fields"


def test_json_report_validates_and_dry_run_checks_dst(run_cli, tmp_path):
    from gptqfmt.resources import validator
    r = run_cli("convert", CKPT / "b4-sym-noact-gptq-single", tmp_path / "o", "--format", "json")
    doc = json.loads(r.stdout)
    validator("convert").validate(doc)
    assert doc["exit_code"] == 0 and doc["written"] is True
    r = run_cli("convert", CKPT / "b4-asym-act-gptq-single", tmp_path / "p", "--format", "json")
    validator("convert").validate(json.loads(r.stdout))
    r = run_cli("convert", CKPT / "b4-sym-noact-gptq-single", tmp_path / "o", "--dry-run")
    assert r.exit_code == 2 and "already exists" in r.stderr


@pytest.mark.parametrize("to", ["gptq", "gptq_v2"])
def test_a_from_the_data_contradict_is_refused_with_nothing_written(tmp_path, run_cli, to):
    """--from gptq on gptq_v2 data: read as asked, every zero point would be written off by one
    (or, into gptq, a gptq label over gptq_v2 data): refused, nothing written, the way out named."""
    src = CKPT / "b4-asym-noact-gptq_v2-single"
    r = run_cli("convert", src, tmp_path / "o", "--from", "gptq", "--to", to)
    assert r.exit_code == 1 and not (tmp_path / "o").exists()
    assert r.stdout.splitlines()[1].startswith(
        "GQ422 --from gptq, but the data are gptq_v2 (confidence 1.0000)")
    assert "drop --from (the data decide: gptq_v2), or add --trust-from" in r.stdout
    assert staging_dirs(tmp_path) == []


@pytest.mark.parametrize(("name", "to"), [("b4-asym-noact-gptq_v2-single", "gptq"),
                                          ("b4-sym-noact-gptq_v2-single", "gptq_v2")])
def test_a_trusted_from_is_kept_only_when_verify_passes_the_output(tmp_path, run_cli, name,
                                                                   to):
    """With --trust-from the conversion runs as asked (GQ413), and the staged output is
    verified as a whole: an output verify would fail is never written."""
    r = run_cli("convert", CKPT / name, tmp_path / "o", "--from", "gptq", "--to", to,
                "--trust-from", "--allow-lossy")
    assert r.exit_code == 1 and not (tmp_path / "o").exists()
    assert r.stdout.splitlines()[1].startswith(
        f"{tmp_path / 'o'}: GQ503 verify of the output would report ")
    assert staging_dirs(tmp_path) == []


def test_a_trusted_from_the_data_agree_with_converts(tmp_path):
    rep = convert(CKPT / "b4-sym-noact-gptq-single", tmp_path / "o", src_convention="gptq",
                  to="gptq_v2", trust_from=True)
    assert rep.written and rep.findings == []


def test_converts_from_a_hugging_face_cache_snapshot(tmp_path):
    """The cache is made of symbolic links into blobs/: read through them, write real files."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    src = CKPT / "b4-sym-act-gptq-sharded"
    for i, f in enumerate(sorted(src.iterdir())):
        shutil.copy(f, blobs / f"blob{i}")
        os.symlink(os.path.relpath(blobs / f"blob{i}", snap), snap / f.name)
    before = {p.name: p.read_bytes() for p in blobs.iterdir()}
    rep = convert(snap, tmp_path / "out")
    assert rep.written and rep.gate.ok
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in src.iterdir())
    assert not any(p.is_symlink() for p in out.iterdir())
    assert {p.name: p.read_bytes() for p in blobs.iterdir()} == before


@pytest.mark.parametrize("after", [False, True], ids=["before-rename", "after-rename"])
def test_a_disk_error_says_whether_dst_was_put_in_place(tmp_path, monkeypatch, after):
    """An OSError before the rename leaves nothing; one after it (the parent directory's
    fsync) leaves a complete DST, and the message says which."""
    from gptqfmt.conversion import atomic
    from gptqfmt.errors import OutputError
    dst = tmp_path / "out"
    real = atomic.fsync_path

    def failing(path):
        if (os.path.abspath(path) == str(tmp_path)) == after:
            raise OSError(5, "Input/output error", str(path))
        real(path)
    monkeypatch.setattr(atomic, "fsync_path", failing)
    with pytest.raises(OutputError) as e:
        convert(CKPT / "b4-sym-act-gptq-sharded", dst, backend="cpu")
    if after:
        assert f"Input/output error after {dst} was put in place" in str(e.value)
        assert not gptqfmt.validate(dst).failed()
    else:
        assert "cannot write the output: Input/output error; nothing was written" in str(e.value)
        assert not dst.exists() and list(tmp_path.iterdir()) == []


def test_a_trusted_from_in_place_is_rolled_back_when_verify_would_fail(tmp_path, run_cli):
    """In place, the trusted output is verified as a whole before the journal completes: the
    checkpoint is left byte for byte as it was."""
    src = tmp_path / "c"
    shutil.copytree(CKPT / "b4-sym-noact-gptq_v2-single", src)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    r = run_cli("convert", src, "--in-place", "--from", "gptq", "--to", "gptq_v2",
                "--trust-from")
    assert r.exit_code == 1 and f"{src}: GQ503 verify of the output would report" in r.stdout
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
