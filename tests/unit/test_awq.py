"""The AutoAWQ reader (gptqfmt/formats/awq.py): what is not the GEMM layout is refused with its
reason."""
from __future__ import annotations

import json
import shutil

from gptqfmt.ops.verify import validate
from tests.support import FIXTURES

FORMATS = FIXTURES / "formats"


def edit_config(d, fn):
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg["quantization_config"])
    (d / "config.json").write_text(json.dumps(cfg))


def test_awq_gemv_is_refused_with_its_reason(tmp_path):
    d = tmp_path / "a"
    shutil.copytree(FORMATS / "awq-b4-g32", d)
    edit_config(d, lambda q: q.update({"version": "gemv"}))
    rep = validate(d)
    assert [f.code for f in rep.findings if f.code == "GQ210"] and \
        "GEMV" in next(f.message for f in rep.findings if f.code == "GQ210")
