"""The public API (gptqfmt/__init__.py) as users call it: the names it exports and what the
results they return carry, for a GPTQ checkpoint and for one in another format."""
import inspect as pyinspect

import gptqfmt
from tests.support import CKPT, FORMATS

GPTQ_CKPT = CKPT / "b4-sym-noact-gptq_v2-single"
CT_CKPT = FORMATS / "ct-b4-asym-g32"


def test_the_exported_names():
    assert sorted(gptqfmt.__all__) == sorted([
        "CATALOGUE", "Checkpoint", "ConvertReport", "Detection", "Diagnosis", "NotRepresentable",
        "convert", "convert_qzeros", "doctor", "doctor_remote", "Finding", "FindingError",
        "GptqfmtError", "InspectResult", "Module", "ModuleVerdict", "RemoteError", "Report",
        "ScanResult", "UsageError", "__version__", "detect", "inspect", "inspect_remote",
        "open_checkpoint", "pack", "unpack", "scan", "validate"])
    assert all(hasattr(gptqfmt, n) for n in gptqfmt.__all__)
    assert list(pyinspect.signature(gptqfmt.convert).parameters)[:3] == ["src", "dst", "to"]
    assert list(pyinspect.signature(gptqfmt.detect).parameters) == ["path", "full"]
    assert list(pyinspect.signature(gptqfmt.doctor).parameters)[:2] == ["path", "runtime"]


def test_inspect_and_validate_results_carry_the_gptq_model():
    r = gptqfmt.inspect(GPTQ_CKPT)
    assert isinstance(r, gptqfmt.InspectResult) and r.ok
    assert isinstance(r.checkpoint, gptqfmt.Checkpoint) and r.checkpoint.label == "gptq_v2"
    assert isinstance(r.detection, gptqfmt.Detection) and r.detection.verdict == "gptq_v2"
    assert r.runtimes and all(isinstance(f, gptqfmt.Finding) for f in r.findings)
    v = gptqfmt.validate(GPTQ_CKPT)
    assert isinstance(v, gptqfmt.Report) and not v.failed() and v.qweight_bytes > 0
    assert isinstance(v.checkpoint, gptqfmt.Checkpoint) and v.path == str(GPTQ_CKPT)
    assert v.checksums is None and v.detection.verdict == "gptq_v2"


def test_another_format_has_no_gptq_model_and_nothing_to_detect():
    for r in (gptqfmt.inspect(CT_CKPT), gptqfmt.validate(CT_CKPT)):
        assert r.checkpoint is None and r.detection is None and r.runtimes is None
        assert r.to_json()["format"] == "compressed-tensors"
