"""The AutoAWQ reader (gptqfmt/formats/awq.py): what is not the GEMM layout is refused with its
reason."""
from __future__ import annotations

import shutil

from gptqfmt.ops.verify import validate
from tests.support import FORMATS, edit_config


def test_awq_gemv_is_refused_with_its_reason(tmp_path):
    d = tmp_path / "a"
    shutil.copytree(FORMATS / "awq-b4-g32", d)
    edit_config(d, lambda q: q.update({"version": "gemv"}))
    rep = validate(d)
    assert [f.code for f in rep.findings if f.code == "GQ210"] and \
        "GEMV" in next(f.message for f in rep.findings if f.code == "GQ210")
