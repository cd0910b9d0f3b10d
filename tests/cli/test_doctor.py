"""`gptqfmt doctor`: the answer for one runtime first, its reason second, the cheapest lossless
plan with the user's paths, and --fix carrying it out with the commands' own proofs, judged
again by the runtime's rules (and by verify --runtime, an independent reading of the output)."""
import json
import shutil

import pytest
from click.testing import CliRunner

import gptqfmt
from gptqfmt.cli import main
from gptqfmt.doctor import BROKEN, MISCOMPUTES, REFUSES, SERVES
from gptqfmt.errors import UsageError
from tests.support import CKPT, FIXTURES, digest

SINGLE = CKPT / "b4-sym-noact-gptq-single"
MISLABELLED = CKPT / "mislabelled-b4-sym-v2-as-gptq"     # gptq_v2 data labelled gptq
V1_SYM = CKPT / "rt-nodescact-b4-sym-gptq"              # gptq data, desc_act missing
STATIC = CKPT / "static-b4-asym-act-gptq_v2"            # desc_act with trivial g_idx
ACT = CKPT / "b4-sym-act-gptq-single"                   # a g_idx that reorders


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


def doc(*args):
    code, out = run(*args, "--format", "json")
    d = json.loads(out)
    assert d["exit_code"] == code
    return code, d


def test_a_runtime_that_serves_it_says_so_first_and_exits_0():
    code, out = run("doctor", SINGLE, "--runtime", "transformers")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].startswith("OK: transformers (GPTQModel backend) >= 5.0")
    assert lines[0].endswith("will load it and compute the right weights")
    assert lines[1].startswith("why: ")
    assert lines[-1].startswith("OK: 7 modules, 0 errors, 0 warnings, 0 infos; transformers")


def test_a_mislabel_is_answered_with_fix_label_on_the_users_path():
    code, d = doc("doctor", MISLABELLED, "--runtime", "exllamav2")
    assert code == 1 and d["answer"] == MISCOMPUTES
    assert d["modules_wrong"] == d["modules"] == 7
    assert "reads the zero points as gptq, but the data are gptq_v2" in d["reason"]
    [step] = d["plan"]["steps"]
    assert step["action"] == "fix-label"
    assert step["command"] == f"gptqfmt fix-label {MISLABELLED}"
    assert d["plan"]["expect"].endswith("compute the right weights")


def test_fix_into_dst_leaves_the_source_and_passes_the_runtime_gate(tmp_path):
    before = digest(MISLABELLED)
    dst = tmp_path / "fixed"
    code, d = doc("doctor", MISLABELLED, "--runtime", "exllamav2", "--fix", dst)
    assert code == 0 and d["status"] == "ok" and d["fix"]["ok"]
    assert [s["error"] for s in d["fix"]["steps"]] == [None]
    assert d["fix"]["after"]["answer"] == SERVES
    assert digest(MISLABELLED) == before
    # an independent reading of the output: verify's runtime gate
    assert run("verify", dst, "--runtime", "exllamav2")[0] == 0
    assert run("verify", MISLABELLED, "--runtime", "exllamav2")[0] == 1


def test_fix_in_place_relabels_a_copy(tmp_path):
    work = tmp_path / "ck"
    shutil.copytree(MISLABELLED, work)
    code, out = run("doctor", work, "--runtime", "exllamav2", "--fix", "--in-place")
    assert code == 0, out
    assert "; exllamav2: fixed" in out.splitlines()[-1]
    assert run("doctor", work, "--runtime", "exllamav2")[0] == 0


def test_data_a_runtime_reads_as_stored_are_converted_in_place(tmp_path):
    """Humming takes qzeros as Z whatever the label: gptq data decode one off there until the
    zero points are rewritten as gptq_v2, which convert --in-place does losslessly."""
    code, d = doc("doctor", V1_SYM, "--runtime", "vllm-humming")
    assert code == 1 and d["answer"] == MISCOMPUTES
    [step] = d["plan"]["steps"]
    assert step["action"] == "convert-in-place"
    assert step["command"] == f"gptqfmt convert {V1_SYM} --in-place --from gptq --to gptq_v2"
    work = tmp_path / "ck"
    shutil.copytree(V1_SYM, work)
    assert run("doctor", work, "--runtime", "vllm-humming", "--fix", "--in-place")[0] == 0
    assert run("verify", work, "--runtime", "vllm-humming")[0] == 0


def test_what_vllm_refuses_as_gptq_goes_to_compressed_tensors(tmp_path):
    code, d = doc("doctor", STATIC, "--runtime", "vllm")
    assert code == 1 and d["answer"] == REFUSES
    [step] = d["plan"]["steps"]
    assert step["command"].endswith("--from gptq_v2 --to compressed-tensors")
    dst = tmp_path / "ct"
    code, d = doc("doctor", STATIC, "--runtime", "vllm", "--fix", dst)
    assert code == 0 and d["fix"]["after"]["answer"] == SERVES
    cfg = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors"
    assert "actorder" not in json.dumps(cfg)   # static groups: no reordering to refuse
    # a re-layout is never written in place
    code, out = run("doctor", STATIC, "--runtime", "vllm", "--fix", "--in-place")
    assert code == 1 and "writes a new directory, not in place" in out
    assert "(--fix DST runs it)" in run("doctor", STATIC, "--runtime", "vllm")[1]


def test_the_version_asked_decides_act_order():
    """vLLM 0.30 refused act-order with groups: 0.25 serves the checkpoint, the newest does not
    and names the versions that do."""
    assert run("doctor", ACT, "--runtime", "vllm@0.25")[0] == 0
    code, d = doc("doctor", ACT, "--runtime", "VLLM")
    assert code == 1 and d["answer"] == REFUSES
    assert "desc_act is true with group_size" in d["reason"]
    assert "vLLM >= 0.22, < 0.30" in d["plan"]["elsewhere"]
    assert d["runtime"] == {"id": "vllm", "family": "vllm", "name": "vLLM",
                            "versions": ">= 0.22 (read: 0.33.0)", "version": None}
    _, d = doc("doctor", ACT, "--runtime", "vllm@0.18")
    assert d["runtime"]["id"] == "vllm-gptq-gemm" and d["runtime"]["version"] == "0.18"


def test_a_version_newer_than_the_code_read_is_noted():
    _, d = doc("doctor", SINGLE, "--runtime", "vllm@0.40")
    assert d["notes"] == ["vLLM 0.40 is newer than the code the table was read at (0.33.0): "
                          "judged by that code"]


@pytest.mark.parametrize("args, says", [
    (["--runtime", "vlm"], "not a runtime the table knows; runtimes: autogptq"),
    (["--runtime", "tgi@2.0"], "the table knows tgi 3.3.x"),
    (["--runtime", "vllm@next"], "expected a version after @"),
    (["--fix"], "--fix needs DST, or --in-place"),
    (["--in-place"], "--in-place goes with --fix"),
])
def test_usage_errors_say_what_is_known(args, says):
    code, out = run("doctor", SINGLE, *args)
    assert code == 2 and says in out


def test_a_checkpoint_that_fails_verify_gets_no_plan():
    code, d = doc("doctor", FIXTURES / "invalid" / "g-idx-out-of-range", "--runtime", "vllm")
    assert code == 1
    assert d["answer"] == BROKEN and d["plan"]["steps"] == [] and d["findings"]
    assert d["plan"]["tried"][0].startswith("fix what verify reports first: `gptqfmt verify")


def test_another_format_is_refused_with_a_reason():
    code, out = run("doctor", FIXTURES / "formats" / "ct-b4-asym-g32")
    assert code == 2 and "doctor judges GPTQ checkpoints" in out


def test_the_library_call_is_the_command():
    d = gptqfmt.doctor(MISLABELLED, runtime="exllamav2")
    assert d.answer == MISCOMPUTES and [s.action for s in d.plan.steps] == ["fix-label"]
    with pytest.raises(UsageError):
        gptqfmt.doctor(MISLABELLED, runtime="nope")


def test_github_annotations_carry_the_runtime_finding():
    code, out = run("doctor", MISLABELLED, "--runtime", "exllamav2", "--format", "github")
    assert code == 1 and "GQ602" in out


def test_fix_on_a_checkpoint_that_already_serves_exits_0_and_writes_nothing(tmp_path):
    dst = tmp_path / "fixed"
    code, out = run("doctor", SINGLE, "--runtime", "transformers", "--fix", dst)
    assert code == 0 and not dst.exists()
    assert "nothing to run: it already computes the right weights" in out
    assert "requantize" not in out
    code, d = doc("doctor", SINGLE, "--runtime", "transformers", "--fix", dst)
    assert code == 0 and d["fix"]["ok"] and d["fix"]["steps"] == []
    assert d["fix"]["output"] == str(SINGLE) and not dst.exists()
