#!/usr/bin/env python3
"""The floor plan of the package, measured: its rooms (the modules and packages directly under
gptqfmt/), the imports between them (lazy imports inside functions and TYPE_CHECKING imports
count too), the imports that run up a floor, import cycles, reaches into another module's
private names, and the places outside the format readers and writers that ask which format a
checkpoint is in.

    python3 scripts/floors.py [--root DIR]      # DIR: a checkout (default: this one)

FLOORS is the plan, from the ground up: a room imports only rooms on lower floors (rooms on one
floor do not import each other). A tree whose rooms the plan does not name (an older one) is
measured without it: an import runs up a floor there when it closes a cycle between rooms and
goes against the direction most imports between those rooms take.
tests/project/test_architecture.py holds the package to the plan.
"""
from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The floors, from the ground up (a room is a module or package directly under gptqfmt/).
FLOORS: list[tuple[str, ...]] = [
    ("findings", "version", "faults", "parallel", "resources"),  # leaves
    ("errors",),          # every exception (FindingError carries findings)
    ("bits",),            # pure numpy: packing, layout, packed-word predicates, conventions
    ("safetensors_io",),  # the container: header, reader, writer, index, journal, hub
    ("formats",),         # every format's reader (and writer) of the one module model
    ("detection",),       # the zero-point convention from the data
    ("runtimes",),        # the runtimes as data, their readings, their verdicts
    ("checks",),          # the rules, as findings
    ("numerics",),        # the CPU twin and the CuPy backend
    ("ops",),             # the bodies of inspect, verify, --against and --reference
    ("conversion",),      # convert, --in-place, fix-label
    ("doctor",),          # one runtime's answer, the plan, --fix with convert and fix-label
    ("cli",),             # click, the error boundary, the reporters
    ("__init__", "__main__"),
]
# Where a format may be named: its readers and writers.
FORMAT_HOMES = ("formats",)
# Per-format classes and results: an isinstance on one of them asks which format it is.
FORMAT_CLASSES = {"GptqSource", "CtSource", "AwqSource", "ExactSource", "FormatInspectResult",
                  "FormatReport", "ConfigCheck", "Checkpoint"}
FORMAT_NAMES = {"COMPRESSED_TENSORS", "AWQ", "compressed-tensors", "awq"}
# GPTQ's conventions name its format too where a checkpoint's `.format` is compared with them
CONVENTION_NAMES = {"GPTQ", "GPTQ_V2", "gptq", "gptq_v2"}


def modules(root: Path) -> dict[str, Path]:
    """gptqfmt's modules under `root` (a checkout), by dotted name."""
    out = {}
    for p in (root / "gptqfmt").rglob("*.py"):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, str]]:
    """(module imported, name taken from it or '') for every gptqfmt import in `path`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.startswith("gptqfmt")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(filter(None, [*parts, base]))
            if base.startswith("gptqfmt"):
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    out.append((sub, "") if sub in known else (base, a.name))
    return out


def graph(root: Path) -> dict[str, set[str]]:
    """Module -> the gptqfmt modules it imports."""
    mods = modules(root)
    return {m: {t for t, _ in imports(m, p, set(mods)) if t in mods and t != m}
            for m, p in mods.items()}


def room(module: str) -> str:
    """The room a module lives in: `gptqfmt.bits.swar` -> `bits`; the package's own
    __init__ is `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def cycles(root: Path) -> list[str]:
    """Every import cycle between modules, as `a -> b -> a`."""
    g = graph(root)
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(g[m]):
            if state.get(t) == 1:
                found.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2
    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    return found


def private_reaches(root: Path) -> list[str]:
    """Imports of another module's private names, and attribute reaches into them."""
    mods = modules(root)
    bad = []
    for m, p in mods.items():
        bad += [f"{m} imports {t}.{n}" for t, n in imports(m, p, set(mods))
                if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                    not node.attr.startswith("__") and \
                    not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                bad.append(f"{m}:{node.lineno} {ast.unparse(node)}")
    return bad


def room_imports(root: Path) -> Counter[tuple[str, str]]:
    """(importing room, imported room) -> how many module imports run between them."""
    out: Counter[tuple[str, str]] = Counter()
    for m, targets in graph(root).items():
        for t in targets:
            if room(m) != room(t):
                out[(room(m), room(t))] += 1
    return out


def floor_of(name: str) -> int | None:
    return next((i for i, f in enumerate(FLOORS) if name in f), None)


def upward(root: Path) -> list[str]:
    """Module imports that run up a floor (or across one), `a -> b`. Rooms the plan does not
    name are judged by the cycles between rooms (see the module docstring)."""
    g = graph(root)
    rooms = {room(m) for m in g}
    if all(floor_of(r) is not None for r in rooms):
        return sorted(f"{m} -> {t}" for m, ts in g.items() for t in ts
                      if room(m) != room(t) and floor_of(room(m)) <= floor_of(room(t)))
    counts = room_imports(root)
    reach = {r: {b for (a, b) in counts if a == r} for r in rooms}
    for r in rooms:                      # transitive closure between rooms
        todo = list(reach[r])
        while todo:
            x = todo.pop()
            for y in reach.get(x, ()):
                if y not in reach[r]:
                    reach[r].add(y)
                    todo.append(y)
    out = []
    for m, ts in g.items():
        for t in ts:
            a, b = room(m), room(t)
            if a != b and a in reach.get(b, ()) and counts[(a, b)] < counts[(b, a)]:
                out.append(f"{m} -> {t}")
    return sorted(out)


def _names_format(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` is one of `names`, as a constant or as a name (bare or an attribute)."""
    if isinstance(node, ast.Constant):
        return node.value in names
    return isinstance(node, (ast.Name, ast.Attribute)) and \
        getattr(node, "id", getattr(node, "attr", None)) in names


def format_forks(root: Path) -> list[str]:
    """Places outside the format readers and writers that ask which format a checkpoint is
    in: an isinstance on a per-format class or result, a comparison with a format name other
    than GPTQ's conventions, or of a checkpoint's `.format` with any format name."""
    out = []
    for m, p in modules(root).items():
        if room(m) in FORMAT_HOMES:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "isinstance" and len(node.args) == 2:
                names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")
                         for n in ast.walk(node.args[1])}
                if names & FORMAT_CLASSES:
                    out.append(f"{p.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_names_format(s, FORMAT_NAMES) for s in sides) or (
                        any(isinstance(s, ast.Attribute) and s.attr == "format" for s in sides)
                        and any(_names_format(s, FORMAT_NAMES | CONVENTION_NAMES)
                                for s in sides)):
                    out.append(f"{p.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="a checkout (default: this one)")
    root = ap.parse_args().root.resolve()
    g = graph(root)
    counts = room_imports(root)
    rooms = sorted({room(m) for m in g})
    up, forks = upward(root), format_forks(root)
    print(f"{len(g)} modules in {len(rooms)} rooms: {', '.join(rooms)}")
    print(f"{sum(counts.values())} module imports between rooms, {len(counts)} room pairs")
    print(f"{len(up)} imports up a floor" + "".join(f"\n  {u}" for u in up))
    print(f"{len(cycles(root))} import cycles, {len(private_reaches(root))} private reaches")
    print(f"{len(forks)} places outside the formats ask which format a checkpoint is in"
          + "".join(f"\n  {f}" for f in forks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
