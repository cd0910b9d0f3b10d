"""The compressed-tensors reader (gptqfmt/formats/ct.py): one finding per defect of its config or
tensors, the exporter's signed clamp, padding bits, the stream compressed-tensors itself
writes read back, and its two packing layouts (padded up to 0.17, dense from 0.18) told apart by
the shapes and read alike."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gptqfmt import formats
from gptqfmt.bits.packing import unpack
from gptqfmt.conversion import convert
from gptqfmt.errors import FindingError
from gptqfmt.ops.inspect import inspect_checkpoint
from gptqfmt.ops.verify import validate
from gptqfmt.resources import validator
from gptqfmt.safetensors_io import save_file
from tests.support import (
    FORMATS,
    HAVE_CT,
    Q,
    ct_copy,
    ct_release_helpers,
    dequant_all,
    edit_config,
    load_generator,
    needs_ct,
    rewrite_tensors,
    tensors_of,
)

if HAVE_CT:
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
    )


def test_signed_clamp_is_found_in_every_module_and_by_inspect():
    rep = validate(FORMATS / "ct-b4-asym-signed-clamp")
    hits = [f for f in rep.findings if f.code == "GQ418"]
    assert len(hits) == 7 and all("auto-round" in f.message for f in hits)
    assert {f.code for f in inspect_checkpoint(FORMATS / "ct-b4-asym-signed-clamp").findings} \
        == {"GQ418"}


def _float_weights(q):
    q["config_groups"]["group_0"]["weights"]["type"] = "float"


def _no_group_size(q):
    q["config_groups"]["group_0"]["weights"]["group_size"] = 0


def _symmetric_string(q):
    q["config_groups"]["group_0"]["weights"]["symmetric"] = "false"


def _ignore_not_a_list(q):
    q["ignore"] = 5


def _symmetric_over_zero_points(q):
    q["config_groups"]["group_0"]["weights"]["symmetric"] = True


def _untargeted(q):
    q["config_groups"]["group_0"]["targets"] = ["re:.*mlp.*"]


def _ignored(q):
    q["ignore"].append(Q)


CASES = [
    ("GQ210", "ct-b4-asym-g32", _float_weights, None, "type is 'float'"),
    ("GQ210", "ct-b4-asym-g32", _no_group_size, None, "group_size is 0"),
    ("GQ210", "ct-b4-asym-g32", _symmetric_string, None, "symmetric is 'false'"),
    ("GQ210", "ct-b4-asym-g32", _ignore_not_a_list, None, "ignore is 5"),
    ("GQ303", "ct-b4-asym-g32", _symmetric_over_zero_points, None, "readers of a symmetric"),
    ("GQ303", "ct-b4-asym-g32", None,
     lambda t: t.__setitem__(f"{Q}.weight_shape", ("I64", np.array([64, -64], np.int64))),
     "expected positive"),
    ("GQ211", "ct-b4-asym-g32", _untargeted, None, "no config group"),
    ("GQ211", "ct-b4-asym-g32", _ignored, None, "ignore lists"),
    ("GQ301", "ct-b4-asym-g32", None, lambda t: t.pop(f"{Q}.weight_zero_point"),
     "weight_zero_point"),
    ("GQ302", "ct-b4-asym-g32", None,
     lambda t: t.__setitem__(f"{Q}.weight_scale", ("F64", t[f"{Q}.weight_scale"][1]
                                                     .astype(np.float64))), "dtype F64"),
    ("GQ303", "ct-b4-asym-g32", None,
     lambda t: t.__setitem__(f"{Q}.weight_scale", ("F16", t[f"{Q}.weight_scale"][1][:, :1])),
     "weight_scale is [64, 1]"),
    ("GQ304", "ct-b4-asym-g32", None,
     lambda t: t.__setitem__(f"{Q}.weight_packed", ("I32", t[f"{Q}.weight_packed"][1][:, :4])),
     "weight_packed is [64, 4]"),
    ("GQ501", "ct-b4-asym-g32", None,
     lambda t: t[f"{Q}.weight_scale"][1].__setitem__((0, 0), np.float16(0)),
     "NaN, infinite or zero"),
]


@pytest.mark.parametrize("code, name, cfg_edit, tensor_edit, fragment", CASES,
                         ids=[f"{c[0]}-{c[4][:18]}" for c in CASES])
def test_one_finding_per_defect(code, name, cfg_edit, tensor_edit, fragment, tmp_path):
    d = ct_copy(tmp_path, name)
    if cfg_edit:
        edit_config(d, cfg_edit)
    if tensor_edit:
        rewrite_tensors(d, tensor_edit)
    rep = validate(d)
    found = [f for f in rep.findings if f.code == code]
    assert found and fragment in found[0].message, [f.one_line() for f in rep.findings]
    assert found[0].file and (found[0].tensor or code in ("GQ210",))
    with pytest.raises(FindingError):
        convert(d, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_padding_bits_set_are_found(tmp_path):
    """K = 60 at 3 bits: 180 bits in 6 words, 12 padding bits that must be zero."""
    d = ct_copy(tmp_path, "ct-b3-asym-g32")
    edit_config(d, lambda q: q["config_groups"]["group_0"]["weights"].update(
        {"strategy": "channel", "group_size": None}))

    def channel_k60(t):
        for n in [x for x in t if x.endswith(".weight_shape")]:
            p = n[:-len("weight_shape")]
            if t[n][1][1] == 64:
                t[n] = ("I64", np.array([t[n][1][0], 60], np.int64))
                t[p + "weight_packed"][1][:, -1] &= np.int32(0x000FFFFF)  # values 50..59
            t[p + "weight_scale"] = ("F16", t[p + "weight_scale"][1][:, :1].copy())
            t[p + "weight_zero_point"] = ("I32", t[p + "weight_zero_point"][1][:, :1].copy())
        t[f"{Q}.weight_packed"][1][0, -1] |= np.int32(1 << 29)      # a padding bit
    rewrite_tensors(d, channel_k60)
    rep = validate(d)
    assert [f.code for f in rep.findings] == ["GQ317"], [f.one_line() for f in rep.findings]
    assert rep.findings[0].tensor == f"{Q}.weight_packed" and "1 of 64" in \
        rep.findings[0].message


def to_dtype(w32: np.ndarray, dtype: str) -> np.ndarray:
    t = torch.from_numpy(w32)
    return t.to(torch.bfloat16 if dtype == "BF16" else torch.float16).float().numpy()


@needs_ct
@pytest.mark.parametrize("bits, sym, gs", [(2, False, 32), (3, False, 32), (4, False, 32),
                                           (4, True, 16), (8, False, -1), (8, True, 32),
                                           (3, True, -1)])
def test_we_read_what_compressed_tensors_compresses(bits, sym, gs, tmp_path):
    """A checkpoint written by compressed-tensors' own compressor: our reading dequantizes to
    its decompression, bit for bit, and converts to gptq_v2 and back to the same bytes."""
    torch.manual_seed(bits * 10 + gs)
    n, k = 64, 96
    strategy = "channel" if gs == -1 else "group"
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy=strategy,
                            group_size=None if gs == -1 else gs)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    w = torch.randn(n, k) * 0.02
    groups = 1 if gs == -1 else k // gs
    wg = w.reshape(n, groups, -1)
    lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
    if sym:
        hi = torch.maximum(-lo, hi)
        scale = (2 * hi / ((1 << bits) - 1)).to(torch.float16)
        zp = None
    else:
        scale = ((hi - lo) / ((1 << bits) - 1)).to(torch.float16)
        zp = (torch.round(-lo / scale.float()) - (1 << (bits - 1))).clamp(
            -(1 << (bits - 1)), (1 << (bits - 1)) - 1).to(torch.int8)
    sd = {"weight": w.half(), "weight_scale": scale}
    if zp is not None:
        sd["weight_zero_point"] = zp
    packed = PackedQuantizationCompressor.compress(sd, scheme)
    d = tmp_path / "theirs"
    d.mkdir()
    name = "model.layers.0.mlp.up_proj"
    tensors = {f"{name}.{k_}": v.numpy() for k_, v in packed.items()}
    tensors["lm_head.weight"] = np.zeros((8, k), np.float16)
    save_file(tensors, d / "model.safetensors")
    qc = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                            format="pack-quantized", quantization_status="compressed")
    cfg = {"quantization_config": {"version": "0.20.0", "quant_method": "compressed-tensors",
                                   **qc.model_dump(exclude=["quant_method"])}}
    (d / "config.json").write_text(json.dumps(cfg))
    theirs = PackedQuantizationCompressor.decompress(packed, scheme)["weight"].float().numpy()
    assert not validate(d).failed()
    ours = dequant_all(d)[name]
    assert np.array_equal(theirs, to_dtype(ours, "F16").T)
    convert(d, tmp_path / "v2", backend="cpu")
    convert(tmp_path / "v2", tmp_path / "back", to="compressed-tensors", backend="cpu")
    assert tensors_of(tmp_path / "back") == tensors_of(d)


# ------------------------------------- the two layouts: padded (<= 0.17) and dense (>= 0.18)

PADDED_FIXTURE = "ct-b3-asym-g32-padded"     # ct-b3-asym-g32's weights, packed as 0.17.1 did
FGEN = load_generator("make_formats")


def _set_version(version):
    return lambda q: q.__setitem__("version", version)


@pytest.mark.parametrize(("name", "version", "layout"), [
    ("ct-b3-asym-g32", "0.17.0", "dense"),               # an old version over dense shapes
    ("ct-b3-asym-g32", "0.17.2a20260301", "dense"),      # a nightly: dense already
    (PADDED_FIXTURE, "0.20.0", "padded"),                 # a new version over padded shapes
    (PADDED_FIXTURE, None, "padded")])
def test_the_shapes_decide_the_layout_not_the_version(name, version, layout, tmp_path):
    d = ct_copy(tmp_path, name)
    edit_config(d, (lambda q: q.pop("version")) if version is None else _set_version(version))
    rep = validate(d)
    assert [f.code for f in rep.findings] == (["GQ320"] if layout == "padded" else [])
    assert rep.to_json()["pack_layout"]["layout"] == layout
    ours, want = dequant_all(d), dequant_all(FORMATS / "ct-b3-asym-g32")
    assert set(ours) == set(want) and all(np.array_equal(ours[n], want[n]) for n in want)


def test_padded_and_dense_read_to_the_same_one_model():
    """The same weights in both layouts: every module's one-model tensors are equal word for
    word, and so is what they dequantize to."""
    pairs = []
    for name in ("ct-b3-asym-g32", PADDED_FIXTURE):
        src = formats.open_source(FORMATS / name)
        pairs.append({m.name: formats.module_tensors(src, m) for m in src.modules})
        src.close()
    dense, padded = pairs
    assert set(dense) == set(padded) and len(dense) == 7
    for n in dense:
        assert np.array_equal(dense[n].qweight, padded[n].qweight), n
        assert np.array_equal(dense[n].qzeros, padded[n].qzeros), n
    a, b = dequant_all(FORMATS / "ct-b3-asym-g32"), dequant_all(FORMATS / PADDED_FIXTURE)
    assert all(np.array_equal(a[n], b[n]) for n in a)


def test_inspect_and_verify_name_the_padded_layout_and_what_vllm_makes_of_it(run_cli):
    path = FORMATS / PADDED_FIXTURE
    doc = inspect_checkpoint(path).to_json()
    assert not list(validator("inspect").iter_errors({**doc, "exit_code": 0}))
    want = {"layout": "padded", "description": "padded (compressed-tensors <= 0.17)",
            "padded": 7, "dense": 0}
    assert doc["quantization"]["pack_layout"] == want and doc["status"] == "ok"
    rep = validate(path).to_json()
    assert not list(validator("report").iter_errors({**rep, "exit_code": 0}))
    assert rep["pack_layout"] == want and rep["status"] == "ok"
    [f] = rep["findings"]
    assert f["code"] == "GQ320" and f["severity"] == "warning"
    assert f["tensor"] == "model.layers.0.mlp.down_proj.weight_packed"
    assert "is [64, 13], dense [64, 12]" in f["message"] and "vLLM 0.25-0.33" in f["message"]
    assert f["hint"] == (f"re-pack it in the dense layout: gptqfmt convert {path} {path}-dense "
                         "--to compressed-tensors")
    text = run_cli("inspect", path).stdout
    assert "(layout padded (compressed-tensors <= 0.17); config version 0.17.1;" in text
    assert "layout padded (compressed-tensors <= 0.17)" in run_cli("verify", path).stdout
    dense = run_cli("inspect", FORMATS / "ct-b3-asym-g32").stdout
    assert "layout dense (compressed-tensors >= 0.18)" in dense and "GQ320" not in dense
    j = json.loads(run_cli("verify", FORMATS / "ct-b4-asym-g32", "--format", "json").stdout)
    assert j["pack_layout"]["layout"] == "either"      # 4 bits: one layout
    assert "layout" not in run_cli("inspect", FORMATS / "ct-b4-asym-g32").stdout


def _widen(tensor, width):
    def edit(t):
        old = t[tensor][1]
        t[tensor] = ("I32", np.zeros((old.shape[0], width), np.int32))
    return edit


def test_a_weight_that_fits_neither_layout_names_both_shapes(tmp_path):
    d = ct_copy(tmp_path, "ct-b3-asym-g32")
    rewrite_tensors(d, _widen(f"{Q}.weight_packed", 8))
    [f] = [f for f in validate(d).findings if f.code == "GQ304"]
    assert f.tensor == f"{Q}.weight_packed" and f.file == "model.safetensors"
    assert f.message == ("weight_packed is [64, 8]; weight_shape (64, 64) at 3 bits (config "
                         "group group_0) needs [64, 6] dense (compressed-tensors >= 0.18) or "
                         "[64, 7] padded (compressed-tensors <= 0.17)")


def test_a_zero_point_that_fits_neither_or_the_other_layout(tmp_path):
    d = ct_copy(tmp_path, "ct-b3-asym-g32")
    zp = f"{Q}.weight_zero_point"
    rewrite_tensors(d, lambda t: t.__setitem__(zp, ("I32", np.zeros((8, 2), np.int32))))
    [f] = [f for f in validate(d).findings if f.code == "GQ303"]
    assert f.tensor == zp and f.message == (
        "weight_zero_point is [8, 2]; expected [6, 2] dense (compressed-tensors >= 0.18) or "
        "[7, 2] padded (compressed-tensors <= 0.17)")
    rewrite_tensors(d, lambda t: t.__setitem__(zp, ("I32", np.zeros((7, 2), np.int32))))
    [f] = [f for f in validate(d).findings if f.code == "GQ303"]
    assert f.tensor == zp and "weight_packed [64, 6] is dense (compressed-tensors >= 0.18), but " \
        "weight_zero_point [7, 2] is padded (compressed-tensors <= 0.17)" in f.message


def test_a_set_bit_above_the_values_of_a_padded_word_is_found(tmp_path):
    d = ct_copy(tmp_path, PADDED_FIXTURE)

    def top_bit(t):
        t[f"{Q}.weight_packed"][1][5, 0] |= np.int32(1 << 30)
    rewrite_tensors(d, top_bit)
    bad = [f for f in validate(d).findings if f.code == "GQ317"]
    assert len(bad) == 1 and bad[0].tensor == f"{Q}.weight_packed"
    assert "1 of 64" in bad[0].message and "not the padded layout" in bad[0].message


def _tiny(d, modules, bits=3, version="0.17.1"):
    """A compressed-tensors checkpoint of asymmetric channel-strategy modules {name: (N, K,
    layout)}, packed by make_formats.py's slow writers; returns each module's codes [N, K] and
    zero points [1, N]."""
    rng = np.random.default_rng(len(modules) * 10 + bits)
    tensors, truth = {}, {}
    for name, (n, k, layout) in modules.items():
        q = rng.integers(0, 1 << bits, (n, k))
        z = rng.integers(0, 1 << bits, (1, n))
        s = (rng.random((n, 1)) * 0.01 + 0.001).astype(np.float16)
        rows = FGEN.padded_rows if layout == "padded" else FGEN.stream_rows
        tensors[f"{name}.weight_packed"] = rows(q, bits)
        tensors[f"{name}.weight_zero_point"] = np.ascontiguousarray(rows(z, bits).T)
        tensors[f"{name}.weight_scale"] = s
        tensors[f"{name}.weight_shape"] = np.array([n, k], np.int64)
        truth[name] = (q, z)
    d.mkdir()
    save_file(tensors, d / "model.safetensors")
    w = {"num_bits": bits, "type": "int", "symmetric": False, "strategy": "channel",
         "group_size": None, "dynamic": False}
    q = {"version": version, "quant_method": "compressed-tensors", "format": "pack-quantized",
         "quantization_status": "compressed", "ignore": [],
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": w}}}
    (d / "config.json").write_text(json.dumps({"quantization_config": q}))
    return truth


UNDECIDED = "model.layers.0.mlp.up_proj"      # 20 x 20 at 3 bits: 2 words a row either way


def test_a_module_whose_shapes_fit_both_layouts_is_not_read_alone(tmp_path):
    _tiny(tmp_path / "c", {UNDECIDED: (20, 20, "padded")})
    rep = validate(tmp_path / "c")
    [f] = rep.findings
    assert f.code == "GQ319" and f.severity == "error" and rep.failed()
    assert (f.file, f.tensor) == ("model.safetensors", f"{UNDECIDED}.weight_packed")
    assert f.message == (
        f"{UNDECIDED}.weight_packed is [20, 2]; weight_shape (20, 20) at 3 bits needs [20, 2] "
        "dense (compressed-tensors >= 0.18) or [20, 2] padded (compressed-tensors <= 0.17): the "
        "same shape, with the values at other bits; no other module's shapes tell the layout "
        "either: not read")
    assert rep.module_count == 0
    with pytest.raises(FindingError):
        convert(tmp_path / "c", tmp_path / "out")


@pytest.mark.parametrize("layout", ["padded", "dense"])
def test_the_other_modules_decide_an_undecided_one(layout, tmp_path):
    truth = _tiny(tmp_path / "c", {UNDECIDED: (20, 20, layout),
                                   "model.layers.0.mlp.down_proj": (64, 64, layout)})
    rep = validate(tmp_path / "c")
    assert [f.code for f in rep.findings] == (["GQ320"] if layout == "padded" else [])
    assert rep.to_json()["pack_layout"][layout] == 2
    assert_read_exactly(tmp_path / "c", truth)


def assert_read_exactly(d, truth, bits=3):
    """Every module's words as the reader hands them over are the dense rows make_formats.py's
    slow writer packs from the true codes and zero points (20 values of 3 bits are no whole
    words, so the one model's dequant does not take them)."""
    src = formats.open_source(d)
    try:
        assert {m.name for m in src.modules} == set(truth)
        for m in src.modules:
            q, z = truth[m.name]
            assert np.array_equal(src.stored_qweight(m)[0], FGEN.stream_rows(q, bits)), m.name
            assert np.array_equal(src.qzeros(m), FGEN.stream_rows(z, bits)), m.name
    finally:
        src.close()


def test_modules_that_disagree_leave_an_undecided_one_unread(tmp_path):
    _tiny(tmp_path / "c", {UNDECIDED: (20, 20, "dense"),
                           "model.layers.0.mlp.down_proj": (64, 64, "padded"),
                           "model.layers.0.mlp.gate_proj": (64, 64, "dense")})
    rep = validate(tmp_path / "c")
    assert sorted(f.code for f in rep.findings) == ["GQ319", "GQ320"]
    [f] = [f for f in rep.findings if f.code == "GQ319"]
    assert "the other modules' shapes say both layouts" in f.message
    assert rep.to_json()["pack_layout"] == {
        "layout": "mixed", "padded": 1, "dense": 1,
        "description": "mixed: 1 module padded (compressed-tensors <= 0.17), 1 dense "
                       "(compressed-tensors >= 0.18)"}


def test_rows_of_one_word_are_the_same_bits_in_both(tmp_path):
    """8 values of 3 bits fit one word: both layouts store them alike, nothing to decide."""
    truth = _tiny(tmp_path / "c", {UNDECIDED: (8, 8, "padded")})
    rep = validate(tmp_path / "c")
    assert rep.findings == [] and rep.to_json()["pack_layout"]["layout"] == "either"
    assert_read_exactly(tmp_path / "c", truth)


@pytest.mark.parametrize("bits", [5, 6, 7])
def test_the_layout_of_bits_gptqfmt_does_not_read_is_still_said(bits, tmp_path):
    """5, 6 and 7 bits are outside the one model (GQ210), but their shapes tell the layout, and
    the padded one is still one vLLM refuses: GQ320 then names compressed-tensors' own way."""
    _tiny(tmp_path / "c", {"model.layers.0.mlp.down_proj": (64, 64, "padded")}, bits=bits)
    doc = inspect_checkpoint(tmp_path / "c").to_json()
    assert doc["quantization"]["pack_layout"]["layout"] == "padded"
    codes = sorted(f["code"] for f in doc["findings"])
    assert codes == ["GQ210", "GQ320"], codes
    [f] = [f for f in doc["findings"] if f["code"] == "GQ320"]
    assert f"{32 // bits} values a word at {bits} bits" in f["message"]
    assert "gptqfmt convert" not in f["hint"] and "compressed-tensors 0.17" in f["hint"]


def test_we_read_what_compressed_tensors_0171_packs():
    """The padded fixture against compressed-tensors 0.17.1's own unpack_from_int32: the codes
    and zero points we read are theirs (+ 2^(bits-1))."""
    import torch
    ct = ct_release_helpers("0.17.1")
    src = formats.open_source(FORMATS / PADDED_FIXTURE)
    try:
        for m in src.modules:
            n, k = m.out_features, m.in_features
            t = formats.module_tensors(src, m)
            packed = torch.from_numpy(np.array(src.store.view(m.tensors["qweight"])))
            q = ct.unpack_from_int32(packed, 3, torch.Size((n, k))).numpy().astype(int) + 4
            assert np.array_equal(unpack(t.qweight, 3, axis=0).T, q), m.name
            zp = torch.from_numpy(np.array(src.store.view(m.tensors["qzeros"])))
            z = ct.unpack_from_int32(zp, 3, torch.Size((n, m.groups)), packed_dim=0).numpy()
            assert np.array_equal(unpack(t.qzeros, 3, axis=1).T, z.astype(int) + 4), m.name
    finally:
        src.close()
