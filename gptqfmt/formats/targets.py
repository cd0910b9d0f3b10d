"""Module names as config targets: the patterns a compressed-tensors `config_groups[*].targets`
or a GPTQ `dynamic` rule is written with, and matching them back.

Both runtimes' readers match a target against a module name with Python's re.match after a
`re:` prefix (compressed-tensors utils/match.py `is_match`; vLLM compressed_tensors/utils.py
`_is_equal_or_regex_match`), and by equality otherwise; a target without a dot that is not a
module name is a class name (`Linear`), which matches every quantized module here, since files
carry no classes.
"""
from __future__ import annotations

import re
from collections import defaultdict

_LAYER = re.compile(r"\.\d+\.")


def patterns(names: list[str], universe: list[str]) -> list[str]:
    """Targets that match exactly `names` among `universe` (every module with weights): one
    `re:` pattern per name shape with the layer numbers generalised (`model.layers.\\d+.mlp.
    up_proj`) where that pattern catches no other module of `universe`, else the exact names.
    Sorted, so a config is the same for the same checkpoint."""
    chosen = set(names)
    shapes: dict[str, list[str]] = defaultdict(list)
    for n in sorted(chosen):
        shapes[_shape(n)].append(n)
    out = []
    for shape, members in shapes.items():
        rx = re.compile(shape)
        caught = [u for u in universe if rx.fullmatch(u)]
        if len(members) > 1 and set(caught) <= chosen:
            out.append("re:^" + shape + "$")
        else:
            out.extend(members)
    return sorted(out)


def _shape(name: str) -> str:
    parts = _LAYER.split(name)
    return r"\.\d+\.".join(re.escape(p) for p in parts)


def kind(target: str) -> str:
    """"regex", "name" or "class": the order vLLM tries targets in (find_matched_target: names
    and `re:` patterns of every group before any class name)."""
    if target.startswith("re:"):
        return "regex"
    return "class" if "." not in target and not _is_layer_name(target) else "name"


def matches(target: str, name: str) -> bool:
    """Whether config target `target` names module `name` (see the module docstring)."""
    if target.startswith("re:"):
        try:
            return re.match(target[3:], name) is not None
        except re.error:
            return False
    if target == name:
        return True
    return "." not in target and not _is_layer_name(target)


def _is_layer_name(target: str) -> bool:
    """`lm_head` is a module name, `Linear` a class name: class names start upper-case."""
    return not target[:1].isupper()


def any_match(targets, name: str) -> bool:
    return any(matches(t, name) for t in targets)
