"""GQ212 (gptqfmt/checks/labels.py files_disagree): config files that declare different
conventions, and what each loader then reads, from which file and key.

The expectations are the loaders' own rules, read in their code (not in the runtime table):
GPTQModel takes quantize_config.json before config.json and `format` before
`checkpoint_format` (ModelCloud/GPTQModel@f4c327a17eb3 gptqmodel/quantization/config.py
QUANT_CONFIG_FILENAME_COMPAT L74, from_pretrained L3022-3040, from_quant_config L2824-2923);
transformers 5.24 reads config.json, `checkpoint_format` overriding `format`
(src/transformers/utils/quantization_config.py GPTQConfig.__init__ L716-719, PyPI wheel); vLLM
0.21's gptq_gemm and ExLlamaV2 read config.json's `checkpoint_format` only."""
from __future__ import annotations

import json
import shutil

import pytest

from gptqfmt.checks.labels import files_disagree
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from tests.support import CKPT

CJ, QC = "config.json:quantization_config", "quantize_config.json"
BASE = {"bits": 4, "group_size": 32, "desc_act": False, "sym": True, "quant_method": "gptq"}


def checkpoint(tmp_path, config_json: dict | None, quantize_config: dict | None):
    """The gptq data of a clean fixture under these two config files (None: no such file)."""
    d = tmp_path / "c"
    shutil.copytree(CKPT / "b4-sym-noact-gptq-single", d)
    for name, keys, wrap in (("config.json", config_json, True),
                             ("quantize_config.json", quantize_config, False)):
        if keys is None:
            (d / name).unlink()
            continue
        doc = {**BASE, **keys}
        (d / name).write_text(json.dumps({"model_type": "llama", "quantization_config": doc}
                                         if wrap else doc))
    return open_checkpoint(d)


def gq212(tmp_path, cj, qc):
    with checkpoint(tmp_path, cj, qc) as ck:
        return files_disagree(ck)


def test_optimum_layout_splits_the_loaders(tmp_path):
    """optimum 2.3: config.json format gptq_v2 (stored before save converted the data),
    quantize_config.json format gptq."""
    [f] = gq212(tmp_path, {"format": "gptq_v2"}, {"format": "gptq"})
    assert f.code == "GQ212" and f.severity == "error" and f.file == CJ
    reads = f.details["reads"]
    assert reads["gptqmodel"] == {"convention": "gptq", "file": QC, "key": "format"}
    assert reads["transformers"] == {"convention": "gptq_v2", "file": CJ, "key": "format"}
    assert reads["vllm-gptq-gemm"] == {"convention": "gptq", "file": CJ, "key": None}
    assert reads["exllamav2"] == {"convention": "gptq", "file": CJ, "key": None}
    assert f.details["declared"] == {CJ: {"format": "gptq_v2"}, QC: {"format": "gptq"}}
    assert "\n" not in f.message and "gptq_v2 by transformers" in f.message
    assert "fix-label" in f.hint


def test_checkpoint_format_disagreeing_across_files(tmp_path):
    [f] = gq212(tmp_path, {"checkpoint_format": "gptq"}, {"checkpoint_format": "gptq_v2"})
    reads = f.details["reads"]
    assert reads["gptqmodel"] == {"convention": "gptq_v2", "file": QC,
                                  "key": "checkpoint_format"}
    assert reads["transformers"]["convention"] == reads["vllm-gptq-gemm"]["convention"] == "gptq"


def test_a_file_that_declares_nothing_says_gptq(tmp_path):
    """GPTQModel reads quantize_config.json first: there a missing label is gptq, whatever
    config.json says."""
    [f] = gq212(tmp_path, {"checkpoint_format": "gptq_v2", "format": "gptq_v2"}, {})
    assert f.details["reads"]["gptqmodel"] == {"convention": "gptq", "file": QC, "key": None}
    assert f.details["reads"]["vllm-gptq-gemm"]["convention"] == "gptq_v2"
    assert "quantize_config.json: neither key (gptq)" in f.message


@pytest.mark.parametrize(("cj", "qc"), [
    ({"checkpoint_format": "gptq", "format": "gptq"}, {"checkpoint_format": "gptq",
                                                       "format": "gptq"}),
    # one convention said with other keys: every loader reads gptq_v2
    ({"checkpoint_format": "gptq_v2", "format": "gptq_v2"}, {"format": "gptq_v2"}),
    # format alone in both: a within-file matter (GQ209), not a disagreement between files
    ({"format": "gptq_v2"}, {"format": "gptq_v2"}),
    ({}, {}),                                   # AutoGPTQ: no label anywhere
    ({"checkpoint_format": "gptq_v2"}, None),   # one file
])
def test_agreeing_or_single_files_are_not_gq212(tmp_path, cj, qc):
    assert gq212(tmp_path, cj, qc) == []
