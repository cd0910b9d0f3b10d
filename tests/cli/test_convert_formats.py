"""convert between formats (gptqfmt/conversion/reformat.py, reformat_gate.py): gptq/gptq_v2 to
compressed-tensors, compressed-tensors and AWQ to gptq_v2, through the one module model; the
refusals, the gate that catches a wrong writer, kills that leave nothing, and verify --against
across formats.

Oracles: compressed-tensors' own compressor and decompressor (a test dependency, never a
runtime one), make_formats.py's independent slow writers of each documented layout, and golden
words."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from gptqfmt import formats
from gptqfmt.bits.layout import stored_fields
from gptqfmt.bits.packing import unpack
from gptqfmt.conversion import convert
from gptqfmt.errors import FindingError, UsageError
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from gptqfmt.formats.relayout import awq_fields
from gptqfmt.ops.verify import validate
from gptqfmt.resources import validator
from gptqfmt.safetensors_io import SafetensorsFile, save_file
from gptqfmt.safetensors_io.index import open_store
from tests.support import (
    CKPT,
    FORMATS,
    HAVE_CT,
    ROOT,
    SPECS,
    Q,
    dequant_all,
    digest,
    load_generator,
    needs_ct,
    rewrite_tensors,
    staging_dirs,
    tensors_of,
)

FMANIFEST = json.loads((FORMATS / "manifest.json").read_text())

FGEN = load_generator("make_formats")

if HAVE_CT:
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
    )

# every GPTQ fixture in gptq_v2 without act-order, one file each: all bits, sym and group sizes
V2_PLAIN = sorted(n for n, s in SPECS.items()
                  if s.convention == "gptq_v2" and not s.act_order and s.config_style == "gptqmodel"
                  and s.declared == "same" and s.g_idx and not n.endswith("-sharded")
                  and not n.startswith(("rt-", "mislabelled"))) + ["b4-asym-noact-gptq_v2-sharded"]


@pytest.mark.parametrize("name", V2_PLAIN)
def test_gptq_v2_to_ct_and_back_is_byte_identical(name, tmp_path):
    src = CKPT / name
    ct, back = tmp_path / "ct", tmp_path / "back"
    rep = convert(src, ct, to="compressed-tensors", backend="cpu")
    assert rep.written and rep.gate.ok and rep.to_json()["detected"]["verdict"] == "gptq_v2"
    assert not list(validator("convert").iter_errors({**rep.to_json(), "exit_code": 0}))
    convert(ct, back, to="gptq_v2", backend="cpu")
    a, b = tensors_of(src), tensors_of(back)
    if SPECS[name].word_bits == 32:
        assert a == b
    else:  # GPTQModel's int8/16/64 words come back as int32 words of the same bit stream
        assert {k: v for k, v in a.items() if not k.endswith((".qweight", ".qzeros"))} == \
            {k: v for k, v in b.items() if not k.endswith((".qweight", ".qzeros"))}
    wa, wb = dequant_all(src), dequant_all(back)
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert validate(back).failed() is False and validate(ct).failed() is False


@pytest.mark.parametrize("name", sorted(n for n in FMANIFEST if "clamp" not in n))
def test_format_fixture_to_gptq_v2_keeps_every_code_zero_and_scale(name, tmp_path):
    out = tmp_path / "out"
    rep = convert(FORMATS / name, out, backend="cpu")
    assert rep.written and rep.to_json()["detected"] is None
    assert validate(out).failed() is False
    truth = FMANIFEST[name]["modules"]
    src = open_store(FORMATS / name)
    try:
        with open_checkpoint(out) as ck:
            assert {m.name for m in ck.modules} == set(truth)
            for m in ck.modules:
                # the written GPTQ tensors against the fixture's, read without gptqfmt's readers
                q, z, s = fixture_fields(src, m.name, m.bits,
                                         FMANIFEST[name]["params"]["layout"] == "awq",
                                         truth[m.name],
                                         FMANIFEST[name]["params"]["packing"] == "padded")
                assert np.array_equal(unpack(ck.view(m.tensors["qweight"]), m.bits, 0), q)
                assert np.array_equal(unpack(ck.view(m.tensors["qzeros"]), m.bits, 1), z)
                assert np.array_equal(np.asarray(ck.view(m.tensors["scales"])), s)
                assert int((z == 0).sum()) == truth[m.name]["zero_fields"], m.name
    finally:
        src.close()
    q = json.loads((out / "quantize_config.json").read_text())
    assert q["checkpoint_format"] == q["format"] == "gptq_v2"


def fixture_fields(st, name, bits, is_awq, truth, padded=False):
    """Codes [K, N], Z [G, N] and scales [G, N] of a format fixture's module, decoded here by
    the documented layouts (AutoAWQ's nibble loop; compressed-tensors' bit stream, 32-bit words
    split by hand, or with `padded` its 0.17 words of floor(32/bits) fields each),
    independently of gptqfmt.formats."""
    k, n, g = truth["in_features"], truth["out_features"], truth["groups"]
    if is_awq:
        def nibbles(t):
            w = np.asarray(st.view(f"{name}.{t}")).view(np.uint32)
            out = np.empty((w.shape[0], w.shape[1] * 8), np.uint8)
            for i, ch in enumerate(FGEN.AWQ_ORDER):
                out[:, ch::8] = (w >> np.uint32(4 * i)) & 15
            return out
        return nibbles("qweight"), nibbles("qzeros"), np.asarray(st.view(f"{name}.scales"))

    def stream(words, count):   # per row: value c at stream bit c*bits
        w = np.asarray(words).view(np.uint32).astype(np.uint64)
        bits_ = np.concatenate([(w >> np.uint64(b)) & 1 for b in range(32)], axis=0)
        bits_ = bits_.reshape(32, *w.shape).transpose(1, 2, 0).reshape(w.shape[0], -1)
        if padded:   # each word's fields 0 .. floor(32/bits)-1, its top bits left out
            per = 32 // bits
            bits_ = bits_.reshape(w.shape[0], -1, 32)[:, :, :per * bits].reshape(w.shape[0], -1)
        vals = bits_[:, :count * bits].reshape(w.shape[0], count, bits)
        return (vals << np.arange(bits, dtype=np.uint64)).sum(axis=2).astype(np.uint8)
    q = stream(st.view(f"{name}.weight_packed"), k).T
    zp = f"{name}.weight_zero_point"
    z = stream(np.asarray(st.view(zp)).T, n) if zp in st.locations else \
        np.full((g, n), 1 << (bits - 1), np.uint8)
    return q, z, np.ascontiguousarray(np.asarray(st.view(f"{name}.weight_scale")).T)


def test_awq_to_compressed_tensors_through_the_one_model(tmp_path):
    convert(FORMATS / "awq-b4-g32", tmp_path / "ct", to="compressed-tensors", backend="cpu")
    wa, wb = dequant_all(FORMATS / "awq-b4-g32"), dequant_all(tmp_path / "ct")
    assert set(wa) == set(wb) and all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert not validate(tmp_path / "ct").failed()


@pytest.mark.parametrize("src", [FORMATS / "awq-b4-g32", CKPT / "b4-asym-noact-gptq_v2-sharded"])
def test_weight_packed_made_in_small_bands_is_the_same_file(src, monkeypatch, tmp_path):
    """weight_packed is made a band at a time (formats/relayout.py: Banded): with bands of a
    few rows, each tensor takes many bands and several of them wait on the writer, and every
    output file is byte for byte the one whole-sized bands make."""
    convert(src, tmp_path / "whole", to="compressed-tensors", backend="cpu")
    for constant, value in (("BAND_BYTES", 64), ("AWQ_TILE", 1), ("TRANSPOSE_TILE", 1)):
        monkeypatch.setattr(f"gptqfmt.formats.relayout.{constant}", value)
    seen: list[int] = []
    real = formats.relayout.Banded.bands

    def counted(self, *a, **k):
        out = real(self, *a, **k)
        seen.append(len(out))
        return out
    monkeypatch.setattr(formats.relayout.Banded, "bands", counted)
    convert(src, tmp_path / "bands", to="compressed-tensors", backend="cpu")
    assert seen and min(seen) > 3   # every weight_packed in several bands
    files = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "bands").iterdir())
    for name in files:
        assert (tmp_path / "whole" / name).read_bytes() == \
            (tmp_path / "bands" / name).read_bytes(), name


def test_awq_keeps_zero_points_of_zero(tmp_path):
    """The case every AWQ -> GPTQ converter loses: Z = 0 stays 0 in gptq_v2."""
    truth = FMANIFEST["awq-b4-g32"]["modules"]
    assert sum(t["zero_fields"] for t in truth.values()) > 0
    convert(FORMATS / "awq-b4-g32", tmp_path / "out", backend="cpu")
    r = validate(tmp_path / "out")
    assert not r.failed() and r.detection.verdict == "gptq_v2"


def test_mixed_schemes_become_dynamic_rules_and_back(tmp_path):
    convert(FORMATS / "ct-b2-asym-mixed", tmp_path / "v2", backend="cpu")
    q = json.loads((tmp_path / "v2" / "quantize_config.json").read_text())
    assert q["bits"] == 2 and q["dynamic"] == {
        r"-:^model\.layers\.0\.self_attn\.o_proj$": {},
        r"+:^model\.layers\.0\.mlp\.down_proj$": {"bits": 8, "group_size": 32, "sym": False,
                                                  "desc_act": False}}
    with open_checkpoint(tmp_path / "v2") as ck:
        assert {m.name: m.bits for m in ck.modules}["model.layers.0.mlp.down_proj"] == 8
        assert {m.name: (m.declared.bits if m.declared else None) for m in ck.modules} == \
            {m.name: m.bits for m in ck.modules}
    convert(tmp_path / "v2", tmp_path / "ct", to="compressed-tensors", backend="cpu")
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    groups = {g["weights"]["num_bits"]: g["targets"] for g in qc["config_groups"].values()}
    assert groups[8] == ["model.layers.0.mlp.down_proj"] and len(groups[2]) == 5
    assert "model.layers.0.self_attn.o_proj" in qc["ignore"] and "lm_head" in qc["ignore"]
    assert tensors_of(tmp_path / "ct") == tensors_of(FORMATS / "ct-b2-asym-mixed")


def test_gptq_dynamic_fixture_becomes_config_groups(tmp_path):
    convert(CKPT / "dynamic-b4-asym-gptq_v2", tmp_path / "ct", to="compressed-tensors",
            backend="cpu")
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    bits = sorted(g["weights"]["num_bits"] for g in qc["config_groups"].values())
    assert bits == [4, 8] and "model.layers.0.self_attn.o_proj" in qc["ignore"]
    assert not (tmp_path / "ct" / "quantize_config.json").exists()  # GPTQModel would read it


def refusal_codes(src, to):
    try:
        convert(src, src.parent / "never", to=to, dry_run=True, backend="cpu")
    except FindingError as e:
        return sorted({f.code for f in e.findings})
    return []


@pytest.mark.parametrize("name", sorted(n for n, s in SPECS.items() if s.convention == "gptq"
                                        and s.config_style == "gptqmodel"
                                        and s.declared == "same"))
def test_gptq_to_ct_refuses_where_gptq_to_v2_does_plus_act_order(name, tmp_path):
    src = tmp_path / name
    shutil.copytree(CKPT / name, src)
    v2, ct = refusal_codes(src, "gptq_v2"), refusal_codes(src, "compressed-tensors")
    with open_checkpoint(src) as ck:
        no_form = any(m.act_order or (m.group_size not in (-1, None) and
                                      m.in_features % m.group_size)
                      for m in ck.modules if m.valid)
    assert set(ct) - {"GQ419"} == set(v2)             # the same zero-point refusals
    if not v2:                                         # and GQ419 exactly where no form exists
        assert ("GQ419" in ct) == no_form
    if no_form:
        assert SPECS[name].act_order or SPECS[name].group_size not in (32, -1, 128)


def test_act_order_refusal_names_the_reason(tmp_path):
    with pytest.raises(FindingError) as e:
        convert(CKPT / "b4-asym-act-gptq_v2-single", tmp_path / "x", to="compressed-tensors")
    f = e.value.findings[0]
    assert f.code == "GQ419" and "removed 2026/08/27" in f.message and "vLLM 0.30" in f.message
    assert f.hint and not (tmp_path / "x").exists()


def test_partial_last_group_is_refused(tmp_path):
    src = CKPT / "rt-ragged-b4-sym-gptq_v2"       # in_features 96, group_size 64
    with open_checkpoint(src) as ck:
        assert all(m.in_features % 64 for m in ck.modules)
    with pytest.raises(FindingError) as e:
        convert(src, tmp_path / "x", to="compressed-tensors")
    assert {f.code for f in e.value.findings} == {"GQ419"}
    f = e.value.findings[0]
    assert "divisible by the given group_size" in f.message and f.tensor.endswith(".qweight")


def test_a_quantized_module_the_config_excludes_is_refused(tmp_path):
    """GQ313 (quantized although `dynamic` excludes it) has no config of the target: refused,
    not carried over as stray GPTQ tensors."""
    src = tmp_path / "src"
    shutil.copytree(CKPT / "b4-asym-noact-gptq_v2-single", src)
    for name in ("quantize_config.json", "config.json"):
        doc = json.loads((src / name).read_text())
        q = doc.get("quantization_config", doc)
        q["dynamic"] = {r"-:.*q_proj": {}}
        (src / name).write_text(json.dumps(doc))
    with pytest.raises(FindingError) as e:
        convert(src, tmp_path / "x", to="compressed-tensors")
    f = e.value.findings[0]
    assert [x.code for x in e.value.findings] == ["GQ419"] and "GQ313" in f.message
    assert f.tensor == f"{Q}.qweight" and not (tmp_path / "x").exists()


def test_old_ct_act_order_converts_to_gptq_v2_with_its_g_idx(tmp_path):
    convert(FORMATS / "ct-b4-asym-actorder-g32", tmp_path / "v2", backend="cpu")
    with open_checkpoint(tmp_path / "v2") as ck:
        assert all(m.act_order for m in ck.modules)
    q = json.loads((tmp_path / "v2" / "quantize_config.json").read_text())
    assert q["desc_act"] is True


@pytest.mark.parametrize("args, fragment", [
    (("awq-b4-g32", "gptq"), "converts to gptq_v2"),
    (("ct-b4-asym-g32", "compressed-tensors"), "already compressed-tensors"),
    (("ct-b4-asym-g32", "gptq"), "convert that to gptq afterwards"),
])
def test_unsupported_directions_are_usage_errors(args, fragment, tmp_path):
    name, to = args
    with pytest.raises(UsageError, match=fragment):
        convert(FORMATS / name, tmp_path / "x", to=to)


def test_gptq_source_with_a_foreign_from_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="not --from awq"):
        convert(CKPT / "b4-sym-noact-gptq_v2-single", tmp_path / "x", src_convention="awq")


def test_against_a_sym_gptq_with_a_stored_maxq_reports_not_raises(run_cli, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(CKPT / "b4-sym-noact-gptq-single", src)
    convert(src, tmp_path / "ct", to="compressed-tensors", backend="cpu")

    def one_maxq(t):
        z = t[f"{Q}.qzeros"][1]
        z[0, 0] |= np.int32(0xF)   # field 0 of the first group: 15 (v1's ambiguous maxq)
    rewrite_tensors(src, one_maxq)
    r = run_cli("verify", src, "--against", tmp_path / "ct")
    assert r.exit_code == 1 and "DIFFERS" in r.stdout


def test_jobs_between_formats_is_refused_not_ignored(tmp_path):
    with pytest.raises(UsageError, match="--jobs applies between gptq and gptq_v2"):
        convert(FORMATS / "ct-b4-asym-g32", tmp_path / "x", jobs=2)


def test_from_must_name_the_source_format(tmp_path):
    with pytest.raises(UsageError, match="not --from awq"):
        convert(FORMATS / "ct-b4-asym-g32", tmp_path / "x", src_convention="awq")
    with pytest.raises(UsageError, match="a GPTQ checkpoint"):
        convert(CKPT / "b4-sym-noact-gptq_v2-single", tmp_path / "x",
                to="compressed-tensors", src_convention="compressed-tensors")


def test_clamped_export_is_refused(tmp_path):
    with pytest.raises(FindingError) as e:
        convert(FORMATS / "ct-b4-asym-signed-clamp", tmp_path / "x")
    assert {f.code for f in e.value.findings} == {"GQ418"} and not (tmp_path / "x").exists()


def test_against_across_formats(run_cli, tmp_path):
    src = CKPT / "b4-asym-noact-gptq-sharded"
    convert(src, tmp_path / "v2", backend="cpu", allow_lossy=True)
    convert(tmp_path / "v2", tmp_path / "ct", to="compressed-tensors", backend="cpu")
    r = run_cli("verify", tmp_path / "v2", "--against", tmp_path / "ct", "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["summary"]["differ"] == 0
    assert doc["src_convention"] == "gptq_v2" and doc["dst_convention"] == "compressed-tensors"
    assert not list(validator("equivalence").iter_errors(doc))
    # the gptq source reads its maxq fields as Z = 16 (the reference runtime): not equal there
    r = run_cli("verify", src, "--against", tmp_path / "ct")
    assert r.exit_code == 1 and "DIFFERS" in r.stdout
    # one flipped code is found
    d = tmp_path / "ct2"
    shutil.copytree(tmp_path / "ct", d)
    shard = next(p for p in sorted(d.glob("*.safetensors"))
                 if f"{Q}.weight_packed" in SafetensorsFile(p).tensors)
    f = SafetensorsFile(shard)
    t = {n: (i.dtype, np.array(f.view(n))) for n, i in f.tensors.items()}
    meta = f.metadata
    t[f"{Q}.weight_packed"][1][3, 0] ^= 1
    save_file(t, shard, meta)
    r = run_cli("verify", tmp_path / "ct", "--against", d)
    assert r.exit_code == 1 and Q in r.stdout.split("DIFFERS")[0]


def ct_state(d, m, src):
    """compressed-tensors' decompression of module `m` of the checkpoint at d."""
    st = src.store
    sd = {k: torch.from_numpy(np.array(st.view(v)))
          for k, v in (("weight_packed", m.tensors["qweight"]),
                       ("weight_scale", m.tensors["scales"]),
                       ("weight_shape", m.tensors["shape"]))}
    if "qzeros" in m.tensors:
        sd["weight_zero_point"] = torch.from_numpy(np.array(st.view(m.tensors["qzeros"])))
    if m.scale_dtype == "BF16":
        sd["weight_scale"] = sd["weight_scale"].view(torch.bfloat16)
    g = src.config.group_for(m.name)
    args = QuantizationArgs(num_bits=g.bits, type="int", symmetric=g.symmetric,
                            strategy=g.strategy, group_size=g.group_size)
    return PackedQuantizationCompressor.decompress(sd, QuantizationScheme(targets=["Linear"],
                                                                          weights=args))


def to_dtype(w32: np.ndarray, dtype: str) -> np.ndarray:
    t = torch.from_numpy(w32)
    return t.to(torch.bfloat16 if dtype == "BF16" else torch.float16).float().numpy()


@needs_ct
@pytest.mark.parametrize("name", [n for n in V2_PLAIN if SPECS[n].word_bits == 32])
def test_compressed_tensors_decompresses_our_output_to_our_dequant(name, tmp_path):
    convert(CKPT / name, tmp_path / "ct", to="compressed-tensors", backend="cpu")
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    QuantizationConfig.model_validate(qc)    # their own parser accepts what we write
    ours = dequant_all(CKPT / name)
    src = formats.open_source(tmp_path / "ct")
    try:
        for m in src.modules:
            theirs = ct_state(tmp_path / "ct", m, src)["weight"].float().numpy()   # [N, K]
            assert np.array_equal(theirs, to_dtype(ours[m.name], m.scale_dtype).T), m.name
    finally:
        src.close()


def test_library_entry_point_and_cli_agree(run_cli, tmp_path):
    import gptqfmt
    rep = gptqfmt.convert(FORMATS / "ct-b4-sym-g32-sharded", tmp_path / "lib")
    r = run_cli("convert", FORMATS / "ct-b4-sym-g32-sharded", tmp_path / "cli", "--format",
                "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["from"] == "compressed-tensors" and doc["to"] == "gptq_v2"
    assert not list(validator("convert").iter_errors(doc))
    assert tensors_of(tmp_path / "lib") == tensors_of(tmp_path / "cli") and rep.written
    idx = json.loads((tmp_path / "cli" / "model.safetensors.index.json").read_text())
    total = sum(p.stat().st_size for p in (tmp_path / "cli").glob("*.safetensors"))
    assert sorted(set(idx["weight_map"].values())) == sorted(
        p.name for p in (tmp_path / "cli").glob("*.safetensors"))
    assert 0 < idx["metadata"]["total_size"] < total
    assert not [f for f in validate(tmp_path / "cli").findings if f.code == "GQ125"]
    r = run_cli("convert", FORMATS / "ct-b4-sym-g32-sharded", tmp_path / "t")
    assert "carried exactly" in r.stdout and "verified (cpu)" in r.stdout


def test_dry_run_writes_nothing(run_cli, tmp_path):
    r = run_cli("convert", CKPT / "b4-sym-noact-gptq-single", tmp_path / "x", "--to",
                "compressed-tensors", "--dry-run")
    assert r.exit_code == 0 and "would convert" in r.stdout and not (tmp_path / "x").exists()


@pytest.mark.faults
@pytest.mark.parametrize("fault", ["mid-shard:1.2", "before-gate", "gate-module:3",
                                   "before-rename:SIGTERM"])
def test_killed_conversion_leaves_nothing(fault, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(CKPT / "b4-asym-noact-gptq_v2-sharded", src)
    before = digest(src)
    env = {**os.environ, "GPTQFMT_FAULT": fault, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "gptqfmt", "convert", str(src),
                        str(tmp_path / "dst"), "--to", "compressed-tensors", "--quiet"],
                       env=env, capture_output=True, text=True)
    sig = signal.SIGTERM if fault.endswith("SIGTERM") else signal.SIGKILL
    assert r.returncode in (-sig, 128 + sig), r.stderr
    assert not (tmp_path / "dst").exists() and digest(src) == before
    if sig == signal.SIGTERM:   # unwound like an error: the staging directory is gone too
        assert not staging_dirs(tmp_path)
    else:                       # the next run removes what the killed one left
        convert(src, tmp_path / "dst", to="compressed-tensors", backend="cpu")
        assert not staging_dirs(tmp_path)


def test_a_wrong_writer_is_caught_by_the_gate(monkeypatch, tmp_path):
    from gptqfmt.formats.ct import CtWriter
    real = CtWriter.tensor

    def off_by_one(self, role, src, m):
        out = real(self, role, src, m)
        if role == "scales" and m.name == Q:
            out = out.copy()
            out.view(np.uint16)[0, 0] ^= 1
        return out
    monkeypatch.setattr(CtWriter, "tensor", off_by_one)
    with pytest.raises(FindingError) as e:
        convert(CKPT / "b4-asym-noact-gptq_v2-single", tmp_path / "x", to="compressed-tensors")
    assert {f.code for f in e.value.findings} == {"GQ503"}
    assert "(scales: 1 of 128 values differ)" in e.value.findings[0].message
    assert not (tmp_path / "x").exists() and not staging_dirs(tmp_path)


@pytest.mark.parametrize("src", [CKPT / "b4-asym-noact-gptq_v2-single", FORMATS / "awq-b4-g32"])
def test_a_wrong_zero_point_is_caught_by_the_gate(monkeypatch, tmp_path, src):
    """One zero point of one module written one higher: AWQ stores Z itself, so its words are
    compared whole (Source.zero_words) and the cell count comes from the cell-by-cell path;
    gptq_v2 takes that path from the start. Both name the module and the one cell."""
    from gptqfmt.formats.ct import CtWriter
    real = CtWriter.tensor

    def one_higher(self, role, source, m):
        out = real(self, role, source, m)
        if role == "qzeros" and m.name == Q:
            out = out.copy()
            low = int(out.view(np.uint32)[-1, -1]) & 0xF   # the last group's last word
            out.view(np.uint32)[-1, -1] ^= low ^ ((low + 1) & 0xF)
        return out
    monkeypatch.setattr(CtWriter, "tensor", one_higher)
    with pytest.raises(FindingError) as e:
        convert(src, tmp_path / "x", to="compressed-tensors")
    assert {f.code for f in e.value.findings} == {"GQ503"}
    assert e.value.findings[0].message.startswith(f"{Q}: the converted module does not ")
    assert "(1 zero points differ" in e.value.findings[0].message
    assert not (tmp_path / "x").exists() and not staging_dirs(tmp_path)


@pytest.mark.parametrize("name", [FORMATS / "awq-b4-g32", CKPT / "b4-asym-noact-gptq_v2-single",
                                  CKPT / "b3-asym-noact-gptq_v2-single"])
def test_zero_points_stored_exactly_are_compared_word_for_word(monkeypatch, tmp_path, name):
    """A source whose stored words hold Z itself (AWQ, gptq_v2) is never unpacked whole at the
    gate when its words match: the cell-by-cell reading (Source.zeros) is not called, and the
    module's cells are still counted in the report."""
    from gptqfmt.formats.gptq.source import GptqSource
    from gptqfmt.formats.source import ExactSource

    def unpacked(self, m, gptq_rule=None):
        raise AssertionError(f"{m.name}: unpacked whole")
    monkeypatch.setattr(ExactSource, "zeros", unpacked)
    monkeypatch.setattr(GptqSource, "zeros", unpacked)
    gate = convert(name, tmp_path / "ct", to="compressed-tensors").gate
    assert gate.ok and gate.modules and all(c.zeros_equal and c.cells for c in gate.modules)
    src = formats.open_source(name)
    try:
        m = src.modules[0]
        raw = np.asarray(src.store.view(m.tensors["qzeros"]))
        # Z read apart from zero_words: AWQ's nibbles put in channel order one by one
        # (awq_fields, not the delta swaps), GPTQ's stored fields
        truth = awq_fields(raw) if src.labelled is None else stored_fields(raw, m.bits)
        assert np.array_equal(unpack(src.zero_words(m), m.bits, axis=1), truth)
        assert gate.modules[0].cells == m.groups * m.out_features
    finally:
        src.close()


@pytest.mark.parametrize("name", ["b4-asym-noact-gptq-single", "b4-asym-noact-gptq_v2-single"])
def test_zero_words_only_where_the_stored_words_are_z(name):
    """gptq stores Z - 1 (and a maxq two runtimes read two ways): it has no zero words, and
    neither has gptq_v2's data read as gptq. Read as gptq_v2, the stored words are Z, what
    the rule reads of them (Source.zeros), and qzeros() gives them as they are."""
    src = formats.open_source(CKPT / name)
    try:
        m = src.modules[0]
        as_v2 = src.read_as("gptq_v2", allow_lossy=True)
        raw = np.asarray(src.store.view(m.tensors["qzeros"])).view(np.int32)
        assert np.array_equal(as_v2.zero_words(m), raw)
        assert np.array_equal(as_v2.qzeros(m), raw)
        assert unpack(as_v2.zero_words(m), m.bits, axis=1).tolist() == \
            as_v2.zeros(m)[0].tolist()
        assert src.read_as("gptq").zero_words(m) is None
    finally:
        src.close()


@pytest.mark.parametrize("src", [CKPT / "b4-asym-noact-gptq_v2-single", FORMATS / "awq-b4-g32"])
@pytest.mark.parametrize("which", ["first", "last"])
def test_a_wrong_code_word_is_caught_by_the_gate(monkeypatch, tmp_path, src, which):
    """One word of one module's weight_packed flipped in the staged output: the gate, which
    compares each module's codes on another thread while it checks the module before, names
    that module and that word, whether it is the first module or the last."""
    from gptqfmt.conversion import run

    real = run.run_format_gate
    hit = []

    def flipped(source, tmp, to, backend="cpu", on_module=None):
        names = sorted(m.name for m in source.modules)
        name = names[0] if which == "first" else names[-1]
        for shard in sorted(tmp.glob("*.safetensors")):
            f = SafetensorsFile(shard)
            t = f"{name}.weight_packed"
            if t in f.tensors:
                at = f.header.data_start + f.tensors[t].begin + 4 * 5
                with open(shard, "r+b") as fh:
                    fh.seek(at)
                    b = fh.read(1)
                    fh.seek(at)
                    fh.write(bytes([b[0] ^ 0x10]))
                hit.append(name)
        return real(source, tmp, to, backend, on_module)
    monkeypatch.setattr(run, "run_format_gate", flipped)
    with pytest.raises(FindingError) as e:
        convert(src, tmp_path / "x", to="compressed-tensors")
    assert len(hit) == 1
    assert [f.code for f in e.value.findings] == ["GQ503"]
    assert e.value.findings[0].message.startswith(f"{hit[0]}: the converted module does not ")
    assert "(qweight: 1 of " in e.value.findings[0].message
    assert not (tmp_path / "x").exists() and not staging_dirs(tmp_path)


# ------------------------------- compressed-tensors' padded layout (<= 0.17) re-packed dense

PADDED = FORMATS / "ct-b3-asym-g32-padded"    # ct-b3-asym-g32's weights, packed as 0.17.1 did


def _version(d) -> tuple[int, ...]:
    v = json.loads((d / "config.json").read_text())["quantization_config"]["version"]
    return tuple(int(x) for x in v.split(".")[:2])


def test_a_padded_checkpoint_converts_to_the_dense_layout(run_cli, tmp_path):
    """convert SRC DST --to compressed-tensors re-packs the padded words: the tensors are those
    of the same weights packed densely (ct-b3-asym-g32, byte for byte), the config names a
    release that packs densely, and verify --against finds both compute the same."""
    out = tmp_path / "dense"
    r = run_cli("convert", PADDED, out, "--to", "compressed-tensors", "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and (doc["from"], doc["to"]) == ("compressed-tensors",) * 2
    assert not list(validator("convert").iter_errors(doc))
    assert tensors_of(out) == tensors_of(FORMATS / "ct-b3-asym-g32")
    assert _version(out) >= (0, 18)
    rep = validate(out)
    assert rep.findings == [] and rep.to_json()["pack_layout"]["layout"] == "dense"
    for a, b in ((PADDED, out), (out, PADDED), (PADDED, FORMATS / "ct-b3-asym-g32")):
        r = run_cli("verify", a, "--against", b, "--format", "json")
        eq = json.loads(r.stdout)
        assert r.exit_code == 0 and eq["status"] == "ok" and eq["findings"] == [], r.stdout
        assert len(eq["modules"]) == 7 and all(m["equal"] for m in eq["modules"])
    text = run_cli("verify", PADDED, "--against", FORMATS / "ct-b3-asym-g32").stdout
    assert "OK: 7 of 7 modules compute the same Y = X @ W" in text


def test_a_dense_checkpoint_is_not_converted_into_itself(run_cli, tmp_path):
    r = run_cli("convert", FORMATS / "ct-b3-asym-g32", tmp_path / "x", "--to",
                "compressed-tensors")
    assert r.exit_code == 2 and "is already compressed-tensors" in r.stderr
    assert not (tmp_path / "x").exists()


def test_a_padded_checkpoint_converts_to_gptq_v2_as_the_dense_one_does(tmp_path):
    convert(PADDED, tmp_path / "a", backend="cpu")
    convert(FORMATS / "ct-b3-asym-g32", tmp_path / "b", backend="cpu")
    assert tensors_of(tmp_path / "a") == tensors_of(tmp_path / "b")


@pytest.mark.parametrize("name", ["b3-asym-noact-gptq_v2-single", "b3-sym-noact-gptq-single"])
def test_3_bit_gptq_converts_to_the_dense_layout(name, tmp_path):
    """What convert writes at 3 bits is 0.18's dense layout, K*3/32 words a row (not 0.17's
    ceil(K/10)), under a config version that packs densely."""
    convert(CKPT / name, tmp_path / "ct", to="compressed-tensors", backend="cpu")
    assert _version(tmp_path / "ct") >= (0, 18)
    st = open_store(tmp_path / "ct")
    try:
        packed = [t for t in st.locations if t.endswith(".weight_packed")]
        for t in packed:
            n, k = (int(v) for v in np.asarray(st.view(t[:-len("packed")] + "shape")))
            assert tuple(st.info(t).shape) == (n, k * 3 // 32) != (n, -(-k // 10)), t
    finally:
        st.close()
    assert packed and validate(tmp_path / "ct").to_json()["pack_layout"]["layout"] == "dense"


@pytest.mark.parametrize("name, lossy", [(FORMATS / "awq-b4-g32", False),
                                         (CKPT / "b4-asym-noact-gptq_v2-single", False),
                                         (CKPT / "b4-asym-noact-gptq-single", True)])
def test_the_gate_takes_each_modules_columns_on_its_second_thread(monkeypatch, tmp_path,
                                                                   name, lossy):
    """The columns Y = X @ W is computed on are taken on the gate's second thread, beside the
    word comparison that has the module's qweight mapped: once a module and side, a block of
    GEMM_COLUMNS. A module with lossy cells (gptq's stored 0 fields, which gptq_v2 cannot
    say) adds up to half as many lossy columns, taken again on this thread. What the gate
    says of every module is what check_module says taking everything itself, on one thread,
    with the same draws."""
    import threading

    from gptqfmt.conversion import reformat_gate as rg
    from gptqfmt.formats.awq import AwqSource
    from gptqfmt.formats.ct import CtSource
    from gptqfmt.formats.gptq.source import GptqSource
    from gptqfmt.numerics import get_backend
    taken: list[tuple[str, bool, list[int]]] = []
    for cls in (AwqSource, CtSource, GptqSource):
        real = cls.qweight_columns

        def recorded(self, m, cols, real=real):
            taken.append((m.name, threading.current_thread() is threading.main_thread(),
                          [int(c) for c in cols]))
            return real(self, m, cols)
        monkeypatch.setattr(cls, "qweight_columns", recorded)
    gate = convert(name, tmp_path / "ct", to="compressed-tensors", allow_lossy=lossy).gate
    src = formats.open_source(name)
    if src.labelled is not None:   # read as convert reads it: as its data are (gptq, gptq_v2)
        src = src.read_as("gptq" if lossy else "gptq_v2", allow_lossy=lossy)
    out = formats.open_source(tmp_path / "ct")
    try:
        mods = src.modules
        ahead = [t for t in taken if not t[1]]
        assert [n for n, _, _ in ahead] == [m.name for m in mods for _ in "ab"]
        assert all(cols == list(range(cols[0], cols[0] + rg.GEMM_COLUMNS))
                   for _, _, cols in ahead)
        here = [n for n, main, _ in taken if main]
        assert bool(here) == lossy and set(here) <= {c.name for c in gate.modules
                                                      if c.lossy_cells}
        assert any(c.lossy_cells for c in gate.modules) == lossy
        theirs = {m.name: m for m in out.modules}
        alone = [rg.check_module(src, out, m, theirs[m.name], [get_backend("cpu")], None, i)[0]
                 for i, m in enumerate(mods)]
        assert gate.modules == alone
    finally:
        src.close()
        out.close()
