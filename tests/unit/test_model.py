"""The one module model (gptqfmt/formats/model.py): the element kinds the kernel numbers, and the
modules it has no form of."""
from __future__ import annotations

import re

from gptqfmt.formats.model import QuantModule, any_lm_head, is_lm_head, mixed, uniform
from tests.support import ROOT


def test_element_kinds_are_the_kernels():
    from gptqfmt.formats.model import Kind
    header = (ROOT / "kernels" / "gptq_dequant.h").read_text()
    enum = dict(re.findall(r"GQ_(F32|F16|BF16) = (\d+)", header))
    assert {k: int(v) for k, v in enum.items()} == {k.name: k.value for k in Kind}


def test_modules_outside_gptq_words_have_no_form():
    from gptqfmt.formats.model import QuantModule, outside_words
    assert outside_words(QuantModule("m", 3, -1, 40, 64, False, False, "F16")) and \
        outside_words(QuantModule("m", 3, -1, 64, 48, False, False, "F16"))
    assert outside_words(QuantModule("m", 3, 32, 64, 96, False, False, "F16")) is None


def test_lm_head_under_any_prefix_and_only_it():
    assert all(is_lm_head(n) for n in ("lm_head", "model.lm_head", "a.b.lm_head"))
    assert not any(is_lm_head(n) for n in ("lm_head_x", "model.lm_head.proj", "xlm_head", ""))


def test_any_lm_head_is_any_is_lm_head():
    from types import SimpleNamespace
    names = ["lm_head", "model.lm_head", "a.b.lm_head", "lm_head_x", "model.lm_head.proj",
             "xlm_head", "", "layers.0.q", ".lm_head", "a.xlm_head"]
    for k in range(len(names) + 1):
        for group in (names[:k], names[k:], names[k:] + names[:k]):
            mods = [SimpleNamespace(name=n) for n in group]
            assert any_lm_head(mods) == any(is_lm_head(n) for n in group), group


def test_uniform_and_mixed():
    a = QuantModule("a", 4, 128, 64, 64, True, False, "F16")
    b = QuantModule("b", 4, 32, 64, 64, True, False, "F16")
    assert uniform([a, b], "bits") == 4 and uniform([a, b], "group_size") is None
    assert uniform([], "bits") is None
    assert mixed([a, b], ("bits", "group_size")) and not mixed([a, b], ("bits", "sym"))
