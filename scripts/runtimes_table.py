"""Print the runtime tables from the rules table (gptqfmt/runtimes/table.py), so that the README
and docs/runtimes.md never say other than the code:

    python3 scripts/runtimes_table.py           # the README's block (runtimes-table markers)
    python3 scripts/runtimes_table.py --rules   # docs/runtimes.md's block (runtimes-rules markers)
    python3 scripts/runtimes_table.py --write   # rewrite both blocks in place

tests/unit/test_table.py checks that both files carry what this prints."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gptqfmt.bits.conventions import GPTQ, GPTQ_V2  # noqa: E402
from gptqfmt.runtimes.readings import Reading  # noqa: E402
from gptqfmt.runtimes.rules import Runtime  # noqa: E402
from gptqfmt.runtimes.table import RUNTIMES  # noqa: E402

BEGIN, END = "<!-- runtimes-table:begin -->", "<!-- runtimes-table:end -->"
RULES_BEGIN, RULES_END = "<!-- runtimes-rules:begin -->", "<!-- runtimes-rules:end -->"
README, RULES_PAGE = ROOT / "README.md", ROOT / "docs" / "runtimes.md"


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
    """The README's table: each runtime, where it takes the convention from, its paths."""
    out = [BEGIN, "", "| id | versions | convention from | paths (when) and zero reading |",
           "|---|---|---|---|"]
    for r in RUNTIMES:
        paths = "<br>".join(
            f"`{p.kernel}`" + (f" ({'; '.join(x.text for x in p.when)})" if p.when else "")
            + f": {_readings(p)}" for p in r.paths)
        out.append(f"| `{r.id}` | {r.versions} | {_label(r)} | {paths} |")
    out += ["", END]
    return "\n".join(out)


def rules_block() -> str:
    """docs/runtimes.md's list: every loading rule of every runtime, with its source."""
    out = [RULES_BEGIN, "", "Every loading rule, with the code it comes from (`verify --runtime` "
           "names the failing one in `rules_failed`):", ""]
    for r in RUNTIMES:
        out.append(f"- **`{r.id}`** ({r.name}; convention: {r.label_source})")
        rules = [("", x) for x in r.requires] + [
            (f"{p.kernel} ", x) for p in r.paths for x in p.when + p.requires]
        if r.ignores_dynamic is not None:
            out.append(f"  - does not read `dynamic` ({r.ignores_dynamic})")
        for where, x in rules:
            out.append(f"  - {where}{x.scope}: {x.text} ({x.source})")
    out += ["", RULES_END]
    return "\n".join(out)


def replace_block(text: str, new: str) -> str:
    """`text` with the block between `new`'s first and last lines (the markers) replaced."""
    begin, end = new.splitlines()[0], new.splitlines()[-1]
    i, j = text.index(begin), text.index(end) + len(end)
    return text[:i] + new + text[j:]


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for path, new in ((README, block()), (RULES_PAGE, rules_block())):
            path.write_text(replace_block(path.read_text("utf-8"), new), "utf-8")
    elif sys.argv[1:] == ["--rules"]:
        print(rules_block())
    elif not sys.argv[1:]:
        print(block())
    else:
        sys.exit(__doc__)
