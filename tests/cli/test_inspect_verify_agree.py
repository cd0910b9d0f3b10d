"""inspect and verify never contradict each other: whatever inspect reports, verify reports with
the same code, severity, file and tensor; verify may report more only where it reads more (the
scales, and the codes of qweight rows that inspect does not sample)."""
import json

import pytest

import gptqfmt
from gptqfmt.errors import GptqfmtError
from gptqfmt.ops.equivalence import reference_fp32
from gptqfmt.resources import validator
from tests.support import CKPT, FIXTURES, GEN

# Findings that need every scale, which inspect does not read (README, "inspect reads headers,
# configs, g_idx and qzeros, plus 64 KiB of qweight per module").
SCALE_CODES = {"GQ501", "GQ502"}

DIRS = sorted(p for root in ("ckpt", "hostile", "invalid") for p in (FIXTURES / root).iterdir()
              if p.is_dir())


def outcome(fn, path):
    try:
        return fn(path), None
    except GptqfmtError as e:
        return None, e


def key(f):
    return (f.code, f.severity, f.file, f.tensor)


@pytest.mark.parametrize("path", DIRS, ids=[f"{p.parent.name}/{p.name}" for p in DIRS])
def test_inspect_reports_what_verify_reports(path):
    ins, ins_err = outcome(gptqfmt.inspect, path)
    rep, rep_err = outcome(lambda p: gptqfmt.validate(p, jobs=1), path)
    if ins_err or rep_err:  # unreadable: both stop, with the same error
        assert type(ins_err) is type(rep_err) and ins_err.exit_code == rep_err.exit_code
        assert [key(f) for f in getattr(ins_err, "findings", [])] == \
            [key(f) for f in getattr(rep_err, "findings", [])]
        return
    got = {key(f) for f in ins.findings}
    want = {key(f) for f in rep.findings}
    assert got <= want, f"inspect only: {sorted(got - want)}"
    # These checkpoints are small enough that inspect's sample is every qweight row: it must then
    # see everything but the scale checks.
    assert {k for k in want if k[0] not in SCALE_CODES} <= got
    assert ins.ok == (not any(f.severity == "error" and f.code not in SCALE_CODES
                              for f in rep.findings))
    doc = ins.to_json()
    validator("inspect").validate({**doc, "exit_code": int(not ins.ok)})  # as the CLI prints it
    assert doc["status"] == ("ok" if ins.ok else "fail")


def test_corruption_signature_in_inspect_json_is_an_error(run_cli):
    """The reported case: inspect's own JSON named autogptq_sign_extension, yet said ok."""
    name = "autogptq-b4-asym-gptq"
    r = run_cli("inspect", CKPT / name, "--format", "json")
    doc = json.loads(r.stdout)
    flagged = {f"{m['name']}.qzeros" for m in doc["modules"]
               if "autogptq_sign_extension" in m["zero_point"]["signatures"]}
    assert len(flagged) == 7
    gq405 = {f["tensor"] for f in doc["findings"] if f["code"] == "GQ405"}
    assert gq405 == flagged
    assert all(f["severity"] == "error" for f in doc["findings"] if f["code"] == "GQ405")
    assert doc["status"] == "fail" and r.exit_code == 1
    text = run_cli("inspect", CKPT / name, "-v")
    assert text.exit_code == 1 and text.stdout.count(" GQ405 ") == 7
    brief = run_cli("inspect", CKPT / name).stdout   # one line for the seven, counted
    assert brief.count(" GQ405 ") < 7 and " more like it): GQ405 " in brief


# Checkpoints large enough that inspect reads only a sample of qweight: the MLP modules have
# 64 x 16384 weights (128 KiB of int32 qweight for gate_proj and up_proj, 512 KiB for down_proj,
# against inspect's 64 KiB per module), so inspect leaves some groups' codes unread. Their
# verdicts may then change when verify reads every row, so inspect reports for them only what
# qzeros alone decide.
SAMPLED = {
    "sampled-b4-asym-gptq": dict(bits=4, sym=False, act_order=False, convention="gptq"),
    "sampled-b4-asym-gptq_v2": dict(bits=4, sym=False, act_order=False, convention="gptq_v2"),
    "sampled-autogptq-b4-asym-gptq": dict(bits=4, sym=False, act_order=False, convention="gptq",
                                          writer="autogptq", config_style="autogptq"),
}
SAMPLED_MODULES = ("model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_proj",
                   "model.layers.0.mlp.up_proj")


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampled")
    truth = {}
    for name, kw in SAMPLED.items():
        truth[name] = GEN.build(GEN.Spec(name, intermediate=16384, **kw), root / name)
    return root, truth


def test_sampled_checkpoints_are_sampled(sampled):
    """The premise of the tests below: inspect leaves codes unread in the MLP modules only."""
    from gptqfmt.detection.codestats import read_cell_sums
    from gptqfmt.detection.read import sampled_blocks
    root, _ = sampled
    with gptqfmt.open_checkpoint(root / "sampled-b4-asym-gptq") as ckpt:
        for m in ckpt.modules:
            qw = ckpt.view(m.tensors["qweight"])
            read, _, counts = read_cell_sums(qw, m.bits, ckpt.g_idx(m), m.groups,
                                             sampled_blocks(m, qw.shape, full=False))
            # one qweight row (8 codes) of some groups, none of others
            if m.name in SAMPLED_MODULES:
                assert set(counts.tolist()) == {8} and 0 < len(read) < m.groups, m.name
            else:
                assert read.tolist() == list(range(m.groups)), m.name
                assert counts.tolist() == [32] * m.groups, m.name
    det = gptqfmt.detect(root / "sampled-b4-asym-gptq")
    assert sorted(v.name for v in det.modules if not v.complete) == sorted(SAMPLED_MODULES)


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_sampled_inspect_is_a_subset_of_verify(sampled, name):
    root, _ = sampled
    ins = gptqfmt.inspect(root / name)
    rep = gptqfmt.validate(root / name, jobs=1)
    # GQ424 is inspect's own: its sample shows what only verify settles
    assert {key(f) for f in ins.findings if f.code != "GQ424"} <= {key(f) for f in rep.findings}
    assert ins.ok or rep.failed()


@pytest.mark.parametrize("name", ["sampled-b4-asym-gptq", "sampled-b4-asym-gptq_v2"])
def test_sampled_modules_leave_code_evidence_to_verify(sampled, name):
    """GQ406/GQ407 rest on the verdict, which the unread rows may change: inspect gives them for
    the modules it read whole, verify for every module; the counts are the generator's Z = 0."""
    root, truth = sampled
    code = "GQ406" if SAMPLED[name]["convention"] == "gptq" else "GQ407"
    expect = {f"{m}.qzeros": t["zero_fields"] for m, t in truth[name]["modules"].items()
              if t["zero_fields"]}
    assert all(f"{m}.qzeros" in expect for m in SAMPLED_MODULES)  # verify reports each
    got = {f.tensor: f.details["fields"] for f in gptqfmt.validate(root / name, jobs=1).findings
           if f.code == code}
    assert got == expect
    got = {f.tensor: f.details["fields"] for f in gptqfmt.inspect(root / name).findings
           if f.code == code}
    assert got == {t: n for t, n in expect.items()
                   if t.removesuffix(".qzeros") not in SAMPLED_MODULES}


def test_sampled_sign_extension_is_found_from_qzeros_alone(sampled):
    """AutoGPTQ's runs of maxq at the top of qzeros words need no codes: inspect reports them
    for the sampled modules too, as verify does."""
    root, _ = sampled
    name = "sampled-autogptq-b4-asym-gptq"
    ins = {f.tensor: f.details["signatures"] for f in gptqfmt.inspect(root / name).findings
           if f.code == "GQ405"}
    for m in SAMPLED_MODULES:
        assert ins[f"{m}.qzeros"] == ["autogptq_sign_extension"]
    rep = {f.tensor for f in gptqfmt.validate(root / name, jobs=1).findings
           if f.code == "GQ405"}
    assert set(ins) <= rep


def test_clean_gptq_with_many_zero_points_is_not_called_corrupt(sampled):
    root, _ = sampled
    rep = gptqfmt.validate(root / "sampled-b4-asym-gptq", jobs=1)
    assert [f.tensor for f in rep.findings if f.code == "GQ405"] == []


def test_zero_stats_counts_stored_fields_of_unread_groups():
    """Counts that need no codes cover every group; those that need codes only the read ones.
    Groups 0-3 read (stored 5, mean code 6: the gptq offset of 1), groups 4-31 unread, of which
    4-19 have the top four fields of one word at maxq (AutoGPTQ's run), a different word in
    each, as Z = 0 falls in different columns; 4-bit int32 words, 8 per group. (Runs always in
    the same columns and groups would be those columns' and groups' own lean, not a bug.)"""
    import numpy as np

    from gptqfmt.detection.decide import corruption_signatures
    from gptqfmt.detection.stats import zero_stats
    stored = np.full((32, 64), 5, dtype=np.uint8)
    for g in range(4, 20):
        w = g % 8
        stored[g, w * 8 + 4: w * 8 + 8] = 15
    counts = np.array([32] * 4 + [0] * 28)
    sums = np.where(counts[:, None] > 0, 32 * 6, 0) * np.ones((1, 64), dtype=np.int64)
    st = zero_stats(stored, sums, counts, 4, 32)
    assert (st.stored_maxq, st.stored_zero, st.top_runs) == (64, 0, 16)
    assert (st.wrapped, st.maxq_consistent, st.cells, st.median) == (0, 0, 256, 1.0)
    assert st.top_runs_expected < 0.1
    assert corruption_signatures(st, 4, codes=False)[0] == ["autogptq_sign_extension"]


def test_declared_metadata_findings_are_reported_by_inspect(tmp_path):
    """GQ315 (desc_act true, trivial g_idx) needs only config and g_idx: inspect reports it as
    verify does, for each module, naming the g_idx tensor and the shard that holds it."""
    import shutil
    src = CKPT / "int64-b4-asym-gptq_v2"  # sharded, no act-order
    shutil.copytree(src, tmp_path / "c")
    for f in ("config.json", "quantize_config.json"):
        doc = json.loads((tmp_path / "c" / f).read_text())
        doc.get("quantization_config", doc)["desc_act"] = True
        (tmp_path / "c" / f).write_text(json.dumps(doc))
    shard = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    modules = json.loads((FIXTURES / "manifest.json").read_text())["int64-b4-asym-gptq_v2"][
        "modules"]
    expect = {("GQ315", "warning", shard[f"{m}.g_idx"], f"{m}.g_idx") for m in modules}
    for result in (gptqfmt.inspect(tmp_path / "c"), gptqfmt.validate(tmp_path / "c", jobs=1)):
        assert {key(f) for f in result.findings if f.code == "GQ315"} == expect


# AutoGPTQ 0.7.1's packer at every bit width, on modules big enough that inspect samples the
# codes (512 x 1024, group 128), against the exact writer on the same weights: verify finds the
# sign extension from qzeros and codes (GQ405, exit 1), and inspect either finds it too or says
# that its sample cannot clear it and names verify (GQ424); the clean twin has neither.
WRITER_BITS = [2, 3, 4, 8]


@pytest.fixture(scope="module")
def writers(tmp_path_factory):
    root = tmp_path_factory.mktemp("writers")
    for bits in WRITER_BITS:
        for writer in ("autogptq", "exact"):
            name = f"{writer}-b{bits}"
            GEN.build(GEN.Spec(name, bits, False, False, "gptq", writer=writer, hidden=512,
                               intermediate=1024, group_size=128,
                               config_style="autogptq" if writer == "autogptq" else "gptqmodel"),
                      root / name)
    return root


@pytest.mark.parametrize("bits", WRITER_BITS)
def test_autogptq_sign_extension_is_found_at_every_bit_width(writers, bits, tmp_path):
    bad, clean = writers / f"autogptq-b{bits}", writers / f"exact-b{bits}"
    # never converted, not even with --allow-lossy (its overwritten fields would pass verify
    # written as Z = 0), and --reference does not call the corrupted modules consistent
    with pytest.raises(GptqfmtError) as e:
        gptqfmt.convert(bad, tmp_path / "out", allow_lossy=True)
    assert "GQ405" in {f.code for f in e.value.findings} and not (tmp_path / "out").exists()
    ref = reference_fp32(bad, backend="cpu")
    assert any(d.verdict == "random corruption" for d in ref.modules)
    rep = gptqfmt.validate(bad, jobs=1)
    sign = [f for f in rep.findings if f.code == "GQ405"]
    assert rep.failed() and sign and all(
        f.details["signatures"] == ["autogptq_sign_extension"] for f in sign)
    ins = gptqfmt.inspect(bad)
    codes = {f.code for f in ins.findings}
    assert "GQ405" in codes or "GQ424" in codes
    for f in ins.findings:
        if f.code == "GQ424":
            assert f.hint == f"gptqfmt verify {bad} reads every code and decides"
    for found in (gptqfmt.validate(clean, jobs=1).findings, gptqfmt.inspect(clean).findings):
        assert not {f.code for f in found} & {"GQ405", "GQ423", "GQ424"}


def test_what_the_codes_cannot_settle_is_said_with_counts(tmp_path):
    """GPTQModel's borrow at 2 bits runs through fields of Z = 1, whose codes average about one
    code, as a Z = 0 of one-signed weights does: verify cannot tell, and says so (GQ423) with
    the counts instead of passing the fields."""
    GEN.build(GEN.Spec("borrow-b2", 2, False, False, "gptq", writer="gptqmodel", hidden=512,
                       intermediate=1024, group_size=128), tmp_path / "c")
    rep = gptqfmt.validate(tmp_path / "c", jobs=1)
    undecided = [f for f in rep.findings if f.code == "GQ423"]
    assert undecided and all(f.severity == "warning" for f in undecided)
    for f in undecided:
        d = f.details
        assert d["codes_disagree"] >= 3 and d["fields"] >= d["codes_disagree"]
        assert f.message.startswith(f"{d['fields']} fields store 3 above a wrapped Z = 0 up "
                                    "to the top of their word")
