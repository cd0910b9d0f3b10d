"""The runtimes rules table (gptqfmt/runtimes.py) and what it says about the shipped fixtures
(gptqfmt/verdicts.py): every rule cited and triggered by a fixture, the issue's worked verdicts,
the zero readings against hand-computed fields, and the README's copy of the table."""
import importlib.util
import json

import numpy as np
import pytest

from gptqfmt import runtimes as rt
from gptqfmt.bits.conventions import GPTQ, GPTQ_V2, ZeroRule, effective_zeros
from gptqfmt.runtimes.readings import Reading, read_zeros, truth_zeros
from gptqfmt.errors import GptqfmtError
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from gptqfmt.bits.layout import stored_fields
from gptqfmt.detection.read import detect_checkpoint
from gptqfmt.bits.packing import pack
from gptqfmt.resources import validator
from gptqfmt.runtimes.verdicts import assess, config_facts, module_facts
from tests.support import CKPT, ROOT


def verdicts(name, scales=True, capability=80):
    ckpt = open_checkpoint(CKPT / name)
    det = detect_checkpoint(ckpt, full=True)
    return {v.runtime.id: v for v in assess(ckpt, det, scales=scales, capability=capability)}


def every_rule():
    """(runtime id, where, rule) for every rule of the table."""
    for r in rt.RUNTIMES:
        for x in r.requires:
            yield r.id, "", x
        for p in r.paths:
            for x in p.when + p.requires:
                yield r.id, p.kernel, x


# ---------------------------------------------------------------- the table as data

def test_runtime_ids_are_unique_and_every_required_one_is_there():
    ids = [r.id for r in rt.RUNTIMES]
    assert len(ids) == len(set(ids)) and list(rt.BY_ID) == ids
    assert {"vllm", "vllm-gptq-gemm", "vllm-legacy", "sglang", "exllamav2", "tgi",
            "transformers", "gptqmodel", "autogptq", "llama.cpp"} <= set(ids)


def test_every_rule_cites_its_source():
    for rid, where, rule in every_rule():
        src = rule.source
        assert "/" in src.repo and src.path and src.ref, (rid, where, rule.id)
        assert rule.scope in ("config", "module", "setup"), (rid, rule.id)
        assert rule.text and rule.id
    for r in rt.RUNTIMES:
        assert r.label_source.repo and r.versions and r.config_files or not r.needs_config
        for p in r.paths:
            assert set(p.readings) == {GPTQ, GPTQ_V2} and p.source.ref


def test_rule_ids_are_unique_within_a_path():
    for r in rt.RUNTIMES:
        assert len({x.id for x in r.requires}) == len(r.requires), r.id
        for p in r.paths:
            ids = [x.id for x in p.when + p.requires]
            assert len(ids) == len(set(ids)), (r.id, p.kernel, ids)


def _fixtures():
    for d in sorted(CKPT.iterdir()):
        try:
            ckpt = open_checkpoint(d)
        except GptqfmtError:
            continue  # a fixture that cannot be read (invalid ones live elsewhere)
        yield d.name, ckpt


def test_every_rule_is_triggered_by_a_shipped_fixture():
    """Each rule fails on at least one fixture (for the setup rules: on a GPU of compute
    capability 7.0, 8.0 or 9.0, decoding one row or a prefill of 256): no rule the fixtures
    cannot catch."""
    from dataclasses import replace
    triggered = {}
    for name, ckpt in _fixtures():
        for cap in (70, 80, 90):
            cfg = config_facts(ckpt, cap)
            base = [cfg] + [module_facts(cfg, m) for m in ckpt.modules if m.valid]
            facts = base + [replace(f, rows=256) for f in base]
            for rid, where, rule in every_rule():
                key = (rid, where, rule.id)
                if key not in triggered and any(rule.test(f) is not None for f in facts):
                    triggered[key] = name
        ckpt.close()
    missing = [k for rid, where, rule in every_rule()
               if (k := (rid, where, rule.id)) not in triggered]
    assert missing == []


# ---------------------------------------------------------------- zero readings

def test_read_zeros_worked_example():
    """The fields of the Reading docstring, one packed word at 4 bits."""
    w = pack(np.array([[15, 3, 0, 8, 8, 8, 8, 8]], np.uint8), 4, 32, axis=1)
    want = {Reading.V1_NOWRAP: [16, 4, 1, 9], Reading.V1_WRAP: [0, 4, 1, 9],
            Reading.V1_CARRY: [0, 5, 1, 9], Reading.V2: [15, 3, 0, 8],
            Reading.V2_BORROW: [15, 3, 16, 7], Reading.V1_NIBBLE: [0, 4, 1, 9],
            Reading.SYMMETRIC: [8, 8, 8, 8]}
    for reading, fields in want.items():
        assert read_zeros(w, 4, reading)[0, :4].tolist() == fields, reading


def test_word_readings_against_field_by_field_arithmetic():
    """GPTQModel's packed add and ExLlamaV2's packed subtract, against carries and borrows
    propagated field by field (an independent slow model), at 2, 4 and 8 bits."""
    rng = np.random.default_rng(5)
    for bits in (2, 4, 8):
        top = (1 << bits) - 1
        per = 32 // bits
        s = rng.integers(0, top + 1, size=(6, 4 * per)).astype(np.uint8)
        s[:, ::3] = top       # many fields that carry
        s[:, 1::5] = 0        # and that borrow
        w = pack(s, bits, 32, axis=1)
        carry, borrow = np.zeros(s.shape, np.int64), np.zeros(s.shape, np.int64)
        for g in range(s.shape[0]):
            for word in range(s.shape[1] // per):
                c = b = 0
                for j in range(word * per, (word + 1) * per):
                    v = int(s[g, j]) + 1 + c
                    carry[g, j], c = v & top, v >> bits
                    v = int(s[g, j]) - 1 - b
                    borrow[g, j], b = (v & top) + 1, int(v < 0)
        assert read_zeros(w, bits, Reading.V1_CARRY).tolist() == carry.tolist()
        assert read_zeros(w, bits, Reading.V2_BORROW).tolist() == borrow.tolist()


def test_nibble_reading_is_mod_16_at_8_bits():
    s = np.array([[127, 14, 15, 255]], np.uint8)
    w = pack(s, 8, 32, axis=1)
    assert read_zeros(w, 8, Reading.V1_NIBBLE)[0].tolist() == [0, 15, 0, 0]
    assert read_zeros(w, 8, Reading.V1_NOWRAP)[0].tolist() == [128, 15, 16, 256]


def test_truth_takes_a_stored_maxq_as_zero_unless_its_codes_say_otherwise():
    s = np.array([[15, 7, 15, 0, 8, 8, 8, 8]], np.uint8)
    assert truth_zeros(s, 4, GPTQ)[0, :4].tolist() == [0, 8, 0, 1]
    assert truth_zeros(s, 4, GPTQ, high=[2])[0, :4].tolist() == [0, 8, 16, 1]
    assert truth_zeros(s, 4, GPTQ_V2)[0, :4].tolist() == [15, 7, 15, 0]


# ---------------------------------------------------------------- the verdicts

def test_v2_data_labelled_gptq_with_marlin_shapes():
    """4-bit sym, in % 128 and out % 64: Marlin ignores qzeros, so vLLM decodes right; the
    paths that read qzeros as gptq read every zero point one too high."""
    v = verdicts("mislabelled-marlin-b4-sym-v2-as-gptq")
    ckpt = open_checkpoint(CKPT / "mislabelled-marlin-b4-sym-v2-as-gptq")
    cells = sum(m.groups * m.out_features for m in ckpt.modules)
    # the largest weight change, field by field from the file: gptq_gemm's s + 1 on gptq
    # labels against the data's Z = s (verdicts has a closed form for this case)
    worst = 0.0
    for m in ckpt.modules:
        s = stored_fields(ckpt.view(m.tensors["qzeros"]), 4)
        dz = effective_zeros(s, 4, ZeroRule.V1_NOWRAP) - effective_zeros(s, 4, ZeroRule.V2)
        worst = max(worst, float(np.abs(ckpt.float32(m.tensors["scales"]) * dz).max()))
    for rid in ("vllm", "sglang", "gptqmodel", "transformers"):
        assert v[rid].loads and v[rid].decodes_correctly is True, rid
        assert v[rid].taken.convention_read is None  # Marlin reads no qzeros
    gemm = v["vllm-gptq-gemm"]
    assert gemm.taken.path.kernel == "gptq_marlin" and gemm.decodes_correctly
    alt = {p.path.kernel: p for p in gemm.alternatives}["gptq_gemm"]
    assert alt.convention_read == GPTQ and alt.decodes_correctly is False
    assert (alt.cells_affected, alt.modules_affected) == (cells, 7)
    assert alt.causes.keys() == {"GQ602"}
    assert alt.max_weight_change == pytest.approx(worst)  # every Z off by exactly one
    for rid in ("exllamav2", "llama.cpp"):
        assert v[rid].decodes_correctly is False and v[rid].taken.cells_affected == cells
    tgi = v["tgi"]
    assert tgi.taken.path.kernel == "gptq_marlin" and tgi.decodes_correctly
    assert {p.path.kernel: p.decodes_correctly for p in tgi.alternatives} == \
        {"exllamav2": False, "triton": False}


def test_format_only_label_is_read_by_gptqmodel_alone():
    v = verdicts("formatonly-b4-asym-gptq_v2")
    assert v["gptqmodel"].taken.convention_read == GPTQ_V2 and v["gptqmodel"].decodes_correctly
    g = v["vllm-gptq-gemm"]
    assert g.taken.path.kernel == "gptq_gemm" and g.taken.convention_read == GPTQ
    assert g.decodes_correctly is False and g.taken.causes.keys() == {"GQ602"}
    # transformers 5 reads checkpoint_format, then format; llama.cpp checkpoint_format only
    assert v["transformers"].taken.convention_read == GPTQ_V2
    assert v["llama.cpp"].taken.convention_read == GPTQ


@pytest.mark.parametrize("name, got", [
    ("b4-asym-noact-gptq-single", "sym is false"),
    ("b3-sym-noact-gptq_v2-single", "bits is 3"),
    ("b2-sym-noact-gptq-single", "bits is 2")])
def test_newest_vllm_refuses_asymmetric_and_low_bits_with_the_next_step(name, got):
    v = verdicts(name, scales=False)["vllm"]
    assert not v.loads and v.taken is None and v.decodes_correctly is None
    assert any(r.startswith(got) for r in v.reasons)
    assert any("compressed-tensors" in r for r in v.reasons)
    assert v.failed and all(str(rule.source).startswith("vllm-project/vllm@v0.33.0")
                            for rule, _ in v.failed)


def test_gptq_maxq_fields_at_most_one_of_vllm_gemm_and_tgi_is_right():
    """Asymmetric 4-bit with act-order: stored 15s whose codes say Z = 0. vLLM's gptq_gemm
    reads 16 (wrong in exactly those cells), TGI's triton path 0 (right)."""
    name = "b4-asym-act-gptq-single"
    v = verdicts(name)
    ckpt = open_checkpoint(CKPT / name)
    det = detect_checkpoint(ckpt, full=True)
    wrapped = sum(m.stats.wrapped for m in det.modules)
    assert wrapped and not any(m.stats.maxq_consistent for m in det.modules)
    gemm, tgi = v["vllm-gptq-gemm"], v["tgi"]
    assert tgi.taken.path.kernel == "triton" and tgi.decodes_correctly is True
    assert gemm.decodes_correctly is False and gemm.taken.causes.keys() == {"GQ604"}
    assert gemm.taken.cells_affected == wrapped
    # the change: scale x 16 at the worst wrapped cell, from the file
    worst = 0.0
    for m in ckpt.modules:
        s = stored_fields(ckpt.view(m.tensors["qzeros"]), 4)
        sc = ckpt.float32(m.tensors["scales"])
        worst = max(worst, float((sc[s == 15] * 16).max(initial=0)))
    assert gemm.taken.max_weight_change == pytest.approx(worst)


def test_gptqmodel_carry_moves_the_next_field():
    """GPTQModel adds 0x11111111 to gptq words: a stored 15 reads 0 but lifts its neighbour."""
    t = verdicts("b4-asym-act-gptq-single")["gptqmodel"].taken
    assert t.decodes_correctly is False and t.causes.keys() == {"GQ605"}


def test_autogptq_extension_reads_8_bit_zeros_mod_16():
    v = verdicts("b8-sym-noact-gptq-single")["autogptq"]
    assert v.taken.path.kernel == "cuda_old-ext" and v.decodes_correctly is False
    assert v.taken.causes.keys() == {"GQ605"}
    torch_path = {p.path.kernel: p for p in v.alternatives}["cuda_old-torch"]
    assert torch_path.decodes_correctly is True


def test_undecidable_data_leave_the_verdict_open(monkeypatch):
    ckpt = open_checkpoint(CKPT / "b4-sym-noact-gptq-single")
    det = detect_checkpoint(ckpt, full=True)
    from dataclasses import replace
    det = replace(det, verdict="ambiguous")
    v = {x.runtime.id: x for x in assess(ckpt, det)}
    assert v["exllamav2"].loads and v["exllamav2"].decodes_correctly is None
    assert "do not decide" in v["exllamav2"].reasons[0]


def test_setup_rules_choose_the_path_on_older_gpus():
    v = verdicts("mislabelled-marlin-b4-sym-v2-as-gptq", capability=70)
    assert v["vllm-gptq-gemm"].taken.path.kernel == "gptq_gemm"
    assert v["vllm-gptq-gemm"].decodes_correctly is False
    assert v["tgi"].taken.path.kernel == "triton"
    assert v["vllm"].taken is None and not v["vllm"].loads  # Marlin needs 7.5


def test_runtimes_that_ignore_dynamic_refuse_its_overrides():
    v = verdicts("rt-dynamic-b4-sym-gptq_v2", scales=False)
    for rid in ("tgi", "autogptq", "exllamav2"):
        assert not v[rid].loads and any("`dynamic`" in r for r in v[rid].reasons), rid
    # SGLang reads dynamic per module: the 3-bit module and the asymmetric one fail Marlin
    fails = {rule.id for rule, _ in v["sglang"].taken.failed}
    assert {"dynamic_bits", "dynamic_sym"} <= fails
    # vLLM resolves dynamic on its fused names: up_proj's override misses gate_up_proj
    for rid in ("vllm", "vllm-gptq-gemm", "vllm-legacy"):
        (rule, got), = [(r, g) for r, g in v[rid].failed if r.id == "fused_dynamic"]
        assert got.startswith("model.layers.0.mlp.up_proj has sym=False, but "
                              "model.layers.0.mlp.gate_up_proj gets sym=True")


def test_dynamic_patterns_that_cover_the_fused_name_are_fine():
    v = verdicts("dynamic-b4-asym-gptq_v2", scales=False)
    for rid in ("vllm", "vllm-gptq-gemm", "vllm-legacy"):
        assert "fused_dynamic" not in {r.id for r, _ in v[rid].failed}


def test_runtimes_section_is_in_both_reports_and_valid(run_cli):
    for cmd, schema in (("inspect", "inspect"), ("verify", "report")):
        r = run_cli(cmd, "--format", "json", CKPT / "mislabelled-marlin-b4-sym-v2-as-gptq")
        doc = json.loads(r.stdout)
        validator(schema).validate(doc)
        assert [e["id"] for e in doc["runtimes"]] == [x.id for x in rt.RUNTIMES]
        e = {x["id"]: x for x in doc["runtimes"]}["exllamav2"]
        assert e["decodes_correctly"] is False and e["modules_affected"] == 7
        assert (e["max_weight_change"] is None) == (cmd == "inspect")


# ---------------------------------------------------------------- verify --runtime

@pytest.mark.parametrize("name, ids, code, codes", [
    ("b4-asym-noact-gptq-single", "vllm", 1, {"GQ601"}),
    ("b4-asym-act-gptq-single", "vllm-gptq-gemm", 1, {"GQ604"}),
    # AutoGPTQ decodes right at decoding batch sizes; its prefill path (cuda-torch) would not
    ("b4-asym-act-gptq-single", "tgi,autogptq", 0, {"GQ606"}),
    ("b4-asym-act-gptq-single", "gptqmodel", 1, {"GQ605", "GQ606"}),
    ("mislabelled-b4-sym-v2-as-gptq", "exllamav2", 1, {"GQ401", "GQ602"}),
    ("b8-sym-noact-gptq-single", "autogptq", 1, {"GQ605", "GQ606"}),
    ("rt-marlin-b4-sym-gptq_v2", "vllm,sglang,transformers", 0, set()),
    # TGI ignores the label: right on Marlin, its exllamav2 and triton paths read gptq_v2 wrong
    ("rt-marlin-b4-sym-gptq_v2", "tgi", 0, {"GQ606"}),
    ("mislabelled-marlin-b4-sym-v2-as-gptq", "vllm", 1, {"GQ401"}),
    ("mislabelled-marlin-b4-sym-v2-as-gptq", "vllm-gptq-gemm", 1, {"GQ401", "GQ606"}),
])
def test_verify_runtime_gate(run_cli, name, ids, code, codes):
    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", ids, CKPT / name)
    doc = json.loads(r.stdout)
    validator("report").validate(doc)
    assert r.exit_code == code, r.stdout
    got = {f["code"] for f in doc["findings"] if f["code"] >= "GQ600" or f["code"] == "GQ401"}
    assert got == codes
    for f in doc["findings"]:
        if f["code"] >= "GQ600":
            assert f["details"]["runtime"] in ids.split(",")


def test_verify_runtime_names_the_failing_rule_and_its_source(run_cli):
    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", "vllm",
                CKPT / "b3-asym-act-gptq-single")
    f = next(f for f in json.loads(r.stdout)["findings"] if f["code"] == "GQ601")
    rules = {x["rule"]: x for x in f["details"]["rules_failed"]}
    assert {"bits", "sym", "desc_act_grouped"} <= rules.keys()
    assert rules["bits"]["found"] == "bits is 3" and "auto_gptq.py" in rules["bits"]["source"]
    assert "compressed-tensors" in f["hint"]


def test_verify_runtime_text_shows_the_hint(run_cli):
    r = run_cli("verify", "--quiet", "--runtime", "vllm", CKPT / "b4-asym-noact-gptq-single")
    assert r.exit_code == 1
    line = next(x for x in r.stdout.splitlines() if "GQ601" in x)
    assert "would not load it: sym is false" in line and "(hint: next step:" in line


@pytest.mark.parametrize("arg, fmt", [("nope", "text"), ("vllm,,x", "json"), (",", "text")])
def test_verify_runtime_unknown_id_is_a_usage_error(run_cli, arg, fmt):
    r = run_cli("verify", "--format", fmt, "--runtime", arg, CKPT / "b4-sym-noact-gptq-single")
    assert r.exit_code == 2
    if fmt == "json":
        doc = json.loads(r.stdout)
        assert doc["exit_code"] == 2 and "known: vllm, vllm-gptq-gemm" in doc["error"]
    else:
        assert r.stdout == "" and "--runtime" in r.stderr


def test_verify_runtime_all_and_inapplicable_modes(run_cli):
    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", "all",
                CKPT / "rt-marlin-b4-sym-gptq_v2")
    doc = json.loads(r.stdout)
    named = {f["details"]["runtime"] for f in doc["findings"] if f["code"] >= "GQ600"}
    assert "autogptq" in named and "vllm" not in named
    r = run_cli("verify", "--runtime", "vllm", "--against", CKPT / "b4-sym-noact-gptq-single",
                CKPT / "b4-sym-noact-gptq-single")
    assert r.exit_code == 2 and "--runtime does not apply" in r.stderr


# ---------------------------------------------------------------- the README

def test_readme_carries_the_generated_table():
    spec = importlib.util.spec_from_file_location("runtimes_table",
                                                  ROOT / "scripts" / "runtimes_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = (ROOT / "README.md").read_text()
    assert mod.block() in readme, "run: python3 scripts/runtimes_table.py (README block)"
    assert "verify --runtime vllm" in readme


@pytest.mark.parametrize("name", [
    "b4-asym-act-gptq-single", "b2-asym-noact-gptq-single", "b8-asym-noact-gptq_v2-single",
    "b3-asym-noact-gptq-single", "int16-b4-asym-act-gptq_v2", "int64-b4-asym-gptq_v2",
    "int64-b2-sym-gptq", "int8-b8-asym-gptq", "gptqmodel-b4-asym-gptq", "autogptq-b4-asym-gptq",
    "mislabelled-b4-sym-v2-as-gptq", "b4-sym-noact-gptq-single"])
def test_counting_on_packed_words_equals_comparing_every_field(name):
    """inspect counts misread cells on the packed words (carried_fields, fields_equal); verify
    compares every field: the same cells and cause for every reading, under either truth."""
    from gptqfmt.runtimes.verdicts import misread
    ckpt = open_checkpoint(CKPT / name)
    det = detect_checkpoint(ckpt, full=True)
    by = {v.name: v for v in det.modules}
    for m in ckpt.modules:
        for truth in (GPTQ, GPTQ_V2):
            for reading in Reading:
                for right in (True, False):
                    fast = misread(ckpt, m, by[m.name], truth, reading, right, scales=False)
                    full = misread(ckpt, m, by[m.name], truth, reading, right, scales=True)
                    assert (fast.cells, fast.cause) == (full.cells, full.cause), \
                        (m.name, truth, reading, right)
                    assert fast.max_change is None
                    assert (full.max_change == 0.0) == (full.cells == 0)


def test_marlin_ignoring_non_constant_zeros_is_gq603(run_cli):
    """sym: true over zero points that are not 8: GPTQModel takes Marlin, which decodes with 8."""
    from tests.support import FIXTURES
    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", "gptqmodel",
                FIXTURES / "invalid" / "sym-true-with-asymmetric-zeros")
    doc = json.loads(r.stdout)
    f = next(f for f in doc["findings"] if f["code"] == "GQ603")
    assert r.exit_code == 1 and f["details"]["kernel"] == "marlin"
    assert f["details"]["zero_cells_affected"] > 0 and f["details"]["max_weight_change"] > 0
    assert "marlin ignores qzeros" in f["message"] and "sym=false" in f["hint"]


def test_count_marked_in_chunks_equals_whole_tensor_marks(monkeypatch):
    """count_marked walks rows in chunks of CHUNK words; forced to tiny chunks, it counts
    what the whole-tensor marks count."""
    from gptqfmt.bits import swar as cv
    rng = np.random.default_rng(9)
    s = rng.integers(0, 16, size=(37, 64)).astype(np.uint8)
    s[:, ::5] = 15
    s[:, 2::7] = 0
    w = pack(s, 4, 32, axis=1)
    want = (cv.count_fields(cv.carried_fields(w, 4, True)),
            cv.count_fields(cv.fields_equal(w, 4, 15)),
            cv.count_fields(cv.fields_equal(w, 4, 0) &
                            ~cv.carried_fields(w, 4, False)))
    for chunk in (8, 24, 1 << 15):
        monkeypatch.setattr(cv, "CHUNK", chunk)
        assert (cv.count_marked(w, 4, True), cv.count_marked(w, 4, value=15),
                cv.count_marked(w, 4, False, value=0, unless_carried=True)) == want
    assert want[1] == int((s == 15).sum())


def test_field_comparison_in_chunks_equals_one_pass(monkeypatch):
    """verify compares fields a chunk of groups at a time (CHUNK cells); the 2^bits cells
    of consistent_at land in the right chunk: tiny chunks give the one-pass answer."""
    import gptqfmt.runtimes.verdicts as vd
    ckpt = open_checkpoint(CKPT / "b4-asym-noact-gptq_v2-single")
    det = detect_checkpoint(ckpt, full=True)
    assert any(v.stats.consistent_at for v in det.modules)
    keys = [(r, right) for r in Reading for right in (True, False)]
    for truth in (GPTQ, GPTQ_V2):
        whole = {m.name: vd.misreads(ckpt, m, v, truth, keys, True)
                 for m, v in zip(ckpt.modules, det.modules)}
        monkeypatch.setattr(vd, "CHUNK", 64)   # one group row of 64 columns per chunk
        parts = {m.name: vd.misreads(ckpt, m, v, truth, keys, True)
                 for m, v in zip(ckpt.modules, det.modules)}
        monkeypatch.undo()
        assert parts == whole
