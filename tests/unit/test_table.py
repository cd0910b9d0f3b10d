"""The runtime table (gptqfmt/runtimes/table.py, in the vocabulary of rules.py): every runtime
there, every rule cited and triggered by a shipped fixture, and the README's copy of it."""
import importlib.util

from gptqfmt import runtimes as rt
from gptqfmt.bits.conventions import GPTQ, GPTQ_V2
from gptqfmt.errors import GptqfmtError
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from gptqfmt.runtimes.verdicts import config_facts, module_facts
from tests.support import CKPT, ROOT


def every_rule():
    """(runtime id, where, rule) for every rule of the table."""
    for r in rt.RUNTIMES:
        for x in r.requires:
            yield r.id, "", x
        for p in r.paths:
            for x in p.when + p.requires:
                yield r.id, p.kernel, x


def test_runtime_ids_are_unique_and_every_required_one_is_there():
    ids = [r.id for r in rt.RUNTIMES]
    assert len(ids) == len(set(ids)) and list(rt.BY_ID) == ids
    assert {"vllm", "vllm-gptq-gemm", "vllm-legacy", "sglang", "exllamav2", "tgi",
            "transformers", "gptqmodel", "autogptq", "llama.cpp"} <= set(ids)


def test_every_rule_cites_its_source():
    for rid, where, rule in every_rule():
        src = rule.source
        assert "/" in src.repo and src.path and src.ref, (rid, where, rule.id)
        assert rule.scope in ("config", "module", "setup"), (rid, rule.id)
        assert rule.text and rule.id
    for r in rt.RUNTIMES:
        assert r.label_source.repo and r.versions and r.config_files or not r.needs_config
        for p in r.paths:
            assert set(p.readings) == {GPTQ, GPTQ_V2} and p.source.ref


def test_rule_ids_are_unique_within_a_path():
    for r in rt.RUNTIMES:
        assert len({x.id for x in r.requires}) == len(r.requires), r.id
        for p in r.paths:
            ids = [x.id for x in p.when + p.requires]
            assert len(ids) == len(set(ids)), (r.id, p.kernel, ids)


def _fixtures():
    for d in sorted(CKPT.iterdir()):
        try:
            ckpt = open_checkpoint(d)
        except GptqfmtError:
            continue  # a fixture that cannot be read (invalid ones live elsewhere)
        yield d.name, ckpt


def test_every_rule_is_triggered_by_a_shipped_fixture():
    """Each rule fails on at least one fixture (for the setup rules: on a GPU of compute
    capability 7.0, 8.0 or 9.0, decoding one row or a prefill of 256): no rule the fixtures
    cannot catch."""
    from dataclasses import replace
    triggered = {}
    for name, ckpt in _fixtures():
        for cap in (70, 80, 90):
            cfg = config_facts(ckpt, cap)
            base = [cfg] + [module_facts(cfg, m) for m in ckpt.modules if m.valid]
            facts = base + [replace(f, rows=256) for f in base]
            for rid, where, rule in every_rule():
                key = (rid, where, rule.id)
                if key not in triggered and any(rule.test(f) is not None for f in facts):
                    triggered[key] = name
        ckpt.close()
    missing = [k for rid, where, rule in every_rule()
               if (k := (rid, where, rule.id)) not in triggered]
    assert missing == []


def test_readme_and_runtimes_page_carry_the_generated_tables():
    """The README's table and docs/runtimes.md's list of rules are what
    scripts/runtimes_table.py prints from the table, and --write puts them there."""
    spec = importlib.util.spec_from_file_location("runtimes_table",
                                                  ROOT / "scripts" / "runtimes_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = (ROOT / "README.md").read_text()
    page = (ROOT / "docs" / "runtimes.md").read_text()
    hint = "run: python3 scripts/runtimes_table.py --write"
    assert mod.block() in readme, hint
    assert mod.rules_block() in page, hint
    assert mod.replace_block(readme, mod.block()) == readme
    stale = readme.replace(mod.block(), mod.BEGIN + "\n| old |\n" + mod.END)
    assert stale != readme and mod.replace_block(stale, mod.block()) == readme
    assert all(f"`{r.id}`" in mod.block() and f"**`{r.id}`**" in mod.rules_block()
               for r in rt.RUNTIMES)
    assert "verify --runtime vllm" in page


def _rule(runtime, rule_id):
    return next(x for x in runtime.requires if x.id == rule_id)


def test_gptqmodel_refuses_is_marlin_format_in_the_file_it_reads():
    """GPTQModel >= 6.0 raises on the key itself, `false` too (quantization/config.py
    from_quant_config), in the first of quantize_config.json, quant_config.json, config.json
    that exists; a key in a file it does not read is harmless."""
    from dataclasses import replace
    rule = _rule(rt.BY_ID["gptqmodel"], "no_is_marlin_format")
    assert rule.scope == "config" and rule.source.path == "gptqmodel/quantization/config.py"
    assert "fix-label" in rule.hint
    ckpt = open_checkpoint(CKPT / "autogptq-b4-sym-gptq")   # AutoGPTQ 0.7.1: both files
    try:
        cfg = config_facts(ckpt, 80)
    finally:
        ckpt.close()
    assert cfg.legacy_keys == (("config.json:quantization_config", "is_marlin_format"),
                               ("quantize_config.json", "is_marlin_format"))
    assert rule.test(cfg) == ("quantize_config.json carries is_marlin_format (refused by name "
                              "since GPTQModel 6.0)")
    only_config_json = replace(cfg, legacy_keys=cfg.legacy_keys[:1])
    assert rule.test(only_config_json) is None   # quantize_config.json is read, not config.json
    no_quantize_config = replace(only_config_json, sources=("config.json:quantization_config",))
    assert rule.test(no_quantize_config) == ("config.json:quantization_config carries "
                                             "is_marlin_format (refused by name since "
                                             "GPTQModel 6.0)")
    assert rule.test(replace(cfg, version=(5, 8, 0))) is None   # 5.8.0 still accepted it
    assert rule.test(replace(cfg, version=(6, 0, 0))) is not None
