"""A gptq writer that clamps Z - 1 at 0 (auto-round 0.16's export, make_fixtures.py
write_qzeros "autoround"): the data's signature (detection/stats.py zero_clamped,
detection/decide.py zero_clamp) and its finding (GQ506). The expectations come from the
generator's true zero points, never from gptqfmt's reading of them."""
from __future__ import annotations

import numpy as np
import pytest

from gptqfmt.bits.conventions import GPTQ, GPTQ_V2
from gptqfmt.bits.packing import pack
from gptqfmt.detection.codestats import read_cell_sums
from gptqfmt.detection.decide import zero_clamp
from gptqfmt.detection.stats import zero_stats
from gptqfmt.ops.inspect import inspect_checkpoint
from gptqfmt.ops.verify import validate
from tests.support import CKPT, GEN, MANIFEST, SPECS, slow_unpack_column


def layer(bits, seed, k=256, n=256, gs=32):
    """(true Z [G, N], codes packed [K*bits/32, N], g_idx) of an asymmetric layer with some
    one-signed groups, quantized by the fixture generator's quantizer."""
    rng = np.random.default_rng(seed)
    w = GEN.realistic_weight(rng, n, k)
    g_idx = GEN.assign_groups(k, gs, False, False, rng)
    GEN.force_one_signed_groups(w, g_idx, rng)
    codes, z, _ = GEN.quantize(w, bits, False, g_idx)
    return z, pack(codes, bits, 32, 0), g_idx


def stats_of(stored, qw, bits, g_idx):
    read, sums, counts = read_cell_sums(qw, bits, g_idx, int(g_idx.max()) + 1)
    return zero_stats(stored.astype(np.uint8), sums, counts, bits, 32)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_at_two_bits_the_codes_tell_a_clamped_zero_from_a_one(seed):
    """Every field zero_clamped counts is a true Z = 0 (none of the many true Z = 1 that store
    0 too), and it finds most of them."""
    z, qw, g_idx = layer(2, seed)
    clamped = np.clip(z - 1, 0, 3)
    st = stats_of(clamped, qw, 2, g_idx)
    zeros = int((z == 0).sum())
    assert int((z == 1).sum()) > 10 * zeros > 0   # stored 0 is mostly a genuine Z = 1
    assert 0.6 * zeros <= st.zero_clamped <= zeros
    # the same count when only the true Z = 0 store 0: no Z = 1 field was counted
    only = np.where(z == 0, 0, np.clip(z - 1, 1, 3))
    assert stats_of(only, qw, 2, g_idx).zero_clamped == st.zero_clamped
    assert st.stored_maxq == 0 and zero_clamp(st, 2) is not None


def test_writers_that_store_a_zero_as_maxq_show_no_clamp():
    """The masked writer stores Z = 0 as maxq (3): its stored 0s are Z = 1, and the maxq fields
    rule the signature out; gptq_v2 stores Z = 0 as 0, legitimately (the finding is gptq's)."""
    z, qw, g_idx = layer(2, 1)
    st = stats_of((z - 1) & 3, qw, 2, g_idx)
    assert st.stored_maxq > 0 and zero_clamp(st, 2) is None
    assert stats_of(z, qw, 2, g_idx).zero_clamped > 0  # the v2 zeros; checks ask the verdict


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_from_three_bits_the_codes_do_not_separate_and_nothing_is_counted(bits):
    z, qw, g_idx = layer(bits, 5)
    st = stats_of(np.clip(z - 1, 0, 2**bits - 1), qw, bits, g_idx)
    assert st.zero_clamped == 0 and zero_clamp(st, bits) is None


def gq506(result):
    return {f.tensor: f for f in result.findings if f.code == "GQ506"}


def slow_clamped_counts(d):
    """Per module, its stored 0 fields whose codes' mean is below 1/2, read with the reference
    safetensors reader and the slow bit-stream unpacker (tests/support.py), not gptqfmt's."""
    from safetensors.numpy import load_file
    t = load_file(d / "model.safetensors")
    out = {}
    for name in sorted(k.removesuffix(".qzeros") for k in t if k.endswith(".qzeros")):
        qw, qz, g_idx = t[f"{name}.qweight"], t[f"{name}.qzeros"], t[f"{name}.g_idx"]
        codes = np.array([slow_unpack_column(qw[:, n], 2, 32) for n in range(qw.shape[1])]).T
        stored = np.array([slow_unpack_column(row, 2, 32) for row in qz])
        sums = np.stack([codes[g_idx == g].sum(axis=0) for g in range(stored.shape[0])])
        counts = np.bincount(g_idx, minlength=stored.shape[0])[:, None]
        out[name] = int(((stored == 0) & (2 * sums < counts)).sum())
    return out


def test_fixture_modules_carry_gq506_with_the_counts_the_codes_give():
    """autoround-b2-asym-gptq: verify and inspect report, for each module with 3 such fields or
    more, the count the slow reading gives, never more than the module's true Z = 0 (the
    generator's truth); a warning, so verify passes unless --strict."""
    name = "autoround-b2-asym-gptq"
    assert SPECS[name].writer == "autoround" and SPECS[name].bits == 2
    truth = MANIFEST[name]["modules"]
    want = slow_clamped_counts(CKPT / name)
    assert all(want[m] <= truth[m]["zero_fields"] for m in want)
    assert sum(n >= 3 for n in want.values()) >= 3   # the fixture shows the signature
    rep = validate(CKPT / name, jobs=1)
    found = gq506(rep)
    assert {t: f.details["fields"] for t, f in found.items()} == {
        f"{m}.qzeros": n for m, n in want.items() if n >= 3}
    assert all(f.severity == "warning" and "expected 3" in f.message and "got 0" in f.message
               for f in found.values())
    assert not rep.failed() and rep.failed(strict=True)
    ins = gq506(inspect_checkpoint(CKPT / name))
    assert {t: f.details for t, f in ins.items()} == {t: f.details for t, f in found.items()}


@pytest.mark.parametrize("name", sorted(n for n, s in SPECS.items()
                                        if s.bits == 2 and s.writer != "autoround"))
def test_no_gq506_on_other_two_bit_writers(name):
    """The exact, AutoGPTQ and GPTQModel writers store a Z = 0 as maxq; gptq_v2 stores it as 0
    and means it."""
    assert SPECS[name].convention in (GPTQ, GPTQ_V2)
    assert gq506(validate(CKPT / name, jobs=1)) == {}
