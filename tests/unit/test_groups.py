"""The runtime table grouped by how its paths read a gptq field (gptqfmt/runtimes/groups.py), and
the sentences reports build from the groups."""
from gptqfmt.bits.conventions import GPTQ, GPTQ_V2, REFERENCE, ZeroRule, reference_rule
from gptqfmt.runtimes import groups as runtimes
from gptqfmt.runtimes.table import RUNTIMES


def test_runtimes_group_by_their_rule_and_read_by_the_label():
    groups = runtimes.groups()
    assert [g.gptq for g in groups] == [ZeroRule.V1_NOWRAP, ZeroRule.V1_WRAP]
    assert groups[0].labels[0] == "vLLM gptq_gemm" and "TGI triton" in groups[1].labels
    # every group is the paths of the table with that field rule on gptq files, each once
    for g in groups:
        want = list(dict.fromkeys(p.label for r in RUNTIMES for p in r.paths
                                  if p.readings[GPTQ].rule == g.gptq))
        assert list(g.labels) == want
        assert g.rule(GPTQ_V2) == ZeroRule.V2 and g.rule(GPTQ) == g.gptq
    # the reference reading of a gptq field is the no-wrap one (zeros[i] + 1 with no mask)
    assert REFERENCE == ZeroRule.V1_NOWRAP and reference_rule(GPTQ) == ZeroRule.V1_NOWRAP
    assert reference_rule(GPTQ_V2) == ZeroRule.V2
    n0, n1 = (len(g.labels) - 1 for g in groups)
    assert runtimes.maxq_readings(4) == (f"vLLM gptq_gemm and {n0} other kernels read Z = 16; "
                                         f"TGI triton and {n1} other kernels read Z = 0")
    assert runtimes.maxq_readings(2, sep=", ").startswith("vLLM gptq_gemm and ")
    assert ", TGI triton and " in runtimes.maxq_readings(2, sep=", ")
