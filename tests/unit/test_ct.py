"""The compressed-tensors reader (gptqfmt/formats/ct.py): one finding per defect of its config or
tensors, the exporter's signed clamp, padding bits, and the stream compressed-tensors itself
writes read back."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gptqfmt.conversion import convert
from gptqfmt.errors import FindingError
from gptqfmt.ops.inspect import inspect_checkpoint
from gptqfmt.ops.verify import validate
from gptqfmt.safetensors_io import save_file
from tests.support import (
    FORMATS,
    HAVE_CT,
    Q,
    ct_copy,
    dequant_all,
    edit_config,
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


def _old_3bit(q):
    q["version"] = "0.17.0"


def _untargeted(q):
    q["config_groups"]["group_0"]["targets"] = ["re:.*mlp.*"]


def _ignored(q):
    q["ignore"].append(Q)


CASES = [
    ("GQ210", "ct-b4-asym-g32", _float_weights, None, "type is 'float'"),
    ("GQ210", "ct-b3-asym-g32", _old_3bit, None, "32 // 3 values per word"),
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
