"""verify --against and --reference fp32 on the CPU backend (the GPU runs the same in test_gpu)."""
import json
import shutil

import numpy as np
import pytest

from gptqfmt.bits.packing import pack, unpack
from gptqfmt.conversion import convert
from gptqfmt.formats import open_source
from gptqfmt.ops.equivalence import compare
from gptqfmt.resources import validator
from gptqfmt.safetensors_io import SafetensorsFile, save_file
from tests.support import CKPT, FORMATS, MANIFEST, loops

LOSSLESS = [("b4-sym-act-gptq-sharded", "gptq_v2"), ("b3-sym-noact-gptq_v2-single", "gptq"),
            ("int64-b2-sym-gptq", "gptq_v2"), ("bf16-b4-asym-gptq_v2", "gptq_v2"),
            ("gsm1-b4-sym-gptq", "gptq_v2"), ("b8-sym-act-gptq_v2-sharded", "gptq")]


def rewrite(path, fn):
    f = SafetensorsFile(path)
    t = {k: (i.dtype, np.array(f.view(k))) if i.dtype == "BF16" else np.array(f.view(k))
         for k, i in f.tensors.items()}
    fn(t)
    save_file(t, path, f.metadata)


@pytest.mark.parametrize(("name", "to"), LOSSLESS)
def test_lossless_pairs_are_bitwise_equal(tmp_path, run_cli, name, to):
    convert(CKPT / name, tmp_path / "o", to=to)
    r = run_cli("verify", CKPT / name, "--against", tmp_path / "o", "--backend", "cpu",
                "--format", "json")
    doc = json.loads(r.stdout)
    validator("equivalence").validate(doc)
    assert r.exit_code == 0 and doc["status"] == "ok" and doc["backend"] == "cpu"
    assert doc["summary"]["equal"] == len(MANIFEST[name]["modules"])


def test_one_changed_zero_point_field_fails(tmp_path, run_cli):
    name = "b4-sym-act-gptq-sharded"
    convert(CKPT / name, tmp_path / "o")
    mod = "model.layers.0.self_attn.k_proj"
    shard = json.loads((tmp_path / "o" / "model.safetensors.index.json").read_text())[
        "weight_map"][f"{mod}.qzeros"]

    def bump(t):
        z = unpack(t[f"{mod}.qzeros"], 4, axis=1)
        z[1, 5] = (z[1, 5] + 1) % 16  # one field of one group
        t[f"{mod}.qzeros"] = pack(z, 4, 32, axis=1)
    rewrite(tmp_path / "o" / shard, bump)
    rep = compare(CKPT / name, tmp_path / "o", backend="cpu")
    bad = [m for m in rep.modules if not m.equal]
    assert [m.name for m in bad] == [mod]
    assert all(n == 1 for n in bad[0].cells_differ.values())
    r = run_cli("verify", CKPT / name, "--against", tmp_path / "o", "--backend", "cpu")
    assert r.exit_code == 1 and f"{mod}: DIFFERS" in r.stdout


@pytest.mark.parametrize("name", ["b4-asym-noact-gptq_v2-single", "b8-asym-act-gptq_v2-sharded"])
def test_lossy_pairs_give_the_right_counts(tmp_path, name):
    convert(CKPT / name, tmp_path / "o", to="gptq", allow_lossy=True)
    rep = compare(CKPT / name, tmp_path / "o", backend="cpu")
    truth = MANIFEST[name]["modules"]
    for m in rep.modules:
        want = truth[m.name]["zero_fields"]  # Z = 0 became Z = 1 for every runtime
        assert set(m.cells_differ.values()) == {want}
        assert m.equal is (want == 0)


def test_reference_tells_a_wrong_label_from_corruption(tmp_path, run_cli):
    r = run_cli("verify", CKPT / "mislabelled-b4-sym-v2-as-gptq", "--reference", "fp32",
                "--backend", "cpu", "--format", "json")
    doc = json.loads(r.stdout)
    validator("equivalence").validate(doc)
    assert r.exit_code == 1 and {m["verdict"] for m in doc["modules"]} == {
        "one-step zero offset"}
    r = run_cli("verify", CKPT / "b4-sym-act-gptq_v2-sharded", "--reference", "fp32",
                "--backend", "cpu")
    assert r.exit_code == 0 and r.stdout.splitlines()[-1].startswith("OK: 7 of 7")
    shutil.copytree(CKPT / "b4-sym-noact-gptq_v2-single", tmp_path / "c")
    rng = np.random.default_rng(0)
    key = "model.layers.0.mlp.up_proj.qzeros"

    def scramble(t):
        z = unpack(t[key], 4, axis=1).astype(np.int64)
        t[key] = pack((z + rng.integers(2, 6, z.shape)) % 16, 4, 32, axis=1)
    rewrite(tmp_path / "c" / "model.safetensors", scramble)
    r = run_cli("verify", tmp_path / "c", "--reference", "fp32", "--backend", "cpu")
    assert "model.layers.0.mlp.up_proj: random corruption" in r.stdout


def test_reference_flags_fp16_overflow(tmp_path, run_cli):
    shutil.copytree(CKPT / "b4-sym-noact-gptq_v2-single", tmp_path / "c")
    key = "model.layers.0.self_attn.q_proj.scales"
    rewrite(tmp_path / "c" / "model.safetensors",
            lambda t: t.__setitem__(key, np.full_like(t[key], 60000)))
    r = run_cli("verify", tmp_path / "c", "--reference", "fp32", "--backend", "cpu")
    assert "model.layers.0.self_attn.q_proj: inf/nan" in r.stdout and r.exit_code == 1


def test_backend_choice(run_cli, monkeypatch):
    from gptqfmt.numerics import get_backend
    assert get_backend("cpu").name == "cpu"
    r = run_cli("verify", CKPT / "b4-sym-act-gptq-sharded", "--against", CKPT /
                "b4-sym-act-gptq-sharded", "--backend", "cupy")
    import importlib.util
    has_cupy = importlib.util.find_spec("cupy") is not None
    if not has_cupy:
        assert r.exit_code == 2 and "backend cupy is unavailable" in r.stderr
    assert get_backend("auto").name in ("cpu", "cupy")


def test_against_and_reference_are_exclusive(run_cli):
    r = run_cli("verify", CKPT / "b4-sym-act-gptq-sharded", "--against", CKPT /
                "b4-sym-act-gptq-sharded", "--reference", "fp32")
    assert r.exit_code == 2


def test_against_reads_labels_like_runtimes(tmp_path):
    """A DST whose data are right but whose label is wrong computes garbage in runtimes."""
    name = "b4-sym-act-gptq-sharded"
    convert(CKPT / name, tmp_path / "o")
    for cfg in ("quantize_config.json", "config.json"):
        p = tmp_path / "o" / cfg
        doc = json.loads(p.read_text())
        q = doc.get("quantization_config", doc)
        q["checkpoint_format"] = q["format"] = "gptq"
        p.write_text(json.dumps(doc))
    rep = compare(CKPT / name, tmp_path / "o", backend="cpu")
    assert not rep.equivalent and rep.dst_convention == "gptq"


def test_reference_json_with_inf_is_valid_json(tmp_path, run_cli):
    shutil.copytree(CKPT / "b4-sym-noact-gptq_v2-single", tmp_path / "c")
    key = "model.layers.0.self_attn.q_proj.scales"
    rewrite(tmp_path / "c" / "model.safetensors",
            lambda t: t.__setitem__(key, np.full_like(t[key], 60000)))
    r = run_cli("verify", tmp_path / "c", "--reference", "fp32", "--backend", "cpu",
                "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and any(m["verdict"] == "inf/nan" and m["max_abs"] is None
                                    for m in doc["modules"])


def test_a_module_only_dst_has_differs(tmp_path):
    """Both sides' modules are compared: one that SRC lacks is listed, and fails, as one that
    DST lacks does."""
    name = "b4-sym-noact-gptq_v2-single"
    shutil.copytree(CKPT / name, tmp_path / "less")
    q = "model.layers.0.self_attn.q_proj."
    rewrite(tmp_path / "less" / "model.safetensors",
            lambda t: [t.pop(k) for k in [k for k in t if k.startswith(q)]])
    less = tmp_path / "less"
    for a, b, side in ((less, CKPT / name, "DST"), (CKPT / name, less, "SRC")):
        rep = compare(a, b, backend="cpu")
        mods = {m.name: m for m in rep.modules}
        assert len(mods) == len(MANIFEST[name]["modules"]) and not rep.equivalent
        assert [n for n, m in mods.items() if not m.equal] == [q[:-1]]
        assert mods[q[:-1]].differences == [f"only in {side}"]
        assert [(d.where, d.what) for d in rep.tensors] == [(q + "bias", f"only in {side}")]


def test_a_g_idx_that_differs_alone_differs(tmp_path):
    """Act-order g_idx that no sampled output can tell apart (every group has the same scales
    and zeros) still makes the modules differ: a runtime reading the other order is another
    checkpoint."""
    name = "b4-sym-act-gptq_v2-single"
    for side in ("a", "b"):
        shutil.copytree(CKPT / name, tmp_path / side)

        def same_groups(t, side=side):
            for k in [k for k in t if k.endswith(".scales")]:
                t[k][:] = t[k][:1]
            if side == "b":
                for k in [k for k in t if k.endswith(".g_idx")]:
                    t[k] = np.ascontiguousarray(t[k][::-1])
        rewrite(tmp_path / side / "model.safetensors", same_groups)
    rep = compare(tmp_path / "a", tmp_path / "b", backend="cpu")
    assert not rep.equivalent
    f = SafetensorsFile(tmp_path / "a" / "model.safetensors")
    for m in rep.modules:
        g = f.view(m.name + ".g_idx")
        assert not m.equal and m.max_abs == 0.0
        assert m.differences == [f"g_idx: {int((g != g[::-1]).sum())} of {g.size} entries "
                                 "differ"]


def _copies(tmp_path, name="b4-asym-noact-gptq-single"):
    for side in ("a", "b"):
        shutil.copytree(CKPT / name, tmp_path / side)
    return tmp_path / "a", tmp_path / "b"


def _both_orders(run_cli, a, b):
    """The text lines of verify a --against b and of b --against a, and their exit codes."""
    out = []
    for x, y in ((a, b), (b, a)):
        r = run_cli("verify", x, "--against", y, "--backend", "cpu")
        out.append((r.exit_code, r.stdout.splitlines()))
    return out


def test_an_unquantized_tensor_that_differs_fails_in_either_order(tmp_path, run_cli):
    """64 scrambled bytes in embed_tokens: every module computes the same, the checkpoints do
    not; the line names the tensor and counts the bytes."""
    a, b = _copies(tmp_path)

    def scramble(t):
        e = t["model.embed_tokens.weight"].view(np.uint8).reshape(-1).copy()
        e[100:164] ^= 0x5A
        t["model.embed_tokens.weight"] = e.view(np.float16).reshape(32, 64)
    rewrite(b / "model.safetensors", scramble)
    for code, lines in _both_orders(run_cli, a, b):
        assert code == 1 and lines[-1].startswith("FAIL: 7 of 7 modules compute the same")
        assert "model.embed_tokens.weight: DIFFERS: 64 of 4096 bytes differ" in lines
        assert "7 of 8 other tensors identical byte for byte" in lines[-1]


def test_a_tensor_only_one_side_has_is_named_with_its_side(tmp_path, run_cli):
    a, b = _copies(tmp_path)
    rewrite(b / "model.safetensors", lambda t: t.pop("model.norm.weight"))
    (c1, l1), (c2, l2) = _both_orders(run_cli, a, b)
    assert c1 == c2 == 1
    assert "model.norm.weight: DIFFERS: only in SRC" in l1
    assert "model.norm.weight: DIFFERS: only in DST" in l2


def test_a_bits_mismatch_is_said_as_such(tmp_path, run_cli):
    (c1, l1), (c2, l2) = _both_orders(run_cli, CKPT / "b4-asym-noact-gptq-single",
                                      CKPT / "b8-asym-noact-gptq-single")
    q = "model.layers.0.self_attn.q_proj: DIFFERS: "
    assert c1 == c2 == 1
    assert any(ln.startswith(q + "bits 4 vs 8") for ln in l1)
    assert any(ln.startswith(q + "bits 8 vs 4") for ln in l2)
    assert "quantization bits: DIFFERS: 4 vs 8" in l1


@pytest.mark.parametrize("field", ["qweight", "scales"])
def test_a_field_outside_the_sampled_columns_is_found(tmp_path, field):
    """Every word of qweight and every scale is compared, not only the columns the product
    samples: one changed value in the last column of a wide module fails."""
    a, b = _copies(tmp_path)
    mod = "model.layers.0.mlp.gate_proj"   # 128 output columns, more than the 64 sampled

    def poke(t):
        x = t[f"{mod}.{field}"]
        if field == "qweight":
            x[0, -1] ^= 0x10
        else:
            x[0, -1] = np.float16(x[0, -1] * 2)
    rewrite(b / "model.safetensors", poke)
    rep = compare(a, b, backend="cpu")
    m = {m.name: m for m in rep.modules}[mod]
    total = 8 * 128 if field == "qweight" else 2 * 128
    unit = "words" if field == "qweight" else "values"
    assert not rep.equivalent and not m.equal
    assert m.differences == [f"{field}: 1 of {total} {unit} differ"]


def test_a_model_config_that_differs_fails_and_provenance_does_not(tmp_path, run_cli):
    a, b = _copies(tmp_path)
    cfg = json.loads((b / "config.json").read_text())
    cfg["_name_or_path"] = "somewhere/else"
    (b / "config.json").write_text(json.dumps(cfg))
    code, lines = _both_orders(run_cli, a, b)[0]
    assert code == 0 and lines[-1].endswith(
        "configs agree (gptq vs gptq, backend cpu, 64 columns per module)")
    cfg["torch_dtype"] = "bfloat16"
    (b / "config.json").write_text(json.dumps(cfg))
    (c1, l1), (c2, l2) = _both_orders(run_cli, a, b)
    assert c1 == c2 == 1
    assert 'config.json torch_dtype: DIFFERS: "float16" vs "bfloat16"' in l1
    assert 'config.json torch_dtype: DIFFERS: "bfloat16" vs "float16"' in l2
    assert "1 config entry differs" in l1[-1]


@pytest.mark.parametrize("to", ["gptq_v2", "compressed-tensors"])
def test_a_conversion_is_equal_as_a_whole_in_either_order(tmp_path, run_cli, to):
    """A lossless conversion compares equal as a whole: its label and its format's spelling of
    the quantization config are not differences."""
    src = CKPT / "b4-sym-noact-gptq-sharded"
    convert(src, tmp_path / "o", to=to)
    for code, lines in _both_orders(run_cli, src, tmp_path / "o"):
        assert code == 0 and lines[-1].startswith("OK: 7 of 7 modules compute the same")
        assert "8 of 8 other tensors identical byte for byte, configs agree" in lines[-1]


def test_reference_names_each_reading_and_agrees_with_the_runtimes_section(run_cli):
    """An asymmetric gptq_v2 file with zero points of 0: the kernels that read the label read
    Z = s, except ExLlamaV2, whose packed subtract borrows at a stored 0; --reference says so
    with the formula, and so does verify's runtimes section. Paths that read gptq whatever the
    label say it too, without deciding the module."""
    name = "b4-asym-act-gptq_v2-sharded"
    r = run_cli("verify", CKPT / name, "--reference", "fp32", "--backend", "cpu",
                "--format", "json")
    doc = json.loads(r.stdout)
    validator("equivalence").validate(doc)
    truth = MANIFEST[name]["modules"]
    for m in doc["modules"]:
        by = {tuple(x["runtimes"]): x for x in m["readings"]}
        exl = [x for k, x in by.items() if k == ("ExLlamaV2 exllamav2",)][0]
        assert exl["formula"] == "Z = word - 0x..1111, + 1 (borrows)" and exl["reads_label"]
        assert (exl["verdict"] == "zero points misread") is (truth[m["name"]]["zero_fields"] > 0)
        plain = [x for x in m["readings"] if x["formula"] == "Z = s"][0]
        assert plain["verdict"] == "consistent" and plain["cells"] == 0
        assert all(x["verdict"] == "one-step zero offset" for x in m["readings"]
                   if not x["reads_label"])
        assert m["verdict"] == exl["verdict"]
    ver = json.loads(run_cli("verify", CKPT / name, "--format", "json").stdout)
    exllama = [rt for rt in ver["runtimes"] if rt["id"] == "exllamav2"][0]
    assert exllama["decodes_correctly"] is False
    assert r.exit_code == 1


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize(("src", "mod", "words"), [
    (CKPT / "b4-asym-noact-gptq_v2-single", "model.layers.0.mlp.gate_proj", 1024),
    (FORMATS / "awq-b4-g32", "model.layers.0.mlp.gate_proj", None),
], ids=["gptq", "awq"])
def test_a_word_that_differs_across_layouts_is_counted(tmp_path, compiled, src, mod, words):
    """GPTQ's and AutoAWQ's qweight against compressed-tensors' transposed weight_packed: the
    comparison (compiled: tiles compared in place, AWQ's words never laid out; and numpy's)
    finds one changed word, and nothing in an unchanged copy."""
    ct = tmp_path / "ct"
    convert(src, ct, to="compressed-tensors")
    with loops(compiled):
        assert compare(src, ct, backend="cpu").equivalent

        def poke(t):
            t[f"{mod}.weight_packed"][-1, 0] ^= 0x10
        rewrite(ct / "model.safetensors", poke)
        rep = compare(src, ct, backend="cpu")
    m = {m.name: m for m in rep.modules}[mod]
    assert not rep.equivalent and not m.equal
    if words is None:   # the module's words, as the output's model says
        out = open_source(ct)
        q = {q.name: q for q in out.modules}[mod]
        words = q.in_features * q.bits // 32 * q.out_features
        out.close()
    assert m.differences == [f"qweight: 1 of {words} words differ"]
