"""Print the README's runtime tables from the rules table (gptqfmt/runtimes.py), so that the
README never says other than the code: `python3 scripts/runtimes_table.py` prints the block
between the README's runtimes-table markers; tests/unit/test_table.py checks they agree."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gptqfmt.bits.conventions import GPTQ, GPTQ_V2  # noqa: E402
from gptqfmt.runtimes.readings import Reading  # noqa: E402
from gptqfmt.runtimes.rules import Runtime
from gptqfmt.runtimes.table import RUNTIMES  # noqa: E402

BEGIN, END = "<!-- runtimes-table:begin -->", "<!-- runtimes-table:end -->"


def _label(r: Runtime) -> str:
    if not r.label_keys:
        return "none (always gptq)"
    return " then ".join(f"`{k}`" for k in r.label_keys) + f" in {r.config_files[0]}" + (
        "" if len(r.config_files) == 1 else f" (or {', '.join(r.config_files[1:])})")


def _readings(p) -> str:
    g, v = p.readings[GPTQ], p.readings[GPTQ_V2]
    if g is Reading.SYMMETRIC:
        return g.formula
    return g.formula if g is v else f"gptq: {g.formula}; gptq_v2: {v.formula}"


def block() -> str:
    out = [BEGIN, "", "| id | versions | convention from | paths (when) and zero reading |",
           "|---|---|---|---|"]
    for r in RUNTIMES:
        paths = "<br>".join(
            f"`{p.kernel}`" + (f" ({'; '.join(x.text for x in p.when)})" if p.when else "")
            + f": {_readings(p)}" for p in r.paths)
        out.append(f"| `{r.id}` | {r.versions} | {_label(r)} | {paths} |")
    out += ["", "Every loading rule, with the code it comes from (`verify --runtime` names the "
            "failing one in `rules_failed`):", ""]
    for r in RUNTIMES:
        out.append(f"- **`{r.id}`** ({r.name}; convention: {r.label_source})")
        rules = [("", x) for x in r.requires] + [
            (f"{p.kernel} ", x) for p in r.paths for x in p.when + p.requires]
        if r.ignores_dynamic is not None:
            out.append(f"  - does not read `dynamic` ({r.ignores_dynamic})")
        for where, x in rules:
            out.append(f"  - {where}{x.scope}: {x.text} ({x.source})")
    out += ["", END]
    return "\n".join(out)


if __name__ == "__main__":
    print(block())
