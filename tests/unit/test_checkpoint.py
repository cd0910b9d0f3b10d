"""Module geometry from shapes, cross-checked with the config: one case per finding code."""
import json
import shutil

import numpy as np
import pytest

from gptqfmt.bits.packing import pack
from gptqfmt.conversion.plan import plan_conversion
from gptqfmt.detection import read as detection_read
from gptqfmt.formats import open_source
from gptqfmt.formats.gptq import checkpoint
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from gptqfmt.ops.inspect import inspect_checkpoint
from gptqfmt.ops.verify import validate
from gptqfmt.safetensors_io import SafetensorsFile, compiled, save_file
from gptqfmt.safetensors_io.index import open_store
from tests.support import CKPT, Q


def clone(tmp_path, name, edit=None, cfg=None):
    """Copy a single-file fixture, letting `edit(tensors)` and `cfg(quantize_config)` change it."""
    src = CKPT / name
    dst = tmp_path / name
    shutil.copytree(src, dst)
    if edit:
        f = SafetensorsFile(src / "model.safetensors")
        tensors = {k: (t.dtype, np.array(f.view(k))) if t.dtype == "BF16" else np.array(f.view(k))
                   for k, t in f.tensors.items()}
        edit(tensors)
        save_file(tensors, dst / "model.safetensors", f.metadata)
    if cfg:
        for p in (dst / "quantize_config.json", dst / "config.json"):
            doc = json.loads(p.read_text())
            cfg(doc.get("quantization_config", doc))
            p.write_text(json.dumps(doc))
    return dst


def findings(d, code):
    return [f for f in open_checkpoint(d).findings if f.code == code]


def test_geometry_of_a_clean_module():
    ck = open_checkpoint(CKPT / "b3-asym-act-gptq_v2-single")
    m = next(m for m in ck.modules if m.name.endswith("down_proj"))
    assert (m.bits, m.word_bits, m.in_features, m.out_features, m.groups, m.group_size,
            m.act_order, m.valid) == (3, 32, 128, 64, 4, 32, True, True)


CASES = {
    "GQ301": dict(edit=lambda t: t.pop(f"{Q}.scales")),
    "GQ302": dict(edit=lambda t: t.__setitem__(f"{Q}.qzeros", t[f"{Q}.qzeros"].astype(np.float32))),
    "GQ303": dict(edit=lambda t: t.__setitem__(f"{Q}.g_idx", t[f"{Q}.g_idx"][:32])),
    "GQ308": dict(edit=lambda t: t.pop(f"{Q}.g_idx")),
    "GQ309": dict(edit=lambda t: t[f"{Q}.g_idx"].__setitem__(0, 7)),
    "GQ310": dict(edit=lambda t: t.update({f"{Q}.qzeros": np.zeros((2, 12), np.int16),
                                           f"{Q}.qweight": np.zeros((12, 64), np.int16)})),
    "GQ313": dict(cfg=lambda c: c.__setitem__("dynamic", {"-:.*q_proj": {}})),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_each_geometry_finding(tmp_path, code):
    d = clone(tmp_path, "b4-asym-noact-gptq_v2-single", **CASES[code])
    f = findings(d, code)
    assert len(f) == 1, [x.one_line() for x in open_checkpoint(d).findings]
    assert f[0].tensor.startswith(Q) and f[0].file == "model.safetensors"


@pytest.mark.parametrize(("code", "key", "value"), [("GQ304", "bits", 8),
                                                    ("GQ305", "group_size", 16),
                                                    ("GQ307", "pack_dtype", "int16")])
def test_declared_values_against_shapes(tmp_path, code, key, value):
    d = clone(tmp_path, "b4-asym-noact-gptq_v2-single",
              cfg=lambda c: c.__setitem__(key, value))
    f = open_checkpoint(d).findings
    assert [x.code for x in f] == [code] * 7
    assert f"{key}={value}" in f[0].message


def test_desc_act_false_with_act_order_g_idx(tmp_path):
    d = clone(tmp_path, "b4-asym-act-gptq_v2-single", cfg=lambda c: c.__setitem__("desc_act",
                                                                                  False))
    assert len(findings(d, "GQ306")) == 7


def test_static_groups_desc_act_true_with_trivial_g_idx_is_fine():
    ck = open_checkpoint(CKPT / "static-b4-asym-act-gptq_v2")
    assert ck.findings == [] and not any(m.act_order for m in ck.modules)


def test_features_not_multiple_of_32(tmp_path):
    def edit(t):
        codes = np.zeros((48, 64), np.uint8)
        t[f"{Q}.qweight"] = pack(codes, 4, 32, axis=0)
        t[f"{Q}.g_idx"] = (np.arange(48) // 32).astype(np.int32)
    d = clone(tmp_path, "b4-asym-noact-gptq_v2-single", edit=edit)
    f = findings(d, "GQ312")
    assert len(f) == 1 and "in_features=48" in f[0].message


def test_no_quantized_module(tmp_path):
    save_file({"w": np.zeros(4, np.float16)}, tmp_path / "model.safetensors")
    assert [f.code for f in open_checkpoint(tmp_path).findings] == ["GQ206", "GQ314"]


def test_group_size_minus_one_and_128():
    for name, gs, groups in (("gsm1-b4-asym-gptq_v2", -1, {1}),
                             ("gs128-b4-asym-gptq_v2", 128, {1, 2})):
        ck = open_checkpoint(CKPT / name)
        assert ck.findings == []
        assert {m.groups for m in ck.modules} == groups
        assert {m.group_size for m in ck.modules if m.groups > 1} <= {gs}


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda t: (t.pop(f"{Q}.g_idx"), t.__setitem__(f"{Q}.scales", np.zeros((0, 64), np.float16)),
                t.__setitem__(f"{Q}.qzeros", np.zeros((0, 8), np.int32))), "0 groups"),
    (lambda t: (t.__setitem__(f"{Q}.scales", np.zeros((10**4, 64), np.float16)),
                t.__setitem__(f"{Q}.qzeros", np.zeros((10**4, 8), np.int32))), "10000 groups"),
    (lambda t: (t.pop(f"{Q}.g_idx"), t.__setitem__(f"{Q}.scales", np.ones((3, 64), np.float16)),
                t.__setitem__(f"{Q}.qzeros", np.zeros((3, 8), np.int32))), "fit no group size"),
    (lambda t: (t.pop(f"{Q}.g_idx"), t.__setitem__(f"{Q}.qweight", np.zeros((0, 64), np.int32))),
     "in_features=0"),
])
def test_impossible_geometry_is_a_finding_not_a_crash(tmp_path, edit, needle):
    d = clone(tmp_path, "b4-asym-noact-gptq_v2-single", edit=edit)
    f = findings(d, "GQ303")
    assert len(f) == 1 and needle in f[0].message


def test_3bit_rows_must_hold_whole_values(tmp_path):
    def edit(t):
        t[f"{Q}.qweight"] = np.zeros((4, 64), np.int32)
        t[f"{Q}.qzeros"] = np.zeros((2, 6), np.int32)
        t.pop(f"{Q}.g_idx")
    d = clone(tmp_path, "b4-asym-noact-gptq_v2-single", edit=edit)
    assert "do not hold whole 3-bit values" in findings(d, "GQ303")[0].message


@pytest.mark.parametrize("command", ["inspect", "inspect-forked", "inspect-large",
                                     "inspect-large-forked", "verify", "plan"])
def test_each_modules_symmetric_pattern_is_read_once(monkeypatch, command):
    """The source's sym (for writers) and detection ask the same question of qzeros: one pass
    per module answers both, whichever asks first. inspect's detection reads every small
    qzeros in the parent, before any worker is forked, and no worker reads one again; larger
    ones ("large": above detection's SMALL) are read where the module is, in a forked worker
    when there is one (and kept in the parent, which reads none of them again)."""
    read: list[int] = []
    real, real_bytes = checkpoint.symmetric_pattern, checkpoint.symmetric_pattern_of_bytes
    monkeypatch.setattr(checkpoint, "symmetric_pattern",
                        lambda qz, bits: read.append(id(qz)) or real(qz, bits))
    monkeypatch.setattr(checkpoint, "symmetric_pattern_of_bytes",   # small ones, read together
                        lambda raw, *a: read.append(id(raw)) or real_bytes(raw, *a))
    path = CKPT / "b4-sym-noact-gptq-sharded"
    if command.startswith("inspect"):
        if "large" in command:
            monkeypatch.setattr(detection_read, "SMALL", 0)
        if command.endswith("forked"):
            monkeypatch.setattr(detection_read, "PROCESS_MIN_MODULES", 1)
            monkeypatch.setattr(detection_read, "cpus", lambda: 2)
        r = inspect_checkpoint(path)
        assert [m.pattern for m in r.detection.modules] == ["gptq"] * 7
        assert all(mod.sym for mod in r.source.modules)
    elif command == "verify":
        assert not validate(path).failed()
    else:
        src = open_source(path)
        try:
            plan = plan_conversion(src, "auto", "compressed-tensors", False, 1)
            assert all(m.sym for m in plan.source.modules)
        finally:
            src.close()
    want = 0 if command == "inspect-large-forked" else 7
    if command in ("inspect", "inspect-forked") and compiled.available():
        # inspect's survey found the symmetric qzeros of each dtype and shape in a file alike:
        # one read answers all of them
        st = open_store(path)
        want = len({(st.locations[t], st.info(t).dtype, st.info(t).shape)
                    for t in st.locations if t.endswith(".qzeros")})
        st.close()
        assert want < 7
    assert len(read) == want


ATTN = "model.layers.0.self_attn"   # k, o, q and v_proj: alike in every dtype and shape


def _g_idx(name, values):
    def edit(t):
        t[f"{ATTN}.{name}.g_idx"] = np.asarray(values, np.int32)
    return edit


def _module(ck, name):
    return next(m for m in ck.modules if m.name == f"{ATTN}.{name}")


# each edit, and what shows that it took effect
ALIKE_EDITS = {
    "as built": (None, lambda ck: ck.findings == []),
    "act-order after a trivial one": (
        _g_idx("o_proj", np.random.default_rng(0).permutation(np.arange(64) // 32)),
        lambda ck: _module(ck, "o_proj").act_order and not _module(ck, "q_proj").act_order),
    "a g_idx that fits no group size": (
        _g_idx("q_proj", [1] + [0] * 31 + [1] * 32),
        lambda ck: [f.code for f in ck.findings] == ["GQ303"] and not _module(ck, "q_proj").valid),
    "another group size": (
        _g_idx("o_proj", np.arange(64) // 16),
        lambda ck: not _module(ck, "o_proj").valid or _module(ck, "o_proj").group_size != 32),
    "the first one's finding": (
        _g_idx("k_proj", [0] * 32 + [2] * 32),
        lambda ck: any(f.tensor == f"{ATTN}.k_proj.g_idx" for f in ck.findings)),
    "int64 g_idx": (
        lambda t: t.__setitem__(f"{ATTN}.q_proj.g_idx", t[f"{ATTN}.q_proj.g_idx"].astype(
            np.int64)),
        lambda ck: ck.findings == [] and _module(ck, "q_proj").group_size == 32),
    # a valid module with a finding of its config: each alike module has it too
    "a config finding": (
        {"bits": 8}, lambda ck: [f.code for f in ck.findings] == ["GQ304"] * 7),
}


@pytest.mark.parametrize("edit", sorted(ALIKE_EDITS))
def test_alike_modules_are_inferred_as_each_alone(tmp_path, monkeypatch, edit):
    """Modules alike in dtypes, shapes and declared config are inferred once, and each then
    only has its g_idx compared: the same modules and findings as inferring every one alone,
    whichever of them holds a g_idx of its own."""
    change, took = ALIKE_EDITS[edit]
    d = clone(tmp_path, "b4-asym-noact-gptq_v2-single", **(
        {"cfg": lambda c: c.update(change)} if isinstance(change, dict) else {"edit": change}))
    once = open_checkpoint(d)
    monkeypatch.setattr(checkpoint, "_infer_all",
                        lambda mods, store, found, written, kinds=None: [checkpoint._infer(
                            m, store, found, written) for m in mods])
    alone = open_checkpoint(d)
    assert once.modules == alone.modules and once.findings == alone.findings
    assert took(once)


def test_natural_key_orders_numbers_as_numbers_and_any_name_at_all():
    names = ["model.layers.10.mlp", "model.layers.2.mlp", "model.layers.2.attn",
             "model.layers.02.x", "lm_head", "model.layers.1²", "٣.a", "3.a", "model.layers"]
    got = sorted(names, key=checkpoint.natural_key)
    assert got == ["٣.a", "3.a", "lm_head", "model.layers", "model.layers.1²",   # ٣ is 3
                   "model.layers.2.attn", "model.layers.2.mlp", "model.layers.02.x",
                   "model.layers.10.mlp"]
    assert checkpoint.natural_key("layers.10.mlp") == ["layers.", 10, ".mlp"]


NATURAL_CASES = [
    # a key that is a prefix of the other first; text runs compared whole ("a" < "a.", so
    # "a1" before "a.1", where a character-by-character order puts "." before "1")
    ["a", "a1", "a.1", "ab", "a1b", "a1.", "", "1", "0", "00", "01", "a01", "a1", "a001"],
    # numbers by value at any length, leading zeros ignored, equal keys in their given order
    ["x" + "9" * 30, "x1" + "0" * 30, "x0" + "9" * 30, "x10", "x010", "x0010", "x9"],
    ["model.layers.10.mlp", "model.layers.2.mlp", "model.layers.2.attn", "lm_head",
     "model.layers.02.x", "model.layers", "model.layers.2", "model.layers.2."],
]


@pytest.mark.skipif(not compiled.available(), reason="the compiled reader is not built")
def test_natural_sorted_is_the_natural_keys_order():
    """natural_sorted (kernels/safetensors_native.c natural_order) against
    sorted(key=natural_key): the cases above, 300 random lists of names of digits, dots and
    letters, and names that are not ASCII (left to the key)."""
    import random
    rnd = random.Random(7)
    cases = [list(c) for c in NATURAL_CASES]
    for _ in range(300):
        cases.append(["".join(rnd.choice("0019a.b_Z") for _ in range(rnd.randrange(0, 9)))
                      for _ in range(rnd.randrange(0, 40))])
    cases.append(["٣.a", "3.a", "layers.10", "layers.9", "x²"])
    for names in cases:
        assert checkpoint.natural_sorted(names) == sorted(names, key=checkpoint.natural_key)


@pytest.mark.skipif(not compiled.available(), reason="the compiled reader is not built")
def test_natural_order_takes_ascii_only_and_refuses_other_than_str():
    assert compiled.natural_order(["b", "٣", "a"]) is None
    assert compiled.natural_order([]) == []
    with pytest.raises(TypeError, match="list of str"):
        compiled.natural_order(["a", 1])   # type: ignore[list-item]


@pytest.mark.skipif(not compiled.available(), reason="the compiled reader is not built")
def test_the_compiled_grouping_splits_names_as_rpartition_does():
    """group_roles (kernels/safetensors_native.c) against rpartition(".") on 300 random lists
    of names of dots, role texts and letters, some not ASCII, most given as header entries:
    the same modules in the same order, the same roles (the tuple's own str objects), the
    same names left over, and each module's kind where all its items are entries."""
    import random
    rnd = random.Random(11)
    roles = ("qweight", "qzeros", "scales", "g_idx", "bias")
    bits = ["qweight", "qzeros", "scales", "g_idx", "bias", "é", "layers", "0", ".", "..",
            "q", "qweights", "ß", "x"]
    for _ in range(300):
        names = ["".join(rnd.choice(bits) for _ in range(rnd.randrange(0, 5)))
                 for _ in range(rnd.randrange(0, 40))]
        parts: dict[str, dict[str, str]] = {}
        rest = []
        for t in names:
            prefix, _, role = t.rpartition(".")
            if role in roles and prefix:
                parts.setdefault(prefix, {})[role] = t
            else:
                rest.append(t)
        # some given as header entries (name, dtype, shape, ...), the others as bare names
        items = [(t, rnd.choice("IF"), (rnd.randrange(3),), 0, 1) if rnd.random() < 0.8
                 else t for t in names]
        kinds: dict[str, list | None] = {}
        for it in items:
            t = it[0] if isinstance(it, tuple) else it
            prefix, _, role = t.rpartition(".")
            if role in roles and prefix:
                k = kinds.setdefault(prefix, [])
                if k is not None:
                    kinds[prefix] = k + [(role, it[1], it[2])] if isinstance(it, tuple) \
                        else None
        got_parts, got_rest, got_kinds = compiled.group_roles(items, roles)
        assert list(got_parts.items()) == list(parts.items()) and got_rest == rest
        want = {p: k for p, k in kinds.items() if k is not None}
        assert set(got_kinds) == set(want)   # a number shared exactly by equal kinds
        assert all((got_kinds[a] == got_kinds[b]) == (want[a] == want[b])
                   for a in want for b in want)
        assert all(r is next(x for x in roles if x == r)
                   for g in got_parts.values() for r in g)
    for bad in (["a.qweight", 1], [("a.qweight",)], [(1, "I", ())]):
        with pytest.raises(TypeError, match="str or"):
            compiled.group_roles(bad, roles)
    with pytest.raises(TypeError, match="tuple of str"):
        compiled.group_roles(["a.qweight"], ("qweight", 1))   # type: ignore[arg-type]


@pytest.mark.parametrize("compiled_on", [True, False])
def test_grouping_by_module_and_the_tensors_outside(compiled_on):
    """_group against its definition: a module is a name prefix with a qweight or qzeros
    (one in a shard that cannot be read too); every other tensor that can be read, a plain
    Linear's bias and weight among them, is outside, sorted. With the compiled grouping
    (group_roles) and without it."""
    import random
    from types import SimpleNamespace

    from gptqfmt.formats.gptq.checkpoint import ROLES, _group, _kind, natural_key
    from gptqfmt.safetensors_io.header import TensorInfo
    from tests.support import loops
    rnd = random.Random(3)
    names = [f"model.layers.{i}.{p}.{r}" for i in range(12) for p in ("q", "k", "mlp.up")
             for r in ROLES if rnd.random() < 0.7]
    names += ["lm_head.weight", "model.norm.weight", "bias", ".qweight", "x.y.bias",
              "qweight", "a..qzeros", "a.qweight.", "é.qweight", "é.scales", "ü.x.qzeros",
              "b.qweights", "b.Qweight", "c.qzero"]
    rnd.shuffle(names)
    locations = {t: "a.safetensors" for t in names[:-10]}
    unreadable = {t: "b.safetensors" for t in names[-10:]}
    infos = {t: TensorInfo(t, rnd.choice(["I32", "F16"]), (rnd.randrange(1, 3),), 0, 4)
             for t in locations}
    store = SimpleNamespace(locations=locations, unreadable=unreadable, infos=infos)
    with loops(compiled=compiled_on):
        modules, others, kinds = _group(store, None)
    # the kinds found with the names are what _kind reads of each module's entries
    if compiled_on:   # modules share a number exactly where _kind finds them alike
        assert kinds is not None
        keys = {m.name: None if (k := _kind(m, store, True)) is None else k[0]
                for m in modules}
        assert {n for n, k in keys.items() if k is None} == \
            {m.name for m in modules if m.name not in kinds}
        assert any(k is None for k in keys.values())   # one of a shard not read
        alike = [(a, b) for a in kinds for b in kinds if a in keys and b in keys]
        assert all((kinds[a] == kinds[b]) == (keys[a] == keys[b]) for a, b in alike)
        assert len({kinds[n] for n in keys if n in kinds}) > 1
    else:
        assert kinds is None
    groups: dict[str, dict[str, str]] = {}
    for t in names:
        prefix, _, role = t.rpartition(".")
        if role in ROLES and prefix:
            groups.setdefault(prefix, {})[role] = t
    want = sorted((p for p, g in groups.items() if "qweight" in g or "qzeros" in g),
                  key=natural_key)
    assert [m.name for m in modules] == want
    assert all(m.tensors == groups[m.name] for m in modules)
    claimed = {t for p in want for t in groups[p].values()}
    assert others == sorted(t for t in locations if t not in claimed)
