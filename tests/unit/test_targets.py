"""Module names as config targets (gptqfmt/formats/targets.py): patterns that generalise layer
numbers only where exact, and the order vLLM matches targets in."""
from __future__ import annotations

from gptqfmt.formats.targets import matches, patterns


def test_target_patterns_generalise_layers_only_when_exact():
    universe = [f"model.layers.{i}.mlp.{p}" for i in range(3) for p in ("up_proj", "down_proj")]
    ups = [u for u in universe if u.endswith("up_proj")]
    assert patterns(ups, universe) == [r"re:^model\.layers\.\d+\.mlp\.up_proj$"]
    assert patterns(ups[:2], universe) == sorted(ups[:2])   # layer 2 differs: exact names
    assert matches("Linear", "anything.q_proj") and not matches("lm_head", "model.lm_head")
    assert matches("re:.*lm_head", "model.lm_head") and matches("lm_head", "lm_head")


def test_names_and_patterns_before_class_names_as_vllm_matches():
    from gptqfmt.formats.ct import parse_config
    w = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    cfg = parse_config("c", {"config_groups": {
        "group_0": {"targets": ["Linear"], "weights": w},
        "group_1": {"targets": [r"re:.*up_proj$"], "weights": {**w, "symmetric": False}},
        "group_2": {"targets": ["model.layers.0.mlp.down_proj"], "weights": {**w, "num_bits": 8}}}})
    assert cfg.group_for("model.layers.0.mlp.up_proj").name == "group_1"
    assert cfg.group_for("model.layers.0.mlp.down_proj").name == "group_2"
    assert cfg.group_for("model.layers.0.self_attn.q_proj").name == "group_0"
