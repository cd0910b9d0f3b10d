"""The runtime table applied to the shipped fixtures (gptqfmt/runtimes/verdicts.py): which path
each runtime takes, what it reads, where it decodes wrong and why, counted on the packed words
and compared field by field."""
import shutil

import numpy as np
import pytest

from gptqfmt.bits.conventions import GPTQ, GPTQ_V2, ZeroRule, effective_zeros
from gptqfmt.bits.layout import stored_fields
from gptqfmt.detection.read import detect_checkpoint
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from gptqfmt.runtimes.readings import Reading
from gptqfmt.runtimes.verdicts import assess
from tests.support import CKPT


def verdicts(name, scales=True, capability=80):
    ckpt = open_checkpoint(CKPT / name)
    det = detect_checkpoint(ckpt, full=True)
    return {v.runtime.id: v for v in assess(ckpt, det, scales=scales, capability=capability)}


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


@pytest.mark.parametrize("name", ["rt-nodescact-b4-sym-gptq", "b8-sym-noact-gptq_v2-single",
                                  "b2-sym-noact-gptq-single", "mislabelled-b4-sym-v2-as-gptq",
                                  "b3-sym-noact-gptq_v2-single", "b4-asym-noact-gptq_v2-single"])
def test_a_scenario_judges_as_the_written_fix_does(name, tmp_path):
    """doctor's plan judges a fix without writing it (Scenario): relabelled, and converted
    into the other convention. Each judgement equals the one on the checkpoint that
    fix-label and convert actually write, for every runtime."""
    from gptqfmt.conversion import convert
    from gptqfmt.conversion.relabel import fix_label
    from gptqfmt.errors import FindingError
    from gptqfmt.runtimes.verdicts import Scenario, assess

    def judged(path, scenario=Scenario()):
        ck = open_checkpoint(path)
        det = detect_checkpoint(ck, full=True)
        return [(v.runtime.id, v.loads, v.decodes_correctly,
                 v.taken.cells_affected if v.taken else None,
                 v.taken.modules_affected if v.taken else None)
                for v in assess(ck, det, scenario=scenario)], det.verdict

    src = CKPT / name
    _, truth = judged(src)
    relabelled = tmp_path / "relabelled"
    shutil.copytree(src, relabelled)
    from gptqfmt.conversion.relabel import plan_relabel
    act = any(c.key == "desc_act" for c in plan_relabel(src).changes)
    fix_label(relabelled)
    assert judged(src, Scenario(label=truth, no_act_order=act))[0] == judged(relabelled)[0]
    other = GPTQ if truth == GPTQ_V2 else GPTQ_V2
    if name.startswith("b4-asym"):   # zero points of 0: gptq cannot hold them
        with pytest.raises(FindingError):
            convert(src, tmp_path / "converted", to=other, src_convention=truth)
        return
    convert(src, tmp_path / "converted", to=other, src_convention=truth)
    assert judged(src, Scenario(label=other, convention=other))[0] == \
        judged(tmp_path / "converted")[0]


def test_alike_modules_are_read_once_and_tallied_as_each_one(tmp_path, monkeypatch):
    """_tallies reads one module of each symmetric pattern, bits and qzeros shape and counts
    the others as it: the sums, causes and first modules equal those of each module judged on
    its own, with the stored fields as they are and converted (a scenario). A module of
    another pattern or shape, or of no pattern, is read on its own, and so is every module
    whose codes were read (verify's detection: its verdict has statistics)."""
    import json

    from safetensors.numpy import save_file

    import gptqfmt.runtimes.verdicts as vd
    from gptqfmt.bits.conventions import sym_field
    from gptqfmt.bits.packing import pack

    rng = np.random.default_rng(7)
    k = 256
    kinds = [("gptq", 64), ("gptq", 64), ("gptq_v2", 64), ("gptq", 32), (None, 64),
             ("gptq", 64), ("gptq", 32)]
    t = {}
    for i, (p, n) in enumerate(kinds):
        name = f"model.layers.{i}.mlp.up_proj"
        fields = np.full((k // 32, n), sym_field(4, p)) if p else rng.integers(0, 16, (k // 32, n))
        t[f"{name}.qweight"] = rng.integers(-2**31, 2**31, (k // 8, n)).astype(np.int32)
        t[f"{name}.qzeros"] = pack(fields, 4, 32, 1)
        t[f"{name}.scales"] = np.full((k // 32, n), 0.01, np.float16)
        t[f"{name}.g_idx"] = (np.arange(k) // 32).astype(np.int32)
    save_file(t, tmp_path / "model.safetensors")
    (tmp_path / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 32, "sym": False, "desc_act": False,
         "checkpoint_format": "gptq"}))
    ckpt = open_checkpoint(tmp_path)
    sampled = {v.name: v for v in detect_checkpoint(ckpt, full=False).modules}
    full = {v.name: v for v in detect_checkpoint(ckpt, full=True).modules}
    assert [sampled[m.name].pattern for m in ckpt.modules] == [p for p, _ in kinds]
    assert all(v.stats is not None for v in full.values())
    keys = [(r, right) for r in Reading for right in (True, False)]
    real = vd.misreads
    patterned = [m for m, (p, _) in zip(ckpt.modules, kinds) if p]

    def alone(mods, by, truth, stored_as):
        """The tallies summed from each module judged alone: its misreads, or under a
        scenario (whose fields are compared without misreads) a call of its own."""
        out = {key: vd._Tally() for key in keys}
        for m in mods:
            if stored_as is None:
                for key, r in real(ckpt, m, by[m.name], truth, keys, False).items():
                    out[key].add(m.name, r)
                continue
            for key, one in vd._tallies(ckpt, [m], by, truth, keys, False, stored_as).items():
                if one.modules:
                    (cause,) = one.causes
                    out[key].add(m.name, vd.Misread(one.cells, one.max_change, cause))
        return out

    def names(*i):
        return [f"model.layers.{j}.mlp.up_proj" for j in i]

    cases = [(ckpt.modules, sampled, None, names(0, 2, 3, 4)),
             (ckpt.modules, full, None, names(*range(len(kinds))))]
    for truth in (GPTQ, GPTQ_V2):
        other = GPTQ_V2 if truth == GPTQ else GPTQ
        for mods, by, stored_as, reads in cases + [(patterned, sampled, (truth, other), [])]:
            want = alone(mods, by, truth, stored_as)
            read: list[str] = []
            monkeypatch.setattr(vd, "misreads",
                                lambda ck, m, *a: read.append(m.name) or real(ck, m, *a))
            got = vd._tallies(ckpt, mods, by, truth, keys, False, stored_as)
            monkeypatch.undo()
            assert got == want, (truth, stored_as)
            assert any(x.modules > 1 for x in got.values())
            if stored_as is None:   # a scenario compares fields without misreads()
                assert read == reads
